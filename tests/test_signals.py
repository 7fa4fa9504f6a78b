"""Sampling-free signals (diffmem.analysis.signals): tau_gap per noise level, the level that opens first, tau_auc, the
lags to tau_mem with their intervals, the lag laws, the report section and the figures, on planted experiment folders
whose opening steps are known; folders without the keys analyze as before."""
from __future__ import annotations

import json
import math

import matplotlib as mpl
import numpy as np
import pytest
from scipy import stats

from diffmem.analysis import analyze
from diffmem.analysis.report import report_text
from diffmem.analysis.runfiles import read_csv, read_run
from diffmem.analysis.signals import (CONSTANT_LAG_MAX_WIDTH, SIGNAL_COLUMNS, LevelSignal, first_gap, lag, lag_name,
                                      run_signals, signal_estimate, verdict)
from diffmem.analysis.gap_sizes import crossing_name, gap_size_columns, minimum_name, relative_gap, run_gap_sizes
from diffmem.analysis.synthetic import evaluation_steps, write_synthetic_experiment, write_synthetic_run
from diffmem.analysis.timescales import Estimate, estimate_run
from diffmem.figures import load_experiment_files
from diffmem.figures.checks import figure_problems
from diffmem.figures.signals import plot_signals
from diffmem.figures.style import STYLE, FigureOutput

LOSS_TS = (0.01, 0.1, 1.0)


def neighbours(steps, planted: float) -> tuple[float, float]:
    """The evaluated steps just before (at or below) and just after the planted step."""
    steps = [float(s) for s in steps]
    return max(s for s in steps if s <= planted), min(s for s in steps if s > planted)


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_run")
    planted = write_synthetic_run(root / "r", n=64, width=8, steps=20_000, tau_gen=500, tau_mem=6000, n_evals=30,
                                  loss_ts=LOSS_TS, gap_at_t=(3000.0, 800.0, None), tau_auc=1500.0)
    record = read_run(planted.path)
    estimates = estimate_run(record.evaluations, record.mem_levels)
    return record, run_signals(record.evaluations, estimates), estimates


def test_tau_gap_per_level_is_bracketed_by_the_evaluations_around_the_planted_step(one_run):
    record, signals, _ = one_run
    steps = evaluation_steps(20_000, 30)
    assert [lv.t for lv in signals.levels] == list(LOSS_TS)
    for lv, planted in zip(signals.levels[:2], (3000.0, 800.0)):
        assert (lv.tau_gap.lo, lv.tau_gap.hi) == neighbours(steps, planted)
        assert lv.tau_gap.measured and lv.tau_gap.lo <= lv.tau_gap.value <= lv.tau_gap.hi
        assert (lv.tau_auc.lo, lv.tau_auc.hi) == neighbours(steps, planted)  # the level's AUC opens with its gap
    never = signals.levels[2]
    assert never.tau_gap.censored and never.tau_gap.hi is None and never.tau_gap.value == steps[-1]
    assert never.tau_auc.censored and never.tau_auc.hi is None


def test_the_first_gap_is_the_planted_earliest_level_and_tau_auc_its_bracket(one_run):
    _, signals, estimates = one_run
    assert signals.first_t == 0.1
    assert signals.tau_gap_first.value == signals.levels[1].tau_gap.value
    assert (signals.tau_auc.lo, signals.tau_auc.hi) == neighbours(evaluation_steps(20_000, 30), 1500.0)
    assert signals.tau_auc == estimates["tau_auc"]
    assert signals.tau_auc.value == pytest.approx(math.sqrt(signals.tau_auc.lo * signals.tau_auc.hi))
    mem = estimates["tau_mem"]
    auc_lag = signals.lags["auc_lag"]
    assert auc_lag.value == pytest.approx(mem.value / signals.tau_auc.value)
    assert auc_lag.lo == pytest.approx(mem.lo / signals.tau_auc.hi)
    assert auc_lag.hi == pytest.approx(mem.hi / signals.tau_auc.lo)
    assert set(signals.lags) == {lag_name(s, r) for s in ("tau_gap", "tau_gap_first", "tau_auc")
                                 for r in ("tau_mem", "tau_mem_at_0.01", "tau_mem_at_0.1")}


