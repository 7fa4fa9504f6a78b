"""Figures from files on disk: every figure is written (PNG + PDF, non-empty) or skipped with a reason, and every
figure drawn passes the mechanical readability checks of diffmem.figures.checks."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from diffmem.figures import PlotError, load_experiment_files, make_figures
from diffmem.figures.checks import INTERVAL_GID, figure_problems
from diffmem.figures.curves import CELL_MEAN_STYLE, SEED_STYLE, mean_over_seeds
from diffmem.figures.gallery import gallery_steps, grid_steps, usable_timescales
from diffmem.figures.laws import plot_width
from diffmem.figures.loss_gap import plot_loss_gap
from diffmem.figures.phase import classify_phase, f_mem_at, memorizing_at
from diffmem.figures.style import FigureOutput
from diffmem.figures.window import plot_window, quality_label
from diffmem.analysis import analyze
from diffmem.results import write_results
from diffmem.analysis.runfiles import read_csv
from diffmem.analysis.synthetic import write_synthetic_experiment, write_synthetic_pairs, write_synthetic_run

pytestmark = pytest.mark.xdist_group("figures")
"""One worker runs this module, so that each module-scoped fixture (an experiment analyzed on disk) is built
once rather than once per worker (pytest-xdist, ``--dist loadgroup`` in pyproject.toml)."""

ALL_FIGURES = {"window_w08", "window_w32", "collapse", "scaling", "width", "phase", "loss_gap"}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Two widths, three N, one seed, plus a run that never memorizes; analyzed with figures."""
    root = tmp_path_factory.mktemp("plots")
    write_synthetic_experiment(root, [128, 512, 2048], widths=[8, 32], steps=1_000_000, n_evals=24)
    write_synthetic_run(root / "n04096_w32_s0", n=4096, width=32, steps=200_000, tau_gen=1e5, tau_mem=None,
                        n_evals=20)
    return root, write_results(root)


@pytest.mark.e2e
def test_every_figure_is_written_as_png_and_pdf(experiment):
    root, summary = experiment
    results = {r.name: r for r in summary.figures if r.name not in ("gallery", "pairs")}  # see their own tests
    assert set(results) == ALL_FIGURES
    for result in results.values():
        assert result.skipped is None, result
        assert [p.suffix for p in result.files] == [".png", ".pdf"]
        for path in result.files:
            assert path.parent == root / "figures" and path.stat().st_size > 5000
        assert result.files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert result.files[1].read_bytes()[:5] == b"%PDF-"
    assert "figure scaling" in summary.format()


@pytest.mark.e2e
def test_figures_without_data_are_skipped_with_a_reason(tmp_path):
    write_synthetic_experiment(tmp_path, [64, 256], widths=[16], steps=50_000, n_evals=12, record_fid=False,
                               record_losses=False, tau_gen=lambda n, w: 2e3, tau_mem=lambda n, w: 30.0 * n)
    analyze(tmp_path)
    data = load_experiment_files(tmp_path)
    (tmp_path / "figures").mkdir()
    out = FigureOutput(tmp_path / "figures")
    width = plot_width(data, out)
    assert width.skipped and "one width" in width.skipped and not width.files
    loss = plot_loss_gap(data, out)
    assert loss.skipped and "loss" in loss.skipped
    window = plot_window(data, 16, out)  # f_mem only: still drawn
    assert window.skipped is None and all(p.stat().st_size > 0 for p in window.files)


def test_quality_axis_label_names_the_extractor(tmp_path):
    run = write_synthetic_run(tmp_path / "r", n=32, width=8, steps=1000, tau_gen=100, tau_mem=300, n_evals=8,
                              fid_extractor="diffmem-randconv-v1")
    inception = write_synthetic_run(tmp_path / "s", n=32, width=8, steps=1000, tau_gen=100, tau_mem=300, n_evals=8)
    from diffmem.analysis.runfiles import read_run

    assert quality_label([read_run(run.path)]) == "FD (diffmem-randconv-v1)"
    assert quality_label([read_run(inception.path)]) == "FID"
    assert "mixed" in quality_label([read_run(run.path), read_run(inception.path)])


