"""The report page (diffmem.analysis.report): report.md of a planted experiment holds the settings, the timescale
table, the fitted exponents, links to the figures that exist and what the analysis could not resolve."""
from __future__ import annotations

import re

import pytest

from diffmem.results import write_results
from diffmem.analysis.powerlaw import FIT_METHOD, load_fits
from diffmem.analysis.report import estimate_text, report_text, steps_text, write_report
from diffmem.analysis.runfiles import read_csv, read_figure_index
from diffmem.analysis.synthetic import write_synthetic_experiment, write_synthetic_run

pytestmark = pytest.mark.xdist_group("report")
"""One worker runs this module, so that each module-scoped fixture (an experiment analyzed on disk) is built
once rather than once per worker (pytest-xdist, ``--dist loadgroup`` in pyproject.toml)."""


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """One width, N = 32, 128 and 512 with three seeds each (sample grids for N = 32); N = 2048 never memorizes."""
    root = tmp_path_factory.mktemp("report")
    write_synthetic_experiment(root, [32], widths=[8], seeds=[0, 1, 2], steps=100_000, n_evals=16,
                               tau_gen=lambda n, w: 1500.0, tau_mem=lambda n, w: 100.0 * n, sample_grids=True)
    write_synthetic_experiment(root, [128, 512], widths=[8], seeds=[0, 1, 2], steps=100_000, n_evals=16,
                               tau_gen=lambda n, w: 1500.0, tau_mem=lambda n, w: 100.0 * n)
    write_synthetic_run(root / "n02048_w08_s0", n=2048, width=8, steps=100_000, tau_gen=1500.0, tau_mem=None,
                        n_evals=16)
    summary = write_results(root)
    return root, summary, (root / "report.md").read_text()


@pytest.mark.e2e
def test_analyze_writes_the_report(experiment):
    root, summary, text = experiment
    assert summary.report == root / "report.md"
    assert "report.md" in summary.format()
    assert text.startswith(f"# {root.name}: report\n")
    assert text == report_text(root)  # nothing but the folder's files: the page is reproducible from them


@pytest.mark.e2e
def test_settings_list_what_varies_and_what_is_shared(experiment):
    _, _, text = experiment
    assert "| `data.n` | 32, 128, 512, 2048 |" in text
    assert "| `train.seed` | 0, 1, 2 |" in text
    assert "optimizer = sgd, lr = 0.01" in text
    assert "device" not in text.split("## Timescales")[0]  # execution keys are not settings of the experiment


@pytest.mark.e2e
def test_timescale_table_holds_every_run_with_its_intervals(experiment):
    root, _, text = experiment
    rows = read_csv(root / "summary.csv")
    table = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| n0")}
    assert set(table) == {r["run"] for r in rows}
    for r in rows:
        line = table[r["run"]]
        for key in ("tau_gen", "tau_mem", "tau_gap", "tau_mem_at_0.01", "tau_mem_at_0.1"):
            assert f"| {estimate_text(r, key)} |" in line + " |", (r["run"], key)
    (measured,) = [r for r in rows if r["run"] == "n00128_w08_s1"]
    lo, hi = measured["tau_mem_lo"], measured["tau_mem_hi"]
    assert f"{measured['tau_mem']:.0f} [{lo:.0f}, {hi:.0f}]" in table["n00128_w08_s1"]
    assert lo <= 12_800 <= hi  # the planted onset, 100 N
    (never,) = [r for r in rows if r["run"] == "n02048_w08_s0"]
    assert f"| > {steps_text(never['tau_mem'])} |" in table["n02048_w08_s0"]


@pytest.mark.e2e
def test_laws_with_exponents_intervals_method_and_p_values(experiment):
    root, _, text = experiment
    fits = load_fits(root)
    law = fits["tau_mem_vs_n"].all_runs
    assert law.fitted and law.gof.p_value is not None  # three seeds per N: the lack-of-fit test has a p-value
    assert f"{law.exponent:.3f} [{law.exponent_lo:.3f}, {law.exponent_hi:.3f}]" in text
    assert f"lack of fit p = {law.gof.p_value:.2g}" in text
    assert f"fitted by `{FIT_METHOD}`" in text
    gen = fits["tau_gen_vs_n"].all_runs
    assert f"{gen.exponent:.3f} [{gen.exponent_lo:.3f}, {gen.exponent_hi:.3f}]" in text


@pytest.mark.e2e
def test_every_figure_drawn_is_linked_and_every_link_resolves(experiment):
    root, _, text = experiment
    links = re.findall(r"\]\((figures/[^)]+)\)", text)
    assert links and all((root / link).is_file() for link in links)
    drawn = [e for e in read_figure_index(root / "figures") if not e["skipped"]]
    assert {e["name"] for e in drawn} >= {"window_w08", "collapse", "scaling", "phase", "loss_gap",
                                          "gallery_n00032_w08"}
    for e in drawn:
        for name in e["files"]:
            assert f"figures/{name}" in links
    assert "![gallery_n00032_w08](figures/gallery_n00032_w08.png)" in text.split("## Galleries")[1]


