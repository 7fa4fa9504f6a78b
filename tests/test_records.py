"""Records are never lost and never used unchecked (issue 40, cases 5-11 and the unclear errors).

The append-only files (metrics.jsonl, pairs.jsonl): a last line without its newline is not recorded and is moved
aside, never deleted; a symbolic link is never appended to; every line read is validated and a bad one stops the
command with one line naming the file and line. Then the commands that would otherwise overwrite results with empty
ones, skip missing images, trust a damaged fits.json, or go on after a stop signal. Each failing case: exit code 2,
one line on stderr, the folder byte for byte as it was.
"""
from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from diffmem.analysis.synthetic import write_synthetic_experiment, write_synthetic_pairs, write_synthetic_run
from diffmem.cli import main
from diffmem.io import (COUNTS_ENCODING, NotAppendable, PackedCountsError, TORN_SUFFIX, append_jsonl, pack_counts,
                        read_jsonl, unpack_counts)
from diffmem.metrics.memorization import CopyCounts, copy_counts, memorized_fraction
from diffmem.rundir import PAIRS_FILE, RecordError, RunDir, copies_lines
from tiny_runs import TINY, TINY_GRID, sets


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as their target's name) -> its bytes: a folder compares equal only when
    nothing in it was added, removed or changed."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = b"-> " + os.readlink(p).encode()
        elif p.is_file():
            out[str(p.relative_to(folder))] = p.read_bytes()
    return out


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if ": error: " in line]
    assert len(errors) == 1 and errors == err[-1:], err
    return errors[0]


def small_run(path: Path, **kwargs):
    return write_synthetic_run(path, n=128, width=32, steps=384_000, tau_gen=1e4, tau_mem=4e4, n_evals=12,
                               **kwargs)


def small_experiment(root: Path):
    return write_synthetic_experiment(root, ns=[128, 256], widths=[32], steps=lambda n, w: 3000 * n, n_evals=16)


def pair_experiment(root: Path) -> None:
    """A planted split pair (one N) whose twin trains block 1, as `diffmem pairs` finds it; pairs.jsonl written."""
    planted = write_synthetic_experiment(root, ns=[128], widths=[32], steps=lambda n, w: 3000 * n, n_evals=16)
    write_synthetic_pairs(root, planted, tau_bias=lambda n, w: 100.0, n_evals=16)
    twin = root / f"{planted[0].name}_split1" / "config.json"
    meta = json.loads(twin.read_text())
    meta["config"]["data"]["subset_index"] = 1
    twin.write_text(json.dumps(meta))


def tiny_train_command(tmp_path: Path) -> tuple[RunDir, list[str]]:
    """A run folder and the `diffmem train` argv of a tiny run (8 steps, 2 inline evaluations without FID)."""
    config = tmp_path / "c.toml"
    config.write_text("")
    run = RunDir(tmp_path / "run")
    overrides = sets(TINY + ["train.steps=8", "eval.times=2", "eval.fid=false"])
    return run, ["train", str(config), "--out", str(run.path), "--no-progress", *overrides]


# --- case 5: a line without its newline is never recorded and never deleted ---------------------------------------

def test_a_complete_last_line_without_its_newline_is_not_recorded_and_the_next_append_moves_it_aside(tmp_path):
    run = RunDir(tmp_path / "run")
    small_run(run.path)
    text = run.metrics_path.read_bytes()
    lines = text.splitlines(keepends=True)
    torn = lines[-1].rstrip(b"\n")  # a whole JSON object, only its newline missing
    run.metrics_path.write_bytes(b"".join(lines[:-1]) + torn)
    last_step = json.loads(torn)["step"]
    with pytest.warns(UserWarning, match=rf"metrics.jsonl: skipping a truncated last line \(line {len(lines)}, no "
                                         "newline"):
        assert last_step not in run.evaluated_steps() and len(run.metrics()) == len(lines) - 1
    with pytest.warns(UserWarning, match=rf"line {len(lines)} had no newline .* moved it to metrics.jsonl.torn-"):
        append_jsonl(run.metrics_path, {"step": last_step, "f_mem": 0.5})
    (aside,) = run.path.glob(f"metrics.jsonl{TORN_SUFFIX}*")
    assert aside.read_bytes() == torn  # the evaluation is kept, byte for byte
    assert run.metrics_path.read_bytes() == b"".join(lines[:-1]) + b'{"step": %d, "f_mem": 0.5}\n' % last_step
    # a second torn line goes to another file: nothing is overwritten
    with open(run.metrics_path, "ab") as f:
        f.write(b'{"step": 7')
    with pytest.warns(UserWarning, match="moved it to"):
        append_jsonl(run.metrics_path, {"step": 8})
    assert sorted(p.read_bytes() for p in run.path.glob(f"metrics.jsonl{TORN_SUFFIX}*")) == sorted([torn, b'{"step": 7'])