@pytest.mark.e2e
def test_phase_classification_and_interpolation(experiment):
    root, _ = experiment
    from diffmem.analysis.runfiles import read_run

    record = read_run(root / "n00128_w32_s0")
    assert f_mem_at(record, 1.0) == record.series("f_mem")[0]
    assert f_mem_at(record, 1e9) is None
    assert f_mem_at(record, 9e5) > 0.5  # planted tau_mem = 300 * 128
    # classify_phase(tau, last_step, memorizing, tau_gen, tau_gen_is_bound)
    assert classify_phase(10, None, False, 5) == "not trained that long"
    assert classify_phase(20, 15, True, 5) == "not trained that long"
    assert classify_phase(10, 15, True, 5) == "memorizing"
    assert classify_phase(10, 15, False, 5) == "generalizing"
    assert classify_phase(1, 15, False, 5) == "learning (before tau_gen)"
    assert classify_phase(1, 15, False, None) == "not memorizing (tau_gen unconfirmed)"
    assert classify_phase(10, 15, False, 5, tau_gen_is_bound=True) == "not memorizing (tau_gen unconfirmed)"
    # memorizing by tau_mem's rule (the default) or by an f_mem threshold
    data = load_experiment_files(root)
    (row,) = [r for r in data.rows if r["run"] == "n00128_w32_s0"]
    assert not memorizing_at(data, [row], row["tau_mem"] * 0.9)
    assert memorizing_at(data, [row], row["tau_mem"] * 1.1)
    assert memorizing_at(data, [row], 9e5, threshold=0.5)
    assert not memorizing_at(data, [row], 1.0, threshold=0.01)
    (never,) = [r for r in data.rows if r["run"] == "n04096_w32_s0"]
    assert not memorizing_at(data, [never], 1e9)


def test_figures_need_the_summary(tmp_path):
    write_synthetic_run(tmp_path / "r", n=32, width=8, steps=1000, tau_gen=100, tau_mem=300, n_evals=8)
    with pytest.raises(PlotError, match="diffmem analyze"):
        make_figures(tmp_path)


# --- mechanical checks of every figure (issue #29, item 5) ----------------------------------------------------------

WITH_INTERVALS = ("window", "collapse", "scaling", "width", "pairs")
"""Figures whose data has intervals in the synthetic experiments (f_mem_lo/hi per evaluation, tau_*_lo/hi)."""


@pytest.fixture(scope="module")
def n_sweep(tmp_path_factory):
    """One width, four N within a decade, three seeds (as results/cpu_digits, with seeds): the N ticks of a log axis
    are minor; the window and collapse figures draw each seed thin and the cell mean bold."""
    root = tmp_path_factory.mktemp("n_sweep")
    write_synthetic_experiment(root, [16, 32, 64, 128], widths=[8], seeds=[0, 1, 2], n_evals=24,
                               steps=lambda n, w: max(5000, 250 * n), tau_gen=lambda n, w: 700 * (n / 16) ** -0.15,
                               tau_mem=lambda n, w: 80.0 * n, fid_extractor="diffmem-pixels")
    return root, write_results(root, pdf=False)


@pytest.fixture(scope="module")
def width_sweep(tmp_path_factory):
    """One N, three widths (as results/cpu_digits_width): values within a decade on log y axes; the longest quality
    label, "FD (diffmem-randconv-v1)" (as results/demo_faces_0.1), must fit the window figure's panel."""
    root = tmp_path_factory.mktemp("width_sweep")
    write_synthetic_experiment(root, [32], widths=[8, 16, 32], n_evals=23, steps=8000,
                               fid_extractor="diffmem-randconv-v1",
                               tau_gen=lambda n, w: 1600.0 * 8 / w, tau_mem=lambda n, w: 1800.0 * (8 / w) ** 0.3)
    return root, write_results(root, pdf=False)


@pytest.fixture(scope="module")
def pair_experiment(tmp_path_factory):
    """One width, N = 16, 64 and 256 with two seeds, every run with its split-1 twin and planted pairs.jsonl:
    tau_bias = 20 N (before tau_mem = 80 N), except N = 256, whose bias is never established (censored)."""
    root = tmp_path_factory.mktemp("pairs")
    planted = write_synthetic_experiment(root, [16, 64, 256], widths=[8], seeds=[0, 1], n_evals=24,
                                         steps=lambda n, w: max(5000, 300 * n), tau_gen=lambda n, w: 700.0,
                                         tau_mem=lambda n, w: 80.0 * n)
    pairs = write_synthetic_pairs(root, planted, tau_bias=lambda n, w: None if n == 256 else 20.0 * n, n_evals=24)
    return root, write_results(root, pdf=False), pairs


