"""A run folder's config.json as a record: written once when a run starts (:func:`prepare_run_folder`), compared with
the command's config on every rerun (:func:`check_same_config`), the keys a folder keeps whatever the command says
(:func:`continue_as_recorded`), and its budget raised (:func:`extend_budget`). It is read by
:func:`diffmem.rundir.read_config`.
"""
from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import diffmem
from diffmem.config import (RECORDED_KEYS, ConfigError, RunConfig, continuation_diff, keep_recorded_keys,
                             legacy_keys, upgrade_stored_config)
from diffmem.io import atomic_write_json
from diffmem.rundir.folder import RESTORE, ConfigFileError, RunDir

if TYPE_CHECKING:
    import torch


class RunConfigMismatch(ConfigError):
    """A run folder already holds a run with a different configuration."""


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(diffmem.__file__).parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def check_same_config(cfg: RunConfig, run: RunDir, dataset_sha256: str | None = None) -> bool:
    """False for a new run folder; True when its config.json holds ``cfg`` (and the same dataset, when given);
    otherwise RunConfigMismatch listing the differing keys. A config.json that cannot be read is a one-line
    ConfigFileError (:func:`diffmem.rundir.read_config`)."""
    stored = run.read_config()
    if stored is None:
        held = [p.name for p in (run.state_path, run.state_prev_path, run.metrics_path, run.done_path,
                                 run.checkpoint_dir) if p.exists()]
        if held:
            raise ConfigFileError(f"{run.config_path} is missing, but {run.path} holds a run ({', '.join(held)}); "
                                  f"{RESTORE}")
        return False
    old = upgrade_stored_config(stored.raw)
    diffs = continuation_diff(stored.raw, cfg)
    if dataset_sha256 is not None and stored.meta.get("dataset_sha256") != dataset_sha256:
        diffs.append(f"dataset sha256: {stored.meta.get('dataset_sha256')} -> {dataset_sha256}")
    if diffs:
        flags = [f"--set {k}={json.dumps(_get(old, k))}" for k in legacy_keys(stored.raw)
                 if any(d.startswith(k + ":") for d in diffs)]
        hint = ("use another --out folder or the same config" if not flags else
                "the folder was written by an older diffmem; to continue it as it was trained add " + " ".join(flags))
        raise RunConfigMismatch(f"{run.path} holds a run with a different config ({'; '.join(diffs)}); {hint}")
    return True


def continue_as_recorded(cfg: RunConfig, run: RunDir, log: Callable[[str], None]) -> RunConfig:
    """``cfg`` as the run folder ``run`` continues it: the keys a folder keeps (``diffmem.config.RECORDED_KEYS``,
    the init of its step-0 weights) set to its config.json's values, with a log line for each one the command asked
    otherwise; ``cfg`` itself for a new folder."""
    stored = run.read_config()
    if stored is None:
        return cfg
    kept = keep_recorded_keys(stored.raw, cfg)
    recorded, asked = kept.to_dict(), cfg.to_dict()
    for key in sorted(RECORDED_KEYS):
        if _get(recorded, key) != _get(asked, key):
            log(f"{run.path}: keeps {key} = {json.dumps(_get(recorded, key))}, with which it started (the command's "
                f"{json.dumps(_get(asked, key))} applies to new run folders)")
    return kept


def _get(config: dict[str, Any], key: str) -> Any:
    section, name = key.split(".")
    return config[section][name]


def stored_steps(run: RunDir) -> int | None:
    """train.steps of the config.json of ``run`` (None for a new folder)."""
    stored = run.read_config()
    return None if stored is None else stored.config.train.steps


def extends_budget(cfg: RunConfig, run: RunDir) -> bool:
    """True when ``cfg`` gives the run folder a larger train.steps than it was started with (the rest being equal:
    check_same_config)."""
    old = stored_steps(run)
    return old is not None and cfg.train.steps > old


def extend_budget(cfg: RunConfig, run: RunDir, log: Callable[[str], None]) -> None:
    """Raise the budget of ``run`` to ``cfg.train.steps``: config.json gets the new config and a line in its
    ``extended`` history, and a ``done`` file goes, so that training continues from ``state.pt``. The evaluations
    already recorded stay; the new budget's evaluation steps past the trained step are added. Call it holding the
    run's lock, once the run's state has been read (a run that cannot continue keeps its folder as it was)."""
    stored = run.read_config()
    meta, old = dict(stored.meta), stored.config.train.steps
    meta["extended"] = meta.get("extended", []) + [{
        "from_steps": old, "to_steps": cfg.train.steps, "diffmem_version": diffmem.__version__,
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}]
    config = upgrade_stored_config(stored.raw)
    meta["config"] = config | {"train": config["train"] | {"steps": cfg.train.steps}}
    atomic_write_json(run.config_path, meta)
    run.done_path.unlink(missing_ok=True)
    log(f"{run.path}: budget raised from {old} to {cfg.train.steps} steps; continuing")


def record_reseed(run: RunDir, step: int, from_device: str, to_device: str, seed: int) -> None:
    """Add to config.json's ``reseeded`` history that the run resumed at ``step`` (optimizer steps) on ``to_device``
    from a state saved on ``from_device`` ("cpu" | "cuda"), its generators re-seeded with ``seed``
    (:func:`diffmem.rundir.state.resume_rng`): from there on the run has the statistics of an uninterrupted run, not
    its bits. Call it holding the run's lock."""
    stored = run.read_config()
    meta = dict(stored.meta)
    meta["reseeded"] = meta.get("reseeded", []) + [{
        "step": step, "from_device": from_device, "to_device": to_device, "seed": seed,
        "diffmem_version": diffmem.__version__,
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}]
    atomic_write_json(run.config_path, meta)


def prepare_run_folder(cfg: RunConfig, run: RunDir, dataset_sha256: str, dataset_manifest: dict, params: int,
                       device: torch.device) -> None:
    """Write config.json for a new run, or check that an existing run folder holds the same configuration."""
    import torch  # here, not at the top: see diffmem.rundir.state

    if check_same_config(cfg, run, dataset_sha256):
        return
    run.path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run.config_path, {
        "config": cfg.to_dict(),
        "diffmem_version": diffmem.__version__,
        "git_sha": _git_sha(),
        "dataset_sha256": dataset_sha256,
        "dataset": {k: dataset_manifest.get(k) for k in ("source", "count", "size", "root") if k in dataset_manifest},
        "params": params,
        "batch_size": cfg.batch_size,
        "device": str(device),
        "torch_version": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    })
