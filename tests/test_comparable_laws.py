"""Laws that mean one thing (issue 44, item 4): on a planted experiment with two widths on an uneven grid, every law in
one variable in fits.json, the report, the printed summary and the figures is fitted over runs that agree on the other
varied setting (a law in N per width, a law in W per N); the laws over every run are the joint laws and the law in
N / W, each labelled as such; `diffmem advise` reads the law of the width (or N) it is asked about."""
from __future__ import annotations

import json

import pytest

from diffmem.analysis.advise import advise
from diffmem.analysis.powerlaw import JOINT_FIT_NAMES, load_fits
from diffmem.analysis.runfiles import read_csv
from diffmem.analysis.synthetic import write_synthetic_experiment
from diffmem.figures import laws as law_figures
from diffmem.figures.experiment_files import load_experiment_files
from diffmem.figures.style import FigureOutput
from diffmem.results import write_results

WHOLE_GRID = ("tau_mem_vs_n_over_width",)  # a law in x = N / W: over every run by construction
"""Laws in one variable whose x combines N and W (the report labels them "all runs")."""


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """The paper's law tau_mem = 300 N * 32 / W and tau_gen = 5000 * 32 / W on an uneven grid like
    results/cpu_digits_2's: N = 32, 64, 128 at W = 8 and N = 64, 128 at W = 32, two seeds each. A law in N over all
    ten runs would mix W = 8 and W = 32 (4x apart in tau) into one line."""
    root = tmp_path_factory.mktemp("uneven")
    planted = dict(seeds=[0, 1], steps=500_000, n_evals=24, tau_gen=lambda n, w: 5000.0 * 32 / w)
    write_synthetic_experiment(root, [32, 64, 128], widths=[8], **planted)
    write_synthetic_experiment(root, [64, 128], widths=[32], **planted)
    summary = write_results(root, figures=False)
    return root, summary


def _setting_of(root) -> dict[str, tuple[int, int]]:
    return {r["run"]: (r["n"], r["width"]) for r in read_csv(root / "summary.csv")}


def _other_setting(law: dict) -> int | None:
    """Which of (n, width) a law in one variable must hold fixed: the index into (n, width), None for x = N / W."""
    return {"n": 1, "width": 0}.get(law["x"])


def test_every_fitted_law_in_one_variable_holds_the_other_setting_fixed(uneven):
    root, _ = uneven
    setting = _setting_of(root)
    fits = json.loads((root / "fits.json").read_text())
    checked = 0
    for name, entry in fits.items():
        if not isinstance(entry, dict) or name in JOINT_FIT_NAMES or "quantity" not in entry:
            continue
        key = "by_width" if "by_width" in entry else "by_n" if "by_n" in entry else None
        laws = [entry] + (list(entry[key].values()) if key else [])
        if key and len(entry[key]) > 1:  # the runs differ in the other setting: no law over all of them
            assert entry["exponent"] is None and entry["points"] == [], name
            assert entry["reason"].startswith(f"the runs differ in {key[3:]}") and key in entry["reason"], name
        for law in laws:
            fixed = _other_setting(law)
            if law["exponent"] is None or fixed is None:
                continue
            assert len({setting[p["run"]][fixed] for p in law["points"]}) == 1, (name, law["points"])
            checked += 1
    assert checked >= 10  # per width: tau_mem, tau_gen, epochs and levels in N; per N: the same in W


def test_the_comparable_laws_recover_the_planted_exponents(uneven):
    """Within 0.25 of the planted 1 (N) and -1 (W): the evaluation grid's brackets quantize each tau."""
    _, summary = uneven
    at_8 = summary.fits["tau_mem_vs_n"].groups["8"]
    assert at_8.fitted and at_8.exponent == pytest.approx(1.0, abs=0.25)  # tau_mem ~ N at one width
    assert not summary.fits["tau_mem_vs_n"].all_runs.fitted
    at_64 = summary.fits["tau_gen_vs_width"].groups["64"]
    assert at_64.fitted and at_64.exponent == pytest.approx(-1.0, abs=0.25)  # 2 widths: no interval
    joint = summary.joint["tau_mem_vs_n_and_width"]
    assert joint.exponents == pytest.approx((1.0, -1.0), abs=0.25)


