"""Configuration: frozen dataclasses that are the only home of diffmem's defaults.

The defaults are the paper's protocol (Bonnaire et al. 2025, arXiv 2505.17638): CelebA 32x32 grayscale, U-Net base
width 32, DDPM with T = 1000 and a linear beta schedule, SGD with momentum 0.95 and lr 0.01, batch min(N, 512),
40 log-spaced evaluations, 10k DDIM-100 samples per evaluation, memorized when d1/d2 < 1/3.

A TOML experiment file has the sections ``[data] [model] [diffusion] [train] [eval]`` (and ``[sweep]`` for grids);
``--set section.key=value`` overrides it, a later override winning. Values of ``--set`` are TOML literals
(``false``, ``0.001``, ``[8, 16]``, ``"adam"``); a bare word is taken as a string.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union


class ConfigError(ValueError):
    """A bad configuration value or key; its message is one line that says what to do."""


@dataclass(frozen=True)
class DataConfig:
    """Which images, at which size, and which of them are trained on.

    The images of a source form one fixed ordering (documented per source in ``diffmem.data``). The last
    ``n_heldout`` images of that ordering are the held-out pool (test loss, FID reference); the rest is the training
    part, and the train set is images ``[subset_index * n, (subset_index + 1) * n)`` of the training part.
    ``n_heldout = 0`` chooses the pool per source: half of its M images, at most 50000 (CelebA's 202599 -> 50000, five
    FID reference sets of 10000; digits' 1797 -> 898; lfw_faces' 100 -> 50); see ``diffmem.data.splits``.
    """

    source: str = "celeba"  # "celeba" | "folder" | "lfw_faces" | "digits"
    path: str | None = None  # CelebA root / image folder / a prepared .pt tensor file
    n: int = 1024  # train-set size N (images)
    image_size: int = 32  # side of the square images (pixels)
    subset_index: int = 0  # which disjoint block of n training images
    n_heldout: int = 0  # held-out pool at the end of the ordering (images); 0: per source, min(50000, M // 2)
    cache_dir: str | None = None  # where prepared tensors go; default $DIFFMEM_CACHE or ~/.cache/diffmem


@dataclass(frozen=True)
class ModelConfig:
    """The paper's U-Net (diffusers UNet2DModel): 3 levels with channels (W, 2W, 4W)."""

    width: int = 32  # base channel width W
    channel_mult: tuple[int, ...] = (1, 2, 4)
    layers_per_block: int = 2  # ResNet blocks per level
    attention: bool = True  # 4-head self-attention at the two coarsest levels and the bottleneck
    attention_heads: int = 4  # heads of every self-attention layer (when attention_head_dim = 0)
    attention_head_dim: int = 0  # 0: attention_heads heads at every level (official); > 0: channels per head (diffusers)
    norm_groups: int = 8  # GroupNorm groups; the paper uses 8 (experiments/README.md for W = 8 on CPU)
    dropout: float = 0.1
    dropout_type: str = "channel"  # "channel": nn.Dropout2d, whole feature maps (official) | "element": nn.Dropout
    time_embedding: str = "official"  # sinusoid: "official" [sin, cos], 10000^(-k/(h-1)) | "diffusers" [cos, sin], /h
    time_act: str = "gelu"  # activation between the two linear layers of the time-embedding MLP: "gelu" | "silu"
    init: str = "official"  # weights at step 0: "official" (attention as nn.MultiheadAttention: Xavier q/k/v, zero
    #                         biases) | "diffusers" (PyTorch's nn.Linear default); a run folder keeps its recorded one


@dataclass(frozen=True)
class DiffusionConfig:
    """DDPM variance-preserving forward process with epsilon prediction."""

    num_train_timesteps: int = 1000
    beta_start: float = 1e-4
    beta_end: float = 2e-2
    beta_schedule: str = "linear"
    t_min: int = 1  # smallest DDPM step the training loss draws: t uniform in [t_min, T) (official: 1..999)