def test_pairs_jsonl_follows_the_same_rule(tmp_path):
    path = tmp_path / PAIRS_FILE
    for step in (1, 2):
        append_jsonl(path, {"pair": "p", "step": step})
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    with pytest.warns(UserWarning, match="line 2"):
        assert read_jsonl(path) == [{"pair": "p", "step": 1}]
    with pytest.warns(UserWarning, match="moved it to pairs.jsonl.torn-"):
        append_jsonl(path, {"pair": "p", "step": 3})
    assert read_jsonl(path) == [{"pair": "p", "step": 1}, {"pair": "p", "step": 3}]
    (aside,) = tmp_path.glob(f"{PAIRS_FILE}{TORN_SUFFIX}*")
    assert json.loads(aside.read_text()) == {"pair": "p", "step": 2}


@pytest.mark.e2e
def test_evaluate_measures_a_torn_step_again_and_keeps_its_torn_line(tmp_path, capsys):
    run, argv = tiny_train_command(tmp_path)
    assert main(argv) == 0
    lines = run.metrics_path.read_bytes().splitlines(keepends=True)
    torn = lines[-1].rstrip(b"\n")
    run.metrics_path.write_bytes(b"".join(lines[:-1]) + torn)
    assert main(["evaluate", str(run.path)]) == 0
    assert "moved it to metrics.jsonl.torn-" in capsys.readouterr().err
    (aside,) = run.path.glob(f"metrics.jsonl{TORN_SUFFIX}*")
    assert aside.read_bytes() == torn
    steps = [r["step"] for r in run.metrics()]
    assert steps == [json.loads(line)["step"] for line in lines]  # every step once: the torn one measured again


# --- case 6: appends refuse symbolic links ------------------------------------------------------------------------

def test_an_append_refuses_a_symbolic_link_and_leaves_its_target_as_it_was(tmp_path):
    outside = tmp_path / "elsewhere.txt"
    outside.write_bytes(b"someone else's text, no newline at the end")
    run = RunDir(tmp_path / "run")
    small_run(run.path)
    run.metrics_path.unlink()
    run.metrics_path.symlink_to(outside)
    with pytest.raises(NotAppendable, match=r"metrics.jsonl is a symbolic link \(to .*elsewhere.txt\); diffmem "
                                            "appends only to a regular file"):
        append_jsonl(run.metrics_path, {"step": 1})
    assert outside.read_bytes() == b"someone else's text, no newline at the end"
    assert not list(tmp_path.glob("*.torn-*")) and not list(run.path.glob("*.torn-*"))


def test_evaluate_and_pairs_refuse_a_linked_file_before_any_work(tmp_path, capsys):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text('{"step": 1}\n')
    exp = tmp_path / "exp"
    pair_experiment(exp)
    run = RunDir(exp / "n00128_w32_s0")
    run.metrics_path.unlink()
    run.metrics_path.symlink_to(outside)
    (exp / PAIRS_FILE).unlink()
    (exp / PAIRS_FILE).symlink_to(outside)
    before, target = snapshot(exp), outside.read_bytes()
    assert main(["evaluate", str(run.path)]) == 2
    assert "metrics.jsonl is a symbolic link" in one_error_line(capsys)
    assert main(["pairs", str(exp)]) == 2
    assert "pairs.jsonl is a symbolic link" in one_error_line(capsys)
    assert snapshot(exp) == before and outside.read_bytes() == target


# --- case 7 and the unclear errors: every record is validated -----------------------------------------------------

