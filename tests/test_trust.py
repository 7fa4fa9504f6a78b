"""A folder, a weights file or a cache from elsewhere is data, never code (issue 40, its security half).

Every crafted file here is a pickle whose only effect, if anything unpickled it without restriction, would be to
create a marker file; each test asserts that the marker never appears, and that the command either works from
diffmem's own JSON records or stops with one line naming the file. Damaged job records (sweep.json,
submissions.json, job.json) give one line naming the file, exit 2, and leave the folder as it was.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from diffmem.cli import main
from diffmem.cluster.base import JobResult
from diffmem.cluster.slurm import SlurmJobState, wait_slurm
from diffmem.jobrecords import (SUBMITIT_DIR, JobRecordError, read_job, read_plan, read_submissions, record_job_end,
                                record_job_start, record_submission)
from diffmem.metrics import fid as fidmod
from diffmem.metrics.fid import OFFLINE_EXTRACTOR, FIDWeightsError, build_extractor, check_extractor, fid
from diffmem.cluster.runstate import experiment_status, run_status

DEAD_PID = "999999999"  # no process has this id (above Linux's pid_max)


class Payload:
    """Unpickled without restriction, creates ``marker`` (and nothing else)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant_pickle(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(Payload(marker), f)
    return path


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its content: compared before and after a command that must change nothing."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def submitted_run(exp: Path, name: str, job_id: str, cluster: str = "local", started: bool = True,
                  outcome: str | None = None, error: str | None = None) -> Path:
    """A run folder with one submitted job (log paths as a sweep records them) and, if ``started``, the job's own
    record, ended with ``outcome`` when given."""
    run = exp / name
    run.mkdir(parents=True)
    logs = exp.absolute() / SUBMITIT_DIR
    record_submission(run, job_id=job_id, cluster=cluster, kind="train", steps=20, stdout=str(logs / f"{job_id}_0_log.out"),
                      stderr=str(logs / f"{job_id}_0_log.err"))
    if started:
        record_job_start(run, "train", job_id)
        job = json.loads((run / "job.json").read_text())
        (run / "job.json").write_text(json.dumps(job | {"pid": int(DEAD_PID)}))  # its process is gone
        if outcome:
            record_job_end(run, outcome, step=20 if outcome == "done" else None, error=error)
    return run


# --- case 1: job outcomes come from diffmem's JSON records, never from submitit's result pickles ------------------

@pytest.mark.parametrize("cluster, job_id, started, outcome, state", [
    ("local", DEAD_PID, False, None, "new"),  # submitted, its controller gone: the old code read the result pickle
    ("local", DEAD_PID, True, None, "failed"),  # started here, its process gone without reporting an end
    ("local", DEAD_PID, True, "failed", "failed"),  # the job's own error line
    ("slurm", "4242", True, None, "failed"),  # Slurm cannot be asked here (no scontrol): the records decide
    ("slurm", "4242_3", False, None, "queued"),
])
def test_status_never_unpickles_a_result_file_of_submitit(cluster, job_id, started, outcome, state, tmp_path, capsys,
                                                         monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # no scontrol / sacct: Slurm is unreachable
    exp, marker = tmp_path / "exp", tmp_path / "MARKER"
    submitted_run(exp, "n00008_w08_s0", job_id, cluster, started, outcome,
                  error="DataError: data.n = 80 is too large" if outcome == "failed" else None)
    plant_pickle(exp / SUBMITIT_DIR / f"{job_id}_0_result.pkl", marker)
    before = tree(exp)
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert not marker.exists()
    assert tree(exp) == before
    (row,) = experiment_status(exp)
    assert row.state == state and row.job_id == job_id
    if outcome == "failed":
        assert row.error == "DataError: data.n = 80 is too large" and "n00008_w08_s0 failed: DataError" in out
    elif state == "failed":
        assert "without reporting an end" in row.error
    assert not marker.exists()


def test_status_of_a_done_run_never_unpickles_its_result_file(tmp_path, capsys):
    exp, marker = tmp_path / "exp", tmp_path / "MARKER"
    run = submitted_run(exp, "n00008_w08_s0", DEAD_PID, "local", started=False)  # e.g. job.json not kept
    (run / "done").write_text("")
    plant_pickle(exp / SUBMITIT_DIR / f"{DEAD_PID}_0_result.pkl", marker)
    assert main(["status", str(exp)]) == 0
    assert not marker.exists()


def test_a_job_that_failed_before_it_wrote_a_record_is_read_from_its_error_log(tmp_path):
    """A job whose pickled function could not even be loaded writes no job.json: status reads why from the error
    lines of its log (text), as it once read the result pickle."""
    exp = tmp_path / "exp"
    submitted_run(exp, "n00008_w08_s0", DEAD_PID, "local", started=False)
    log = exp / SUBMITIT_DIR / f"{DEAD_PID}_0_log.err"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "ModuleNotFoundError: No module named 'diffmem'\nUserWarning: not this line\n")
    (row,) = experiment_status(exp)
    assert row.state == "failed" and row.error == "ModuleNotFoundError: No module named 'diffmem'"


