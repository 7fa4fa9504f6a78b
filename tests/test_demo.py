"""`diffmem demo`: the quick demo interrupted by Ctrl-C, then run to the end through the sweep's local executor, its
report (no machine paths, whole steps), and the advice check on the grid run's own models."""
import csv
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from diffmem.analysis.advise import advise
from diffmem.analysis.runfiles import read_metrics
from diffmem.analysis.scaling import analyze
from diffmem.analysis.synthetic import write_synthetic_experiment
from diffmem.analysis.timescales import Estimate
from diffmem.cli import main
from diffmem.config import demo_config_path, load_config
from diffmem.demo import QUICK, AdviceCheck, check_advice, report
from diffmem.experiment import PlannedRun
from diffmem.train import train
from tiny_runs import tiny_config


def _no_machine_paths(text: str, *folders) -> None:
    for folder in folders:
        assert str(folder) not in text
    assert not re.search(r"(^|[\s(])/(tmp|home|root|work|Users)/", text)


def _interrupted_quick_demo(out) -> None:
    """Start `diffmem demo --quick` in a subprocess, press Ctrl-C once its first runs are training, and check that
    it stopped with exit code 130, saying so, with state saved and some run unfinished."""
    command = [sys.executable, "-m", "diffmem.cli", "demo", "--quick", "--no-progress", "--out", str(out)]
    # A shell that starts the tests in the background (`pytest &`, nohup) leaves SIGINT ignored, and an ignored
    # signal stays ignored in children. A terminal's Ctrl-C reaches a demo that handles it: give the child the
    # default disposition (a handler set here resets to the default in the child at exec).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.time() + 120
    while not list(out.glob("*/state.pt")) and time.time() < deadline:  # the first runs are training
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; rerun the same command" in stdout, stdout + stderr[-3000:]
    started = [p for p in out.iterdir() if (p / "state.pt").exists()]
    assert started and not all((p / "done").exists() for p in started)