DAMAGES = {
    "NaN f_mem": (lambda r: r | {"f_mem": math.nan}, "'f_mem' is not a finite number"),
    "negative fid_boot_std": (lambda r: r | {"fid_boot_std": -0.5}, "'fid_boot_std' is -0.5, below 0"),
    "infinite fid": (lambda r: r | {"fid": math.inf}, "'fid' is not a finite number"),
    "text f_mem": (lambda r: r | {"f_mem": "high"}, "'f_mem' is 'high', not a number or null"),
    "f_mem above 1": (lambda r: r | {"f_mem": 1.5}, "'f_mem' is 1.5, outside [0, 1]"),
    "step beyond the budget": (lambda r: r | {"step": 384_001}, "'step' is 384001, beyond the run's budget of 384000"),
    "text step": (lambda r: r | {"step": "12"}, "'step' is '12', not an integer"),
    "float step": (lambda r: r | {"step": 12.5}, "'step' is 12.5, not an integer"),
    "negative step": (lambda r: r | {"step": -1}, "'step' is -1, below 0"),
    "no step": (lambda r: {k: v for k, v in r.items() if k != "step"}, "it has no 'step'"),
    "fewer samples": (lambda r: r | {"n_samples": 10}, "'n_samples' is 10, fewer than the run's eval.n_samples = 256"),
    "not an object": (lambda r: [r["step"]], "it is list JSON, not an object"),
    "a level's AUC above 1": (lambda r: r | {"loss_ts": [0.01], "auc": [1.5]}, "'auc' holds a value outside [0, 1]"),
}


def damage_line(run_dir: Path, number: int, damage) -> None:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[number - 1] = json.dumps(damage(json.loads(lines[number - 1])))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_a_bad_metrics_line_stops_analyze_and_status_naming_its_file_and_line(tmp_path, capsys, name):
    exp = tmp_path / "exp"
    planted = small_experiment(exp)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    capsys.readouterr()
    damage, says = DAMAGES[name]
    damage_line(planted[0].path, 5, damage)
    before = snapshot(exp)
    for argv in (["analyze", str(exp)], ["status", str(exp)]):
        assert main(argv) == 2
        line = one_error_line(capsys)
        assert f"{planted[0].path / 'metrics.jsonl'} line 5: {says}" in line, line
        assert "correct that line or move it out of the file" in line
        assert snapshot(exp) == before


LEVELS = {"loss_ts": [0.01, 0.4], "loss_steps": [40, 551], "train_losses": [0.2, 0.5], "test_losses": [0.3, 0.5],
          "loss_gap_lo": [0.05, -0.01], "loss_gap_hi": [0.15, 0.01], "membership_n": 128, "auc": [0.9, 0.5],
          "auc_lo": [0.85, 0.43], "auc_hi": [0.95, 0.57], "membership_auc": 0.8, "membership_auc_lo": 0.75,
          "membership_auc_hi": 0.85, "membership_s": 0.4}
"""The per-level keys of an evaluation at two noise levels (eval.loss_ts = [0.01, 0.4]), as the evaluation writes."""
LEVEL_DAMAGES = {
    "a list shorter than loss_ts": (lambda r: r | LEVELS | {"auc": [0.9]},
                                    "'auc' is [0.9], not a list of 2 numbers (one per 'loss_ts' level)"),
    "a list longer than loss_ts": (lambda r: r | LEVELS | {"train_losses": [0.2, 0.5, 0.7]},
                                   "'train_losses' is [0.2, 0.5, 0.7], not a list of 2 numbers"),
    "a level's AUC above 1": (lambda r: r | LEVELS | {"auc_hi": [1.2, 0.57]}, "'auc_hi' holds a value outside [0, 1]"),
    "the combined AUC above 1": (lambda r: r | LEVELS | {"membership_auc": 1.5},
                                 "'membership_auc' is 1.5, outside [0, 1]"),
    "a text in a list": (lambda r: r | LEVELS | {"loss_gap_lo": ["x", 0.1]}, "'loss_gap_lo' is ['x', 0.1], not a list"),
    "a NaN in a list": (lambda r: r | LEVELS | {"test_losses": [math.nan, 0.5]},
                        "'test_losses[0]' is not a finite number"),
    "lists without loss_ts": (lambda r: r | {"auc": [0.5]}, "'auc' is given without 'loss_ts'"),
    "a zero diffusion time": (lambda r: r | LEVELS | {"loss_ts": [0.0, 0.4]}, "'loss_ts' is [0.0, 0.4], not a list"),
    "membership_n zero": (lambda r: r | LEVELS | {"membership_n": 0}, "'membership_n' is 0, not an integer >= 1"),
}


