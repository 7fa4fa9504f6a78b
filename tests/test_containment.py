"""No command writes, replaces or deletes anything outside the folder it was given, whatever links the folder holds
(issue 61): the one helper every writer asks (diffmem.io.contained), the cleanup of temporary files by name, the
event files of TensorBoard, the figures and every output of `diffmem analyze`. Each class of writer has a case."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from diffmem.io import OutsideFolder, contained, is_temp_name
from diffmem.rundir import RunDir


@pytest.mark.unit
def test_contained_refuses_every_link_between_the_folder_and_the_path(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (root / "linked").symlink_to(outside)
    (root / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    assert contained(root, root / "real" / "a.png") == root / "real" / "a.png"
    assert contained(root, root / "new" / "b.png") == root / "new" / "b.png"  # not there yet: fine
    for path in (root / "linked" / "a.png", root / "linked", root / "dangling.json"):
        with pytest.raises(OutsideFolder, match="is a symbolic link"):
            contained(root, path)
    with pytest.raises(OutsideFolder, match="is not inside"):
        contained(root, tmp_path / "elsewhere.png")


@pytest.mark.unit
def test_only_diffmem_temporary_names_count_as_temporary():
    targets = re.compile(r"step_\d{9}\.pt")
    assert is_temp_name(".step_000000010.pt.a1b2_c3d.tmp", targets)
    for name in (".step_000000010.pt.tmp", ".notes.txt.a1b2c3d4.tmp", ".anything.tmp", "step_000000010.pt",
                 ".step_000000010.pt.a1b2c3d4.tmp.png"):
        assert not is_temp_name(name, targets), name


@pytest.mark.unit
def test_a_rerun_cleans_up_only_its_own_temporary_files_even_in_a_linked_checkpoint_folder(tmp_path):
    """checkpoints/ on a bigger disk through a link is legitimate: a rerun removes diffmem's temporary files there and
    nothing else; a scratch folder of a retraining that is a link is left alone."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    disk = tmp_path / "big_disk"
    disk.mkdir()
    run.checkpoint_dir.symlink_to(disk)
    ours = [disk / ".step_000000010.pt.abcd1234.tmp", run.path / ".state.pt.zz9_xx0y.tmp"]
    theirs = [disk / ".model.ckpt.abcd1234.tmp", disk / ".other.tmp", run.path / ".notes.tmp"]
    for p in ours + theirs:
        p.write_text("x")
    elsewhere = tmp_path / "scratch_elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    (run.path / ".retrain.1").symlink_to(elsewhere)
    removed = run.remove_temp_files()
    assert sorted(p.name for p in removed) == sorted(p.name for p in ours) and not any(p.exists() for p in ours)
    assert all(p.exists() for p in theirs) and (elsewhere / "keep").exists()


@pytest.mark.unit
def test_the_event_writer_never_writes_through_a_link(tmp_path):
    from diffmem.tensorboard.eventdir import EventDir, Point
    from tensorboard.compat.proto.summary_pb2 import Summary

    folder = tmp_path / "run" / "tensorboard"
    folder.mkdir(parents=True)
    target = tmp_path / "victim"
    # a dangling link with every name the writer could pick in the next seconds
    for k in range(5):
        (folder / f"events.out.tfevents.{int(__import__('time').time()) + k:010d}.diffmem").symlink_to(target)
    events = EventDir(folder)
    events.sync([Point(1, Summary.Value(tag="a", simple_value=1.0)), Point(2, Summary.Value(tag="a", simple_value=2.0))])
    events.sync([Point(1, Summary.Value(tag="a", simple_value=3.0))])  # a rewrite: deletes its own files only
    events.close()
    assert not target.exists()
    assert sum(1 for p in folder.iterdir() if p.is_symlink()) == 5
    linked = tmp_path / "run2" / "tensorboard"
    linked.parent.mkdir()
    other = tmp_path / "other_runs_events"
    other.mkdir()
    (other / "events.out.tfevents.0000000001.diffmem").write_bytes(b"theirs")
    linked.symlink_to(other)
    with pytest.raises(OutsideFolder, match="symbolic link"):
        EventDir(linked)
    assert (other / "events.out.tfevents.0000000001.diffmem").read_bytes() == b"theirs"


@pytest.mark.e2e
@pytest.mark.parametrize("linked", ["figures", "images", "summary.csv"])
def test_analyze_refuses_a_linked_output_before_writing_anything(linked, tmp_path, capsys):
    from diffmem.analysis.synthetic import write_synthetic_experiment
    from diffmem.cli import main

    exp = tmp_path / "exp"
    write_synthetic_experiment(exp, [64, 128], widths=[8], n_evals=12, steps=lambda n, w: 400 * n,
                               tau_gen=lambda n, w: 2000.0, tau_mem=lambda n, w: 100.0 * n)
    outside = tmp_path / "users_folder"
    outside.mkdir()
    (outside / "scaling.pdf").write_bytes(b"the user's own figure")
    (exp / linked).symlink_to(outside if "." not in linked else outside / "scaling.pdf")
    before = sorted(p.name for p in exp.iterdir())
    assert main(["analyze", str(exp), "--no-pdf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a symbolic link" in err[0] and linked in err[0]
    assert (outside / "scaling.pdf").read_bytes() == b"the user's own figure"
    assert sorted(os.listdir(outside)) == ["scaling.pdf"] and sorted(p.name for p in exp.iterdir()) == before


@pytest.mark.unit
def test_a_figure_folder_that_is_a_link_is_refused(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from diffmem.figures.style import FigureOutput

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.pdf").write_bytes(b"theirs")
    (tmp_path / "figures").symlink_to(outside)
    fig = plt.figure()
    with pytest.raises(OutsideFolder):
        FigureOutput(Path(tmp_path / "figures"), pdf=False).save(fig, "x")
    plt.close(fig)
    assert sorted(os.listdir(outside)) == ["x.pdf"]