def test_first_gap_prefers_a_gap_open_from_the_start_and_else_bounds():
    def est(value, lo, hi, censored):
        return Estimate(value, lo, hi, censored, "planted")
    measured = LevelSignal(0.01, est(500.0, 400.0, 600.0, False), est(None, None, None, False))
    early = LevelSignal(1.0, est(10.0, None, 10.0, True), est(None, None, None, False))
    never = LevelSignal(0.1, est(900.0, 900.0, None, True), est(None, None, None, False))
    assert first_gap([measured, never])[1] == 0.01
    first, t = first_gap([measured, early, never])
    assert t == 1.0 and first.censored and first.lo is None and first.hi == 10.0
    first, t = first_gap([never])
    assert t is None and first.censored and first.value == 900.0 and first.hi is None


def test_lag_intervals_and_bounds():
    mem = Estimate(1000.0, 800.0, 1200.0, False, "")
    sig = Estimate(100.0, 50.0, 200.0, False, "")
    both = lag(mem, sig)
    assert (both.value, both.lo, both.hi, both.censored) == (10.0, 4.0, 24.0, False)
    never_memorized = lag(Estimate(5000.0, 5000.0, None, True, ""), sig)  # tau_mem a lower bound
    assert never_memorized.censored and never_memorized.value == never_memorized.lo == 25.0
    assert never_memorized.hi is None
    never_signalled = lag(mem, Estimate(5000.0, 5000.0, None, True, ""))  # the signal a lower bound
    assert never_signalled.censored and never_signalled.hi == never_signalled.value == pytest.approx(0.24)
    opposite = lag(Estimate(5000.0, 5000.0, None, True, ""), Estimate(5000.0, 5000.0, None, True, ""))
    assert opposite.value is None and opposite.censored


def planted_experiment(root, auc_of_n, seeds=(0, 1)):
    return write_synthetic_experiment(
        root, [64, 128, 256, 512], widths=[8], seeds=seeds, n_evals=40, steps=lambda n, w: 400 * n,
        tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 100.0 * n, loss_ts=LOSS_TS,
        gap_at_t=lambda n, w: (50.0 * n, 10.0 * n, None), tau_auc=lambda n, w: auc_of_n(n))


@pytest.fixture(scope="module")
def constant_lag(tmp_path_factory):
    root = tmp_path_factory.mktemp("constant_lag")
    planted_experiment(root, lambda n: 100.0 * n / 4)  # tau_auc = tau_mem / 4 at every N
    return root, analyze(root)


def test_a_constant_lag_on_a_coarse_grid_is_not_resolved(constant_lag):
    """Planted constant lag, 40 evaluations over 400 N steps: the exponent's interval holds 0 and excludes tau_mem's
    exponent, but is wider than CONSTANT_LAG_MAX_WIDTH: not resolved, saying why."""
    root, _ = constant_lag
    fits = json.loads((root / "fits.json").read_text())
    law = fits["auc_lag_vs_n"]
    assert law["exponent_lo"] <= 0 <= law["exponent_hi"]
    assert law["exponent_hi"] - law["exponent_lo"] > CONSTANT_LAG_MAX_WIDTH
    assert fits["tau_auc_vs_n"]["exponent_lo"] <= 1 <= fits["tau_auc_vs_n"]["exponent_hi"]
    (verdict,) = [v for v in fits["calibration"]["laws"] if v["law"] == "auc_lag_vs_n"]
    assert verdict["verdict"] == "not resolved" and verdict["early_warning"] is True
    assert verdict["reference_exponent"] == pytest.approx(fits["tau_mem_vs_n"]["by_width"]["8"]["exponent"])
    assert "wide" in verdict["sentence"] and "holds 0" in verdict["sentence"]
    assert "auc_lag_vs_width" not in fits  # one width: no law in W


