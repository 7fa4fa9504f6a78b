"""A run folder's training state files: ``state.pt`` and its previous version ``state.prev.pt``, read without
executing code from them, and the choice of the one a run resumes from (:func:`load_resume_state`). They are written
by :func:`diffmem.train.train` (atomically, keeping the previous one: :func:`diffmem.io.atomic_torch_save`).

A state also holds the random number generators of the training process (:func:`capture_rng`, restored by
:func:`resume_rng`, across device kinds too) and how its weights were computed as far as their bits go
(:class:`Trajectory`: whether training again from step 0 would give them again).
"""
from __future__ import annotations

import hashlib
import pickle
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffmem.rundir.folder import RunDir

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it, not here: the commands that only read run folders (status,
# analyze, advise) import this package and should not pay torch's import (about 5 s here).

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
    import torch

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


def capture_rng(generator: torch.Generator, device: torch.device) -> dict[str, Any]:
    """The random number generators a training process draws from: ``generator`` (batch order and diffusion noise,
    on ``device``), torch's CPU generator, and on CUDA the default generator of ``device`` (dropout), one 16-byte
    state: never one per visible GPU, so a state saved where four GPUs were visible resumes where one is."""
    import torch

    state = {"generator": generator.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def saved_device_type(state: dict[str, Any]) -> str:
    """"cpu" or "cuda": the device kind whose generators ``state`` holds (its :class:`Trajectory`; a state written
    before that record is a CUDA one when its RNG holds a "cuda" entry)."""
    recorded = state.get("trajectory", {}).get("device")
    return recorded or ("cuda" if "cuda" in state["rng"] else "cpu")


def _cuda_index(device: torch.device) -> int:
    import torch

    return device.index if device.index is not None else torch.cuda.current_device()


def reseed_value(rng: dict[str, Any], step: int) -> int:
    """The seed, in [0, 2^63), that a resume on another device kind gives its generators: a hash of the saved
    batch-order generator's state and the step, so two resumes of one state draw the same numbers."""
    digest = hashlib.sha256(rng["generator"].numpy().tobytes() + int(step).to_bytes(8, "little")).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def resume_rng(state: dict[str, Any], generator: torch.Generator, device: torch.device) -> int | None:
    """Put the generators of ``state`` (a training state) back: ``generator`` (on ``device``), torch's CPU generator
    and, on CUDA, the default generator of ``device`` (of a state written before :func:`capture_rng` saved only that
    one, the entry of ``device``'s index among the GPUs then visible, else the first). None when every generator
    continues as saved.

    A state saved on another device kind (a CUDA generator's state is 16 bytes, a CPU one's 5056: one cannot drive
    the other) restores torch's CPU generator and re-seeds ``generator`` and the CUDA generators deterministically
    with :func:`reseed_value`, which it returns: the run goes on with the statistics of an uninterrupted run but not
    its bits (the caller says so and records it)."""
    import torch

    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    if saved_device_type(state) == device.type:
        generator.set_state(rng["generator"])
        if device.type == "cuda" and "cuda" in rng:
            cuda = rng["cuda"]
            if isinstance(cuda, (list, tuple)):  # written by torch.cuda.get_rng_state_all(): one per visible GPU
                index = _cuda_index(device)
                cuda = cuda[index] if index < len(cuda) else cuda[0]
            torch.cuda.set_rng_state(cuda, device)
        return None
    seed = reseed_value(rng, int(state["step"]))
    generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    return seed


@dataclass(frozen=True)
class Trajectory:
    """How a training state's weights were computed, as far as their bits go; saved in the state as a dict.

    ``device`` ("cpu" | "cuda"), ``gpu`` (the CUDA card's name; "" on a CPU), ``compile`` and ``channels_last``: the
    settings of the latest segment (a segment: what one process trained). ``not_replayable``: "" when training again
    from step 0 with these settings (same software, and the same torch thread count on a CPU) gives these weights bit
    for bit, else why not: a CUDA segment without ``train.deterministic``, or a change of device kind, GPU model,
    compile or channels-last between segments.
    """

    device: str
    gpu: str = ""
    compile: bool = False
    channels_last: bool = False
    not_replayable: str = ""

    @classmethod
    def segment(cls, device: torch.device, *, deterministic: bool, compile: bool,
                channels_last: bool) -> "Trajectory":
        """The trajectory of one process training on ``device`` with these settings from step 0."""
        if device.type != "cuda":
            return cls(device.type, "", compile, channels_last, "")
        import torch

        why = "" if deterministic else "trained on cuda with train.deterministic = false"
        return cls("cuda", torch.cuda.get_device_name(device), compile, channels_last, why)

    @classmethod
    def saved(cls, state: dict[str, Any], current: "Trajectory") -> "Trajectory":
        """The trajectory recorded in ``state``; for a state written before that record, ``current``'s settings on
        the device kind of its generators, replayable when that kind is the CPU (as those runs were)."""
        if "trajectory" in state:
            return cls(**state["trajectory"])
        device = saved_device_type(state)
        if device == "cpu":
            return cls("cpu", "", current.compile, current.channels_last, "")
        return cls("cuda", current.gpu, current.compile, current.channels_last,
                   "trained on cuda before diffmem recorded its determinism")

    def continued_by(self, current: "Trajectory") -> "Trajectory":
        """The trajectory of a run whose state had this one, continued by the segment ``current``."""
        why = self.not_replayable or current.not_replayable
        if not why:
            keys = ("device", "gpu", "compile", "channels_last")
            changed = [f"{k} ({getattr(self, k)!r} -> {getattr(current, k)!r})" for k in keys
                       if getattr(self, k) != getattr(current, k)]
            why = "resumed with a changed " + ", ".join(changed) if changed else ""
        return replace(current, not_replayable=why)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TrajectoryNotReplayable(RuntimeError):
    """Training again from step 0 would not give the run's weights bit for bit, so diffmem refuses to write them."""
