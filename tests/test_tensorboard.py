"""TensorBoard event files (diffmem.tensorboard), read back with TensorBoard's own reader and server.

* the event folder: points arriving out of step order or changed are shown once per step, in step order, by both of
  TensorBoard's readers (its Python EventAccumulator, and the Rust data server's preemption rule, brute-forced here);
* ``diffmem tensorboard`` on a copy of a committed experiment: every tag, values equal to metrics.jsonl and
  pairs.jsonl, the sample grids byte for byte, the timescales of summary.csv; a rerun writes nothing;
* the live hooks: a tiny training run killed and resumed from an older state shows every step once, with the values
  of its metrics.jsonl, like an uninterrupted run; a failed write or a missing package is one warning, never an error;
* a real ``tensorboard --logdir`` server, started on a free loopback port, answers its scalar routes.
"""
from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard package (pip install -e '.[tensorboard]')")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader  # noqa: E402
from tensorboard.backend.event_processing.plugin_event_accumulator import \
    EventAccumulator as PluginEventAccumulator  # noqa: E402

from diffmem.analysis.runfiles import latest_per_step, read_pairs  # noqa: E402
from diffmem.cli import main  # noqa: E402
from diffmem.eval_grid import evaluation_steps  # noqa: E402
from diffmem.rundir import RunDir  # noqa: E402
from diffmem.tensorboard import live  # noqa: E402
from diffmem.tensorboard.eventdir import EventDir, event_files  # noqa: E402
from diffmem.tensorboard.points import (TIMESCALES_TAG, evaluation_points, pair_points, run_points,  # noqa: E402
                                        scalar)
from diffmem.tensorboard.rebuild import write_tensorboard  # noqa: E402
from diffmem.train import train  # noqa: E402
from tiny_runs import tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "results" / "demo"
PAIRS = ROOT / "results" / "digits_pairs"

EVALUATION_TAGS = {"memorization/f_mem", "memorization/f_mem_lo", "memorization/f_mem_hi", "loss_gap/train_loss",
                   "loss_gap/test_loss", "loss_gap/gap", "training/images_per_second"}


def accumulate(folder: Path) -> EventAccumulator:
    """TensorBoard's Python reader over one event folder, everything kept (no sampling)."""
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalar_series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def rust_view(folder: Path) -> dict[str, list[int]]:
    """The steps per tag that TensorBoard's Rust data server shows: it reads the files in name order, and a point at
    step s drops every earlier point of its tag at a step >= s (its reservoir's preemption)."""
    series: dict[str, list[int]] = {}
    for path in event_files(folder):
        for event in LegacyEventFileLoader(str(path)).Load():
            for value in event.summary.value:
                kept = [s for s in series.get(value.tag, []) if s < event.step]
                series[value.tag] = kept + [event.step]
    return series


def assert_each_step_once_in_order(acc: EventAccumulator, folder: Path) -> None:
    """Each tag's steps strictly increasing for TensorBoard's three readers: the EventAccumulator, the server's
    Python reader (``--load_fast=false``) and the Rust data server's rule."""
    for tag in acc.Tags()["scalars"]:
        steps = [step for step, _ in scalar_series(acc, tag)]
        assert steps == sorted(set(steps)), f"{tag}: steps {steps}"
    server = PluginEventAccumulator(str(folder), size_guidance={"tensors": 0})
    server.Reload()
    for tag in server.Tags()["tensors"]:
        steps = [e.step for e in server.Tensors(tag)]
        assert steps == sorted(set(steps)), f"{tag} (server's Python reader): steps {steps}"
    for tag, steps in rust_view(folder).items():
        assert steps == sorted(set(steps)), f"{tag} (Rust reader): steps {steps}"


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)  # event files hold float32


def copy_experiment(source: Path, dest: Path, runs: list[str] | None = None) -> Path:
    """A copy of a committed experiment (all its run folders, or only ``runs``) that tests may write into."""
    if runs is None:
        shutil.copytree(source, dest)
        return dest
    dest.mkdir()
    for name in runs:
        shutil.copytree(source / name, dest / name)
    for name in ("summary.csv", "pairs.jsonl"):
        if (source / name).is_file():
            shutil.copy(source / name, dest / name)
    return dest


# --- the event folder ----------------------------------------------------------------------------------------------

