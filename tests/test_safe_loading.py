"""Opening a run folder never runs code from it: training states are read with torch.load(weights_only=True)."""
from __future__ import annotations

import pytest
import os

import torch

from diffmem.cli import main
from diffmem.rundir import RunDir
from diffmem.train import train
from tiny_runs import TINY, sets, tiny_config


class Payload:
    """A pickle that would create a file when unpickled by an unrestricted loader."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.e2e
def test_a_crafted_state_runs_nothing_and_stops_with_one_line_naming_it(tmp_path, capsys):
    cfg = tiny_config("train.steps=20", "eval.times=[10, 20]")
    run = RunDir(tmp_path / "run")
    train(cfg, run.path, progress=False, log=lambda s: None)
    assert run.state_prev_path.exists()  # a good previous state that a fallback could hide the problem behind
    marker = tmp_path / "PWNED"
    state = torch.load(run.state_path, weights_only=True)
    state["rng"] = Payload(marker)
    torch.save(state, run.state_path)
    run.done_path.unlink()
    empty = tmp_path / "c.toml"
    empty.write_text("")
    code = main(["train", str(empty), "--out", str(run.path), "--no-progress",
                 *sets(TINY + ["train.steps=20", "eval.times=[10, 20]"])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "state.pt" in err and "could run code" in err
    assert not marker.exists()
    assert not run.done_path.exists() and not (run.path / "state.damaged.pt").exists()


@pytest.mark.e2e
def test_states_written_by_diffmem_load_with_weights_only(tmp_path):
    cfg = tiny_config("train.steps=12", "eval.times=[6, 12]", "train.optimizer=sgd", "train.lr=0.01")
    run = RunDir(tmp_path / "run")
    train(cfg, run.path, progress=False, log=lambda s: None, stop_at_step=6)
    state = torch.load(run.state_path, weights_only=True)  # raises if anything but plain data were stored
    assert state["step"] == 6 and isinstance(state["rng"]["generator"], torch.Tensor)
    assert train(cfg, run.path, progress=False, log=lambda s: None).status == "done"