def test_a_constant_lag_on_a_dense_grid_is_recognised(tmp_path):
    write_synthetic_experiment(
        tmp_path, [64, 128, 256, 512], widths=[8], seeds=(0, 1, 2), n_evals=160, steps=lambda n, w: 400 * n,
        tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 100.0 * n, loss_ts=LOSS_TS,
        gap_at_t=lambda n, w: (50.0 * n, 10.0 * n, None), tau_auc=lambda n, w: 25.0 * n)
    analyze(tmp_path)
    fits = json.loads((tmp_path / "fits.json").read_text())
    (verdict,) = [v for v in fits["calibration"]["laws"] if v["law"] == "auc_lag_vs_n"]
    assert verdict["exponent_hi"] - verdict["exponent_lo"] <= CONSTANT_LAG_MAX_WIDTH
    assert verdict["verdict"] == "constant lag" and "excludes tau_mem's exponent" in verdict["sentence"]


def test_a_lag_whose_interval_holds_both_zero_and_the_references_exponent_is_not_resolved():
    from diffmem.analysis.powerlaw import PowerLawFit

    fit = PowerLawFit.from_dict({"quantity": "auc_lag", "x": "n", "exponent": 0.6, "exponent_lo": -0.4,
                                 "exponent_hi": 1.6, "prefactor": 1.0, "n_runs": 3, "reason": None})
    cells = [{"geometric_mean": 3.0, "lo": 2.0, "hi": 4.0}]
    text, early, sentence = verdict(fit, cells, reference_exponent=1.1)
    assert text == "not resolved" and early is True and "own exponent 1.10" in sentence
    assert verdict(fit, cells, None)[0] == "not resolved"
    grows = PowerLawFit.from_dict({"quantity": "auc_lag", "x": "n", "exponent": 0.6, "exponent_lo": 0.1,
                                   "exponent_hi": 1.1, "prefactor": 1.0, "n_runs": 3, "reason": None})
    assert verdict(grows, cells, 1.1)[0] == "lag changes with n"


def test_cell_lags_are_the_geometric_mean_with_a_t_interval(constant_lag):
    root, _ = constant_lag
    rows = {r["run"]: r for r in read_csv(root / "summary.csv")}
    cells = json.loads((root / "fits.json").read_text())["calibration"]["cells"]
    (cell,) = [c for c in cells if c["lag"] == "gap_lag" and c["n"] == 128]
    values = np.log([rows[run]["gap_lag"] for run in cell["runs"]])
    assert cell["measured"] == 2
    assert cell["geometric_mean"] == pytest.approx(math.exp(values.mean()), rel=1e-5)  # csv: 6 digits
    half = stats.t.ppf(0.975, 1) * values.std(ddof=1) / math.sqrt(2)
    assert cell["lo"] <= math.exp(values.mean() - half) * (1 + 1e-5)
    assert cell["hi"] >= math.exp(values.mean() + half) * (1 - 1e-5)
    lo_ends = math.exp(np.mean(np.log([rows[run]["gap_lag_lo"] for run in cell["runs"]])))
    assert cell["lo"] <= lo_ends * (1 + 1e-5)


def test_a_lag_that_grows_with_n_has_the_exponent_difference(tmp_path):
    planted_experiment(tmp_path, lambda n: 100.0 * 64 * (n / 64) ** 0.5 / 4, seeds=(0,))  # tau_auc ~ N^0.5
    analyze(tmp_path)
    fits = json.loads((tmp_path / "fits.json").read_text())
    law = fits["auc_lag_vs_n"]
    assert law["exponent"] == pytest.approx(0.5, abs=0.15)
    assert law["exponent_lo"] > 0
    (verdict,) = [v for v in fits["calibration"]["laws"] if v["law"] == "auc_lag_vs_n"]
    assert verdict["verdict"] == "lag changes with n" and "grows" in verdict["sentence"]


def test_summary_columns_and_the_report_section(constant_lag):
    root, _ = constant_lag
    header = (root / "summary.csv").read_text().splitlines()[0].split(",")
    start = header.index(SIGNAL_COLUMNS[0])
    assert header[start:start + len(SIGNAL_COLUMNS)] == list(SIGNAL_COLUMNS)
    assert header[start + len(SIGNAL_COLUMNS):] == gap_size_columns((0.1, 0.3, 1.0), LOSS_TS)  # then the effect sizes
    rows = read_csv(root / "summary.csv")
    assert {r["tau_gap_first_t"] for r in rows} == {0.1}
    text = report_text(root)
    section = text[text.index("## Sampling-free signals"):]
    assert "| n00064_w08_s0 | 64 | 8 | 0 |" in section and "(t = 0.1)" in section
    assert "`auc_lag_vs_n` | width = 8" in section and "not resolved" in section
    assert "In words" in section