def test_points_out_of_step_order_or_changed_are_shown_once_per_step_in_order(tmp_path):
    folder = tmp_path / "events"
    f_mem = {1: 0.0, 2: 0.1, 8: 0.4, 16: 0.9}
    loss = {s: 1.0 / s for s in range(1, 17)}
    events = EventDir(folder)
    for s in range(1, 17):  # live: the training loss every step, an evaluation at 1, 2, 8, 16
        events.append(scalar("training/loss", s, loss[s]))
        if s in f_mem:
            assert events.sync([scalar("f_mem", k, v) for k, v in f_mem.items() if k <= s]) == 1
    assert not events.append(scalar("training/loss", 12, 5.0))  # a resumed process: step 12 was written
    older = {p.name: p.read_bytes() for p in event_files(folder)}
    f_mem[4] = 0.2  # a refinement between steps 2 and 8, appended after step 16
    f_mem[8] = 0.5  # and a value that changed
    events.sync([scalar("f_mem", k, v) for k, v in f_mem.items()])
    events.close()
    assert len(event_files(folder)) == 1  # the folder written again as one file
    for kill_before_the_deletions in (False, True):
        if kill_before_the_deletions:
            for name, content in older.items():
                (folder / name).write_bytes(content)
        acc = accumulate(folder)
        assert [(s, round(v, 6)) for s, v in scalar_series(acc, "f_mem")] == sorted(f_mem.items())
        assert all(close(v, loss[s]) for s, v in scalar_series(acc, "training/loss"))
        assert [s for s, _ in scalar_series(acc, "training/loss")] == list(range(1, 17))
        assert rust_view(folder) == {"f_mem": sorted(f_mem), "training/loss": list(range(1, 17))}
        assert_each_step_once_in_order(acc, folder)
    # another process (a rerun) reads it all back and has nothing to write
    again = EventDir(folder)
    assert again.sync([scalar("f_mem", k, v) for k, v in f_mem.items()]) == 0
    assert not again.append(scalar("training/loss", 16, 0.0))
    assert again.append(scalar("training/loss", 17, 0.5))
    again.close()
    assert [s for s, _ in scalar_series(accumulate(folder), "training/loss")] == list(range(1, 18))


def test_an_evaluation_with_noise_levels_gets_a_gap_and_an_auc_per_level_and_the_combined_auc():
    record = {"step": 7, "f_mem": 0.0, "loss_ts": [0.01, 0.4], "train_losses": [0.2, 0.5], "test_losses": [0.35, 0.5],
              "auc": [0.9, 0.5], "membership_auc": 0.8, "membership_auc_lo": 0.7, "membership_auc_hi": 0.9}
    points = {p.value.tag: (p.step, p.value.simple_value) for p in evaluation_points(record)}
    expected = {"membership_auc/combined": 0.8, "membership_auc/combined_lo": 0.7, "membership_auc/combined_hi": 0.9,
                "membership_auc/t=0.01": 0.9, "membership_auc/t=0.4": 0.5, "loss_gap/t=0.01": 0.15,
                "loss_gap/t=0.4": 0.0, "memorization/f_mem": 0.0}
    assert set(points) == set(expected) and all(points[tag][0] == 7 for tag in points)
    assert all(close(points[tag][1], value) for tag, value in expected.items()), points
    older = {p.value.tag for p in evaluation_points({"step": 7, "f_mem": 0.0})}  # a folder written before the levels
    assert older == {"memorization/f_mem"}


# --- diffmem tensorboard EXP -----------------------------------------------------------------------------------------

def test_a_committed_experiment_is_written_from_its_files_and_a_rerun_writes_nothing(tmp_path, capsys):
    exp = copy_experiment(DEMO, tmp_path / "demo")
    assert main(["tensorboard", str(exp)]) == 0
    assert f"tensorboard --logdir {exp}" in capsys.readouterr().out
    files = {run: [p.name for p in event_files(exp / run / "tensorboard")] for run in ("n00016_w08_s0",)}
    for run in ("n00016_w08_s0", "n00032_w08_s0", "n00064_w08_s0"):
        folder = exp / run / "tensorboard"
        acc = accumulate(folder)
        records = latest_per_step(RunDir(exp / run).metrics())
        tags = set(acc.Tags()["scalars"])
        assert EVALUATION_TAGS | {"quality/FD (diffmem-pixels)", "quality/FD (diffmem-pixels) standard error"} == tags
        assert [s for s, _ in scalar_series(acc, "memorization/f_mem")] == [r["step"] for r in records]
        for tag, key in (("memorization/f_mem", "f_mem"), ("memorization/f_mem_hi", "f_mem_hi"),
                         ("quality/FD (diffmem-pixels)", "fid"), ("loss_gap/test_loss", "test_loss")):
            assert all(close(v, r[key]) for (_, v), r in zip(scalar_series(acc, tag), records)), tag
        gaps = dict(scalar_series(acc, "loss_gap/gap"))
        assert all(close(gaps[r["step"]], r["test_loss"] - r["train_loss"]) for r in records)
        images = acc.Images("samples/grid")
        assert [i.step for i in images] == [r["step"] for r in records]
        assert images[-1].encoded_image_string == RunDir(exp / run).samples_path(records[-1]["step"]).read_bytes()
        timescales = acc.Tensors(TIMESCALES_TAG)[0].tensor_proto.string_val[0].decode()
        assert "| tau_mem |" in timescales and "| tau_mem_at_0.01 |" in timescales
        assert "_hparams_/session_start_info" in acc.summary_metadata
        assert_each_step_once_in_order(acc, folder)
    capsys.readouterr()
    assert main(["tensorboard", str(exp)]) == 0
    assert "0 point(s) written" in capsys.readouterr().out
    assert files == {run: [p.name for p in event_files(exp / run / "tensorboard")] for run in files}  # no new file


