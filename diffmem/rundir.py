"""The run folder: the on-disk contract between training, evaluation and analysis (see README, "Run folder").

```
<run>/config.json                  resolved RunConfig + version + git sha + dataset sha256 + parameter count
<run>/state.pt                     latest full training state, atomically replaced
<run>/checkpoints/step_XXXXXXXXX.pt  model weights at each evaluation step
<run>/metrics.jsonl                one JSON object per evaluation, appended
<run>/samples/step_XXXXXXXXX.png   sample grid of that evaluation
<run>/done                         written last
```
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffmem.io import read_jsonl

_STEP_FILE = re.compile(r"^step_(\d{9})\.pt$")


@dataclass(frozen=True)
class RunDir:
    """Paths and simple queries of one run folder."""

    path: Path

    def __init__(self, path: str | Path):
        object.__setattr__(self, "path", Path(path))

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def state_path(self) -> Path:
        return self.path / "state.pt"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples_dir(self) -> Path:
        return self.path / "samples"

    @property
    def done_path(self) -> Path:
        return self.path / "done"

    @staticmethod
    def step_name(step: int) -> str:
        return f"step_{step:09d}"

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoint_dir / f"{self.step_name(step)}.pt"

    def samples_path(self, step: int) -> Path:
        return self.samples_dir / f"{self.step_name(step)}.png"

    def checkpoint_steps(self) -> list[int]:
        """Steps that have a saved checkpoint, ascending."""
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.checkpoint_dir.iterdir() if (m := _STEP_FILE.match(p.name)))

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def evaluated_steps(self) -> set[int]:
        return {int(r["step"]) for r in self.metrics()}

    def is_done(self) -> bool:
        return self.done_path.exists()