def test_old_folders_without_the_keys_analyze_as_before(tmp_path):
    write_synthetic_experiment(tmp_path, [64, 128, 256], widths=[8], n_evals=20, steps=lambda n, w: 400 * n,
                               tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 100.0 * n)
    summary = analyze(tmp_path)
    assert all(r.signals is None for r in summary.runs)
    header = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    assert not set(SIGNAL_COLUMNS) & set(header)
    fits = json.loads((tmp_path / "fits.json").read_text())
    assert "calibration" not in fits and not any("auc" in k or "lag" in k or "gap" in k for k in fits)
    assert "Sampling-free" not in report_text(tmp_path)
    assert plot_signals(load_experiment_files(tmp_path), FigureOutput(tmp_path)) == []


def test_the_figures_are_drawn_and_readable(constant_lag):
    root, _ = constant_lag
    out = root / "figures"
    out.mkdir(exist_ok=True)
    with mpl.rc_context(STYLE):  # as make_figures draws them
        results = {r.name: r for r in plot_signals(load_experiment_files(root), FigureOutput(out, pdf=False))}
    assert set(results) == {"signals_gap_w08", "signals_auc_w08", "signals_calibration"}
    for name, result in results.items():
        assert result.skipped is None and [p.suffix for p in result.files] == [".png"]
        assert figure_problems(result.figure, expect_intervals=name != "signals_gap_w08", name=name) == []
    # the gap map marks tau_gap(t) of each level that opened: two white circles per panel
    gap = results["signals_gap_w08"].figure
    circles = [line for ax in gap.axes for line in ax.get_lines() if line.get_marker() == "o" and line.get_xdata().size]
    assert len(circles) == 2 * 4


# --- the no-member control ------------------------------------------------------------------------------------------

def control_run(root, **control):
    planted = write_synthetic_run(root / "r", n=64, width=8, steps=20_000, tau_gen=500, tau_mem=6000, n_evals=30,
                                  loss_ts=LOSS_TS, gap_at_t=(3000.0, 800.0, None), tau_auc=1500.0, **control)
    record = read_run(planted.path)
    return run_signals(record.evaluations, estimate_run(record.evaluations, record.mem_levels))


def test_a_control_that_holds_its_null_flags_nothing_and_changes_no_signal(tmp_path, one_run):
    _, plain, _ = one_run
    signals = control_run(tmp_path, control_at_t=(None, None, None), control_auc=None)
    assert signals.control_n == 64 and signals.flags == {}
    assert all(lv.gap_control.left is None and lv.auc_control.left is None for lv in signals.levels)
    assert signals.controls["tau_auc"].left is None and signals.controls["tau_gap"].left is None
    # the same planted openings (the control's noise draws shift the noise of later lines, not the brackets)
    assert (signals.tau_gap_first.lo, signals.tau_gap_first.hi) == (plain.tau_gap_first.lo, plain.tau_gap_first.hi)
    assert (signals.tau_auc.lo, signals.tau_auc.hi) == (plain.tau_auc.lo, plain.tau_auc.hi)
    row = signals.row()
    assert row["control_n"] == 64 and row["tau_auc_flag"] == "" and row["tau_gap_control"] is None
    assert signal_estimate(signals, "auc_lag").measured  # it enters the laws


