"""Every bad input is one line on stderr naming what to do, exit 2, nothing half-written and no run marked done.

One row per bad input; docs/commands.md ("Errors") lists the same cases. The second half holds the cases of issue #28
on a finished tiny run (damaged run files, recovery paths, analyses that mix what cannot be mixed): each asserts the
one-line message, exit 2 and a folder left byte for byte as it was, or, for the recovery paths, that nothing is lost.
"""
import json
import shutil
from pathlib import Path

import pytest
import torch

from diffmem.analysis.runfiles import read_csv
from diffmem.cli import main
from diffmem.rundir import RunDir
from diffmem.cluster.runstate import run_status
from tiny_runs import SMOKE, sets



def _a_file(tmp_path: Path) -> Path:
    path = tmp_path / "results.txt"
    path.write_text("not an experiment folder\n")
    return path


def corrupt_celeba(celeba_root):
    root = celeba_root(n=6)
    image = root / "celeba" / "img_align_celeba" / "000003.jpg"
    image.write_bytes(image.read_bytes()[:50])
    return root


CASES = {
    # data
    "celeba root missing": (lambda t, c: ["prepare", "celeba", "--root", str(t / "nope")], "does not exist"),
    "celeba root empty": (lambda t, c: ["prepare", "celeba", "--root", str((t / "empty").mkdir() or t / "empty")],
                          "img_align_celeba"),
    "wrong layout": (lambda t, c: ["prepare", "celeba", "--root", str(_wrong_layout(t))], "img_align_celeba"),
    "corrupt image": (lambda t, c: ["prepare", "celeba", "--root", str(corrupt_celeba(c))], "000003.jpg"),
    "N larger than the data": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["data.n=65"])],
                               "larger than the training part"),
    "N < 2": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["data.n=1"])], "at least 2 images"),
    "subset index out of range": (lambda t, c: ["train", "CFG", "--out", "OUT",
                                                *sets(SMOKE + ["data.n=32", "data.subset_index=2"])], "out of range"),
    "held-out pool overlapping everything": (lambda t, c: ["train", "CFG", "--out", "OUT",
                                                           *sets(SMOKE + ["data.n=8", "data.n_heldout=100"])],
                                             "n_heldout"),
    # model and training
    "width not a multiple of the groups": (lambda t, c: ["train", "CFG", "--out", "OUT",
                                                         *sets(SMOKE + ["model.norm_groups=3"])], "multiple of"),
    "image size not divisible": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["data.image_size=18"])],
                                 "multiple of 4"),
    "steps <= 0": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["train.steps=0"])], "must be > 0"),
    "lr <= 0": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["train.lr=0"])], "train.lr = 0.0 must be"),
    "unknown optimizer": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["train.optimizer=sdg"])],
                          "did you mean 'sgd'"),
    "unknown key": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["model.widht=8"])],
                    "did you mean 'width'"),
    "unknown section": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["evall.fid=false"])],
                        "did you mean 'eval'"),
    "wrong value type": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["train.steps=many"])],
                         "expected int"),
    "FID with no Inception weights": (lambda t, c: ["train", "CFG", "--out", "OUT",
                                                    *sets(SMOKE + ["eval.fid_extractor=inception"])],
                                      "weights-inception-2015-12-05-6726825d.pth"),
    # folders that are not runs or experiments
    "evaluate a non-run folder": (lambda t, c: ["evaluate", str(t)], "not a run folder"),
    "analyze a non-experiment folder": (lambda t, c: ["analyze", str(t)], "holds no run folder"),
    "status of a non-experiment folder": (lambda t, c: ["status", str(t / "nope")], "nope"),
    "status of a file": (lambda t, c: ["status", str(_a_file(t))], "is a file, not a folder"),
    "analyze a file": (lambda t, c: ["analyze", str(_a_file(t))], "is a file, not a folder"),
    "advise from a non-experiment folder": (lambda t, c: ["advise", "--n", "8", "--width", "8", "--from", str(t)],
                                            "fits.json"),
    # sweeps
    "sweep with an empty grid": (lambda t, c: ["sweep", "CFG", "--cluster", "debug", "--out", "OUT", *sets(SMOKE)],
                                 "grid is empty"),
    "sweep with duplicate grid points": (lambda t, c: ["sweep", "CFG", "--cluster", "debug", "--out", "OUT",
                                                       *sets(SMOKE + ["sweep.n=[8, 8]"])], "twice"),
    # keys nothing checked before issue #28 (each trained and failed later, or ended in a traceback)
    "lr NaN": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["train.lr=nan"])],
               "train.lr = nan is not a finite number (NaN and infinity are refused)"),
    "lr infinite": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["train.lr=inf"])],
                    "train.lr = inf is not a finite number"),
    "loss_t NaN": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["eval.loss_t=nan"])],
                   "eval.loss_t = nan is not a finite number"),
    "no attention heads": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["model.attention_heads=0"])],
                           "model.attention_heads = 0 must be >= 1"),
    "no U-Net levels": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["model.channel_mult=[]"])],
                        "model.channel_mult = [] must list one multiplier >= 1 per level"),
    "no ResNet blocks": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["model.layers_per_block=0"])],
                         "model.layers_per_block = 0 must be >= 1"),
    "a trillion evaluations": (lambda t, c: ["train", "CFG", "--out", "OUT",
                                             *sets(SMOKE + ["eval.times=1000000000000"])],
                               "eval.times = 1000000000000 must be a count of log-spaced evaluation steps in "
                               "[1, 10000]"),
    "beta_end above 1": (lambda t, c: ["train", "CFG", "--out", "OUT", *sets(SMOKE + ["diffusion.beta_end=1.5"])],
                         "diffusion.beta_start = 0.0001, beta_end = 1.5: need 0 < beta_start < beta_end < 1"),
    "beta_start above beta_end": (lambda t, c: ["train", "CFG", "--out", "OUT",
                                                *sets(SMOKE + ["diffusion.beta_start=0.05"])],
                                  "beta_start = 0.05, beta_end = 0.02: need 0 < beta_start < beta_end < 1"),
    "a NaN time limit": (lambda t, c: ["sweep", "CFG", "--cluster", "local", "--time", "nan", "--out", "OUT",
                                       *sets(SMOKE + ["sweep.n=[8]"])], "--time nan must be a finite number > 0"),
    "an infinite grid ratio": (lambda t, c: ["coverage", "--grid-ratio", "inf", "--n-sim", "1"],
                               "--grid-ratio inf must be a finite number > 1"),
}


