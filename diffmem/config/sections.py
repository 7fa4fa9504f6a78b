"""The config dataclasses: the one home of diffmem's defaults, one frozen dataclass per section of an experiment file
(``[data] [model] [diffusion] [train] [eval] [sweep]``, and ``[theory]`` of ``diffmem theory``), the choices and
limits their keys are checked against (:mod:`diffmem.config.checks`), and :class:`ConfigError`.

The defaults are the paper's protocol (Bonnaire et al. 2025, arXiv 2505.17638): CelebA 32x32 grayscale, U-Net base
width 32, DDPM with T = 1000 and a linear beta schedule, SGD with momentum 0.95 and lr 0.01, batch min(N, 512),
40 log-spaced evaluations, 10k DDIM-100 samples per evaluation, memorized when d1/d2 < 1/3.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A bad configuration value or key; its message is one line that says what to do."""


@dataclass(frozen=True)
class DataConfig:
    """Which images, at which size, and which of them are trained on.

    The images of a source form one fixed ordering (documented per source in ``diffmem.data``). ``order`` says how
    the split reads it: "shuffled" (the default) first permutes the source's images with the seed ``order_seed``, so
    that every image set a comparison needs (train set, held-out pool, non-members, control, split halves, FID
    reference sets) is a disjoint block of one uniform random permutation: exchangeable by construction; "source"
    keeps the source's ordering (the paper's protocol: the official code's ordered subsets of CelebA). The last
    ``n_heldout`` images of that order are the held-out pool (test loss, FID reference); the rest is the training
    part, and the train set is images ``[subset_index * n, (subset_index + 1) * n)`` of the training part.
    ``n_heldout = 0`` chooses the pool per source: half of its M images, at most 50000 (CelebA's 202599 -> 50000, five
    FID reference sets of 10000; digits' 1797 -> 898; lfw_faces' 100 -> 50); see ``diffmem.data.splits``.
    """

    source: str = "celeba"  # "celeba" | "folder" | "lfw_faces" | "digits"
    path: str | None = None  # CelebA root / image folder / a prepared .pt tensor file
    n: int = 1024  # train-set size N (images)
    image_size: int = 32  # side of the square images (pixels)
    subset_index: int = 0  # which disjoint block of n training images
    order: str = "shuffled"  # "shuffled": blocks of a seeded random permutation of the source | "source": its ordering
    order_seed: int = 0  # seed of the permutation (data.order = "shuffled"); the same for every run of a sweep
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
    copy_distances: tuple[float, ...] = (0.3, 0.4, 0.5)  # fixed-distance copy rules recorded beside the ratio rule:
    #   a sample copies its nearest training image when d1 < f x D, D the median distance from a training image to
    #   its nearest other one (copies.jsonl ``copied_within``); [] records none
    n_boot: int = 1000  # bootstrap resamples for the f_mem confidence interval
    loss_t: float = 0.01  # diffusion time of the train/test loss gap (the DDPM step with alpha_bar closest to e^-2t)
    loss_noise_draws: int = 5
    loss_n_test: int = 2048  # held-out images for the test loss
    loss_ts: tuple[float, ...] = (0.01, 0.025, 0.063, 0.16, 0.4, 1.0)  # diffusion times of the per-level train and
    #   test losses, their gap's interval and the membership AUC (log-spaced 0.01 .. 1); increasing, > 0; [] off
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
    gap_sizes: tuple[float, ...] = (0.1, 0.3, 1.0)  # analysis only: sizes of the relative loss gap test / train - 1
    #                                                 whose crossing steps are read at each noise level
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
DATA_ORDERS = ("shuffled", "source")  # data.order (diffmem.data.splits)
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

# the sections of a run's config (RunConfig, diffmem.config.run) and of an experiment file
SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "diffusion": DiffusionConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
}
ALL_SECTIONS: dict[str, type] = {**SECTIONS, "sweep": SweepConfig}