@pytest.mark.e2e
@pytest.mark.parametrize("which", ["experiment", "n_sweep", "width_sweep", "pair_experiment"])
def test_every_figure_drawn_passes_the_mechanical_checks(which, request):
    """No overlapping tick labels, >= 2 labelled ticks per log axis, a label on every axis with ticks, no label cut
    off, intervals drawn where the data has them; the Figure kept in FigureResult is the one written."""
    root, summary = request.getfixturevalue(which)[:2]
    drawn = [r for r in summary.figures if r.skipped is None]
    assert drawn
    problems = []
    for result in drawn:
        assert result.figure is not None and result.files
        problems += figure_problems(result.figure, name=result.name,
                                    expect_intervals=result.name.startswith(WITH_INTERVALS))
    assert problems == []


@pytest.mark.e2e
def test_the_committed_reference_experiment_drawn_by_todays_code_passes_the_mechanical_checks(tmp_path):
    """Real curves, not planted ones: results/cpu_digits_2 (4 N, 3 widths, 3 seeds, galleries) copied and drawn
    again; every figure that its data supports is drawn, and none has a readability problem."""
    source = Path(__file__).resolve().parents[1] / "results" / "cpu_digits_2"
    root = tmp_path / source.name
    shutil.copytree(source, root, ignore=shutil.ignore_patterns("figures", "checkpoints", "*.pt"))
    drawn = make_figures(root, pdf=False)
    assert {r.name for r in drawn if r.skipped} == {"pairs"}
    problems = []
    for result in drawn:
        if result.skipped is None:
            problems += figure_problems(result.figure, name=result.name,
                                        expect_intervals=result.name.startswith(WITH_INTERVALS))
    assert problems == []


@pytest.mark.e2e
def test_figures_a_single_n_or_width_cannot_support_are_skipped_in_one_line(n_sweep, width_sweep):
    _, by_n = n_sweep
    _, by_width = width_sweep
    others = ("gallery", "pairs")  # no sample grids, no split pairs: see their own tests
    skipped_n = {r.name: r.skipped for r in by_n.figures if r.skipped and r.name not in others}
    skipped_w = {r.name: r.skipped for r in by_width.figures if r.skipped and r.name not in others}
    assert set(skipped_n) == {"width"} and "one width" in skipped_n["width"]
    assert {"scaling", "collapse"} <= set(skipped_w)
    assert all("one N" in skipped_w[k] for k in ("scaling", "collapse"))
    for reason in list(skipped_n.values()) + list(skipped_w.values()):
        assert "\n" not in reason
    assert "skipped scaling: " in by_width.format()


