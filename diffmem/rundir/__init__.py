"""The run folder: the on-disk contract between training, evaluation and analysis (see docs/run-folder.md).

```
<run>/config.json                  resolved RunConfig + version + git sha + dataset sha256 + parameter count
<run>/state.pt                     latest full training state, atomically replaced
<run>/checkpoints/step_XXXXXXXXX.pt  model weights at each evaluation step
<run>/images.json                  source indices of the train set, non-members, control, held-out pool
<run>/metrics.jsonl                one JSON object per evaluation, appended
<run>/image_losses.jsonl           per evaluation: each training and control image's loss per noise level, appended
<run>/samples/step_XXXXXXXXX.png   sample grid of that evaluation
<run>/done                         written last
<run>/state.prev.pt                the state.pt before the latest one (resume falls back to it if state.pt is damaged)
<run>/state.damaged.pt             a damaged state.pt set aside by such a fallback (for inspection; never read)
<run>/lock                         held while a process trains or evaluates the run: JSON {pid, host, started,
                                   started_unix, token}; its mtime is the holder's heartbeat
<run>/checkpoints/step_XXXXXXXXX.damaged.pt  a damaged checkpoint set aside when training wrote it again (never read)
<run>/metrics.jsonl.torn-<time>    a last line without its newline, moved aside by the next append (never read)
<experiment>/pairs.jsonl           one JSON object per (split pair, evaluation step), appended (`diffmem pairs`)
<experiment>/pairs.lock            held while `diffmem pairs` appends to it
```

Everything that knows this layout lives in this package, one concern per module:

- :mod:`~diffmem.rundir.folder`: :class:`RunDir` (the paths and simple queries of one run folder) and
  :func:`read_config`, the one reader of config.json;
- :mod:`~diffmem.rundir.config_file`: config.json as a record: written when a run starts, compared on every rerun,
  the keys a folder keeps, its budget raised;
- :mod:`~diffmem.rundir.state`: the training state files, the one a run resumes from, its generators (restored
  across device kinds) and its :class:`Trajectory` (whether training again would give its bits);
- :mod:`~diffmem.rundir.lock`: :class:`RunLock`, which keeps two processes off one folder, and :func:`pid_alive`;
- :mod:`~diffmem.rundir.images_file`: images.json, which images of the source the run trained on and compared
  them with, validated as it is read;
- :mod:`~diffmem.rundir.image_losses`: image_losses.jsonl, each training and control image's loss per noise level
  at every evaluation;
- :mod:`~diffmem.rundir.records`: the lines of metrics.jsonl and pairs.jsonl, validated as they are read.

Import from ``diffmem.rundir``; the names below are its interface.
"""
from __future__ import annotations

from diffmem.rundir.folder import (PAIRS_FILE, PAIRS_LOCK, RESTORE, RETRAIN_PREFIX, ConfigFileError, FolderError,
                                   RunDir, StoredConfig, not_a_folder, read_config, require_folder,
                                   written_by_newer)
from diffmem.rundir.records import RecordError, copies_lines, metrics_lines, pairs_lines
from diffmem.rundir.lock import LOCK_HEARTBEAT_S, LOCK_STALE_S, RunLock, RunLocked, pid_alive
from diffmem.rundir.state import (START_AGAIN, STATE_KEYS, StateDamaged, Trajectory, TrajectoryNotReplayable,
                                  UnsafeState, capture_rng, load_resume_state, load_state, resume_rng)
from diffmem.rundir.image_losses import append_image_losses, image_losses_lines
from diffmem.rundir.images_file import (ImageManifest, ImagesFileError, check_images_file, read_images_file,
                                        write_images_file)
from diffmem.rundir.config_file import (RunConfigMismatch, check_same_config, continue_as_recorded, extend_budget,
                                        extends_budget, prepare_run_folder, record_reseed, stored_steps)

__all__ = [
    "PAIRS_FILE", "PAIRS_LOCK", "RESTORE", "RETRAIN_PREFIX", "ConfigFileError", "FolderError", "RunDir",
    "StoredConfig", "not_a_folder", "read_config", "require_folder", "written_by_newer",
    "RecordError", "copies_lines", "metrics_lines", "pairs_lines",
    "LOCK_HEARTBEAT_S", "LOCK_STALE_S", "RunLock", "RunLocked", "pid_alive",
    "START_AGAIN", "STATE_KEYS", "StateDamaged", "Trajectory", "TrajectoryNotReplayable", "UnsafeState",
    "capture_rng", "load_resume_state", "load_state", "resume_rng",
    "RunConfigMismatch", "check_same_config", "continue_as_recorded", "extend_budget", "extends_budget",
    "prepare_run_folder", "record_reseed", "stored_steps",
    "append_image_losses", "image_losses_lines",
    "ImageManifest", "ImagesFileError", "check_images_file", "read_images_file", "write_images_file",
]