def test_a_metrics_line_with_its_levels_is_read_as_written(tmp_path):
    run = RunDir(tmp_path / "run")
    small_run(run.path)
    damage_line(run.path, 3, lambda r: r | LEVELS)
    assert {k: run.metrics()[2][k] for k in LEVELS} == LEVELS


@pytest.mark.parametrize("name", sorted(LEVEL_DAMAGES))
def test_a_metrics_line_with_bad_levels_is_one_record_error(tmp_path, name):
    run = RunDir(tmp_path / "run")
    small_run(run.path)
    damage, says = LEVEL_DAMAGES[name]
    damage_line(run.path, 3, damage)
    with pytest.raises(RecordError) as refused:
        run.metrics()
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and f"metrics.jsonl line 3: {says}" in message, message


def test_the_run_folder_reader_validates_too(tmp_path):
    run = RunDir(tmp_path / "run")
    small_run(run.path)
    damage_line(run.path, 3, lambda r: r | {"step": 10**9})
    with pytest.raises(RecordError, match=r"metrics.jsonl line 3: 'step' is 1000000000, beyond the run's budget"):
        run.evaluated_steps()


@pytest.mark.e2e
def test_train_refuses_a_metrics_line_with_a_text_step(tmp_path, capsys):
    run, argv = tiny_train_command(tmp_path)
    assert main(argv + sets(["train.steps=4"])) == 0  # half way: the rerun below continues it
    damage_line(run.path, 1, lambda r: r | {"step": "2"})
    capsys.readouterr()
    before = snapshot(run.path)
    assert main(argv) == 2
    assert "metrics.jsonl line 1: 'step' is '2', not an integer" in one_error_line(capsys)
    assert snapshot(run.path) == before


PAIR_DAMAGES = {
    "text step": (lambda r: r | {"step": "x"}, "'step' is 'x', not an integer"),
    "NaN bias": (lambda r: r | {"bias": math.nan}, "'bias' is not a finite number"),
    "step beyond the budget": (lambda r: r | {"step": 10**9}, "'step' is 1000000000, beyond the run's budget"),
    "no run": (lambda r: {k: v for k, v in r.items() if k != "run_b"}, "'run_b' is None, not a string"),
}


@pytest.mark.parametrize("name", sorted(PAIR_DAMAGES))
def test_a_bad_pairs_line_stops_analyze_and_pairs_naming_its_line(tmp_path, capsys, name):
    exp = tmp_path / "exp"
    pair_experiment(exp)
    path = exp / PAIRS_FILE
    lines = path.read_text().splitlines()
    damage, says = PAIR_DAMAGES[name]
    lines[2] = json.dumps(damage(json.loads(lines[2])))
    path.write_text("\n".join(lines) + "\n")
    before = snapshot(exp)
    for argv in (["analyze", str(exp), "--no-figures"], ["pairs", str(exp), "--device", "cpu"]):
        assert main(argv) == 2
        line = one_error_line(capsys)
        assert f"{path} line 3: {says}" in line, line
        assert snapshot(exp) == before


def test_pairs_needs_two_samples_per_step(tmp_path, capsys):
    assert main(["pairs", str(tmp_path), "--n-samples", "1"]) == 2
    line = one_error_line(capsys)
    assert "--n-samples 1 is too few" in line and "at least 2" in line and "width 0" in line
    assert list(tmp_path.iterdir()) == []


# --- case 8: analyze --n-samples that no evaluation drew ------------------------------------------------------------

