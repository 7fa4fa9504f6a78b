"""The validation of every config key: each value against its meaning (finite numbers, ranges, choices, non-empty lists,
orderings), with a one-line :class:`~diffmem.config.sections.ConfigError` that names the key, its value and what to
give instead. The keys and their defaults are the dataclasses of :mod:`diffmem.config.sections`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any, Protocol

from diffmem.config.sections import (BETA_SCHEDULES, DATA_ORDERS, DATA_SOURCES, DDIM_BETA_SCHEDULES, EVAL_GRIDS,
                                     FID_EXTRACTORS, MAX_EVALUATIONS, MAX_STEPS, MAX_TIMESTEPS, MODEL_CHOICES, OPTIMIZERS,
                                     SAMPLER_SCHEDULES, SAMPLERS, SECTIONS, SEED_LIMIT, THEORY_NOISE_MODES,
                                     TRAIN_PRECISIONS, ConfigError, DataConfig, DiffusionConfig, EvalConfig,
                                     ModelConfig, SweepConfig, TheoryConfig, TrainConfig)


class RunSections(Protocol):
    """What validation reads of one run's config (:class:`diffmem.config.run.RunConfig`): its five sections."""

    @property
    def data(self) -> DataConfig: ...

    @property
    def model(self) -> ModelConfig: ...

    @property
    def diffusion(self) -> DiffusionConfig: ...

    @property
    def train(self) -> TrainConfig: ...

    @property
    def eval(self) -> EvalConfig: ...


def did_you_mean(name: str, options: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the option closest to a misspelled ``name``, or "" when none is close."""
    match = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _fail(key: str, value: Any, text: str) -> None:
    """Raise the one-line ConfigError ``"section.key = value <text>"``."""
    raise ConfigError(f"{key} = {_show(value)} {text}")


def _check_seeds(key: str, value: int | list[int]) -> None:
    """Seeds are integers in [0, SEED_LIMIT) (numpy refuses negative seeds, torch those >= 2**64)."""
    if any(not 0 <= s < SEED_LIMIT for s in (value if isinstance(value, list) else [value])):
        _fail(key, value, "must be a seed in [0, 2**63), e.g. 0")


def _show(value: Any) -> str:
    """A config value as a user writes it in TOML: strings quoted, tuples as lists, nan / inf bare."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        value = list(value)
    return repr(value).replace("None", "null")


def _floats(value: Any) -> list[float]:
    """Every float in a config value (a number, or a list / tuple of them, nested)."""
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _floats(v)]
    return [value] if isinstance(value, float) else []