def test_the_report_and_the_printed_summary_label_every_law_with_its_runs(uneven):
    root, summary = uneven
    text = (root / "report.md").read_text()
    table = [line for line in text.split("## Laws")[1].split("\n## ")[0].splitlines() if line.startswith("| `")]
    assert table
    for line in table:
        law, runs, x = (cell.strip() for cell in line.strip("|").split("|")[:3])
        if x == "n and width" or law.strip("`") in WHOLE_GRID:
            assert runs == "all runs", line
        else:  # a law in N names its width, a law in W its N
            assert runs.startswith({"n": "width = ", "width": "n = "}[x]), line
    assert "| `tau_mem_vs_n` | width = 8 | n |" in text and "| `tau_mem_vs_n` | width = 32 | n |" in text
    assert "| `tau_mem_vs_n` | all runs |" not in text
    assert "over the runs of one width" in text  # the sentence that says why
    unresolved = text.split("## What the analysis could not resolve")[1]
    assert "the runs differ in" not in unresolved  # a law that mixes settings is not a failure to report
    assert "not fitted: `tau_gen_vs_width` (n = 32): fewer than 2 distinct width values" in unresolved
    printed = summary.format()
    assert "  tau_mem_vs_n (width = 8): tau_mem ~ " in printed and "  tau_mem_vs_n (all runs)" not in printed


@pytest.mark.e2e  # draws two figures
def test_the_figures_draw_only_laws_over_comparable_runs(uneven, tmp_path, monkeypatch):
    root, _ = uneven
    setting = _setting_of(root)
    drawn = []
    real = law_figures.draw_fit

    def recording(ax, fit, *args, **kwargs):
        if fit is not None and fit.fitted:
            drawn.append(fit)
        return real(ax, fit, *args, **kwargs)

    monkeypatch.setattr(law_figures, "draw_fit", recording)
    data = load_experiment_files(root)
    out = FigureOutput(tmp_path, pdf=False)
    assert not law_figures.plot_scaling(data, out).skipped
    assert not law_figures.plot_width(data, out).skipped
    assert {f.x_name for f in drawn} == {"n", "width"}
    assert {(f.quantity, f.x_name) for f in drawn} >= {("tau_gen", "width"), ("tau_mem", "width")}
    for fit in drawn:
        fixed = 1 if fit.x_name == "n" else 0
        assert len({setting[p[0]][fixed] for p in fit.points}) == 1, (fit.quantity, fit.x_name)


def test_advise_reads_the_law_of_the_width_and_n_it_is_asked_about(uneven):
    root, _ = uneven
    fits = load_fits(root)
    own = advise(96, 32, root)
    assert own.tau_mem.source.startswith("tau_mem_vs_n at W=32") and own.tau_gen.source.startswith(
        "tau_gen_vs_n at W=32")
    expected = fits["tau_mem_vs_n"].groups["32"].predict([96.0])
    assert own.tau_mem.value == pytest.approx(float(expected[0][0]))
    unmeasured = advise(64, 16, root)  # W = 16 has no law in N: tau_gen from the width law of its own N
    assert unmeasured.tau_gen.source.startswith("tau_gen_vs_width at N=64")
    assert not any("assumed flat in N" in w for w in unmeasured.warnings)
    assert unmeasured.tau_mem.source.startswith("tau_mem_vs_n_over_width")
    nearest = advise(100, 16, root)  # N = 100 not measured: the width law of N = 128, nearest in log
    assert nearest.tau_gen.source.startswith("tau_gen_vs_width at N=128")
    assert any("measured at N = 128: assumed flat in N" in w for w in nearest.warnings)