def test_split_pairs_get_a_tensorboard_run_each(tmp_path):
    exp = copy_experiment(PAIRS, tmp_path / "pairs", runs=["n00016_w08_s0", "n00016_w08_s0_split1"])
    cfg = RunDir(exp / "n00016_w08_s0").read_config().config
    live.records_appended(cfg, RunDir(exp), pair="n00016_w08_s0")  # as `diffmem pairs` after appending a line
    live_files = event_files(exp / "pairs_tensorboard" / "n00016_w08_s0")
    assert len(live_files) == 1
    summary = write_tensorboard(exp, log=lambda _m: None)
    assert summary.folders == 2 + len(read_pairs(exp))
    assert event_files(exp / "pairs_tensorboard" / "n00016_w08_s0") == live_files  # nothing more to write there
    lines = read_pairs(exp)["n00016_w08_s0"]
    acc = accumulate(exp / "pairs_tensorboard" / "n00016_w08_s0")
    assert {"pairs/bias", "pairs/bias_lo", "pairs/bias_hi", "pairs/pair_distance", "pairs/own_fraction"} \
        <= set(acc.Tags()["scalars"])
    assert [(s, round(v, 5)) for s, v in scalar_series(acc, "pairs/pair_distance")] \
        == [(r["step"], round(r["pair_distance"], 5)) for r in lines]
    assert len(pair_points(lines)) == sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"])
    assert write_tensorboard(exp, log=lambda _m: None).points == 0


