"""Every bad input is one line on stderr naming what to do, exit 2, nothing half-written and no run marked done.

One row per bad input; docs/commands.md ("Errors") lists the same cases.
"""
import json

import pytest

from diffmem.cli import main
from tiny_runs import SMOKE, sets



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
    "advise from a non-experiment folder": (lambda t, c: ["advise", "--n", "8", "--width", "8", "--from", str(t)],
                                            "fits.json"),
    # sweeps
    "sweep with an empty grid": (lambda t, c: ["sweep", "CFG", "--cluster", "debug", "--out", "OUT", *sets(SMOKE)],
                                 "grid is empty"),
    "sweep with duplicate grid points": (lambda t, c: ["sweep", "CFG", "--cluster", "debug", "--out", "OUT",
                                                       *sets(SMOKE + ["sweep.n=[8, 8]"])], "twice"),
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
