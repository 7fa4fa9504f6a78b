"""Configuration: frozen dataclasses that are the only home of diffmem's defaults, read from a TOML experiment file
and ``--set section.key=value`` overrides, every key validated.

One concern per module:

- :mod:`~diffmem.config.sections`: the dataclass of each section (``[data] [model] [diffusion] [train] [eval]
  [sweep] [theory]``) with its defaults, the choices and limits of its keys, and :class:`ConfigError`;
- :mod:`~diffmem.config.checks`: the validation of every key (:func:`validate`, :func:`validate_sweep`,
  :func:`validate_theory`), one line per bad value;
- :mod:`~diffmem.config.run`: :class:`RunConfig`, one run's config as a whole; the values of keys older run folders
  predate (``LEGACY_VALUES``); which keys may change between reruns of one folder;
- :mod:`~diffmem.config.loading`: TOML and ``--set`` parsing, type checks, :func:`load_config`,
  :func:`load_theory_config` and :func:`config_from_dict` (a run folder's stored config).

Import from ``diffmem.config``; the names below are its interface.
"""
from __future__ import annotations

from diffmem.config.sections import (ALL_SECTIONS, BETA_SCHEDULES, DATA_ORDERS, DATA_SOURCES, DDIM_BETA_SCHEDULES,
                                     EVAL_GRIDS, FID_EXTRACTORS, MAX_EVALUATIONS, MAX_STEPS, MAX_TIMESTEPS, MODEL_CHOICES,
                                     OPTIMIZERS, SAMPLER_SCHEDULES, SAMPLERS, SECTIONS, SEED_LIMIT,
                                     THEORY_NOISE_MODES, TRAIN_PRECISIONS, ConfigError, DataConfig, DiffusionConfig,
                                     EvalConfig, ModelConfig, SweepConfig, TheoryConfig, TrainConfig)
from diffmem.config.checks import check_finite, did_you_mean, validate, validate_sweep, validate_theory
from diffmem.config.run import (ANALYSIS_KEYS, EXECUTION_KEYS, LEGACY_VALUES, RECORDED_KEYS, RunConfig, config_diff,
                                continuation_diff, keep_recorded_keys, legacy_keys, upgrade_stored_config)
from diffmem.config.loading import (build_configs, config_from_dict, demo_config_path, load_config,
                                    load_theory_config, merge_sections, parse_override, read_toml)

__all__ = [
    "ALL_SECTIONS", "BETA_SCHEDULES", "DATA_ORDERS", "DATA_SOURCES", "DDIM_BETA_SCHEDULES", "EVAL_GRIDS", "FID_EXTRACTORS",
    "MAX_EVALUATIONS", "MAX_STEPS", "MAX_TIMESTEPS", "MODEL_CHOICES", "OPTIMIZERS", "SAMPLER_SCHEDULES", "SAMPLERS",
    "SECTIONS", "SEED_LIMIT", "THEORY_NOISE_MODES", "TRAIN_PRECISIONS", "ConfigError", "DataConfig",
    "DiffusionConfig", "EvalConfig", "ModelConfig", "SweepConfig", "TheoryConfig", "TrainConfig",
    "check_finite", "did_you_mean", "validate", "validate_sweep", "validate_theory",
    "ANALYSIS_KEYS", "EXECUTION_KEYS", "LEGACY_VALUES", "RECORDED_KEYS", "RunConfig", "config_diff",
    "continuation_diff", "keep_recorded_keys", "legacy_keys", "upgrade_stored_config",
    "build_configs", "config_from_dict", "demo_config_path", "load_config", "load_theory_config", "merge_sections",
    "parse_override", "read_toml",
]