def _axes():
    fig = Figure(figsize=(3.4, 2.6), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def test_the_checks_find_what_they_look_for():
    """Each check fires on a figure made to fail it and stays quiet on a clean one."""
    fig, ax = _axes()
    ax.plot([1, 2], [1, 2])
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    assert figure_problems(fig) == []
    assert figure_problems(fig, expect_intervals=True) == ["figure: its data has intervals but none is drawn"]
    band = ax.fill_between([1, 2], [0.5, 1.5], [1.5, 2.5])
    band.set_gid(INTERVAL_GID)
    assert figure_problems(fig, expect_intervals=True) == []

    ax.set_xticks([1.0, 1.02], ["a long label", "another long label"])
    assert any("overlap" in p for p in figure_problems(fig))

    fig, ax = _axes()
    ax.plot([20, 80], [1, 2])
    ax.set_xscale("log")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_xlim(15, 95)
    ax.set_xticks([50], ["50"])
    ax.xaxis.set_minor_formatter("")
    assert any("1 labelled tick" in p for p in figure_problems(fig))

    fig, ax = _axes()
    ax.plot([1, 2], [1, 2])
    ax.set_ylabel("y")
    assert any("x axis shows ticks" in p and "no label" in p for p in figure_problems(fig))
    ax.set_xlabel("x")
    ax.set_ylabel("a y label far too long for a figure 2.6 inches high, so that both of its ends are cut off")
    assert any("cut off" in p for p in figure_problems(fig))

    fig, ax = _axes()
    ax.plot([1, 2], [1, 2], label=r"before $\tau_\mathrm{gen}$, $f_mem$ as mathematics")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend()
    assert figure_problems(fig) == []
    ax.legend(handles=ax.lines, labels=["learning (before tau_gen)"])
    assert figure_problems(fig) == ["figure: 'learning (before tau_gen)' writes tau_gen in plain letters, "
                                    "not as mathematics"]


# --- seeds: each seed thin, the cell mean bold (issue #29, item 3) --------------------------------------------------

def test_mean_over_seeds_is_the_mean_with_its_t_interval(tmp_path):
    """Three planted seeds of one cell: the mean curve at the shared steps is the arithmetic mean of the recorded
    f_mem values and its band the 95 % Student-t interval (t(0.975, 2) = 4.303) of that mean."""
    from scipy import stats

    from diffmem.analysis.runfiles import read_run

    runs = write_synthetic_experiment(tmp_path, [64], widths=[8], seeds=[0, 1, 2], steps=20_000, n_evals=16,
                                      tau_gen=lambda n, w: 500.0, tau_mem=lambda n, w: 2000.0)
    records = [read_run(r.path) for r in runs]
    cell = mean_over_seeds(records, "f_mem")
    values = np.array([rec.series("f_mem") for rec in records])
    assert cell.seeds == 3
    assert np.array_equal(cell.steps, records[0].steps)  # the seeds share their evaluation steps
    assert np.allclose(cell.mean, values.mean(axis=0))
    half = stats.t.ppf(0.975, 2) * values.std(axis=0, ddof=1) / np.sqrt(3)
    assert np.allclose(cell.hi - cell.mean, half) and np.allclose(cell.mean - cell.lo, half)
    assert (half[-3:] > 0).all() and (half[:3] == 0).all()  # seeds differ once they copy, agree at 0 before
    single = mean_over_seeds(records[:1], "f_mem")
    assert single.seeds == 1 and single.lo is None and np.allclose(single.mean, values[0])


@pytest.mark.e2e
def test_seeded_cells_draw_each_seed_thin_and_the_mean_bold(n_sweep):
    """In the window and collapse figures of the 3-seed N sweep every cell has 3 thin seed curves and one bold mean
    whose y data is the mean of the seeds' f_mem; the band over seeds is marked as an interval."""
    root, summary = n_sweep
    figures = {r.name: r.figure for r in summary.figures if r.figure is not None}
    data = load_experiment_files(root)
    for name, axes_index in (("window_w08", 1), ("collapse", 0)):
        ax = figures[name].axes[axes_index]
        thin = [ln for ln in ax.get_lines() if ln.get_linewidth() == SEED_STYLE["lw"]]
        bold = [ln for ln in ax.get_lines() if ln.get_linewidth() == CELL_MEAN_STYLE["lw"]]
        assert len(thin) == 4 * 3 and len(bold) == 4, name
        for n, line in zip(sorted(data.ns), bold):
            records = [data.records[r["run"]] for r in data.rows if r["n"] == n]
            expected = np.mean([rec.series("f_mem") for rec in records], axis=0)
            assert np.allclose(line.get_ydata(), expected), (name, n)
        assert any(c.get_gid() == INTERVAL_GID for c in ax.collections)


# --- memorization gallery (issue #29, item 2) -----------------------------------------------------------------------

def test_gallery_steps_pick_one_grid_per_phase():
    """Known answers on a planted list of grid steps: before tau_gen the grid nearest the log-middle of [first grid,
    tau_gen_lo], inside the window the one nearest sqrt(tau_gen * tau_mem), after tau_mem the last grid."""
    steps = [1, 10, 100, 300, 1000, 2000, 4000, 8000, 16000]
    row = {"tau_gen": 900.0, "tau_gen_lo": 400.0, "tau_gen_hi": 1000.0, "tau_mem": 9000.0, "tau_mem_lo": 8000.0,
           "tau_mem_hi": 16000.0}
    # log-middle of [1, 400] is 20 -> 10; of [900, 9000] is 2846 -> 4000 (|ln 4000/2846| = 0.340 < |ln 2000/2846|)
    assert gallery_steps(steps, row) == {"before tau_gen": 10, "inside the window": 4000,
                                               "after tau_mem": 16000}
    assert gallery_steps(steps[:-1], row)["after tau_mem"] is None  # last grid 8000 < tau_mem_hi
    empty = {**row, "tau_mem": 800.0, "tau_mem_hi": 1000.0}
    assert gallery_steps(steps, empty)["inside the window"] is None  # tau_mem <= tau_gen: no window
    assert usable_timescales(row) is None
    assert "censored" in usable_timescales({**row, "tau_mem_censored": True, "tau_mem_hi": None})
    assert usable_timescales({**row, "tau_gen": None}) == "no tau_gen"


@pytest.fixture(scope="module")
def gallery_experiment(tmp_path_factory):
    """One width, N = 64 and 256 with two seeds each and stored sample grids; the seed 0 of N = 256 lost its grids;
    N = 1024 never memorizes (tau_mem censored)."""
    import shutil

    root = tmp_path_factory.mktemp("gallery")
    write_synthetic_experiment(root, [64, 256], widths=[8], seeds=[0, 1], steps=50_000, n_evals=20,
                               tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 60.0 * n, sample_grids=True)
    write_synthetic_run(root / "n01024_w08_s0", n=1024, width=8, steps=50_000, tau_gen=2000.0, tau_mem=None,
                        n_evals=20, sample_grids=True)
    shutil.rmtree(root / "n00256_w08_s0" / "samples")
    return root, write_results(root, pdf=False)


def _red_frames(image: np.ndarray, size: int) -> int:
    """Tiles of a stored sample grid (diffmem.samplegrid layout, S = ``size``) whose frame is red."""
    step = size + 3  # a tile of S + 2 and 1 pixel of padding
    count = 0
    for y in range(1, image.shape[0] - 1, step):
        for x in range(1, image.shape[1] - 1, step):
            r, g, b = image[y, x, :3]
            count += bool(r > 0.9 and g < 0.2 and b < 0.2)
    return count


@pytest.mark.e2e
def test_gallery_shows_the_stored_grids_before_inside_and_after(gallery_experiment):
    import matplotlib.image

    root, summary = gallery_experiment
    results = {r.name: r for r in summary.figures if r.name.startswith("gallery")}
    assert set(results) == {"gallery_n00064_w08", "gallery_n00256_w08", "gallery_n01024_w08"}
    never = results["gallery_n01024_w08"]
    assert never.skipped and "tau_mem is censored" in never.skipped and "\n" not in never.skipped
    assert "skipped gallery_n01024_w08: " in summary.format()
    data = load_experiment_files(root)
    for name, run in (("gallery_n00064_w08", "n00064_w08_s0"), ("gallery_n00256_w08", "n00256_w08_s1")):
        result = results[name]
        assert result.skipped is None and [p.name for p in result.files] == [f"{name}.png"]
        assert figure_problems(result.figure, name=name) == []
        assert run in result.figure.get_suptitle()  # N = 256's seed 0 has no grids: seed 1 is shown
        (row,) = [r for r in data.rows if r["run"] == run]
        record = data.records[run]
        chosen = gallery_steps(grid_steps(record), row)
        assert chosen["before tau_gen"] < row["tau_gen"] <= chosen["inside the window"] <= row["tau_mem"]
        assert chosen["after tau_mem"] == record.steps[-1]
        for ax, (phase, step) in zip(result.figure.axes, chosen.items()):
            (shown,) = ax.get_images()
            stored = matplotlib.image.imread(root / run / "samples" / f"step_{step:09d}.png")
            scale = shown.get_array().shape[1] // stored.shape[1]
            assert scale >= 2 and shown.get_interpolation() == "nearest"
            assert np.array_equal(shown.get_array(), np.repeat(np.repeat(stored, scale, 0), scale, 1))
            evaluation = next(e for e in record.evaluations if e["step"] == step)
            assert f"step {step}" in ax.get_title(loc="left")
            assert f"= {evaluation['f_mem']:.3g}" in ax.get_title(loc="left")
            copies = _red_frames(stored, size=32)
            assert (copies > 0) == (phase == "after tau_mem"), (phase, copies)  # planted f_mem is 0 before tau_mem


@pytest.mark.e2e
def test_no_gallery_without_stored_grids(experiment):
    _, summary = experiment
    (gallery,) = [r for r in summary.figures if r.name.startswith("gallery")]
    assert gallery.name == "gallery" and "no run has stored sample grids" in gallery.skipped


# --- split pairs (issue #30) ------------------------------------------------------------------------------------------

def _markers(ax, marker: str) -> list:
    return [ln for ln in ax.get_lines() if ln.get_marker() == marker]


@pytest.mark.e2e
def test_pairs_figure_marks_tau_bias_and_the_members_timescales(pair_experiment):
    """The pairs figure: bias, pair distance and own fraction of every pair with their bands; each measured pair's
    tau_bias (whose bracket holds the planted 20 N) as a diamond on its bias curve with its bracket as a marked
    whisker, the censored N = 256 pairs as open triangles pointing right (a lower bound), and the members'
    tau_gen (squares) and tau_mem (triangles) on the same curves."""
    root, summary, planted = pair_experiment
    (result,) = [r for r in summary.figures if r.name == "pairs"]
    assert result.skipped is None and [p.suffix for p in result.files] == [".png"]
    rows = {r["run"]: r for r in read_csv(root / "summary.csv")}
    bias_ax, distance_ax, own_ax = result.figure.axes[:3]
    assert bias_ax.get_xscale() == "log" and "bias" in bias_ax.get_ylabel()
    assert "pair distance" in distance_ax.get_ylabel() and "own fraction" in own_ax.get_ylabel()
    assert any(np.allclose(ln.get_ydata(), 0.0) for ln in bias_ax.get_lines())  # the line at 0
    assert any(np.allclose(ln.get_ydata(), 0.5) for ln in own_ax.get_lines())  # no preference
    for ax in (bias_ax, distance_ax, own_ax):
        assert any(c.get_gid() == INTERVAL_GID for c in ax.collections)
    diamonds = {float(ln.get_xdata()[0]) for ln in _markers(bias_ax, "D")}
    bounds = {float(ln.get_xdata()[0]) for ln in _markers(bias_ax, ">")}
    for pair in planted:
        row = rows[pair.pair]
        if pair.tau_bias is None:
            assert row["tau_bias_censored"] and row["tau_bias"] in bounds
        else:
            assert row["tau_bias_lo"] < pair.tau_bias <= row["tau_bias_hi"]
            assert row["tau_bias"] in diamonds
    whiskers = [c for c in bias_ax.collections if c.get_gid() == INTERVAL_GID and isinstance(c, LineCollection)
                and all(len(seg) == 2 and seg[0][1] == seg[1][1] for seg in c.get_segments())]
    assert len(whiskers) == 4  # one horizontal bracket per measured pair
    squares = {float(ln.get_xdata()[0]) for ln in _markers(bias_ax, "s")}
    triangles = {float(ln.get_xdata()[0]) for ln in _markers(bias_ax, "^")}
    for run in rows.values():
        assert run["tau_gen"] in squares and run["tau_mem"] in triangles


@pytest.mark.e2e
def test_window_figure_shows_tau_bias_and_tau_gap_only_for_cells_with_pairs(pair_experiment, experiment):
    """The window strip of the pair experiment: a diamond at each measured cell's median tau_bias, an open triangle
    at the censored cell's bound, a circle at each cell's tau_gap; the window figure of an experiment without pairs
    has none of these and its title says nothing of them."""
    root, summary, _ = pair_experiment
    figures = {r.name: r.figure for r in summary.figures}
    strip = figures["window_w08"].axes[-1]
    rows = read_csv(root / "summary.csv")
    for i, n in enumerate((16, 64, 256)):
        cell = [r for r in rows if r["n"] == n]
        if n == 256:
            (bound,) = [ln for ln in _markers(strip, ">") if ln.get_ydata()[0] == pytest.approx(i - 0.2)]
            assert bound.get_xdata()[0] == pytest.approx(np.median([r["tau_bias"] for r in cell]))
        else:
            (diamond,) = [ln for ln in _markers(strip, "D") if ln.get_ydata()[0] == pytest.approx(i - 0.2)]
            assert diamond.get_xdata()[0] == pytest.approx(np.median([r["tau_bias"] for r in cell]))
        (gap,) = [ln for ln in _markers(strip, "o") if ln.get_ydata()[0] == pytest.approx(i + 0.2)]
        assert gap.get_xdata()[0] == pytest.approx(np.median([r["tau_gap"] for r in cell]))
    assert "tau_\\mathrm{bias}$ of the split pairs" in strip.get_title(loc="left")
    assert "only a bound" in strip.get_title(loc="left")
    _, plain = experiment
    for result in plain.figures:
        if result.name.startswith("window"):
            ax = result.figure.axes[-1]
            assert not _markers(ax, "D") and not _markers(ax, "o") and not _markers(ax, ">")
            assert "bias" not in ax.get_title(loc="left")


@pytest.mark.e2e
def test_no_pairs_figure_without_pairs_jsonl(experiment, tmp_path):
    _, summary = experiment
    (result,) = [r for r in summary.figures if r.name == "pairs"]
    assert result.skipped == "no pairs.jsonl: no split pairs (`sweep.splits = [0, 1]`, then `diffmem pairs`)"
    assert not result.files and "\n" not in result.skipped
    from diffmem.analysis.runfiles import read_figure_index

    root, _ = experiment
    (entry,) = [e for e in read_figure_index(root / "figures") if e["name"] == "pairs"]
    assert entry["skipped"] == result.skipped and not entry["files"]