def test_analyze_refuses_a_sample_count_no_evaluation_drew_and_changes_nothing(tmp_path, capsys):
    exp = tmp_path / "exp"
    small_experiment(exp)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    capsys.readouterr()
    before = snapshot(exp)
    assert (exp / "summary.csv").is_file() and (exp / "fits.json").is_file() and (exp / "report.md").is_file()
    assert main(["analyze", str(exp), "--n-samples", "999"]) == 2
    line = one_error_line(capsys)
    assert "--n-samples 999: no evaluation" in line and "the sample counts recorded: 256" in line
    assert snapshot(exp) == before
    assert main(["analyze", str(exp), "--n-samples", "256", "--no-figures"]) == 0  # a count present works


def test_analyze_refuses_to_overwrite_results_when_no_run_has_an_evaluation(tmp_path, capsys):
    exp = tmp_path / "exp"
    planted = small_experiment(exp)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    for run in planted:
        (run.path / "metrics.jsonl").write_text("")
    capsys.readouterr()
    before = snapshot(exp)
    assert main(["analyze", str(exp), "--no-figures"]) == 2
    line = one_error_line(capsys)
    assert "no run of" in line and f"overwrite {exp / 'summary.csv'} with empty results" in line
    assert snapshot(exp) == before


# --- case 9: prepare with images missing that the partition file lists -------------------------------------------