@dataclass(frozen=True)
class TrainConfig:
    """The optimizer and the length of training. Steps are optimizer steps; images seen = steps x batch."""

    optimizer: str = "sgd"  # "sgd" | "adam"
    lr: float = 0.01
    momentum: float = 0.95  # SGD momentum (ignored by Adam)
    batch_size: int = 512  # the effective batch is min(batch_size, data.n)
    steps: int = 2_000_000
    seed: int = 0
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:K" (K < the GPUs the job sees)
    num_threads: int = 0  # CPU threads for torch; 0 keeps torch's default
    deterministic: bool = True  # CUDA: deterministic algorithms (bitwise resume and replay; see docs/run-folder.md)
    precision: str = "fp32"  # "fp32" | "bf16" (autocast of the U-Net forward; see diffmem/acceleration.py)
    channels_last: bool = False  # model and data in channels-last memory format
    compile: bool = False  # torch.compile the training forward
    tensorboard: bool = True  # TensorBoard event files in <run>/tensorboard while training (needs the tensorboard package)


@dataclass(frozen=True)
class EvalConfig:
    """What is measured at each evaluation step."""

    times: int | list[int] | str = "paper"  # "paper": the official code's grid; a count k: k log-spaced steps; a list
    inline: bool = True  # evaluate inside the training job (else leave it to `diffmem evaluate`)
    n_samples: int = 10000
    sampler: str = "ddim"  # "ddim" (deterministic, eta 0) | "ddpm" (ancestral, diffusers)
    sampler_steps: int = 100  # DDIM: points of the timestep sequence ("official": steps - 1 network calls)
    sampler_schedule: str = "official"  # DDIM timesteps: "official" floor(linspace(0, T-1, steps)), ends at step 0 |
    #                                     "diffusers" (DDIMScheduler "leading" spacing, last update to alpha_bar = 1)
    clip_sample: bool = False  # clip the predicted clean image to [-1, 1] at every step (the official code does not)
    fid_clip_sample: bool | None = None  # None: the FID uses the f_mem draw; true/false: its own draw of n_samples,
    #                                    from the same initial noise, clipped or not (f_mem unclipped, FD clipped)
    batch_size: int = 1000  # samples generated per forward batch
    seed: int = 0  # sampling seed: the same checkpoint always gives the same samples
    mem_threshold: float = 1 / 3  # memorized when d1/d2 < mem_threshold
    n_boot: int = 1000  # bootstrap resamples for the f_mem confidence interval
    loss_t: float = 0.01  # diffusion time of the train/test loss gap (the DDPM step with alpha_bar closest to e^-2t)
    loss_noise_draws: int = 5
    loss_n_test: int = 2048  # held-out images for the test loss
    fid: bool = True
    fid_extractor: str = "auto"  # "auto" | "inception" | the offline extractor's name
    fid_n_reference: int = 10000  # held-out images per FID reference set (at most n_heldout // fid_reference_sets)
    fid_reference_sets: int = 5  # disjoint reference sets; metrics hold the mean FID and its spread over the sets
    fid_boot: int = 0  # bootstrap resamples of the samples for the FID's sampling noise (fid_boot_std); 0: off
    checkpoint_ratio: float = 0.0  # > 1: also keep weights between evaluations, at most this factor apart (steps)
    refine_ratio: float = 0.0  # > 1: after training, evaluate kept checkpoints in the tau brackets down to this factor
    refine_n_samples: int = 0  # > 0: refinement evaluations draw this many samples (f_mem from all, FID from the
    #                            first n_samples) and tau_mem's clean end is re-measured with them; 0: n_samples
    stop_f_mem: float = 0.0  # > 0: stop training once f_mem_lo >= this and tau_mem and tau_gen are measured
    mem_levels: tuple[float, ...] = (0.01, 0.1)  # analysis only: f_mem levels whose crossing steps are read
    #                                              (tau_mem_at_L); increasing, each in (0, 1); [] reads none
    bias_levels: tuple[float, ...] = (0.05, 0.1)  # analysis only: levels of a split pair's bias (mean log ratio)
    #                                               whose crossing steps are read (tau_bias_at_L); increasing, > 0
    fid_weights: str | None = None  # local Inception weights file (else $DIFFMEM_FID_WEIGHTS or torch's hub cache)