@pytest.mark.e2e
def test_quick_demo_survives_ctrl_c_then_runs_end_to_end_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    _interrupted_quick_demo(out)
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0  # the same command continues
    printed = capsys.readouterr().out
    _, sweep = load_config(demo_config_path())
    assert "tau_mem vs N" in printed and f"Advice for N = {max(sweep.n)}" in printed and "Check:" in printed
    assert f"files in {out}" in printed  # the folder is printed to the terminal only
    written = (out / "report.txt").read_text()
    assert written.strip() in printed
    _no_machine_paths(written, out, tmp_path)
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["n"]) for r in rows) == sorted(sweep.n), (rows, printed)
    assert all(int(r["steps"]) == QUICK["steps_per_n"] * int(r["n"]) for r in rows), (rows, printed)
    assert all(r["state"] == "done" for r in rows), rows
    for row in rows:  # the table shows each run's last step as a whole number
        assert re.search(rf"^{row['n']}\s+8\s+\d+\s+{int(row['steps'])}\s", written, re.M)
    assert (out / "fits.json").stat().st_size > 0 and str(tmp_path) not in (out / "fits.json").read_text()
    for name in ("window_w08", "collapse", "scaling", "loss_gap"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 0
    # every run went through the sweep's local executor: a submitit job id is recorded in each run folder
    assert all((out / r["run"] / "submissions.json").exists() for r in rows)
    # rerunning finds every run done and only redoes the analysis: no run folder changes
    runs = sorted(p for p in out.iterdir() if (p / "config.json").exists())
    before = {p.name: ((p / "state.pt").stat().st_mtime_ns, (p / "metrics.jsonl").read_text()) for p in runs}
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    assert "tau_mem vs N" in capsys.readouterr().out
    assert {p.name: ((p / "state.pt").stat().st_mtime_ns, (p / "metrics.jsonl").read_text()) for p in runs} == before


def test_the_report_names_no_machine_path_and_prints_whole_steps(tmp_path):
    # planted laws with an open window at N = 1024 (tau_gen 1e5 flat, tau_mem = 300 N 32 / W)
    write_synthetic_experiment(tmp_path, [256, 512, 1024], widths=(32,), steps=2_000_000)
    summary = analyze(tmp_path)
    advice = advise(1024, 32, tmp_path / "fits.json")
    assert str(tmp_path) in advice.laws  # advise names its source; the demo's report must not
    step = round(advice.stop_step)
    check = AdviceCheck(run="advice_check/n01024_w32_s0", step=step, kept=((100000, 0.0, 30.9), (step, 0.0, 30.5)),
                        n_samples=256, chosen=step, fresh_seed=1, fresh_f_mem=0.0, fresh_quality=30.6,
                        plateau_level=31.5, metric="FD (diffmem-pixels)")
    text = report(summary, [dataclasses.replace(advice, laws="the laws fitted in fits.json")], check, 61.0)
    _no_machine_paths(text, tmp_path)
    assert "advice verified" in text and f"step {check.step} and stopped there" in text
    for r in summary.runs:
        assert re.search(rf"^{r.n}\s+32\s+\d+\s+{int(r.steps)}\s", text, re.M)
    assert not re.search(r"\d\.0\b", text.split("\n\n")[0])  # no float steps in the table


@pytest.mark.parametrize("kept_f_mem, fresh_f_mem, fresh_quality, passed, says", [
    (0.0, 0.0, 1.0, True, "advice verified"),
    (0.01, 0.0, 1.0, False, "copies training images"),  # a kept checkpoint copies, though the chosen one does not
    (0.0, 0.01, 1.0, False, "copies training images"),
    (0.0, 0.0, 2.5, False, "off the plateau"),
])
def test_the_advice_check_needs_no_copies_and_a_plateau_quality(kept_f_mem, fresh_f_mem, fresh_quality, passed,
                                                                 says):
    # the model at the stop itself (step 100, quality 3.0) is off the plateau: the check judges the one kept
    check = AdviceCheck("advice_check/x", 100, ((60, kept_f_mem, 1.1), (80, 0.0, 0.9), (100, 0.0, 3.0)), 100,
                        chosen=80, fresh_seed=1, fresh_f_mem=fresh_f_mem, fresh_quality=fresh_quality,
                        plateau_level=2.0, metric="FD (x)")
    text = check.format()
    assert check.passed is passed and says in text
    assert "the model at step 100 itself: FD (x) = 3" in text and "kept: step 80 (best FD (x))" in text


@pytest.mark.e2e
def test_the_advice_check_follows_the_advice_on_the_grid_runs_own_models(tmp_path):
    # a grid run evaluated at steps 5, 20, 60 keeping checkpoints 1.5x apart; advice: stop at 20, keep from 5. The
    # check trains a fresh folder to 20 and must find the grid run's models at every kept step (training is
    # deterministic with the same thread count, evaluation is seeded), then judge the best one with fresh samples
    cfg = tiny_config("eval.times=[5, 20, 60]", "eval.checkpoint_ratio=1.5")
    grid_run = PlannedRun("n00008_w08_s0", cfg, tmp_path / "n00008_w08_s0")
    train(cfg.replace(train={"num_threads": 1}), grid_run.path, progress=False, log=lambda _m: None)
    assert main(["evaluate", str(grid_run.path), "--kept"]) == 0
    grid = {r["step"]: r for r in read_metrics(grid_run.path / "metrics.jsonl") if 5 <= r["step"] <= 20}
    assert sorted(grid) == [5, 7, 10, 15, 20]
    advice = dataclasses.replace(advise(8, 8), stop_step=20.4, keep_from=4.6)  # only these two are used
    best = min(grid.values(), key=lambda r: r["fid"])
    plateau = Estimate(10.0, 5.0, 15.0, False, "planted", level=best["fid"] + 10.0)
    check = check_advice(advice, grid_run, tmp_path, plateau, threads=1)
    assert check.run == "advice_check/n00008_w08_s0" and check.step == 20
    assert [s for s, _, _ in check.kept] == [5, 7, 10, 15, 20]
    for s, f_mem, quality in check.kept:
        assert f_mem == grid[s]["f_mem"] and quality == pytest.approx(grid[s]["fid"], rel=1e-9, abs=1e-9)
    assert check.chosen == best["step"] and check.fresh_seed == 1
    fresh = [r for r in read_metrics(tmp_path / check.run / "metrics.jsonl") if r["seed"] == 1]
    assert [r["step"] for r in fresh] == [check.chosen] and check.fresh_quality == fresh[0]["fid"]
    assert check.fresh_quality != best["fid"]  # other samples, other number
    assert check.on_plateau
    assert not (tmp_path / "advice_check" / "config.json").exists()  # not a run of the experiment
    lines = (tmp_path / check.run / "metrics.jsonl").read_text()
    again = check_advice(advice, grid_run, tmp_path, plateau, threads=1)  # a finished check is read back
    assert again == check and (tmp_path / check.run / "metrics.jsonl").read_text() == lines


def test_a_law_the_grid_cannot_resolve_is_said_in_words():
    """Three N over a factor 2 (the demo's grid): the report says the law is not resolved instead of printing an
    exponent beside the paper's; a law whose interval can tell 0 from 1 is printed with the paper's exponent."""
    from diffmem.analysis.powerlaw import fit_power_law
    from diffmem.demo import law_line

    wide = fit_power_law("tau_mem", "n", [("a", 16.0, 1739.0), ("b", 24.0, 2472.0), ("c", 32.0, 1743.0)])
    text = law_line("tau_mem vs N", wide, "paper: exponent 1")
    assert "not resolved by n = 16..32" in text and "paper: exponent 1" not in text
    assert f"[{wide.exponent_lo:.2f}, {wide.exponent_hi:.2f}]" in text and "results/cpu_digits" in text
    sharp = fit_power_law("tau_mem", "n", [("a", 16.0, 1600.0), ("b", 64.0, 6500.0), ("c", 256.0, 25000.0)])
    assert law_line("tau_mem vs N", sharp, "paper: exponent 1").endswith("(paper: exponent 1)")