def test_prepare_refuses_images_listed_in_the_partition_file_but_missing(tmp_path, celeba_root, capsys,
                                                                        isolated_diffmem_cache):
    root = celeba_root(n=10)
    image_dir = root / "celeba" / "img_align_celeba"
    gone = sorted(image_dir.iterdir())[3:5]
    for p in gone:
        p.unlink()
    before = snapshot(root)
    out = tmp_path / "c.pt"
    assert main(["prepare", "celeba", "--root", str(root), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"2 images listed in '{image_dir.parent / 'list_eval_partition.txt'}' are missing" in line
    assert f"(first: {gone[0].name})" in line and "--skip-bad" not in line
    assert not out.exists() and not out.with_suffix(".json").exists() and list(tmp_path.iterdir()) == [root]
    assert snapshot(root) == before and not any(isolated_diffmem_cache.iterdir())


# --- case 10: advise --from a damaged fits.json -------------------------------------------------------------------

def fits_damages() -> dict[str, tuple]:
    def at(*keys):
        def put(value):
            def change(d):
                target = d
                for k in keys[:-1]:
                    target = target[k]
                target[keys[-1]] = value
            return change
        return put

    return {
        "NaN exponent": (at("tau_mem_vs_n", "by_width", "32", "exponent")(math.nan),
                         "'tau_mem_vs_n.by_width.32.exponent' is nan, not a finite number"),
        "negative prefactor": (at("tau_mem_vs_n", "by_width", "32", "prefactor")(-2.0),
                               "'tau_mem_vs_n.by_width.32.prefactor' is -2.0, not > 0"),
        "text exponent": (at("tau_gen_vs_n", "exponent")("one"), "'tau_gen_vs_n.exponent' is 'one'"),
        "infinite t": (at("tau_mem_vs_n", "by_width", "32", "t")(math.inf), "'tau_mem_vs_n.by_width.32.t' is inf"),
        "short covariance": (at("tau_mem_vs_n", "by_width", "32", "cov_log10")([1.0]),
                             "'tau_mem_vs_n.by_width.32.cov_log10' is [1.0], not four finite numbers"),
        "short rounding covariance": (at("tau_mem_vs_n", "by_width", "32", "rounding_cov_log10")([0.0, 1.0]),
                                      "'tau_mem_vs_n.by_width.32.rounding_cov_log10' is [0.0, 1.0], not four finite"),
        "a collinear factor below 1": (at("tau_mem_vs_n", "by_width", "32", "collinear_factor")(0.5),
                                       "'tau_mem_vs_n.by_width.32.collinear_factor' is 0.5, below 1"),
        "an infinite collinear factor": (at("tau_mem_vs_n", "collinear_factor")(math.inf),
                                         "'tau_mem_vs_n.collinear_factor' is inf, not a finite number"),
        "a fit that is a number": (at("tau_gen_vs_width")(3), "'tau_gen_vs_width' is int, not a fit"),
        "a zero point": (at("tau_mem_vs_n", "points", 0, "x")(0), "'tau_mem_vs_n.points[0].x' is 0, not a number > 0"),
        "a negative crossing bracket": (at("tau_mem_at_0.1_vs_n", "points", 0, "bracket_lo")(-1.0),
                                        "'tau_mem_at_0.1_vs_n.points[0].bracket_lo' is -1.0, not a number > 0 or null"),
        "a damaged goodness of fit": (at("tau_mem_vs_n", "by_width", "32", "goodness_of_fit")(1.0),
                                      "'tau_mem_vs_n' is malformed"),
    }


@pytest.mark.parametrize("name", sorted(fits_damages()))
def test_advise_refuses_a_damaged_fits_json_naming_the_file_and_key(tmp_path, capsys, name):
    exp = tmp_path / "exp"
    write_synthetic_experiment(exp, ns=[128, 256, 512], widths=[32], steps=lambda n, w: 3000 * n, n_evals=16)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    assert main(["advise", "--n", "300", "--width", "32", "--from", str(exp)]) == 0
    capsys.readouterr()
    fits = json.loads((exp / "fits.json").read_text())
    change, says = fits_damages()[name]
    change(fits)
    (exp / "fits.json").write_text(json.dumps(fits))
    assert main(["advise", "--n", "300", "--width", "32", "--from", str(exp)]) == 2
    line = one_error_line(capsys)
    assert f"{exp / 'fits.json'}: {says}" in line and "rerun `diffmem analyze`" in line, line


def test_advise_refuses_a_fits_json_that_is_not_an_object(tmp_path, capsys):
    (tmp_path / "fits.json").write_text("[1, 2]\n")
    assert main(["advise", "--n", "300", "--width", "32", "--from", str(tmp_path)]) == 2
    assert "is not a fits.json" in one_error_line(capsys)


# --- the other unclear errors -------------------------------------------------------------------------------------

def test_coverage_names_a_negative_seed(capsys):
    assert main(["coverage", "--seed", "-1", "--n-sim", "5"]) == 2
    assert "--seed -1 must be an integer >= 0" in one_error_line(capsys)


@pytest.mark.e2e
def test_a_quick_theory_sweep_compares_with_an_experiment(tmp_path, capsys):
    exp = tmp_path / "exp"
    small_experiment(exp)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    out = tmp_path / "theory"
    assert main(["theory", "sweep", "--quick", "--out", str(out), "--compare", str(exp)]) == 0
    assert (out / "figures" / "theory_vs_unet.png").is_file()


# --- case 11: a stop signal ends a debug sweep ---------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else [signal.SIGTERM],
                         ids=lambda s: s.name)
def test_a_stop_signal_ends_a_debug_sweep_after_saving_the_run_in_progress(tmp_path, sig):
    config = tmp_path / "grid.toml"
    config.write_text("[sweep]\nn = [8, 16]\nwidth = [8]\nseeds = [0]\n")
    exp = tmp_path / "exp"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "diffmem.cli", "sweep", str(config), "--cluster", "debug",
                             "--out", str(exp), "--no-progress", *sets(TINY_GRID + ["train.steps=400"])],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    runs = [RunDir(exp / "n00016_w08_s0"), RunDir(exp / "n00008_w08_s0")]  # the longest run first
    deadline = time.monotonic() + 120
    while not any(r.checkpoint_steps() for r in runs) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    started = [r for r in runs if r.state_path.exists()]
    assert len(started) == 1 and not started[0].is_done(), out  # one run saved its state, the other never started
    other = next(r for r in runs if r is not started[0])
    assert not other.state_path.exists() and not other.checkpoint_steps()
    assert "the sweep stops here (1 more run(s) not started)" in out and "stopped by a signal" in out


# --- copies.jsonl: packed counts -------------------------------------------------------------------------------------

def _copies_line(n_train: int = 40, seed: int = 0) -> tuple[dict, CopyCounts]:
    """A packed copies.jsonl line through the evaluation's own path: 3 copies of image 5, 2 of image 17, noise."""
    g = torch.Generator().manual_seed(seed)
    train = torch.rand((n_train, 16), generator=g)
    samples = torch.cat([train[[5, 5, 5, 17, 17]], torch.rand((25, 16), generator=g) * 3 - 1])
    counts = copy_counts(memorized_fraction(samples, train, n_boot=1))
    return counts.record(7, len(samples), 0, 1 / 3, n_train), counts