@dataclass(frozen=True)
class SweepConfig:
    """A grid of runs: every combination of n, width, seed and split."""

    n: list[int] = field(default_factory=list)
    width: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    cells: list[list[int]] = field(default_factory=list)  # extra [n, width] cells beyond n x width (each for every seed)
    steps_per_n: int = 0  # > 0: each run trains for max(min_steps, steps_per_n * n) steps (tau_mem ∝ N needs it)
    min_steps: int = 0  # the smallest per-run budget when steps_per_n > 0 (steps)
    splits: list[int] = field(default_factory=lambda: [0])  # training blocks: split i trains on data.subset_index = i
    #                                                         (disjoint train sets of one pool; [0, 1]: split pairs)

    def run_steps(self, n: int, default: int) -> int:
        """The training budget (optimizer steps) of a grid run with train-set size ``n``; ``default`` is
        ``train.steps``, used when ``steps_per_n`` is 0."""
        return max(self.min_steps, self.steps_per_n * n) if self.steps_per_n > 0 else default


@dataclass(frozen=True)
class TheoryConfig:
    """The random-features model of the score (``diffmem theory``); defaults are the paper's numerics (Sec. 3).

    Score s_A(x) = (A / sqrt p) tanh(W x / sqrt d), W (p x d) frozen standard Gaussian, A (d x p) trained from 0 by
    gradient descent on the DSM loss at the one diffusion time ``t``; data n samples of N(0, I_d). Training time
    tau = k * lr / d^2 (k gradient steps). p = round(psi_p * d), n = round(psi_n * d).
    """

    d: int = 100  # data dimension
    psi_p: float = 64.0  # p / d (features per dimension)
    psi_n: list[float] = field(default_factory=lambda: [4.0, 8.0, 16.0, 32.0])  # n / d values of the sweep
    t: float = 0.1  # diffusion time of the loss curves and timescales (the paper's Fig. 5)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # independent draws of W, data and GEP noise
    noise: str = "gaussian-equivalent"  # how E_xi is done: "gaussian-equivalent" | "monte-carlo"
    noise_draws: int = 16  # monte-carlo: noise draws per training sample (fixed; the model trains on them)
    test_draws: int = 4000  # fresh Monte Carlo draws for the memorization distance (and, monte-carlo, the test set)
    tau_min: float = 0.1  # first training time of the curves
    tau_max: float = 1.0e8  # last training time of the curves
    n_tau: int = 241  # log-spaced training times
    gap_fraction: float = 0.5  # tau_mem: L_gen = L_test - L_train reaches this fraction of its tau -> inf value
    spectrum_t: float = 0.01  # the spectrum figure's diffusion time (the paper's Fig. 4)
    spectrum_psi_n: float = 8.0  # and its n / d
    spectrum_noise_draws: int = 16  # real tanh features' spectrum overlay: noise draws per sample (0: left out)
    device: str = "cpu"  # "cpu" | "cuda" | "auto"


THEORY_NOISE_MODES = ("gaussian-equivalent", "monte-carlo")
EVAL_GRIDS = ("paper",)  # named evaluation grids of eval.times (diffmem.eval_grid.evaluation_steps)
SAMPLER_SCHEDULES = ("official", "diffusers")  # eval.sampler_schedule (diffmem.diffusion)
MODEL_CHOICES = {"dropout_type": ("channel", "element"), "time_embedding": ("official", "diffusers"),
                 "time_act": ("gelu", "silu"), "init": ("official", "diffusers")}