def _wrong_layout(tmp_path):
    root = tmp_path / "wrong"
    (root / "photos").mkdir(parents=True)
    (root / "readme.txt").write_text("not images")
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case, tmp_path, celeba_root, capsys):
    make_argv, fragment = CASES[case]
    config = tmp_path / "c.toml"
    config.write_text("")
    out = tmp_path / "out"
    argv = [str(config) if a == "CFG" else str(out) if a == "OUT" else a for a in make_argv(tmp_path, celeba_root)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if ": error: " in line]
    assert len(errors) == 1 and fragment in errors[0], err
    assert not out.exists()  # nothing written, no run marked done


@pytest.mark.e2e
def test_rerun_with_a_different_config_lists_the_differing_keys(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("")
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--no-progress", *sets(SMOKE + ["data.n=8"])]) == 0
    capsys.readouterr()
    assert main(["train", str(config), "--out", str(out), *sets(SMOKE + ["data.n=8", "train.lr=0.5"])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.lr: 0.01 -> 0.5" in err


def test_a_truncated_last_metrics_line_is_skipped_with_a_warning(tmp_path, capsys):
    from diffmem.analysis.synthetic import write_synthetic_experiment

    write_synthetic_experiment(tmp_path / "exp", ns=[128, 256], widths=[32], steps=lambda n, w: 3000 * n)
    metrics = next((tmp_path / "exp").glob("*/metrics.jsonl"))
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    assert main(["analyze", str(tmp_path / "exp"), "--no-figures"]) == 0
    captured = capsys.readouterr()
    assert "truncated" in captured.err and "2 run(s)" in captured.out
    assert json.loads((tmp_path / "exp" / "fits.json").read_text())["tau_mem_vs_n"]


def test_skip_bad_skips_and_counts_the_corrupt_image(tmp_path, celeba_root, capsys):
    root = corrupt_celeba(celeba_root)
    out = tmp_path / "c.pt"
    assert main(["prepare", "celeba", "--root", str(root), "--size", "8", "--out", str(out), "--skip-bad"]) == 0
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["count"] == 5 and manifest["n_skipped"] == 1


# --- issue #28: damaged run folders, recovery paths, mixed analyses ---------------------------------------------------

# the finished tiny run R0: digits 8x8, N = 16, W = 8, no attention, 40 steps, evaluations at steps 1, 6, 40
R0 = ["data.source=digits", "data.image_size=8", "data.n=16", "data.n_heldout=100", "model.width=8",
      "model.attention=false", "model.norm_groups=1", "train.steps=40", "train.device=cpu", "train.num_threads=1",
      "eval.times=3", "eval.n_samples=16", "eval.sampler_steps=3", "eval.n_boot=10", "eval.loss_n_test=8",
      "eval.fid_extractor=diffmem-pixels", "eval.fid_reference_sets=1", "eval.fid_n_reference=50"]
MIDDLE = 6  # the evaluation step between the first and the last
MEASURED = ("f_mem", "f_mem_lo", "f_mem_hi", "fid", "train_loss", "test_loss")  # what an evaluation measures


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """R0, trained once per test process (a rerun continues it with this process's torch threads)."""
    root = tmp_path_factory.mktemp("r0")
    (root / "c.toml").write_text("")
    assert main(["train", str(root / "c.toml"), "--out", str(root / "R0"), "--no-progress", *sets(R0)]) == 0
    return root / "R0"


@pytest.fixture
def x(finished, tmp_path):
    """X: a fresh copy of R0 in this test's folder."""
    shutil.copytree(finished, tmp_path / "X")
    return RunDir(tmp_path / "X")


def train_argv(run: RunDir, *extra: str) -> list[str]:
    config = run.path.parent / "c.toml"
    config.write_text("")
    return ["train", str(config), "--out", str(run.path), "--no-progress", *sets(R0 + list(extra))]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def fails_and_leaves(folder: Path, argv: list[str], fragment: str, capsys) -> str:
    """Run ``argv``: exit 2, exactly one error line on stderr holding ``fragment`` and no traceback, and ``folder``
    byte for byte as before. Returns the error line."""
    before = snapshot(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and fragment in errors[0] and "Traceback" not in err, err
    assert snapshot(folder) == before
    return errors[0]


def drop_metrics_line(run: RunDir, step: int) -> None:
    lines = run.metrics_path.read_text().splitlines(keepends=True)
    run.metrics_path.write_text("".join(line for line in lines if json.loads(line)["step"] != step))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def record(run: RunDir, step: int) -> dict:
    (line,) = [r for r in run.metrics() if r["step"] == step]
    return {k: line[k] for k in MEASURED}


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = (torch.load(p, weights_only=True)["model"] for p in (a, b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.e2e
def test_a_damaged_checkpoint_names_train_which_writes_it_again_and_evaluates_it(finished, x, capsys):
    """Case 1: the message no longer says "delete it"; the command it gives restores the evaluation."""
    drop_metrics_line(x, MIDDLE)  # the evaluation of that step was lost (a crash), and its checkpoint is damaged
    truncate(x.checkpoint_path(MIDDLE))
    err = fails_and_leaves(x.path, ["evaluate", str(x.path)], "step_000000006.pt is damaged", capsys)
    assert "rerun `diffmem train` with the command that trained this run" in err and "delete" not in err
    assert main(train_argv(x)) == 0
    assert same_weights(x.checkpoint_path(MIDDLE), RunDir(finished).checkpoint_path(MIDDLE))  # bit-identical
    assert (x.checkpoint_dir / "step_000000006.damaged.pt").exists()  # set aside, not deleted
    assert record(x, MIDDLE) == record(RunDir(finished), MIDDLE) and x.is_done()


@pytest.mark.e2e
def test_evaluate_refuses_data_that_are_not_those_the_run_trained_on(finished, x, capsys):
    """A run folder evaluated where its data differ (another copy of the source): its memorization and losses would
    be measured against other images, so `diffmem evaluate` stops with one line and writes nothing."""
    drop_metrics_line(x, MIDDLE)  # work for evaluate to do
    meta = json.loads(x.config_path.read_text())
    x.config_path.write_text(json.dumps({**meta, "dataset_sha256": "0" * 64}))
    err = fails_and_leaves(x.path, ["evaluate", str(x.path)], "differ from those the run trained on", capsys)
    assert "use the copy of the data it trained on" in err


@pytest.mark.e2e
def test_a_deleted_checkpoint_and_done_are_written_again_by_train(finished, x, capsys):
    """Case 1, the issue's reproduction: the checkpoint and `done` deleted (the old advice), train rerun."""
    drop_metrics_line(x, MIDDLE)
    x.checkpoint_path(MIDDLE).unlink()
    x.done_path.unlink()
    assert main(train_argv(x)) == 0
    assert same_weights(x.checkpoint_path(MIDDLE), RunDir(finished).checkpoint_path(MIDDLE))
    assert record(x, MIDDLE) == record(RunDir(finished), MIDDLE) and x.is_done()
    capsys.readouterr()
    assert main(["evaluate", str(x.path)]) == 0 and "already has a metrics line" in capsys.readouterr().out


@pytest.mark.e2e
def test_evaluate_refuses_a_lost_step_and_evaluates_it_once_its_checkpoint_is_back(finished, x, capsys):
    """Case 1, evaluation left to `diffmem evaluate`: a finished run whose step lost its line and its checkpoint is
    refused by evaluate (not "every checkpoint already has a metrics line"); train writes the checkpoint again
    without evaluating it (eval.inline off), and evaluate then evaluates it."""
    drop_metrics_line(x, MIDDLE)
    x.checkpoint_path(MIDDLE).unlink()
    assert run_status(x.path).state == "partial"  # not done: a sweep trains it again
    err = fails_and_leaves(x.path, ["evaluate", str(x.path)],
                           "evaluation step(s) 6 have neither a metrics line nor a checkpoint", capsys)
    assert "rerun `diffmem train`" in err
    assert main(train_argv(x, "eval.inline=false")) == 0
    assert x.checkpoint_path(MIDDLE).exists() and MIDDLE not in x.evaluated_steps()
    assert main(["evaluate", str(x.path)]) == 0
    assert record(x, MIDDLE) == record(RunDir(finished), MIDDLE) and run_status(x.path).state == "done"


@pytest.mark.e2e
def test_extending_a_run_whose_states_are_both_damaged_changes_nothing(finished, x, capsys):
    """Case 2: config.json is not rewritten and `done` not deleted before the state is read."""
    truncate(x.state_path)
    truncate(x.state_prev_path)
    err = fails_and_leaves(x.path, train_argv(x, "train.steps=60"), "cannot resume", capsys)
    assert "state.pt is damaged" in err and "delete" not in err
    for name in ("state.pt", "state.prev.pt"):  # restored: the original command is not refused
        shutil.copy(finished / name, x.path / name)
    assert main(train_argv(x)) == 0 and "already done, skipping" in capsys.readouterr().out


@pytest.mark.e2e
def test_done_without_metrics_is_named_by_analyze_and_evaluated_again_by_train(finished, x, tmp_path, capsys):
    """Case 3: `done` present, metrics.jsonl missing."""
    x.metrics_path.unlink()
    (tmp_path / "analysis").mkdir()
    assert main(["analyze", str(x.path), "--out", str(tmp_path / "analysis")]) == 0
    assert "is marked done but has no evaluations" in capsys.readouterr().err
    assert main(train_argv(x)) == 0
    assert [record(x, s) for s in (1, MIDDLE, 40)] == [record(RunDir(finished), s) for s in (1, MIDDLE, 40)]


def _edit_config(text: str, change) -> str:
    meta = json.loads(text)
    change(meta)
    return json.dumps(meta)


DAMAGED_CONFIGS = {
    "truncated": (lambda t: t[: len(t) // 2], "is not valid JSON"),
    "empty": (lambda t: "", "is empty"),
    "an empty object": (lambda t: "{}", "is not a diffmem run config"),
    "a list": (lambda t: "[1, 2]", "is not a diffmem run config"),
    "a section missing": (lambda t: _edit_config(t, lambda m: m["config"].pop("model")),
                          "lacks the [model] section"),
    "a wrong type": (lambda t: _edit_config(t, lambda m: m["config"]["data"].update(n="16")),
                     "data.n = '16' has the wrong type"),
    "a NaN": (lambda t: t.replace('"lr": 0.01', '"lr": NaN'), "train.lr = nan is not a finite number"),
    "a newer version": (lambda t: _edit_config(t, lambda m: (m.update(diffmem_version="9.0.0"),
                                                             m["config"]["eval"].update(new_key=1))),
                        "was written by diffmem 9.0.0, newer than this diffmem"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("verb", ["train", "evaluate", "status", "analyze"])
@pytest.mark.parametrize("damage", sorted(DAMAGED_CONFIGS))
def test_a_damaged_config_json_is_one_line_naming_it_and_the_way_out(damage, verb, x, capsys):
    """Case 4: one reader of config.json; never a traceback, never advice to delete anything."""
    make, fragment = DAMAGED_CONFIGS[damage]
    x.config_path.write_text(make(x.config_path.read_text()))
    argv = {"train": train_argv(x), "evaluate": ["evaluate", str(x.path)], "status": ["status", str(x.path.parent)],
            "analyze": ["analyze", str(x.path), "--no-figures"]}[verb]
    err = fails_and_leaves(x.path, argv, fragment, capsys)
    assert str(x.config_path) in err and "delete" not in err
    assert ("upgrade diffmem" if damage == "a newer version" else "restore") in err


@pytest.mark.e2e
def test_a_sweep_over_a_run_with_a_damaged_config_json_names_it(x, tmp_path, capsys):
    """Case 4, through `diffmem sweep`: the grid's run folder holds a truncated config.json."""
    experiment = tmp_path / "experiment"
    experiment.mkdir()
    run = experiment / "n00016_w08_s0"
    shutil.move(x.path, run)
    text = (run / "config.json").read_text()
    (run / "config.json").write_text(text[: len(text) // 2])
    (tmp_path / "c.toml").write_text("")
    argv = ["sweep", str(tmp_path / "c.toml"), "--cluster", "debug", "--out", str(experiment), "--no-progress",
            *sets(R0 + ["sweep.n=[16]"])]
    err = fails_and_leaves(experiment, argv, f"{run / 'config.json'} is not valid JSON", capsys)
    assert "restore it from a copy" in err


@pytest.mark.parametrize("verb", ["train", "sweep", "demo", "theory"])
def test_out_naming_a_file_says_it_must_be_a_folder(verb, tmp_path, capsys):
    """Case 7."""
    (tmp_path / "c.toml").write_text("")
    target = tmp_path / "a_file"
    target.write_text("keep me")
    argv = {"train": ["train", str(tmp_path / "c.toml"), *sets(SMOKE)],
            "sweep": ["sweep", str(tmp_path / "c.toml"), "--cluster", "debug", *sets(SMOKE + ["sweep.n=[8]"])],
            "demo": ["demo", "--quick", "--no-progress"], "theory": ["theory", "sweep", "--quick"]}[verb]
    fails_and_leaves(tmp_path, argv + ["--out", str(target)], f"--out {target} is a file, not a folder", capsys)


@pytest.mark.e2e
def test_analyze_refuses_runs_of_another_data_source_and_image_size(x, tmp_path, capsys):
    """Case 8: a digits 8x8 run and an lfw_faces 16x16 run are not fitted as one law; summary.csv says what each
    run was."""
    experiment = tmp_path / "experiment"
    experiment.mkdir()
    shutil.move(x.path, experiment / "n00016_w08_s0")
    assert main(["analyze", str(experiment), "--no-figures"]) == 0
    (row,) = read_csv(experiment / "summary.csv")
    assert (row["data_source"], row["image_size"], row["optimizer"], row["lr"]) == ("digits", 8, "sgd", 0.01)
    for name in ("summary.csv", "fits.json"):
        (experiment / name).unlink()
    faces = experiment / "n00008_w08_s0"
    (tmp_path / "c.toml").write_text("")
    assert main(["train", str(tmp_path / "c.toml"), "--out", str(faces), "--no-progress",
                 *sets(SMOKE + ["data.n=8"])]) == 0
    capsys.readouterr()
    err = fails_and_leaves(experiment, ["analyze", str(experiment)],
                           "differ in data.source (\"lfw_faces\" in n00008_w08_s0, \"digits\" in n00016_w08_s0)",
                           capsys)
    assert "data.image_size (16 in n00008_w08_s0, 8 in n00016_w08_s0)" in err and "not comparable" in err