@pytest.mark.parametrize("job_id", ["../n00004_w08_s0/samples/x", "/tmp/x", "12 34", "-j1", "", "DEBUG_../x", 12])
def test_a_job_id_that_is_not_a_job_id_is_refused_with_one_line(job_id, tmp_path, capsys):
    exp, marker = tmp_path / "exp", tmp_path / "MARKER"
    run = submitted_run(exp, "n00008_w08_s0", "123", "local", started=False)
    data = json.loads((run / "submissions.json").read_text())
    data["submissions"][0]["job_id"] = job_id
    (run / "submissions.json").write_text(json.dumps(data))
    if isinstance(job_id, str) and job_id:  # what the old code unpickled: <.submitit>/<job id>_0_result.pkl
        target = exp / SUBMITIT_DIR / f"{job_id}_0_result.pkl"
        if not job_id.startswith("/") and " " not in job_id:
            plant_pickle(target.resolve(), marker)
    before = tree(exp)
    assert main(["status", str(exp)]) == 2
    err = one_line_error(capsys)
    assert "submissions.json" in err and "job_id" in err and not marker.exists()
    assert tree(exp) == before


def test_a_job_id_in_job_json_that_is_not_a_job_id_is_refused(tmp_path, capsys):
    exp = tmp_path / "exp"
    run = submitted_run(exp, "n00008_w08_s0", "123", "local")
    job = json.loads((run / "job.json").read_text())
    job["job_id"] = "../../etc"
    (run / "job.json").write_text(json.dumps(job))
    assert main(["status", str(exp)]) == 2
    err = one_line_error(capsys)
    assert "job.json" in err and "job_id" in err


def test_log_paths_of_submissions_json_are_never_followed_outside_the_experiment(tmp_path, capsys):
    exp = tmp_path / "exp"
    run = submitted_run(exp, "n00008_w08_s0", "4242", "slurm")
    data = json.loads((run / "submissions.json").read_text())
    data["submissions"][0]["stdout"] = "/etc/passwd"
    data["submissions"][0]["stderr"] = "../../elsewhere.err"
    (run / "submissions.json").write_text(json.dumps(data))
    (row,) = experiment_status(exp)
    assert row.log == str(exp.absolute() / SUBMITIT_DIR / "4242_0_log.out")  # the job id's own log, always
    assert row.error_log == str(exp.absolute() / SUBMITIT_DIR / "4242_0_log.err")


