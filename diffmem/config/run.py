"""One run's config as a whole (:class:`RunConfig`, saved resolved in its run folder's config.json), the configs that
older diffmem versions stored (``LEGACY_VALUES``), and which keys may change between reruns of one run folder.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from diffmem.config.checks import validate
from diffmem.config.sections import DataConfig, DiffusionConfig, EvalConfig, ModelConfig, TrainConfig


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run; saved resolved in the run folder's config.json."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def batch_size(self) -> int:
        """The effective batch: min(train.batch_size, data.n)."""
        return min(self.train.batch_size, self.data.n)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _section_to_dict(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **sections: dict[str, Any]) -> RunConfig:
        """A copy with some keys changed, e.g. ``cfg.replace(train={"steps": 10})``."""
        new = {name: dataclasses.replace(getattr(self, name), **values) for name, values in sections.items()}
        out = dataclasses.replace(self, **new)
        validate(out)
        return out


def _section_to_dict(obj: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


# Keys added after run folders were first written, with the value that every run folder written before them used
# (diffmem 0.1 followed diffusers' conventions there). A stored config that lacks one of them gets this value, so an old
# run is evaluated with the model and sampler it was trained with, and a rerun with today's defaults names the key.
def _legacy_head_dim(model: dict[str, Any]) -> int:
    width = model.get("width", ModelConfig.width)
    mult = model.get("channel_mult", list(ModelConfig.channel_mult))
    return max(1, width * mult[-1] // model.get("attention_heads", ModelConfig.attention_heads))


LEGACY_VALUES: dict[str, dict[str, Any]] = {
    "data": {"order": "source", "order_seed": 0},  # before data.order every split cut the source's own ordering
    "model": {"dropout_type": "element", "time_embedding": "diffusers", "time_act": "silu",
              "attention_head_dim": _legacy_head_dim, "init": "diffusers"},
    "diffusion": {"t_min": 0},
    "train": {"precision": "fp32", "channels_last": False, "compile": False},
    "eval": {"sampler_schedule": "diffusers", "fid_reference_sets": 1, "fid_boot": 0, "checkpoint_ratio": 0.0,
             "refine_ratio": 0.0, "refine_n_samples": 0, "stop_f_mem": 0.0, "fid_clip_sample": None,
             "loss_ts": [], "copy_distances": []},
}


def upgrade_stored_config(d: dict[str, Any]) -> dict[str, Any]:
    """A run folder's stored config (``RunConfig.to_dict()`` of the diffmem that wrote it) with every key it predates
    set to the value that version used (``LEGACY_VALUES``); keys it has are kept."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for section, keys in LEGACY_VALUES.items():
        if section not in out:
            continue
        for key, value in keys.items():
            if key not in out[section]:
                out[section][key] = value(out[section]) if callable(value) else value
    return out


def legacy_keys(stored: dict[str, Any]) -> list[str]:
    """``section.key`` of every ``LEGACY_VALUES`` key that a stored config lacks (it was written before them)."""
    return [f"{section}.{key}" for section, keys in LEGACY_VALUES.items() if section in stored
            for key in keys if key not in stored[section]]


# Keys that may change between reruns of one run folder: they change how a run executes, not what it computes.
# A change of train.device, train.deterministic, train.channels_last or train.compile keeps the statistics of the
# trajectory but not its bits: the training state records it (diffmem.rundir.state.Trajectory).
EXECUTION_KEYS = frozenset({"train.device", "train.num_threads", "train.deterministic", "train.channels_last",
                            "train.compile", "eval.inline", "eval.batch_size", "eval.fid_weights",
                            "train.tensorboard"})
# Keys that only the analysis of a run's metrics reads: they change neither training nor any evaluation, so they may
# change between reruns too, and a run folder written before one of them continues with today's value.
ANALYSIS_KEYS = frozenset({"eval.mem_levels", "eval.bias_levels", "eval.gap_sizes"})
# Keys that decide only how a run starts (the weights drawn at step 0), so a run folder keeps the value it recorded
# (for a folder written before the key, its LEGACY_VALUES value): a command that continues the folder with another
# value is not refused, and the run goes on with the folder's value (diffmem.train.train, keep_recorded_keys).
RECORDED_KEYS = frozenset({"model.init"})


def continuation_diff(stored: dict[str, Any], cfg: RunConfig) -> list[str]:
    """Why a run folder whose config.json holds ``stored`` (``RunConfig.to_dict()`` of any diffmem version) cannot be
    continued with ``cfg``: every differing key (``config_diff``) except a larger ``train.steps``, which extends the
    run's budget (the training trajectory does not depend on the budget), and ``RECORDED_KEYS``, which the folder
    keeps (``keep_recorded_keys``). [] when it can."""
    diffs = [d for d in config_diff(upgrade_stored_config(stored), cfg.to_dict())
             if d.split(":")[0] not in RECORDED_KEYS]
    old_steps = stored.get("train", {}).get("steps")
    if isinstance(old_steps, int) and cfg.train.steps > old_steps:
        diffs = [d for d in diffs if not d.startswith("train.steps:")]
    elif isinstance(old_steps, int) and cfg.train.steps < old_steps:
        diffs = [d + " (a budget may grow, never shrink)" if d.startswith("train.steps:") else d for d in diffs]
    return diffs


def keep_recorded_keys(stored: dict[str, Any], cfg: RunConfig) -> RunConfig:
    """``cfg`` with every ``RECORDED_KEYS`` key set to the value of the run folder whose config.json holds
    ``stored`` (``RunConfig.to_dict()`` of any diffmem version; a key it predates reads as its ``LEGACY_VALUES``
    value), so that continuing, extending or repairing the run draws what the run was started with."""
    old = upgrade_stored_config(stored)
    changes: dict[str, dict[str, Any]] = {}
    for key in sorted(RECORDED_KEYS):
        section, name = key.split(".")
        changes.setdefault(section, {})[name] = old[section][name]
    return cfg.replace(**changes)


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``section.key: old -> new`` for every key that differs between two ``RunConfig.to_dict()`` results,
    ignoring ``EXECUTION_KEYS`` and ``ANALYSIS_KEYS``."""
    out = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            name = f"{section}.{key}"
            if name not in EXECUTION_KEYS and name not in ANALYSIS_KEYS and a.get(key) != b.get(key):
                out.append(f"{name}: {a.get(key)!r} -> {b.get(key)!r}")
    return out