@pytest.mark.e2e
def test_what_could_not_be_resolved_is_listed(experiment):
    root, summary, text = experiment
    unresolved = text.split("## What the analysis could not resolve")[1]
    assert "censored: `n02048_w08_s0` tau_mem > " in unresolved and "a lower bound" in unresolved
    assert "not fitted: `tau_gen_vs_width` (all runs): fewer than 2 distinct width values" in unresolved
    skipped = {r.name: r.skipped for r in summary.figures if r.skipped}
    assert "width" in skipped and "gallery_n00128_w08" in skipped
    for name, reason in skipped.items():
        assert f"- figure skipped: {name}: {reason}" in unresolved
    # every law whose interval its brackets set (read back from fits.json) is listed with its widest bracket, and
    # only those; analyze's own lines end the same way
    fits = load_fits(root)
    laws = [(name, group, fit) for name, fs in fits.items() for group, fit in fs.laws() if fit.fitted]
    by_brackets = [(name, group, fit) for name, group, fit in laws if fit.set_by_brackets]
    assert by_brackets  # planted taus without scatter: every fitted law here
    for name, group, fit in by_brackets:
        assert f"- interval: `{name}` ({group}): {fit.resolution_note()} (how: " in unresolved
        assert "widest bracket" in fit.resolution_note()
        assert f"{name} ({group}): {fit.describe()}" in summary.format()
        assert fit.describe().endswith("x)") and "interval set by the brackets (widest" in fit.describe()
    assert unresolved.count("interval set by the brackets") == len(by_brackets)  # one width: no joint law fitted


@pytest.mark.e2e
def test_a_missing_figure_is_not_linked_and_no_figures_is_said(experiment, tmp_path):
    root, _, _ = experiment
    (root / "figures" / "phase.png").rename(tmp_path / "phase.png")
    try:
        text = report_text(root)
        assert "figures/phase.png" not in text and "figures/phase.pdf" in text
    finally:
        (tmp_path / "phase.png").rename(root / "figures" / "phase.png")
    plain = tmp_path / "plain"
    write_synthetic_experiment(plain, [64, 256], widths=[8], steps=20_000, n_evals=12,
                               tau_gen=lambda n, w: 500.0, tau_mem=lambda n, w: 20.0 * n)
    write_results(plain, figures=False)
    page = (plain / "report.md").read_text()
    assert "figures: none drawn" in page and "](figures/" not in page
    assert write_report(plain) == plain / "report.md"


def test_a_law_whose_goodness_of_fit_fails_is_listed_as_unresolved(tmp_path):
    """A planted bend: tau_mem flat from N = 16 to 32 (2560 steps), then 80 N; no single line passes through every
    run's interval, and the report lists the flags of that law with the cells whose removal lets one pass."""
    write_synthetic_experiment(tmp_path, [16, 32, 64, 128], widths=[8], steps=40_000, n_evals=40,
                               tau_gen=lambda n, w: 500.0, tau_mem=lambda n, w: 80.0 * max(n, 32))
    write_results(tmp_path, figures=False)
    gof = load_fits(tmp_path)["tau_mem_vs_n"].all_runs.gof
    assert gof.line_through_intervals is False
    text = (tmp_path / "report.md").read_text()
    unresolved = text.split("## What the analysis could not resolve")[1]
    assert "- goodness of fit: `tau_mem_vs_n` (width = 8): " + "; ".join(gof.flagged()) in unresolved
    assert "no single line passes through every run's interval" in unresolved


# --- split pairs (issue #30) ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair_experiment(tmp_path_factory):
    """N = 32 and 128 (one seed) with their split-1 twins and planted tau_bias = 20 N (before tau_mem = 100 N), and
    N = 512 whose bias is never established (a censored tau_bias)."""
    from diffmem.analysis.synthetic import write_synthetic_pairs

    root = tmp_path_factory.mktemp("report_pairs")
    planted = write_synthetic_experiment(root, [32, 128, 512], widths=[8], steps=100_000, n_evals=20,
                                         tau_gen=lambda n, w: 1500.0, tau_mem=lambda n, w: 100.0 * n)
    pairs = write_synthetic_pairs(root, planted, tau_bias=lambda n, w: None if n == 512 else 20.0 * n, n_evals=20)
    write_results(root, pdf=False)
    return root, pairs, (root / "report.md").read_text()