def test_a_slurm_wait_reads_the_outcome_from_job_json_never_the_result_pickle(tmp_path, monkeypatch):
    exp, marker = tmp_path / "exp", tmp_path / "MARKER"
    submitted_run(exp, "a", "7001", "slurm", True, "done")
    submitted_run(exp, "b", "7002", "slurm", True, "failed", error="DataError: bad")
    submitted_run(exp, "c", "7003", "slurm", True, None)  # started, ended without a record: Slurm's word
    for job_id in ("7001", "7002", "7003"):
        plant_pickle(exp / SUBMITIT_DIR / f"{job_id}_0_result.pkl", marker)
    states = {"7001": SlurmJobState("COMPLETED"), "7002": SlurmJobState("FAILED", exit_code="1:0"),
              "7003": SlurmJobState("OUT_OF_MEMORY")}
    monkeypatch.setattr("diffmem.cluster.slurm.slurm_job_state", lambda job_id, fresh=False: states[job_id])
    submitted = [JobResult(name, "train", job_id, "submitted", log=str(exp / SUBMITIT_DIR / f"{job_id}_0_log.out"))
                 for name, job_id in (("a", "7001"), ("b", "7002"), ("c", "7003"))]
    results = wait_slurm(submitted, exp, poll_s=0.01, log=lambda _m: None)
    assert [(r.status, r.step, r.error) for r in results[:2]] == [("done", 20, None), ("failed", None, "DataError: bad")]
    assert results[2].status == "failed" and "OUT_OF_MEMORY" in results[2].error
    assert not marker.exists()


@pytest.mark.e2e
def test_a_local_sweep_never_unpickles_anything_in_its_process(tmp_path, monkeypatch, capsys):
    """The sweep's own process submits local jobs (pickling them for submitit's runner) and reads what became of
    them from job.json: nothing in it unpickles, also not the result files its jobs write."""
    from tiny_runs import TINY_GRID, sets

    exp, marker = tmp_path / "exp", tmp_path / "MARKER"
    earlier = submitted_run(exp, "n00080_w08_s0", DEAD_PID, "local", started=False)  # an earlier sweep's job
    plant_pickle(exp / SUBMITIT_DIR / f"{DEAD_PID}_0_result.pkl", marker)

    def refuse(*args, **kwargs):
        raise AssertionError("the sweep process unpickled something")

    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    config = tmp_path / "grid.toml"
    config.write_text("[sweep]\nn = [80]\nwidth = [8]\n")
    code = main(["sweep", str(config), "--out", str(exp), "--cluster", "local", "--no-progress", *sets(TINY_GRID)])
    out = capsys.readouterr().out
    # n = 80 does not fit the data: the job fails, and its error line comes from the job.json it wrote
    assert code == 1 and "n00080_w08_s0 train job" in out and "failed: DataError: data.n = 80" in out, out
    (_, sub) = read_submissions(earlier)
    assert read_job(earlier)["job_id"] == sub["job_id"] and read_job(earlier)["outcome"] == "failed"
    assert not marker.exists()


# --- case 4: names and ids from a folder's files stay inside the folder ---------------------------------------------