def check_finite(section: str, obj: Any) -> None:
    """Reject NaN and infinity in every float field of one config section (NaN passes every ``<=`` comparison, so no
    range check would catch it); the message names ``section.key`` and the key's default."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not all(math.isfinite(v) for v in _floats(value)):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            raise ConfigError(f"{section}.{f.name} = {_show(value)} is not a finite number (NaN and infinity are "
                              f"refused); give a finite value, e.g. the default {_show(default)}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} = '{value}' is unknown{did_you_mean(value, list(choices))}; choose "
                          + " or ".join(choices))


def validate_theory(cfg: TheoryConfig) -> None:
    """Reject theory settings that cannot work, with one line that says what to change."""
    check_finite("theory", cfg)
    if cfg.d < 2:
        raise ConfigError(f"theory.d = {cfg.d} must be >= 2")
    if cfg.psi_p <= 0 or round(cfg.psi_p * cfg.d) < 1:
        raise ConfigError(f"theory.psi_p = {cfg.psi_p} must be > 0 (p = psi_p * d features)")
    if not cfg.psi_n or any(x <= 0 or round(x * cfg.d) < 2 for x in cfg.psi_n):
        raise ConfigError(f"theory.psi_n = {cfg.psi_n}: give a list of n / d values with n = psi_n * d >= 2")
    if len(set(cfg.psi_n)) != len(cfg.psi_n) or len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError("theory.psi_n and theory.seeds must not repeat a value; remove the duplicates")
    if not cfg.seeds:
        raise ConfigError("theory.seeds is empty; give at least one seed, e.g. [0]")
    _check_seeds("theory.seeds", cfg.seeds)
    for name in ("t", "spectrum_t"):
        if not 0 < getattr(cfg, name) <= 10:
            raise ConfigError(f"theory.{name} = {getattr(cfg, name)} must be a diffusion time in (0, 10]")
    if cfg.spectrum_psi_n <= 0 or round(cfg.spectrum_psi_n * cfg.d) < 2:
        raise ConfigError(f"theory.spectrum_psi_n = {cfg.spectrum_psi_n} must give n = psi_n * d >= 2")
    if cfg.noise not in THEORY_NOISE_MODES:
        raise ConfigError(f"theory.noise = '{cfg.noise}'{did_you_mean(cfg.noise, list(THEORY_NOISE_MODES))}; "
                          "choose one of " + ", ".join(THEORY_NOISE_MODES))
    if cfg.spectrum_noise_draws < 0:
        raise ConfigError(f"theory.spectrum_noise_draws = {cfg.spectrum_noise_draws} must be >= 0 (0: no overlay)")
    if cfg.noise_draws < 1 or cfg.test_draws < 10:
        raise ConfigError("theory.noise_draws must be >= 1 and theory.test_draws >= 10")
    if not 0 < cfg.tau_min < cfg.tau_max or cfg.n_tau < 10:
        raise ConfigError(f"theory.tau_min = {cfg.tau_min}, tau_max = {cfg.tau_max}, n_tau = {cfg.n_tau}: need "
                          "0 < tau_min < tau_max and n_tau >= 10")
    if not 0 < cfg.gap_fraction < 1:
        raise ConfigError(f"theory.gap_fraction = {cfg.gap_fraction} must be in (0, 1), e.g. 0.5")
    if cfg.device not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"theory.device = '{cfg.device}' must be cpu, cuda or auto")


# --- a run and a grid -------------------------------------------------------------------------------------------

def validate_sweep(sweep: SweepConfig, base: RunSections | None = None) -> None:
    """Reject grids that cannot work (every key of ``[sweep]``; each run's config is validated when it is built).
    ``base``: the experiment's run config, for the keys that depend on it (``sweep.splits`` sets
    ``data.subset_index``)."""
    check_finite("sweep", sweep)
    if any(n < 2 for n in sweep.n):
        raise ConfigError(f"sweep.n = {sweep.n}: every train-set size must be >= 2")
    if any(w < 1 for w in sweep.width):
        raise ConfigError(f"sweep.width = {sweep.width}: every width must be >= 1")
    _check_seeds("sweep.seeds", sweep.seeds)
    if not sweep.splits or any(i < 0 for i in sweep.splits):
        raise ConfigError(f"sweep.splits = {sweep.splits} must list training blocks >= 0, e.g. [0, 1] for split pairs "
                          "(the default [0] trains every run on block 0)")
    for key, values in (("n", sweep.n), ("width", sweep.width), ("seeds", sweep.seeds), ("splits", sweep.splits)):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ConfigError(f"sweep.{key} = {values} lists {repeated} twice: each grid point must be one run folder; "
                              "remove the duplicates")
    for cell in sweep.cells:
        if len(cell) != 2 or cell[0] < 2 or cell[1] < 1:
            raise ConfigError(f"sweep.cells = {sweep.cells}: each cell is [n, width] with n >= 2 and width >= 1, "
                              "e.g. [[64, 16], [64, 32]]")
    if len({tuple(c) for c in sweep.cells}) != len(sweep.cells):
        raise ConfigError(f"sweep.cells = {sweep.cells} lists a cell twice; remove the duplicate")
    if sweep.steps_per_n < 0:
        raise ConfigError(f"sweep.steps_per_n = {sweep.steps_per_n} must be >= 0 (0: every run uses train.steps)")
    if sweep.min_steps < 0:
        raise ConfigError(f"sweep.min_steps = {sweep.min_steps} must be >= 0")
    if base is not None and base.data.subset_index and sweep.splits != [0]:
        raise ConfigError(f"sweep.splits = {sweep.splits} sets data.subset_index of every run, but data.subset_index = "
                          f"{base.data.subset_index}; leave data.subset_index at 0 (split i trains on block i)")


def validate(cfg: RunSections) -> None:
    """Reject values that cannot work, with a one-line message that says what to do: every key of every section
    against its meaning (finite numbers, ranges, choices, non-empty lists, orderings such as beta_start < beta_end < 1
    and t_min < T, evaluation steps within the budget and of sane size). ``diffmem train``, ``sweep``, ``evaluate``
    and ``analyze`` all read configs through it (a run folder's config.json too: diffmem.rundir.read_config)."""
    for name in SECTIONS:
        check_finite(name, getattr(cfg, name))
    _validate_data(cfg.data, cfg.model)
    _validate_model(cfg.model)
    _validate_diffusion(cfg.diffusion)
    _validate_train(cfg.train)
    _validate_eval(cfg.eval, cfg)


def _validate_data(d: DataConfig, m: ModelConfig) -> None:
    _check_choice("data.source", d.source, DATA_SOURCES)
    if d.source in ("celeba", "folder") and not d.path:
        raise ConfigError(f"data.source = '{d.source}' needs data.path (a local CelebA copy, an image folder or a "
                          "tensor from `diffmem prepare`); or use --set data.source=lfw_faces for the embedded faces")
    for key, value in (("data.path", d.path), ("data.cache_dir", d.cache_dir)):
        if value is not None and not value.strip():
            _fail(key, value, "is an empty path; give a path, or leave the key out")
    if d.n < 2:
        raise ConfigError(f"data.n = {d.n}: the train set needs at least 2 images (the memorization test compares "
                          "nearest and second-nearest)")
    if d.subset_index < 0:
        raise ConfigError(f"data.subset_index = {d.subset_index} must be >= 0")
    _check_choice("data.order", d.order, DATA_ORDERS)
    if d.order_seed < 0:
        raise ConfigError(f"data.order_seed = {d.order_seed} must be >= 0")
    if d.n_heldout < 0:
        raise ConfigError(f"data.n_heldout = {d.n_heldout} must be >= 1 (held-out images for test loss and FID), or 0 "
                          "to let the source choose (half its images, at most 50000)")
    levels = len(m.channel_mult)
    factor = 2 ** max(levels - 1, 0)
    if d.image_size < factor or d.image_size % factor:
        raise ConfigError(f"data.image_size = {d.image_size} must be a multiple of {factor} (the U-Net halves it "
                          f"{levels - 1} times)")


def _validate_model(m: ModelConfig) -> None:
    if m.width < 1:
        raise ConfigError(f"model.width = {m.width} must be >= 1")
    if not m.channel_mult or any(c < 1 for c in m.channel_mult):
        _fail("model.channel_mult", m.channel_mult, "must list one multiplier >= 1 per level of the U-Net, e.g. "
              "[1, 2, 4]")
    if m.layers_per_block < 1:
        _fail("model.layers_per_block", m.layers_per_block, "must be >= 1 (ResNet blocks per level; the paper: 2)")
    if m.attention_heads < 1:
        _fail("model.attention_heads", m.attention_heads, "must be >= 1 (heads per attention layer; the paper: 4)")
    if m.norm_groups < 1 or m.width % m.norm_groups:
        raise ConfigError(f"model.width = {m.width} is not a multiple of model.norm_groups = {m.norm_groups}; "
                          "pick a width like 8, 16, 32 or set model.norm_groups to a divisor of the width")
    if m.attention and m.attention_head_dim == 0 and (m.width * min(m.channel_mult)) % m.attention_heads:
        raise ConfigError(f"model.width = {m.width} is not divisible by model.attention_heads = {m.attention_heads}")
    if m.attention_head_dim < 0 or (m.attention and m.attention_head_dim
                                    and any((m.width * c) % m.attention_head_dim for c in m.channel_mult[1:])):
        raise ConfigError(f"model.attention_head_dim = {m.attention_head_dim} must be 0 (attention_heads heads "
                          "everywhere) or divide the channels of every attention level")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout = {m.dropout} must be in [0, 1)")
    for key, choices in MODEL_CHOICES.items():
        _check_choice(f"model.{key}", getattr(m, key), choices)


def _validate_diffusion(f: DiffusionConfig) -> None:
    if not 2 <= f.num_train_timesteps <= MAX_TIMESTEPS:
        _fail("diffusion.num_train_timesteps", f.num_train_timesteps,
              f"must be in [2, {MAX_TIMESTEPS}] (DDPM steps T; the paper: 1000)")
    if not 0.0 < f.beta_start < f.beta_end < 1.0:
        raise ConfigError(f"diffusion.beta_start = {f.beta_start}, beta_end = {f.beta_end}: need 0 < beta_start < "
                          "beta_end < 1 (variances of the noise steps; the paper: 1e-4 and 0.02)")
    _check_choice("diffusion.beta_schedule", f.beta_schedule, BETA_SCHEDULES)
    if not 0 <= f.t_min < f.num_train_timesteps:
        raise ConfigError(f"diffusion.t_min = {f.t_min} must be in [0, num_train_timesteps = "
                          f"{f.num_train_timesteps}) (official: 1)")


def _validate_train(t: TrainConfig) -> None:
    _check_choice("train.optimizer", t.optimizer, OPTIMIZERS)
    if t.lr <= 0:
        raise ConfigError(f"train.lr = {t.lr} must be > 0")
    if not 0.0 <= t.momentum < 1.0:
        raise ConfigError(f"train.momentum = {t.momentum} must be in [0, 1)")
    if t.steps <= 0:
        raise ConfigError(f"train.steps = {t.steps} must be > 0")
    if t.steps > MAX_STEPS:
        _fail("train.steps", t.steps, f"is more than {MAX_STEPS:.0e} optimizer steps; give a budget in steps")
    if t.batch_size < 1:
        raise ConfigError(f"train.batch_size = {t.batch_size} must be >= 1")
    _check_seeds("train.seed", t.seed)
    if t.device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", t.device):
        raise ConfigError(f"train.device = '{t.device}' is unknown; choose auto, cpu, cuda or cuda:K (K a GPU index)")
    if t.num_threads < 0:
        raise ConfigError(f"train.num_threads = {t.num_threads} must be >= 0 (0 keeps torch's default)")
    _check_choice("train.precision", t.precision, TRAIN_PRECISIONS)


def _validate_eval(e: EvalConfig, cfg: RunSections) -> None:
    steps = cfg.train.steps
    if isinstance(e.times, str):
        if e.times not in EVAL_GRIDS:
            raise ConfigError(f"eval.times = '{e.times}' is unknown{did_you_mean(e.times, list(EVAL_GRIDS))}; give "
                              "\"paper\", a count of log-spaced steps like 40, or a list of steps")
    elif isinstance(e.times, int):
        if not 1 <= e.times <= MAX_EVALUATIONS:
            raise ConfigError(f"eval.times = {e.times} must be a count of log-spaced evaluation steps in [1, "
                              f"{MAX_EVALUATIONS}] (e.g. 40), or a list of steps")
    else:
        bad = [s for s in e.times if not 1 <= s <= steps]
        if not e.times or bad:
            raise ConfigError(f"eval.times lists steps {bad or '[]'} outside [1, train.steps = {steps}]")
        if len(e.times) > MAX_EVALUATIONS:
            raise ConfigError(f"eval.times lists {len(e.times)} steps; give at most {MAX_EVALUATIONS}")
    _check_choice("eval.sampler", e.sampler, SAMPLERS)
    _check_choice("eval.sampler_schedule", e.sampler_schedule, SAMPLER_SCHEDULES)
    if e.sampler == "ddim" and e.sampler_schedule == "diffusers" \
            and cfg.diffusion.beta_schedule not in DDIM_BETA_SCHEDULES:
        raise ConfigError(f"diffusion.beta_schedule = '{cfg.diffusion.beta_schedule}' is unknown to diffusers' DDIM "
                          f"sampler (eval.sampler_schedule = 'diffusers'); choose {' or '.join(DDIM_BETA_SCHEDULES)}, "
                          "or eval.sampler_schedule = 'official'")
    if e.sampler == "ddim" and e.sampler_schedule == "official" and e.sampler_steps < 2:
        raise ConfigError(f"eval.sampler_steps = {e.sampler_steps}: the official DDIM sequence needs >= 2 points "
                          "(steps - 1 updates)")
    if e.sampler_steps > cfg.diffusion.num_train_timesteps:
        _fail("eval.sampler_steps", e.sampler_steps, f"is more than the {cfg.diffusion.num_train_timesteps} DDPM "
              "steps of diffusion.num_train_timesteps; lower it (the paper: 100)")
    for key, low in (("n_samples", 2), ("sampler_steps", 1), ("batch_size", 1), ("n_boot", 1),
                     ("loss_noise_draws", 1), ("loss_n_test", 1), ("fid_n_reference", 2), ("fid_reference_sets", 1),
                     ("fid_boot", 0)):
        if getattr(e, key) < low:
            raise ConfigError(f"eval.{key} = {getattr(e, key)} must be >= {low}")
    _check_seeds("eval.seed", e.seed)
    _check_choice("eval.fid_extractor", e.fid_extractor, FID_EXTRACTORS)
    if e.fid_weights is not None and not e.fid_weights.strip():
        _fail("eval.fid_weights", e.fid_weights, "is an empty path; give the Inception weights file, or leave the "
              "key out")
    n_heldout = cfg.data.n_heldout
    if e.fid and n_heldout and n_heldout // e.fid_reference_sets < 2:  # 0: checked once the source is read
        raise ConfigError(f"eval.fid_reference_sets = {e.fid_reference_sets} disjoint FID reference sets need at "
                          f"least 2 images each, but data.n_heldout = {n_heldout}; lower fid_reference_sets")
    for key in ("checkpoint_ratio", "refine_ratio"):
        if getattr(e, key) != 0 and getattr(e, key) <= 1:
            raise ConfigError(f"eval.{key} = {getattr(e, key)} must be 0 (off) or a factor > 1, e.g. 1.25")
    if e.refine_ratio and not 1 < e.checkpoint_ratio <= e.refine_ratio:
        raise ConfigError(f"eval.refine_ratio = {e.refine_ratio} needs kept checkpoints at least as dense: set "
                          f"eval.checkpoint_ratio in (1, {e.refine_ratio}], e.g. {e.refine_ratio}")
    if e.refine_n_samples and e.refine_n_samples < e.n_samples:
        raise ConfigError(f"eval.refine_n_samples = {e.refine_n_samples} must be 0 (off) or >= eval.n_samples = "
                          f"{e.n_samples}: refinement adds samples, it never uses fewer")
    if not 0.0 <= e.stop_f_mem <= 1.0:
        raise ConfigError(f"eval.stop_f_mem = {e.stop_f_mem} must be in [0, 1] (0: never stop early)")
    if any(not 0.0 < v < 1.0 for v in e.mem_levels) or any(b <= a for a, b in zip(e.mem_levels, e.mem_levels[1:])):
        raise ConfigError(f"eval.mem_levels = {list(e.mem_levels)} must be increasing fractions in (0, 1), e.g. "
                          "[0.01, 0.1], or [] to read no level crossing")
    if any(not v > 0.0 for v in e.bias_levels) or any(b <= a for a, b in zip(e.bias_levels, e.bias_levels[1:])):
        raise ConfigError(f"eval.bias_levels = {list(e.bias_levels)} must be increasing log ratios > 0, e.g. "
                          "[0.05, 0.1], or [] to read no level crossing")
    if any(not v > 0.0 for v in e.gap_sizes) or any(b <= a for a, b in zip(e.gap_sizes, e.gap_sizes[1:])):
        raise ConfigError(f"eval.gap_sizes = {list(e.gap_sizes)} must be increasing relative gaps > 0, e.g. "
                          "[0.1, 0.3, 1], or [] to read none")
    if any(not v > 0.0 for v in e.copy_distances) or any(b <= a for a, b in zip(e.copy_distances,
                                                                                  e.copy_distances[1:])):
        raise ConfigError(f"eval.copy_distances = {list(e.copy_distances)} must be increasing fractions > 0 of the "
                          "train set's median nearest-neighbour distance, e.g. [0.3, 0.4, 0.5], or [] to record none")
    if not 0.0 < e.mem_threshold <= 1.0:
        raise ConfigError(f"eval.mem_threshold = {e.mem_threshold} must be in (0, 1]")
    if e.loss_t <= 0:
        raise ConfigError(f"eval.loss_t = {e.loss_t} must be > 0 (a diffusion time, paper: 0.01)")
    if any(not v > 0.0 for v in e.loss_ts) or any(b <= a for a, b in zip(e.loss_ts, e.loss_ts[1:])):
        raise ConfigError(f"eval.loss_ts = {list(e.loss_ts)} must be increasing diffusion times > 0, e.g. "
                          "[0.01, 0.1, 1.0], or [] to measure the loss at eval.loss_t only")