@pytest.mark.e2e
def test_split_pairs_section_holds_each_pair_with_its_timescales(pair_experiment):
    root, planted, text = pair_experiment
    section = text.split("## Split pairs")[1].split("\n## ")[0]
    rows = {r["run"]: r for r in read_csv(root / "summary.csv")}
    lines = {line.split(" | ")[0].lstrip("| "): line for line in section.splitlines() if line.startswith("| n0")}
    assert set(lines) == {p.pair for p in planted}
    header = [c.strip() for c in next(line for line in section.splitlines() if line.startswith("| pair")).strip(
        "|").split("|")]
    levels = [f"tau_bias_at_{h[len('bias = '):]}" for h in header if h.startswith("bias = ")]
    assert levels == ["tau_bias_at_0.05", "tau_bias_at_0.1"]  # eval.bias_levels' default
    for p in planted:
        a, b = rows[p.run_a.name], rows[p.run_b.name]
        cells = dict(zip(header, (c.strip() for c in lines[p.pair].strip("|").split("|"))))
        assert [cells[h] for h in ("pair", "N", "W", "seed")] == [p.pair, str(p.run_a.n), "8", "0"]
        assert [cells[h] for h in header[4:]] == (
            [estimate_text(a, "tau_bias")] + [estimate_text(a, k) for k in levels]
            + [estimate_text(m, k) for k in ("tau_gen", "tau_gap", "tau_mem") for m in (a, b)]
            + [cells["tau_bias < tau_mem"], str(a["pair_evals"])])
        assert header[4:] == ["tau_bias", "bias = 0.05", "bias = 0.1", "tau_gen (block 0)", "tau_gen (block 1)",
                              "tau_gap (block 0)", "tau_gap (block 1)", "tau_mem (block 0)", "tau_mem (block 1)",
                              "tau_bias < tau_mem", "paired evaluations"]
        if p.tau_bias is None:  # never biased in 1e5 steps: a lower bound above tau_mem = 51 200
            assert cells["tau_bias"].startswith("> ") and cells["tau_bias < tau_mem"] == "no"
        else:  # planted 20 N, well before 100 N
            assert a["tau_bias_lo"] < p.tau_bias <= a["tau_bias_hi"] and cells["tau_bias < tau_mem"] == "yes"
    law = load_fits(root)["tau_bias_vs_n"].all_runs
    assert "`tau_bias_vs_n` | width = 8" in section  # only two measured N: a law without an interval
    assert f"{law.exponent:.3f}" in section
    assert "![pairs](figures/pairs.png)" in section and (root / "figures" / "pairs.png").is_file()
    unresolved = text.split("## What the analysis could not resolve")[1]
    assert (f"- censored: pair `n00512_w08_s0` tau_bias {estimate_text(rows['n00512_w08_s0'], 'tau_bias')} steps "
            "(a lower bound: the bias is not established at the last paired evaluation)") in unresolved
    assert "figure skipped: pairs" not in unresolved


@pytest.mark.e2e
def test_no_split_pairs_section_without_pairs(experiment):
    _, _, text = experiment
    assert "## Split pairs" not in text
    assert "- figure skipped: pairs: no pairs.jsonl" in text.split("## What the analysis could not resolve")[1]


def test_bias_before_mem_reads_the_intervals_and_bounds():
    from diffmem.analysis.report import bias_before_mem

    def row(key, value, lo=None, hi=None, censored=False):
        return {key: value, f"{key}_lo": lo, f"{key}_hi": hi, f"{key}_censored": censored}

    mem = [row("tau_mem", 1000, 900, 1100), row("tau_mem", 1200, 1100, 1300)]
    assert bias_before_mem(row("tau_bias", 300, 250, 350), mem) == "yes"
    assert bias_before_mem(row("tau_bias", 1150, 1120, 1180), mem) == "no"  # after the first member's onset
    assert bias_before_mem(row("tau_bias", 950, 850, 1050), mem) == "undecided (intervals overlap)"
    assert bias_before_mem(row("tau_bias", 200, None, 200, censored=True), mem) == "yes"  # upper bound
    assert bias_before_mem(row("tau_bias", 5000, None, None, censored=True), mem) == "no"  # lower bound, later
    assert bias_before_mem(row("tau_bias", None), mem) == "-"


def test_every_committed_verdict_reads_the_same_in_fits_json_report_md_and_the_readme():
    """For every committed experiment with lag laws: each law's verdict (fits.json calibration.laws) is the one its
    row of report.md shows, and a line of the README that names the law (in backticks) and gives a verdict gives
    that one."""
    import json
    import re
    from pathlib import Path

    phrases = ("constant lag", "not resolved", "lag changes with")
    checked = 0
    for fits_path in sorted((Path(__file__).parents[1] / "results").glob("*/fits.json")):
        laws = json.loads(fits_path.read_text()).get("calibration", {}).get("laws", [])
        if not laws:
            continue
        report = (fits_path.parent / "report.md").read_text()
        readme = (fits_path.parent / "README.md").read_text().splitlines()
        verdicts: dict[str, set[str]] = {}
        for law in laws:
            row = [line for line in report.splitlines() if line.startswith(f"| `{law['law']}` | {law['runs']} |")]
            assert len(row) == 1 and f"| {law['verdict']} |" in row[0], (fits_path, law["law"], law["runs"])
            verdicts.setdefault(law["law"], set()).add(law["verdict"])
            checked += 1
        for line in readme:
            named = [name for name in re.findall(r"`([a-z_0-9.]+_vs_n)`", line) if name in verdicts]
            if named and any(p in line for p in phrases):
                for name in named:
                    assert any(v in line for v in verdicts[name]), (fits_path.parent.name, name, line)
    assert checked > 0
