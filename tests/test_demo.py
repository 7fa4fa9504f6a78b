"""`diffmem demo --quick` end to end: trains the demo grid, analyzes it, prints the report; a rerun resumes."""
import csv
import os
import signal
import subprocess
import sys
import time

from diffmem.cli import demo_config_path, main
from diffmem.config import load_config
from diffmem.demo import QUICK


def test_quick_demo_runs_end_to_end_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    _, sweep = load_config(demo_config_path())
    assert "tau_mem vs N" in report and f"Advice for N = {max(sweep.n)}" in report and "figures:" in report
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["n"]) for r in rows) == sorted(sweep.n)
    assert all(int(r["steps"]) == QUICK["steps_per_n"] * int(r["n"]) for r in rows)
    assert all(r["state"] == "done" for r in rows)
    assert (out / "fits.json").stat().st_size > 0
    for name in ("window_w08", "collapse", "scaling", "loss_gap"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 0
    # rerunning finds every run done and only redoes the analysis: no run folder changes
    runs = sorted(p for p in out.iterdir() if (p / "config.json").exists())
    before = {p.name: ((p / "state.pt").stat().st_mtime_ns, (p / "metrics.jsonl").read_text()) for p in runs}
    assert main(["demo", "--quick", "--no-progress", "--out", str(out)]) == 0
    assert "tau_mem vs N" in capsys.readouterr().out
    assert {p.name: ((p / "state.pt").stat().st_mtime_ns, (p / "metrics.jsonl").read_text()) for p in runs} == before


def test_ctrl_c_stops_the_demo_with_state_saved_and_a_rerun_finishes(tmp_path):
    out = tmp_path / "demo"
    # two of the demo's four N: the interruption and the rerun are under test here, not the grid
    command = [sys.executable, "-m", "diffmem.cli", "demo", "--quick", "--no-progress", "--out", str(out),
               "--set", "sweep.n=[8,12]"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 120
    while not list(out.glob("*/checkpoints")) and time.time() < deadline:  # the first runs are training
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; rerun the same command" in stdout
    started = [p for p in out.iterdir() if (p / "state.pt").exists()]
    assert started and not all((p / "done").exists() for p in started)
    assert subprocess.run(command, capture_output=True).returncode == 0
    assert all((p / "done").exists() for p in out.iterdir() if (p / "config.json").exists())