def test_the_verb_without_the_package_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(live, "available", lambda: False)
    assert main(["tensorboard", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install" in err


# --- the live hooks --------------------------------------------------------------------------------------------------

def test_a_failed_write_or_a_missing_package_is_one_warning_and_never_stops_the_run(tmp_path, monkeypatch):
    cfg = tiny_config()
    run = RunDir(tmp_path / "run")

    def fail(self, point):
        raise OSError("disk full")

    monkeypatch.setattr(EventDir, "append", fail)
    with pytest.warns(live.TensorBoardWarning, match="disk full"):
        live.training_loss(cfg, run, 100, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        live.training_loss(cfg, run, 200, 0.4)  # no second warning, no exception
        live.records_appended(cfg, run)
    monkeypatch.setattr(live, "available", lambda: False)
    monkeypatch.setattr(live, "_missing_warned", [False])
    other = RunDir(tmp_path / "other")
    with pytest.warns(live.TensorBoardWarning, match="pip install"):
        live.training_loss(cfg, other, 100, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        live.records_appended(cfg, other)
        live.training_loss(cfg.replace(train={"tensorboard": False}), other, 100, 0.5)
    assert not (other.path / "tensorboard").exists()


@pytest.mark.e2e
def test_a_run_killed_and_resumed_from_an_older_state_shows_every_step_once(tmp_path):
    cfg = tiny_config("train.steps=120", "eval.times=5")
    steps = evaluation_steps(cfg.eval.times, cfg.train.steps)
    run = RunDir(tmp_path / "cut")
    before, at = steps[-3], steps[-2]
    train(cfg, run.path, progress=False, stop_at_step=before + 2)
    older = run.state_path.read_bytes()
    train(cfg, run.path, progress=False, stop_at_step=at + 1)  # evaluates `at`, writes the losses up to at + 1
    # as a kill after that would: the state of `at` lost, the run resumes from the older state and trains through
    # steps whose training loss and evaluation the event files already show
    run.state_path.write_bytes(older)
    run.state_prev_path.unlink()
    assert train(cfg, run.path, progress=False).status == "done"
    acc = accumulate(run.path / "tensorboard")
    assert_each_step_once_in_order(acc, run.path / "tensorboard")
    records = latest_per_step(run.metrics())
    assert [s for s, _ in scalar_series(acc, "memorization/f_mem")] == steps == [r["step"] for r in records]
    assert set(acc.Tags()["scalars"]) >= EVALUATION_TAGS | {"training/loss"}
    for tag, key in (("memorization/f_mem", "f_mem"), ("memorization/f_mem_lo", "f_mem_lo"),
                     ("loss_gap/train_loss", "train_loss"), ("loss_gap/test_loss", "test_loss"),
                     ("membership_auc/combined", "membership_auc")):
        assert all(close(v, r[key]) for (_, v), r in zip(scalar_series(acc, tag), records)), tag
    assert all(close(v, r["test_losses"][0] - r["train_losses"][0])
               for (_, v), r in zip(scalar_series(acc, "loss_gap/t=0.01"), records))
    assert [i.step for i in acc.Images("samples/grid")] == steps
    loss_steps = [s for s, _ in scalar_series(acc, "training/loss")]  # checked at each evaluation and every 100
    assert set(steps) <= set(loss_steps) and loss_steps[-1] == cfg.train.steps
    assert write_tensorboard(run.path, log=lambda _m: None).points == 0  # the rebuild agrees with the live events


# --- a real TensorBoard server ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, body: dict | None = None) -> object | None:
    """The JSON answer of ``url`` (a POST of ``body`` when given); None while the server does not answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
        return None


@pytest.mark.e2e
def test_a_tensorboard_server_answers_with_the_runs_and_tags_of_a_committed_experiment(tmp_path):
    exp = copy_experiment(DEMO, tmp_path / "demo", runs=["n00016_w08_s0", "n00032_w08_s0"])
    write_tensorboard(exp, log=lambda _m: None)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(exp), "--port", str(port),
                               "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}/data/plugin/scalars"
    run = "n00016_w08_s0/tensorboard"
    try:
        tags, deadline = None, time.monotonic() + 25
        while time.monotonic() < deadline and server.poll() is None:
            tags = get_json(f"{base}/tags")
            if isinstance(tags, dict) and len(tags) == 2 and all(EVALUATION_TAGS <= set(t) for t in tags.values()):
                break
            time.sleep(0.5)
        assert server.poll() is None, server.stderr.read().decode()[-2000:]
        assert isinstance(tags, dict) and set(tags) == {run, "n00032_w08_s0/tensorboard"}, tags
        assert all(EVALUATION_TAGS <= set(t) for t in tags.values()), tags
        query = urllib.parse.urlencode({"run": run, "tag": "memorization/f_mem"})
        series = get_json(f"{base}/scalars?{query}")
        records = latest_per_step(RunDir(exp / "n00016_w08_s0").metrics())
        assert [point[1] for point in series] == [r["step"] for r in records]
        assert all(close(point[2], r["f_mem"]) for point, r in zip(series, records))
        experiment = get_json(f"http://127.0.0.1:{port}/data/plugin/hparams/experiment", {"experimentName": ""})
        assert {"n", "width", "seed", "lr", "batch", "data_source"} <= {h["name"] for h in experiment["hparamInfos"]}
    finally:
        server.kill()
        server.wait(timeout=10)
        server.stderr.close()


def test_a_damaged_or_oversized_sample_grid_costs_one_warning_and_the_rest_is_written(tmp_path):
    """One grid that is not a PNG, one whose header claims 5000 x 5000 pixels: each is named in one warning and
    left out; every other point of the run, and the other runs, are written."""
    import struct
    import zlib

    from diffmem.analysis.synthetic import write_synthetic_experiment
    from diffmem.tensorboard.rebuild import write_tensorboard

    planted = write_synthetic_experiment(tmp_path, [64, 128], widths=[8], n_evals=6, steps=lambda n, w: 400 * n,
                                         tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 100.0 * n,
                                         sample_grids=True)
    run = RunDir(planted[0].path)
    grids = sorted(run.samples_dir.glob("step_*.png"))
    grids[0].write_bytes(b"not a png at all")
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 5000, 5000, 8, 0, 0, 0, 0)  # 25 M pixels: below PIL's bomb limit
    grids[1].write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b""))
                         + chunk(b"IEND", b""))
    with pytest.warns(UserWarning) as caught:
        summary = write_tensorboard(tmp_path, log=lambda _: None)
    named = [str(w.message) for w in caught if "left out of TensorBoard" in str(w.message)]
    assert len(named) == 2 and grids[0].name in named[0] + named[1] and grids[1].name in named[0] + named[1]
    assert any("5000x5000" in message for message in named)  # the header alone was read
    assert summary.folders == 2 and summary.points > 0