TRAIN_PRECISIONS = ("fp32", "bf16")  # train.precision (diffmem/acceleration.py)
DATA_SOURCES = ("celeba", "folder", "lfw_faces", "digits")  # data.source (diffmem.data.sources)
OPTIMIZERS = ("sgd", "adam")  # train.optimizer
SAMPLERS = ("ddim", "ddpm")  # eval.sampler
# diffusion.beta_schedule: diffusers' DDPMScheduler names (training, DDPM sampling and the official DDIM sequence);
# diffusers' DDIMScheduler (eval.sampler_schedule = "diffusers") knows only the first three
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid", "laplace")
DDIM_BETA_SCHEDULES = BETA_SCHEDULES[:3]
# eval.fid_extractor: the one list of names; diffmem.metrics.fid resolves each of them (config imports no torch module,
# so the list lives here and fid.py reads it)
FID_EXTRACTORS = ("auto", "inception", "inception-v3-compat", "diffmem-randconv-v1", "diffmem-pixels")
MAX_STEPS = 10 ** 12  # the largest train.steps (optimizer steps): step arithmetic stays exact in int64 and float64
MAX_EVALUATIONS = 10_000  # the most evaluation steps of eval.times (the paper's grid has 45)
MAX_TIMESTEPS = 100_000  # the largest diffusion.num_train_timesteps (DDPM steps; the paper: 1000)
SEED_LIMIT = 2 ** 63  # seeds are integers in [0, SEED_LIMIT): what torch and numpy generators both accept


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
        raise ConfigError(f"{key} = '{value}' is unknown{_closest(value, list(choices))}; choose "
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
        raise ConfigError(f"theory.noise = '{cfg.noise}'{_closest(cfg.noise, list(THEORY_NOISE_MODES))}; "
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


def load_theory_config(path: str | Path | None = None,
                       overrides: list[str] | tuple[str, ...] = ()) -> TheoryConfig:
    """The ``[theory]`` section of a TOML file (or the paper's numerics) with ``--set theory.key=value`` applied."""
    sections = merge_sections(read_toml(path) if path is not None else {}, list(overrides))
    extra = sorted(set(sections) - {"theory"})
    if extra:
        raise ConfigError(f"a theory config has only a [theory] section, not [{extra[0]}]; "
                          "use --set theory.key=value")
    cfg = _build_section(TheoryConfig, "theory", sections.get("theory", {}))
    validate_theory(cfg)
    return cfg


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


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "diffusion": DiffusionConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
}
ALL_SECTIONS: dict[str, type] = {**SECTIONS, "sweep": SweepConfig}


def _section_to_dict(obj: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


# --- parsing and type checking ------------------------------------------------------------------------------------

def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{where} = {value!r} has the wrong type: expected {_type_name(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: expected null")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} = {value!r} has the wrong type: expected a list like [1, 2]")
        (item_tp, *_) = typing.get_args(tp)
        items = [_coerce(v, item_tp, where) for v in value]
        return tuple(items) if origin is tuple else items
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer beyond float's range
                raise ConfigError(f"{where} = {str(value)[:12]}... is too large for a number; give a finite value, "
                                  "e.g. 0.01") from None
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - every annotation above is one of these
        raise TypeError(f"unsupported annotation {tp!r} for {where}")
    raise ConfigError(f"{where} = {value!r} has the wrong type: expected {_type_name(tp)}")


def _closest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _build_section(cls: type, section: str, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"unknown key '{section}.{key}'{_closest(key, names)}; valid keys of [{section}]: "
                              + ", ".join(names))
        kwargs[key] = _coerce(value, hints[key], f"{section}.{key}")
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"train.lr=0.001"`` -> ("train", "lr", 0.001). The value is a TOML literal; a bare word is a string."""
    key, sep, raw = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(f"--set expects section.key=value, got '{text}' (e.g. --set train.steps=1000)")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, name, value


def merge_sections(base: dict[str, dict[str, Any]], overrides: list[str]) -> dict[str, dict[str, Any]]:
    """Apply ``--set`` overrides (in order) to a nested dict of TOML sections."""
    out = {k: dict(v) for k, v in base.items()}
    for text in overrides:
        section, name, value = parse_override(text)
        out.setdefault(section, {})[name] = value
    return out


def read_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass a TOML file like experiments/demo.toml")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file '{path}' is not valid TOML: {e}") from None
    for section, values in raw.items():
        if not isinstance(values, dict):
            raise ConfigError(f"'{section}' in {path} must be a [section] table; valid sections: "
                              + ", ".join(ALL_SECTIONS))
    return raw


def build_configs(sections: dict[str, dict[str, Any]]) -> tuple[RunConfig, SweepConfig]:
    """Nested dict of sections -> (validated RunConfig, SweepConfig)."""
    for section in sections:
        if section not in ALL_SECTIONS:
            raise ConfigError(f"unknown config section '[{section}]'{_closest(section, list(ALL_SECTIONS))}; "
                              "valid sections: " + ", ".join(ALL_SECTIONS))
    built = {name: _build_section(cls, name, sections.get(name, {})) for name, cls in ALL_SECTIONS.items()}
    sweep = built.pop("sweep")
    run = RunConfig(**built)
    validate(run)
    validate_sweep(sweep, run)
    return run, sweep


def demo_config_path() -> Path:
    """experiments/demo.toml of the checkout this package was installed from (it may not exist: a wheel install)."""
    return Path(__file__).resolve().parent.parent / "experiments" / "demo.toml"


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> tuple[RunConfig, SweepConfig]:
    """Read a TOML experiment file (or none: the paper's defaults) and apply ``--set`` overrides."""
    base = read_toml(path) if path is not None else {}
    return build_configs(merge_sections(base, list(overrides)))


# Keys added after run folders were first written, with the value that every run folder written before them used
# (diffmem 0.1 followed diffusers' conventions there). A stored config that lacks one of them gets this value, so an old
# run is evaluated with the model and sampler it was trained with, and a rerun with today's defaults names the key.
def _legacy_head_dim(model: dict[str, Any]) -> int:
    width = model.get("width", ModelConfig.width)
    mult = model.get("channel_mult", list(ModelConfig.channel_mult))
    return max(1, width * mult[-1] // model.get("attention_heads", ModelConfig.attention_heads))


LEGACY_VALUES: dict[str, dict[str, Any]] = {
    "model": {"dropout_type": "element", "time_embedding": "diffusers", "time_act": "silu",
              "attention_head_dim": _legacy_head_dim, "init": "diffusers"},
    "diffusion": {"t_min": 0},
    "train": {"precision": "fp32", "channels_last": False, "compile": False},
    "eval": {"sampler_schedule": "diffusers", "fid_reference_sets": 1, "fid_boot": 0, "checkpoint_ratio": 0.0,
             "refine_ratio": 0.0, "refine_n_samples": 0, "stop_f_mem": 0.0, "fid_clip_sample": None},
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


def config_from_dict(d: dict[str, Any]) -> RunConfig:
    """Inverse of ``RunConfig.to_dict`` (reads the ``config`` stored in a run folder's config.json, also one written
    by an older diffmem: see ``upgrade_stored_config``)."""
    run, _ = build_configs({k: v for k, v in upgrade_stored_config(d).items() if k in SECTIONS})
    return run


# --- validation -----------------------------------------------------------------------------------------------------

def validate_sweep(sweep: SweepConfig, base: RunConfig | None = None) -> None:
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


def validate(cfg: RunConfig) -> None:
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


def _validate_eval(e: EvalConfig, cfg: RunConfig) -> None:
    steps = cfg.train.steps
    if isinstance(e.times, str):
        if e.times not in EVAL_GRIDS:
            raise ConfigError(f"eval.times = '{e.times}' is unknown{_closest(e.times, list(EVAL_GRIDS))}; give "
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
    if not 0.0 < e.mem_threshold <= 1.0:
        raise ConfigError(f"eval.mem_threshold = {e.mem_threshold} must be in (0, 1]")
    if e.loss_t <= 0:
        raise ConfigError(f"eval.loss_t = {e.loss_t} must be > 0 (a diffusion time, paper: 0.01)")


# Keys that may change between reruns of one run folder: they change how a run executes, not what it computes.
# A change of train.device, train.deterministic, train.channels_last or train.compile keeps the statistics of the
# trajectory but not its bits: the training state records it (diffmem.rundir.state.Trajectory).
EXECUTION_KEYS = frozenset({"train.device", "train.num_threads", "train.deterministic", "train.channels_last",
                            "train.compile", "eval.inline", "eval.batch_size", "eval.fid_weights",
                            "train.tensorboard"})
# Keys that only the analysis of a run's metrics reads: they change neither training nor any evaluation, so they may
# change between reruns too, and a run folder written before one of them continues with today's value.
ANALYSIS_KEYS = frozenset({"eval.mem_levels", "eval.bias_levels"})
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