def test_a_packed_copies_line_reads_back_exactly_and_a_plain_line_still_reads(tmp_path):
    line, counts = _copies_line()
    assert line["encoding"] == COUNTS_ENCODING and "nearest_idx" not in line
    plain = {k: v for k, v in line.items() if k not in ("encoding", "nearest", "copied")} | counts.__dict__
    path = tmp_path / "copies.jsonl"
    append_jsonl(path, line)
    append_jsonl(path, plain)
    (_, packed_back), (_, plain_back) = copies_lines(path, budget=10, n_train=40, min_samples=30)
    assert packed_back == plain_back == plain
    assert packed_back["copied_idx"] == [5, 17] and packed_back["copied_n"] == [3, 2]
    assert sum(packed_back["nearest_n"]) == 30


def test_pack_counts_round_trips_and_refuses_what_is_not_its_array():
    values = np.array([0, 3, 0, 0, 2**32 - 1, 1], dtype=np.int64)
    assert unpack_counts(pack_counts(values), 6).tolist() == values.tolist()
    bomb = base64.b64encode(zlib.compress(b"\0" * 10**7)).decode()  # 10 MB of zeros where 6 values are expected
    for text, says in ((pack_counts(values), "exactly 5"), (bomb, "exactly 6"), ("not base64!", "not zlib"),
                       (base64.b64encode(b"plain").decode(), "not zlib"), (12, "not packed text")):
        with pytest.raises(PackedCountsError, match=says.replace("not zlib", COUNTS_ENCODING)):
            unpack_counts(text, 5 if says == "exactly 5" else 6)
    with pytest.raises(ValueError):
        pack_counts(np.array([-1]))


@pytest.mark.parametrize("damage, says", [
    (lambda r: r | {"nearest": r["nearest"][:-8]}, "its counts cannot be unpacked"),
    (lambda r: r | {"encoding": "pickle"}, "its counts cannot be unpacked: 'encoding' is 'pickle'"),
    (lambda r: r | {"copied": r["nearest"]}, None),  # every nearest image copied: allowed
    (lambda r: r | {"nearest": r["copied"]}, "'nearest_n' sums to 5, not n_samples = 30"),
    (lambda r: r | {"n_train": 41}, "'n_train' is 41, not the run's N = 40"),
    (lambda r: r | {"step": 11}, "'step' is 11, beyond the run's budget"),
    (lambda r: r | {"first_copies": [5, 17]}, None),
    (lambda r: r | {"first_copies": [17, 5]}, "'first_copies' is not increasing indices of copied images"),
    (lambda r: r | {"first_copies": [0]}, "'first_copies' is not increasing indices of copied images"),
])
def test_a_damaged_copies_line_is_one_record_error(tmp_path, damage, says):
    line, _ = _copies_line()
    path = tmp_path / "copies.jsonl"
    append_jsonl(path, damage(line))
    if says is None:
        assert len(copies_lines(path, budget=10, n_train=40, min_samples=30)) == 1
        return
    with pytest.raises(RecordError) as refused:
        copies_lines(path, budget=10, n_train=40, min_samples=30)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and f"copies.jsonl line 1: {says}" in message, message


def test_advise_refuses_a_law_that_predicts_an_infinite_step(tmp_path, capsys):
    """A finite but absurd exponent (1e300) passes the fits.json checks and overflows the prediction: one line that
    names the quantity and the law, exit 2, no 'recommended stop: step inf'."""
    exp = tmp_path / "exp"
    write_synthetic_experiment(exp, ns=[128, 256, 512], widths=[32], steps=lambda n, w: 3000 * n, n_evals=16)
    assert main(["analyze", str(exp), "--no-figures"]) == 0
    capsys.readouterr()
    fits = json.loads((exp / "fits.json").read_text())
    fits["tau_mem_vs_n"]["by_width"]["32"]["exponent"] = 1e300
    (exp / "fits.json").write_text(json.dumps(fits))
    assert main(["advise", "--n", "300", "--width", "32", "--from", str(exp)]) == 2
    line = one_error_line(capsys)
    assert "tau_mem predicted for N = 300, W = 32" in line and "not a finite number of steps" in line, line