def test_a_control_that_opens_flags_its_signals_and_keeps_them_out_of_the_laws(tmp_path):
    """The control's gap at t = 0.01 (the run's loss_t) and its combined AUC open: tau_gap and tau_auc are
    flagged, their lags give no value to a law, and tau_gap_first skips the flagged level."""
    steps = evaluation_steps(20_000, 30)
    signals = control_run(tmp_path, control_at_t=(3000.0, None, None), control_auc=1500.0)
    gap_control = signals.levels[0].gap_control
    assert (gap_control.above.lo, gap_control.above.hi) == neighbours(steps, 3000.0)
    assert set(signals.flags) == {"tau_gap", "tau_auc"} and "(above)" in signals.flags["tau_auc"]
    assert signals.row()["tau_auc_control"] == signals.controls["tau_auc"].above.value
    for quantity in ("tau_auc", "auc_lag", "auc_lag_at_0.01", "gap_lag"):
        est = signal_estimate(signals, quantity)
        assert est.value is None and est.rule.startswith("flagged, left out: the control of")
    assert signals.estimates()["tau_auc"].measured  # summary.csv keeps the value, next to its flag
    assert signals.first_t == 0.1  # level 0.01's control opened; 0.1's did not
    assert signal_estimate(signals, "gap_first_lag").value is not None


def test_a_control_that_leaves_its_null_downwards_is_flagged_too(tmp_path):
    signals = control_run(tmp_path, control_at_t=(None, 800.0, None), control_auc=1500.0, control_below=True)
    assert "(below)" in signals.flags["tau_auc"] and signals.levels[1].gap_flag
    assert signals.levels[1].gap_control.above.censored  # the control is never fitted better than held out
    assert signals.first_t is None or signals.first_t != 0.1


def test_the_report_and_fits_carry_the_control_and_its_flags(tmp_path):
    write_synthetic_experiment(
        tmp_path, [64, 128, 256], widths=[8], seeds=(0,), n_evals=40, steps=lambda n, w: 400 * n,
        tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 100.0 * n, loss_ts=LOSS_TS,
        gap_at_t=lambda n, w: (50.0 * n, 10.0 * n, None), tau_auc=lambda n, w: 25.0 * n,
        control_at_t=(None, None, None), control_auc=500.0)
    analyze(tmp_path)
    fits = json.loads((tmp_path / "fits.json").read_text())
    runs = fits["calibration"]["runs"]
    assert all(set(r["flags"]) == {"tau_auc"} and r["control_n"] == r["n"] for r in runs)
    law = fits["tau_auc_vs_n"]  # every run flagged: no law, each run listed as left out with its flag
    assert law["n_runs"] == 0 and len(law["excluded"]) == 3
    assert all(e["reason"].startswith("flagged, left out: the control of tau_auc") for e in law["excluded"])
    assert fits["tau_gap_first_vs_n"]["n_runs"] == 3  # its control held: it is fitted
    rows = read_csv(tmp_path / "summary.csv")
    assert all(str(r["tau_auc_flag"]).startswith("the control of tau_auc left its null") for r in rows)
    section = report_text(tmp_path)
    assert "no-member control" in section and "left its null" in section


# --- the gap as an effect size ----------------------------------------------------------------------------------------

def planted_loss_base(s: float) -> float:
    """A loss level that falls until step 1000 and rises after it."""
    return 1.0 + 0.5 * abs(math.log(s / 1000.0))


def linear_gap_records(steps, t=0.01, slope=1e-4, control=None):
    """Evaluations at level t whose train loss is planted_loss_base and whose held-out loss is that times
    (1 + slope x step), so the relative gap is slope x step (it reaches L at L / slope), with a +-1 % interval;
    optionally the control's losses, control(step, train, held-out)."""
    out = []
    for s in steps:
        train = planted_loss_base(s)
        heldout = train * (1 + slope * s)
        line = {"step": s, "loss_ts": [t], "train_losses": [train], "test_losses": [heldout],
                "loss_gap_lo": [heldout - train - 0.01 * train], "loss_gap_hi": [heldout - train + 0.01 * train]}
        if control is not None:
            c = control(s, train, heldout)
            line |= {"control_losses": [c], "control_gap_lo": [heldout - c - 0.01 * c],
                     "control_gap_hi": [heldout - c + 0.01 * c]}
        out.append(line)
    return out