@pytest.mark.parametrize("name", ["../elsewhere", "/tmp", "a/b", ".", "..", ".hidden", "x\ny", ""])
def test_a_run_name_in_sweep_json_that_is_a_path_is_refused(name, tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    (exp / "sweep.json").write_text(json.dumps({"runs": {"n00008_w08_s0": 20, name: 20}}))
    before = tree(tmp_path)
    assert main(["status", str(exp)]) == 2
    err = one_line_error(capsys)
    assert "sweep.json" in err and repr(name) in err and "runs" in err
    assert tree(tmp_path) == before


def test_run_names_that_are_names_are_read(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "sweep.json").write_text(json.dumps({"runs": {"n00008_w08_s0": 20, "n00008_w08_s0_split1": None}}))
    assert read_plan(exp) == {"n00008_w08_s0": 20, "n00008_w08_s0_split1": None}
    assert [r.state for r in experiment_status(exp)] == ["new", "new"]


# --- case 5: damaged job records: one line naming the file, exit 2, nothing changed ------------------------------

DAMAGED_RECORDS = [
    ("sweep.json", "{\"runs\": {\"n00008_w08_s0\": 2"),  # cut short
    ("sweep.json", "[1, 2]"),
    ("sweep.json", "{\"runs\": [\"n00008_w08_s0\"]}"),
    ("sweep.json", "{\"runs\": {\"n00008_w08_s0\": \"twenty\"}}"),
    ("sweep.json", "{\"runs\": {\"n00008_w08_s0\": -5}}"),
    ("n00008_w08_s0/submissions.json", "{\"submissions\": [{\"job_id\": \"1\""),
    ("n00008_w08_s0/submissions.json", "{\"submissions\": {}}"),
    ("n00008_w08_s0/submissions.json", "{\"submissions\": [{\"cluster\": \"local\"}]}"),
    ("n00008_w08_s0/submissions.json", "{\"submissions\": [{\"job_id\": \"1\", \"cluster\": \"mars\", "
                                       "\"kind\": \"train\", \"submitted\": \"2026-01-01T00:00:00+00:00\"}]}"),
    ("n00008_w08_s0/submissions.json", "{\"submissions\": [{\"job_id\": \"1\", \"cluster\": \"local\", "
                                       "\"kind\": \"train\", \"submitted\": 5}]}"),
    ("n00008_w08_s0/job.json", "{\"job_id\": \"12"),
    ("n00008_w08_s0/job.json", "null"),
    ("n00008_w08_s0/job.json", "{\"job_id\": \"123\", \"host\": \"h\", \"pid\": \"many\", \"started\": \"x\"}"),
    ("n00008_w08_s0/job.json", "{\"job_id\": \"123\", \"host\": \"h\", \"pid\": 1, \"started\": \"x\", "
                               "\"outcome\": \"exploded\"}"),
    ("n00008_w08_s0/job.json", "{\"job_id\": \"123\", \"host\": \"h\", \"pid\": 1, \"started\": \"x\", "
                               "\"signals\": \"SIGTERM\"}"),
]


@pytest.mark.parametrize("file, text", DAMAGED_RECORDS)
def test_a_damaged_job_record_is_one_line_naming_it_and_nothing_changes(file, text, tmp_path, capsys):
    exp = tmp_path / "exp"
    submitted_run(exp, "n00008_w08_s0", "123", "local")
    (exp / "sweep.json").write_text(json.dumps({"runs": {"n00008_w08_s0": 20}}))
    (exp / file).write_text(text)
    before = tree(exp)
    assert main(["status", str(exp)]) == 2
    err = one_line_error(capsys)
    assert Path(file).name in err and str(exp) in err
    assert "delete" in err or "restore" in err  # what to do
    assert tree(exp) == before


@pytest.mark.parametrize("file, text", [DAMAGED_RECORDS[0], DAMAGED_RECORDS[6], DAMAGED_RECORDS[12]])
def test_a_sweep_over_a_damaged_job_record_is_one_line_and_trains_nothing(file, text, tmp_path, capsys):
    from tiny_runs import TINY_GRID, sets

    exp = tmp_path / "exp"
    submitted_run(exp, "n00008_w08_s0", DEAD_PID, "local")
    (exp / "sweep.json").write_text(json.dumps({"runs": {"n00008_w08_s0": 20}}))
    (exp / file).write_text(text)
    config = tmp_path / "grid.toml"
    config.write_text("[sweep]\nn = [8]\nwidth = [8]\n")
    before = tree(exp)
    assert main(["sweep", str(config), "--out", str(exp), "--cluster", "debug", "--no-progress",
                 *sets(TINY_GRID)]) == 2
    err = one_line_error(capsys)
    assert Path(file).name in err
    assert tree(exp) == before


def test_a_job_record_or_log_that_is_a_pipe_is_never_opened(tmp_path, capsys):
    """Opening a pipe would block status forever: a record that is not a regular file is one line, a log is
    skipped."""
    import os

    exp = tmp_path / "exp"
    run = submitted_run(exp, "n00008_w08_s0", DEAD_PID, "local", started=False)
    (exp / SUBMITIT_DIR).mkdir()
    os.mkfifo(exp / SUBMITIT_DIR / f"{DEAD_PID}_0_log.err")
    (row,) = experiment_status(exp)
    assert row.state == "new"
    os.mkfifo(run / "job.json")
    assert main(["status", str(exp)]) == 2
    err = one_line_error(capsys)
    assert "job.json" in err and "not a regular file" in err


def test_records_written_by_diffmem_read_back(tmp_path):
    run = submitted_run(tmp_path / "exp", "r", "55_2", "slurm", True, "requeued")
    record_job_end(run, "done", step=20)
    assert read_submissions(run)[0]["job_id"] == "55_2" and read_job(run)["outcome"] == "done"
    assert run_status(run).job_id == "55_2"
    with pytest.raises(JobRecordError, match="job.json"):
        (run / "job.json").write_text("[]")
        read_job(run)


# --- case 2: --fid-weights is loaded with weights_only=True before torch-fidelity sees it --------------------------

@pytest.fixture
def images() -> torch.Tensor:
    return torch.randint(0, 256, (24, 1, 16, 16), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def test_a_crafted_weights_file_runs_nothing_and_is_one_line_naming_it(images, tmp_path):
    marker, weights = tmp_path / "MARKER", tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": Payload(marker)}, weights)
    with pytest.raises(FIDWeightsError) as info:
        fid(images[:12], images[12:], "k", tmp_path / "cache", extractor="inception", weights=weights)
    message = str(info.value)
    assert "\n" not in message and str(weights) in message and not marker.exists()


def test_a_crafted_weights_file_through_the_cli_runs_nothing(tmp_path, capsys):
    marker, weights = tmp_path / "MARKER", tmp_path / "w.pth"
    with open(weights, "wb") as f:
        pickle.dump(Payload(marker), f)
    run = tmp_path / "run"
    from tiny_runs import TINY, sets

    config = tmp_path / "c.toml"
    config.write_text("")
    # training checks the weights before it writes anything
    assert main(["train", str(config), "--out", str(run), "--no-progress", "--fid-weights", str(weights),
                 *sets(TINY + ["eval.fid_extractor=inception"])]) == 2
    err = one_line_error(capsys)
    assert str(weights) in err and not marker.exists() and not run.exists()


def test_a_state_dict_weights_file_builds_the_inception_extractor_with_those_weights(tmp_path):
    """Genuine weights (a state dict of tensors) pass the safe load and become the extractor's weights; here random
    weights of the right shapes, as no test downloads the real ones."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class Unloaded(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, *args, **kwargs):  # keep the random initial weights
            return None

    empty = tmp_path / "empty.pth"
    torch.save({}, empty)
    torch.manual_seed(0)
    state = Unloaded("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(empty)).state_dict()
    weights = tmp_path / "weights.pth"
    torch.save(state, weights)
    built = build_extractor("inception-v3-compat", "2048", weights, {"cuda": False, "verbose": False})
    assert isinstance(built, FeatureExtractorInceptionV3)
    got = built.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)
    assert check_extractor("inception", weights) == "inception-v3-compat"
    del state["fc.weight"]
    torch.save(state, weights)
    with pytest.raises(FIDWeightsError, match="does not hold torch-fidelity's Inception-v3 weights"):
        build_extractor("inception-v3-compat", "2048", weights, {"cuda": False})


# --- case 3: the reference-statistics cache is .npz read without pickles ------------------------------------------

def old_cache_name(key: str, n: int, height: int, width: int) -> str:
    """The name torch-fidelity's pickled cache files had before (diffmem <= this change)."""
    safe = re.sub(r"[^A-Za-z0-9._+-]+", "_", key).strip("_")[:80]
    digest = hashlib.sha256(f"{key}|{n}|{height}x{width}".encode()).hexdigest()[:10]
    return f"diffmem-{safe}-n{n}-{height}x{width}-{digest}"


def test_an_old_pickled_cache_is_never_read_and_is_computed_again(images, tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "MARKER"
    old = old_cache_name("k", 12, 16, 16)
    plant_pickle(cache / f"{old}-{OFFLINE_EXTRACTOR}-stat-fid-256.pt", marker)
    plant_pickle(cache / f"{old}-{OFFLINE_EXTRACTOR}-features-256.pt", marker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fid(images[:12], images[12:], "k", cache, extractor=OFFLINE_EXTRACTOR).value
    assert not marker.exists()
    said = [str(w.message) for w in caught if ".pt" in str(w.message)]
    assert len(said) == 1 and "not read" in said[0] and "\n" not in said[0]
    fresh = fid(images[:12], images[12:], "k", tmp_path / "fresh", extractor=OFFLINE_EXTRACTOR).value
    assert value == fresh


def test_the_cache_is_npz_named_with_the_device_kind_and_reads_back_without_pickles(images, tmp_path):
    cache = tmp_path / "cache"
    first = fid(images[:12], images[12:], "k", cache, extractor=OFFLINE_EXTRACTOR).value
    (entry,) = cache.iterdir()
    assert entry.suffix == ".npz" and "-cpu-" in entry.name
    with np.load(entry, allow_pickle=False) as stored:
        assert stored["mu"].shape == (256,) and stored["sigma"].shape == (256, 256)
    assert fid(images[:12], images[12:], "k", cache, extractor=OFFLINE_EXTRACTOR).value == first


@pytest.mark.parametrize("damage", ["truncated", "object array", "wrong shape", "not finite", "other key"])
def test_a_damaged_cache_file_is_named_in_one_warning_and_computed_again(damage, images, tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "MARKER"
    first = fid(images[:12], images[12:], "k", cache, extractor=OFFLINE_EXTRACTOR).value
    (entry,) = cache.iterdir()
    with np.load(entry, allow_pickle=False) as stored:
        arrays = {k: stored[k] for k in stored.files}
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:300])
    elif damage == "object array":
        arrays["mu"] = np.array([Payload(marker)], dtype=object)
        np.savez(entry, **arrays)
    elif damage == "wrong shape":
        arrays["sigma"] = arrays["sigma"][:3]
        np.savez(entry, **arrays)
    elif damage == "not finite":
        arrays["mu"][0] = np.nan
        np.savez(entry, **arrays)
    else:
        arrays["identity"] = np.array("another set")
        np.savez(entry, **arrays)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = fid(images[:12], images[12:], "k", cache, extractor=OFFLINE_EXTRACTOR).value
    said = [str(w.message) for w in caught if entry.name in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "computing it again" in said[0]
    assert again == first and not marker.exists()
    with np.load(entry, allow_pickle=False) as stored:  # written again, whole
        assert np.isfinite(stored["mu"]).all()


def test_a_run_folder_cannot_make_evaluate_unpickle_a_shipped_cache_nor_weights(tmp_path, capsys, monkeypatch):
    """config.json's data.cache_dir may point at files shipped inside the run folder: they are read as .npz, so the
    shipped pickles are never loaded; a crafted --fid-weights file stops `diffmem evaluate` with one line before it
    writes anything."""
    from diffmem.data import load_images, make_splits
    from diffmem.metrics.fid import make_reference_key
    from tiny_runs import TINY, sets, tiny_config

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))  # no Inception weights: "auto" is
    monkeypatch.delenv(fidmod.WEIGHTS_ENV_VAR, raising=False)                # the offline extractor
    run, marker = tmp_path / "run", tmp_path / "MARKER"
    config = tmp_path / "c.toml"
    config.write_text("")
    shipped = run / "shipped"
    assert main(["train", str(config), "--out", str(run), "--no-progress",
                 *sets(TINY + ["train.steps=8", "eval.times=[8]", "eval.inline=false", "eval.fid_extractor=auto",
                               f"data.cache_dir={json.dumps(str(shipped))}"])]) == 0
    # the names torch-fidelity's pickled cache of this run's reference set had
    images = load_images(tiny_config().data)
    splits = make_splits(images, tiny_config().data)
    n_ref = len(splits.heldout)
    old = old_cache_name(make_reference_key(images.sha256, n_ref, start=splits.heldout_range[0]), n_ref, 16, 16)
    for name in ("stat-fid-256.pt", "features-256.pt"):
        plant_pickle(shipped / "fid_stats" / f"{old}-{OFFLINE_EXTRACTOR}-{name}", marker)
    weights = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    torch.save({"fc.weight": Payload(marker)}, weights)
    capsys.readouterr()
    before = tree(run)
    assert main(["evaluate", str(run), "--device", "cpu", "--fid-weights", str(weights)]) == 2
    err = one_line_error(capsys)
    assert str(weights) in err and "could run code" in err and not marker.exists()
    assert tree(run) == before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "auto" without Inception weights: the offline extractor, with a warning
        assert main(["evaluate", str(run), "--device", "cpu"]) == 0, capsys.readouterr().err
    assert not marker.exists()
    assert json.loads((run / "config.json").read_text())["config"]["data"]["cache_dir"] == str(shipped)
    assert list((shipped / "fid_stats").glob("*.npz"))
