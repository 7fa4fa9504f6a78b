"""A run folder's training state files: ``state.pt`` and its previous version ``state.prev.pt``, read without
executing code from them, and the choice of the one a run resumes from (:func:`load_resume_state`). They are written
by :func:`diffmem.train.train` (atomically, keeping the previous one: :func:`diffmem.io.atomic_torch_save`).
"""
from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from diffmem.rundir.folder import RunDir

STATE_KEYS = ("step", "model", "optimizer", "batcher", "rng")  # what every training state holds
START_AGAIN = "move the run folder aside (it keeps its checkpoints and metrics) and rerun to train again from step 0"


class StateDamaged(RuntimeError):
    """No readable training state to resume from although the run folder holds a started run."""


class UnsafeState(StateDamaged):
    """A training state file holds objects that only an unrestricted unpickler would build (it could run code)."""


def load_state(path: Path) -> dict[str, Any]:
    """Read one training state file without executing code from it (``torch.load(weights_only=True)``: tensors,
    numbers, strings, lists and dicts only, which is all a diffmem state holds).

    A missing, truncated or corrupt file is a one-line StateDamaged naming it; a file that holds anything else (a
    pickle that would build other objects, e.g. call a function) is a one-line UnsafeState naming it.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise StateDamaged(f"{path} does not exist") from None
    except pickle.UnpicklingError as e:
        # torch's restricted unpickler names the callable or class a pickle asked for ("... GLOBAL posix.system
        # ..."); other refusals (unknown opcodes) are plain damage
        if "GLOBAL" in str(e):
            raise UnsafeState(f"{path} holds objects that diffmem does not write and will not build (loading it "
                              "could run code); it was altered or comes from elsewhere: inspect it, then move it "
                              "away (the run resumes from state.prev.pt), or move the run folder aside and rerun to "
                              "train again from step 0") from None
        detail = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), "not a torch file")
        raise StateDamaged(f"{path} is damaged (UnpicklingError: {detail})") from None
    except Exception as e:  # torch raises several types for a damaged zip
        detail = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else "unreadable"
        raise StateDamaged(f"{path} is damaged ({type(e).__name__}: {detail})") from None
    if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
        raise StateDamaged(f"{path} is not a diffmem training state (expected the keys {', '.join(STATE_KEYS)})")
    return state


def load_resume_state(run: RunDir) -> dict[str, Any] | None:
    """The training state to resume ``run`` from: ``state.pt``, else (with a warning) ``state.prev.pt``; None for a
    run that has not started (neither file and no checkpoint).

    Never restarts a started run from step 0 silently: when both files are missing or damaged, or when checkpoints
    exist without any state, it raises StateDamaged naming the files. On a fallback a damaged ``state.pt`` is renamed
    to ``state.damaged.pt``, so that the next save does not push the good previous state out. Call it only while
    holding the run's lock.
    """
    problems = []
    for path in (run.state_path, run.state_prev_path):
        if not path.exists():
            problems.append(f"{path} is missing")
            continue
        try:
            state = load_state(path)
        except UnsafeState:
            raise  # never hidden behind a fallback
        except StateDamaged as e:
            problems.append(str(e))
            continue
        if path != run.state_path:
            if run.state_path.exists():
                run.state_path.replace(run.path / "state.damaged.pt")
            warnings.warn(f"{problems[0]}; resuming from the previous state {path} (step {int(state['step'])})")
        return state
    if not run.state_path.exists() and not run.state_prev_path.exists():
        if not run.checkpoint_steps():
            return None
        raise StateDamaged(f"{run.path} has checkpoints but neither {run.state_path.name} nor "
                           f"{run.state_prev_path.name}; restore {run.state_path} from a copy, or {START_AGAIN}")
    raise StateDamaged(f"cannot resume {run.path}: {'; '.join(problems)}; restore {run.state_path} from a copy, "
                       f"or {START_AGAIN}")