def test_the_relative_gap_and_its_interval_are_the_welch_interval_over_the_train_mean():
    keep, r, lo, hi = relative_gap([2.0, None, 4.0], [3.0, 1.0, 4.0], [0.5, 0.0, -0.4], [1.5, 0.0, 0.4])
    assert keep.tolist() == [True, False, True]
    assert np.allclose(r, [0.5, 0.0]) and np.allclose(lo, [0.25, -0.1]) and np.allclose(hi, [0.75, 0.1])


def test_gap_size_crossings_lie_in_the_brackets_of_the_planted_steps_and_do_not_move_with_other_evaluations():
    """A relative gap planted to reach each size at a known step: each crossing's interval holds it, and adding
    evaluations elsewhere (as refinements for other estimators do) leaves the crossing's value where it was."""
    from diffmem.analysis.synthetic import evaluation_steps as grid

    steps = [int(s) for s in grid(100_000, 30)]
    records = linear_gap_records(steps)
    sizes = run_gap_sizes(records, (0.1, 0.3, 1.0))
    for size in (0.1, 0.3, 1.0):
        est = sizes.estimates[crossing_name(size, 0.01)]
        assert est.measured and est.lo <= size / 1e-4 <= est.hi
    denser = sorted(set(steps) | {7, 11, 13})  # three evaluations placed far from the crossings
    again = run_gap_sizes(linear_gap_records(denser), (0.1, 0.3, 1.0))
    assert again.estimates[crossing_name(0.3, 0.01)].value == pytest.approx(
        sizes.estimates[crossing_name(0.3, 0.01)].value)
    fine = np.geomspace(1, 100_000, 200_001)
    truth = fine[np.argmin([planted_loss_base(v) * (1 + 1e-4 * v) for v in fine])]
    minimum = sizes.estimates[minimum_name(0.01)]
    assert minimum.lo <= truth <= minimum.hi and not minimum.censored


def test_a_gap_size_crossing_whose_control_reaches_it_is_flagged():
    from diffmem.analysis.synthetic import evaluation_steps as grid

    steps = [int(s) for s in grid(100_000, 30)]
    held = run_gap_sizes(linear_gap_records(steps, control=lambda s, train, heldout: heldout), (0.3,))
    assert held.flags == {} and held.controls[crossing_name(0.3, 0.01)] is not None
    fitted = run_gap_sizes(linear_gap_records(steps, control=lambda s, train, heldout: train), (0.3,))  # as members
    assert crossing_name(0.3, 0.01) in fitted.flags
    assert fitted.estimate(crossing_name(0.3, 0.01)).value is None
    assert fitted.row()[f"{crossing_name(0.3, 0.01)}_flag"].startswith("the control of")


def test_the_gap_is_largest_at_another_level_in_x0_units_than_in_epsilon_units():
    """Epsilon-unit gaps 1.0 at t = 0.01 and 0.1 at t = 0.4: in x0 units (x (e^{2t} - 1)) 0.0202 against 0.1226."""
    record = {"step": 10, "loss_ts": [0.01, 0.4], "train_losses": [1.0, 1.0], "test_losses": [2.0, 1.1],
              "loss_gap_lo": [0.9, 0.0], "loss_gap_hi": [1.1, 0.2]}
    sizes = run_gap_sizes([record], (0.1,))
    assert (sizes.eps_peak_t, sizes.x0_peak_t) == (0.01, 0.4)


def test_tau_gaps_bracket_says_whether_it_lies_on_the_grid_or_on_a_refinement():
    from diffmem.analysis.gap_sizes import bracket_source

    est = Estimate(150.0, 100.0, 200.0, False, "planted")
    assert bracket_source(est, {1, 100, 200}) == "grid"
    assert bracket_source(est, {1, 100, 400}) == "refinement"
    assert bracket_source(Estimate(100.0, 100.0, None, True, "bound"), {100}) is None
    assert bracket_source(est, None) is None


def test_the_effect_size_laws_are_fitted_over_n(constant_lag):
    root, _ = constant_lag
    fits = json.loads((root / "fits.json").read_text())
    assert f"{crossing_name(0.1, 0.1)}_vs_n" in fits and f"{minimum_name(0.01)}_vs_n" in fits
    rows = read_csv(root / "summary.csv")
    assert all(crossing_name(0.3, 0.1) in r for r in rows)
