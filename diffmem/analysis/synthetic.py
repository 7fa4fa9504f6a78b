"""Synthetic experiment folders with planted timescales, written in the run-folder contract.

For tests and documentation of the analysis: every curve has a known tau_gen, tau_mem and tau_gap, and the noise of
a real measurement (binomial f_mem from ``n_samples`` samples with its percentile interval, noisy FID and losses), so
the estimators and fits can be checked against the planted values. Nothing here trains a model.

Planted curves, for a step s (optimizer steps):

- f_mem: 0 for s <= tau_mem, then ``f_max * (1 - tau_mem / s)``; the recorded value is Binomial(n_samples, f) /
  n_samples with the 2.5%/97.5% binomial quantiles as f_mem_lo/f_mem_hi.
- FID: ``fid_min * (1 + slope * max(0, log10(tau_gen / s)))`` (falls linearly in log time, flat from tau_gen on),
  plus ``0.2 * fid_min * f`` once memorization starts, times (1 + fid_noise * standard normal).
- sample grids (``sample_grids=True``): ``samples/step_*.png`` at every evaluation, as diffmem.evaluate writes them
  (diffmem.samplegrid): the first 32 samples above their nearest training image; each sample is a copy of it (framed
  in red) with probability equal to the recorded f_mem, else random pixels. Training images are random pixels.
- losses: a common curve ``0.1 + 0.9 / (1 + s / 100)`` for both until tau_gap; after it the train loss falls by
  ``(tau_gap / s) ** 0.5`` and the test loss rises by ``1 + 0.3 * log10(s / tau_gap)``; each times
  (1 + loss_noise * standard normal).
- per-level losses and membership AUCs (``loss_ts`` given; :mod:`diffmem.analysis.signals`): at each diffusion time
  t_k the common curve ``b_k(s) = (1 + t_k) * (0.1 + 0.9 / (1 + s / 100))`` for both until the level's planted
  opening step g_k (``gap_at_t``; None: never), then the train loss ``b_k(s) * (g_k / s) ** 0.5`` and the held-out
  loss ``b_k(g_k) * (1.2 + 0.3 * log10(s / g_k))``, a jump that the tau_gap rule sees at the first evaluation after
  g_k (so tau_gap(t_k)'s bracket is the two evaluations around g_k when at least 3 evaluations come before it); each
  times (1 + loss_noise * standard normal); the gap's interval +-0.02 b_k. The AUC of level k (and the combined
  one, planted at ``tau_auc``, by default the earliest g_k): ``0.5 + 0.02 z`` (z a standard normal clipped to
  +-1.5) with the interval +-0.08 until its step, then ``0.6 + 0.3 * (1 - step / s)`` with the same half width, so
  its lower end stays above 0.5 from the first evaluation after the planted step on.
- split pairs (:func:`write_synthetic_pairs`): each run gets a twin ``<run>_split1`` with the same planted
  timescales and other noise, and ``<experiment>/pairs.jsonl`` one line per (pair, evaluation step) with a planted
  tau_bias: before it the bias is noise (``bias_noise`` times a standard normal clipped to +-2) with an interval of
  +-3 ``bias_noise`` (holding 0); after it ``bias_max * (1 - tau_bias / s) + 3 * bias_noise`` with the same
  half width, so the interval's lower end is above 0 from the first evaluation after tau_bias on and the estimator's
  bracket holds the planted value. own_fraction = 0.5 + 0.5 tanh(bias) +- 0.03; pair_distance = ``distance * (0.5 +
  0.5 f)`` +- 3 % with f the members' mean recorded f_mem; f_mem_a / f_mem_b are the members' recorded f_mem.
- copies (:func:`write_planted_copies`): ``copies.jsonl`` lines at every evaluation of a run, from samples built so
  that chosen training images are copied from chosen steps on (each an exact copy of the image, in the model's
  centered space), the others uniform noise that copies nothing; the counts go through the evaluation's own path,
  ``diffmem.copyrecord.append_copies`` (the evaluation's own writer: counts and the strip of first copies).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from diffmem import __version__
from diffmem.analysis.runfiles import read_run
from diffmem.analysis.timescales import binomial_interval
from diffmem.config import RunConfig
from diffmem.data import load_images, make_splits, to_model
from diffmem.metrics.memorization import memorized_fraction
from diffmem.experiment import run_name
from diffmem.copyrecord import append_copies
from diffmem.io import append_jsonl, atomic_write_text, read_jsonl
from diffmem.rundir import PAIRS_FILE, RunDir
from diffmem.samplegrid import GRID_PAIRS, write_sample_grid


@dataclass(frozen=True)
class PlantedRun:
    """The planted truth of one synthetic run (steps). ``tau_mem`` None: never memorizes."""

    name: str
    path: Path
    n: int
    width: int
    seed: int
    tau_gen: float
    tau_mem: float | None
    tau_gap: float | None
    gap_at_t: tuple[float | None, ...] | None = None  # the planted opening step of each level of loss_ts
    tau_auc: float | None = None  # the planted step from which the combined membership AUC stays above 0.5


def paper_params(width: int) -> int:
    """About the paper U-Net's parameter count at base width W (0.26 M at W = 8, 4.1 M at W = 32)."""
    return int(4000 * width * width)


def evaluation_steps(steps: int, count: int) -> np.ndarray:
    """``count`` log-spaced integer steps in [1, steps] (fewer when rounding merges some), increasing."""
    return np.unique(np.round(np.geomspace(1, steps, count)).astype(int))


def synthetic_config(*, n: int, width: int, seed: int, steps: int, n_samples: int = 256,
                     n_evals: int = 40) -> RunConfig:
    """The RunConfig recorded in a synthetic run's config.json (the paper's defaults with these values)."""
    return RunConfig().replace(data={"source": "digits", "n": n, "image_size": 32}, model={"width": width},
                               train={"steps": steps, "seed": seed}, eval={"n_samples": n_samples, "times": n_evals})


def write_synthetic_run(run_dir: str | Path, *, n: int, width: int, seed: int = 0, steps: int, tau_gen: float,
                        tau_mem: float | None, tau_gap: float | None = None, n_evals: int = 40,
                        n_samples: int = 256, f_max: float = 0.8, fid_min: float = 30.0, fid_slope: float = 5.0,
                        fid_noise: float = 0.01, loss_noise: float = 0.005, record_fid: bool = True,
                        record_f_mem: bool = True, record_losses: bool = True,
                        fid_extractor: str = "inception-v3-compat", sample_grids: bool = False,
                        stop_after: int | None = None, truncate_last_line: bool = False,
                        noise_seed: int = 0, loss_ts: Sequence[float] = (),
                        gap_at_t: Sequence[float | None] | None = None, tau_auc: float | None = None,
                        control_at_t: Sequence[float | None] | None = None,
                        control_auc: float | None = None, control_below: bool = False) -> PlantedRun:
    """Write one run folder (config.json, metrics.jsonl and, unless ``stop_after`` cuts it short, done).

    ``stop_after``: keep only the first this many evaluations and leave no done file (a run still training).
    ``truncate_last_line``: append half a JSON line, as a crash during a write leaves it.
    ``record_*`` False writes null for that metric, as a switched-off metric is recorded.
    ``sample_grids``: also write a planted sample grid at every evaluation (see the module docstring).
    ``loss_ts``: also record the per-level losses and membership AUCs at these diffusion times, the gap of level k
    opening at ``gap_at_t[k]`` (default: none opens) and the combined AUC leaving 0.5 at ``tau_auc`` (default: the
    earliest level's step; module docstring).
    ``control_at_t``: also record the no-member control (``control_n`` = n), whose gap and AUC at level k leave
    their null at ``control_at_t[k]`` (None: never), the combined control AUC at ``control_auc``; with
    ``control_below`` they leave it downwards (the control fitted worse than the held-out images).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = synthetic_config(n=n, width=width, seed=seed, steps=steps, n_samples=n_samples, n_evals=n_evals)
    batch = cfg.batch_size
    meta = {"config": cfg.to_dict(), "diffmem_version": __version__, "git_sha": None,
            "dataset_sha256": "synthetic", "params": paper_params(width), "batch_size": batch}
    atomic_write_text(run_dir / "config.json", json.dumps(meta, indent=2))

    rng = np.random.default_rng([noise_seed, n, width, seed])
    gap_at = tau_gap if tau_gap is not None else (tau_mem / 2 if tau_mem is not None else None)
    lines = []
    gap_at_t = tuple(gap_at_t) if gap_at_t is not None else (None,) * len(loss_ts)
    if len(gap_at_t) != len(loss_ts):
        raise ValueError(f"gap_at_t has {len(gap_at_t)} steps for {len(loss_ts)} levels of loss_ts")
    if tau_auc is None and any(g is not None for g in gap_at_t):
        tau_auc = min(g for g in gap_at_t if g is not None)
    eval_steps = evaluation_steps(steps, n_evals)
    if stop_after is not None:
        eval_steps = eval_steps[:stop_after]
    for s in eval_steps:
        f_true = 0.0 if tau_mem is None or s <= tau_mem else f_max * (1 - tau_mem / s)
        k = rng.binomial(n_samples, f_true)
        f = k / n_samples
        f_lo, f_hi = binomial_interval(np.array(f), np.array(n_samples))
        fid = fid_min * (1 + fid_slope * max(0.0, np.log10(tau_gen / s))) + 0.2 * fid_min * f_true
        fid *= 1 + fid_noise * rng.standard_normal()
        base = 0.1 + 0.9 / (1 + s / 100)
        train, test = base, base
        if gap_at is not None and s > gap_at:
            train = base * (gap_at / s) ** 0.5
            test = base * (1 + 0.3 * np.log10(s / gap_at))
        train *= 1 + loss_noise * rng.standard_normal()
        test *= 1 + loss_noise * rng.standard_normal()
        if sample_grids:
            write_planted_grid(RunDir(run_dir).samples_path(int(s)), f, n=n, size=cfg.data.image_size,
                               rng=np.random.default_rng([noise_seed, n, width, seed, int(s)]))
        levels = planted_levels(float(s), n, loss_ts, gap_at_t, tau_auc, loss_noise, rng) if loss_ts else {}
        if loss_ts and control_at_t is not None:
            levels |= planted_control(float(s), n, loss_ts, levels["test_losses"], tuple(control_at_t), control_auc,
                                      control_below, loss_noise, rng)
        lines.append(json.dumps({
            "step": int(s), "images_seen": int(s) * batch, "wall_s": round(float(s) * 1e-3, 3),
            "n_samples": n_samples, "sampler": "ddim", "sampler_steps": 100,
            "f_mem": f if record_f_mem else None,
            "f_mem_lo": float(f_lo) if record_f_mem else None, "f_mem_hi": float(f_hi) if record_f_mem else None,
            "mem_threshold": 1 / 3,
            "fid": float(fid) if record_fid else None, "fid_extractor": fid_extractor if record_fid else None,
            "fid_reference": "synthetic" if record_fid else None,
            "train_loss": float(train) if record_losses else None, "test_loss": float(test) if record_losses else None,
            "loss_t": 0.01, **levels,
        }))
    text = "\n".join(lines) + ("\n" if lines else "")
    if truncate_last_line and lines:
        text += lines[-1][: len(lines[-1]) // 2]
    atomic_write_text(run_dir / "metrics.jsonl", text)
    done = run_dir / "done"
    if stop_after is None:
        atomic_write_text(done, "")
    else:
        done.unlink(missing_ok=True)
    return PlantedRun(run_dir.name, run_dir, n, width, seed, tau_gen, tau_mem, gap_at,
                      gap_at_t if loss_ts else None, tau_auc if loss_ts else None)


def planted_auc(s: float, opens: float | None, rng: np.random.Generator) -> tuple[float, float, float]:
    """(auc, lo, hi) of a planted membership AUC at step ``s`` that leaves 0.5 at ``opens`` (module docstring)."""
    if opens is None or s <= opens:
        auc = 0.5 + 0.02 * float(np.clip(rng.standard_normal(), -1.5, 1.5))
    else:
        auc = 0.6 + 0.3 * (1 - opens / s)
    return auc, auc - 0.08, min(auc + 0.08, 1.0)


def planted_levels(s: float, n: int, loss_ts: Sequence[float], gap_at_t: Sequence[float | None],
                   tau_auc: float | None, loss_noise: float, rng: np.random.Generator) -> dict[str, object]:
    """The per-level keys of one planted metrics line at step ``s`` (module docstring)."""
    def base(step: float, t: float) -> float:
        return (1 + t) * (0.1 + 0.9 / (1 + step / 100))

    train, test, aucs = [], [], []
    for t, g in zip(loss_ts, gap_at_t):
        tr = te = base(s, t)
        if g is not None and s > g:
            tr = base(s, t) * (g / s) ** 0.5
            te = base(g, t) * (1.2 + 0.3 * np.log10(s / g))
        train.append(float(tr * (1 + loss_noise * rng.standard_normal())))
        test.append(float(te * (1 + loss_noise * rng.standard_normal())))
        aucs.append(planted_auc(s, g, rng))
    combined = planted_auc(s, tau_auc, rng)
    return {"loss_ts": [float(t) for t in loss_ts], "loss_steps": [max(1, round(1000 * t)) for t in loss_ts],
            "train_losses": train, "test_losses": test,
            "loss_gap_lo": [b - a - 0.02 * base(s, t) for a, b, t in zip(train, test, loss_ts)],
            "loss_gap_hi": [b - a + 0.02 * base(s, t) for a, b, t in zip(train, test, loss_ts)],
            "membership_n": n, "auc": [a[0] for a in aucs], "auc_lo": [a[1] for a in aucs],
            "auc_hi": [a[2] for a in aucs], "membership_auc": combined[0], "membership_auc_lo": combined[1],
            "membership_auc_hi": combined[2]}


def planted_control(s: float, n: int, loss_ts: Sequence[float], test: Sequence[float],
                    control_at_t: tuple[float | None, ...], control_auc: float | None, below: bool,
                    loss_noise: float, rng: np.random.Generator) -> dict[str, object]:
    """The no-member control's keys of one planted metrics line at step ``s``: at level k the control's mean loss
    equals the held-out one (up to noise) until ``control_at_t[k]``, then falls below it (``below``: rises above it)
    as a fitted train set's does, and its AUC leaves 0.5 upwards (downwards) at the same step."""
    if len(control_at_t) != len(loss_ts):
        raise ValueError(f"control_at_t has {len(control_at_t)} steps for {len(loss_ts)} levels of loss_ts")
    losses, aucs = [], []
    for te, g in zip(test, control_at_t):
        c = te
        if g is not None and s > g:
            c = te * ((g / s) ** 0.5 if not below else 1 + 0.5 * (1 - g / s))
        losses.append(float(c * (1 + loss_noise * rng.standard_normal())))
        aucs.append(planted_auc(s, g, rng))
    combined = planted_auc(s, control_auc, rng)
    if below:
        aucs = [(1 - a, 1 - hi, 1 - lo) for a, lo, hi in aucs]
        combined = (1 - combined[0], 1 - combined[2], 1 - combined[1])
    return {"control_n": n, "control_losses": losses,
            "control_gap_lo": [t - c - 0.02 * t for t, c in zip(test, losses)],
            "control_gap_hi": [t - c + 0.02 * t for t, c in zip(test, losses)],
            "control_auc": [a[0] for a in aucs], "control_auc_lo": [max(0.0, a[1]) for a in aucs],
            "control_auc_hi": [min(1.0, a[2]) for a in aucs], "control_membership_auc": combined[0],
            "control_membership_auc_lo": max(0.0, combined[1]), "control_membership_auc_hi": min(1.0, combined[2])}


def write_planted_grid(path: Path, f_mem: float, *, n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Write a sample grid (diffmem.samplegrid) whose samples are copies of their nearest training image with
    probability ``f_mem``; returns which of the shown samples are copies (booleans, shape (32,))."""
    shown = GRID_PAIRS
    train = rng.random((min(n, 64), 1, size, size), dtype=np.float32)
    nearest = train[rng.integers(0, len(train), shown)]
    copies = rng.random(shown) < f_mem
    samples = np.where(copies[:, None, None, None], nearest, rng.random(nearest.shape, dtype=np.float32))
    write_sample_grid(path, torch.from_numpy(samples), torch.from_numpy(nearest), torch.from_numpy(copies))
    return copies


def paper_tau_mem(n: int, width: int) -> float:
    """The paper's law: tau_mem ~ 300 N steps at W = 32, proportional to N / W."""
    return 300.0 * n * 32 / width


def paper_tau_gen(n: int, width: int) -> float:
    """The paper's law: tau_gen ~ 1e5 steps at W = 32, flat in N, proportional to 1 / W."""
    return 1e5 * 32 / width


def write_synthetic_experiment(root: str | Path, ns: Iterable[int], widths: Iterable[int] = (32,),
                               seeds: Iterable[int] = (0,), *,
                               tau_mem: Callable[[int, int], float | None] = paper_tau_mem,
                               tau_gen: Callable[[int, int], float] = paper_tau_gen,
                               steps: Callable[[int, int], int] | int = 2_000_000,
                               gap_at_t: Callable[[int, int], Sequence[float | None]] | None = None,
                               tau_auc: Callable[[int, int], float | None] | None = None,
                               **run_kwargs) -> list[PlantedRun]:
    """Write one run folder per (N, W, seed) under ``root`` (names like ``n00128_w08_s0``) with planted laws.

    ``tau_mem``/``tau_gen``: the planted law as a function of (N, W); ``steps``: the training length, a number or a
    function of (N, W); ``gap_at_t`` and ``tau_auc``: the planted per-level gap openings and the combined AUC's step
    as functions of (N, W) (with ``loss_ts``). Other keywords go to :func:`write_synthetic_run`.
    """
    root = Path(root)
    planted = []
    for w in widths:
        for n in ns:
            for seed in seeds:
                total = int(steps(n, w) if callable(steps) else steps)
                name = run_name(synthetic_config(n=n, width=w, seed=seed, steps=total))
                extra = {"gap_at_t": gap_at_t(n, w)} if gap_at_t is not None else {}
                if tau_auc is not None:
                    extra["tau_auc"] = tau_auc(n, w)
                planted.append(write_synthetic_run(root / name, n=n, width=w, seed=seed, steps=total,
                                                   tau_gen=tau_gen(n, w), tau_mem=tau_mem(n, w), **extra,
                                                   **run_kwargs))
    return planted


@dataclass(frozen=True)
class PlantedPair:
    """The planted truth of one synthetic split pair: its id (the split-0 run's name), its two runs and tau_bias
    (optimizer steps; None: the bias is never established)."""

    pair: str
    run_a: PlantedRun
    run_b: PlantedRun
    tau_bias: float | None


def write_synthetic_pairs(root: str | Path, planted: Sequence[PlantedRun], *,
                          tau_bias: Callable[[int, int], float | None], bias_max: float = 1.0,
                          bias_noise: float = 0.02, distance: float = 6.0, n_samples: int = 1000,
                          noise_seed: int = 0, **run_kwargs) -> list[PlantedPair]:
    """Make each of ``planted`` (split-0 runs under ``root``) a split pair: write its twin ``<run>_split1`` (same N,
    W, seed, steps and planted timescales; ``run_kwargs`` go to :func:`write_synthetic_run` and must repeat those
    the run was written with, e.g. ``n_evals``) and append one ``pairs.jsonl`` line per evaluation step of the pair
    with the planted measures of the module docstring. ``tau_bias``: the planted tau_bias as a function of (N, W);
    ``distance``: the pair distance of two unrelated samples (pixel units)."""
    root = Path(root)
    pairs = []
    for run in planted:
        record_a = read_run(run.path)
        twin = write_synthetic_run(root / f"{run.name}_split1", n=run.n, width=run.width, seed=run.seed,
                                   steps=int(record_a.planned_steps), tau_gen=run.tau_gen, tau_mem=run.tau_mem,
                                   tau_gap=run.tau_gap, noise_seed=noise_seed + 1, **run_kwargs)
        record_b = read_run(twin.path)
        tau = tau_bias(run.n, run.width)
        f_a = dict(zip(record_a.steps, record_a.series("f_mem")))
        f_b = dict(zip(record_b.steps, record_b.series("f_mem")))
        rng = np.random.default_rng([noise_seed, run.n, run.width, run.seed, 7])
        for s in sorted(set(f_a) & set(f_b)):
            half = 3 * bias_noise
            if tau is None or s <= tau:
                bias = bias_noise * float(np.clip(rng.standard_normal(), -2, 2))
            else:
                bias = bias_max * (1 - tau / s) + half
            own = 0.5 + 0.5 * math.tanh(bias)
            f = np.nanmean([f_a[s], f_b[s]]) if np.isfinite([f_a[s], f_b[s]]).any() else 0.0
            d = distance * (0.5 + 0.5 * float(f))
            append_jsonl(root / PAIRS_FILE, {
                "pair": run.name, "run_a": run.name, "run_b": twin.name, "split_a": 0, "split_b": 1,
                "n": run.n, "width": run.width, "seed_train": run.seed, "step": int(s), "n_samples": n_samples,
                "pair_distance": d, "pair_distance_lo": 0.97 * d, "pair_distance_hi": 1.03 * d,
                "bias": bias, "bias_lo": bias - half, "bias_hi": bias + half,
                "own_fraction": own, "own_fraction_lo": max(own - 0.03, 0.0),
                "own_fraction_hi": min(own + 0.03, 1.0),
                "f_mem_a": _or_none(f_a[s]), "f_mem_b": _or_none(f_b[s]),
                "seed": 0, "sampler": "ddim", "sampler_steps": 100, "n_boot": 1000, "wall_s": 0.01,
            })
        pairs.append(PlantedPair(run.name, run, twin, tau))
    return pairs


def _or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def write_planted_copies(run_dir: str | Path, first_copy: dict[int, int], *, copies_per_image: int = 1,
                         refinements: Sequence[tuple[int, int]] = (), noise_seed: int = 0) -> None:
    """Append a ``copies.jsonl`` line for every evaluation of the run folder's metrics.jsonl (then one per
    ``refinements`` (step, n_samples), a refinement evaluation with more samples) in which training image i is
    copied by ``copies_per_image`` samples at every evaluation from step ``first_copy[i]`` on (optimizer steps;
    images not in ``first_copy`` are never copied). Each line has the run's eval.n_samples samples (or the
    refinement's): the copies, exact copies of their training image, and uniform noise in the model's pixel range,
    which copies nothing (its two nearest training images are about equally far). The train set is the run's own
    (its config's data; config.json's dataset_sha256 is set to theirs), the counts those of
    :func:`diffmem.copyrecord.append_copies` on ``memorized_fraction(samples, train)`` (the evaluation's own writer)."""
    run = RunDir(run_dir)
    stored = run.read_config()
    cfg = stored.config
    images = load_images(cfg.data)
    if stored.meta.get("dataset_sha256") != images.sha256:  # the copies are of these images: the run says so
        atomic_write_text(run.config_path, json.dumps({**stored.meta, "dataset_sha256": images.sha256}, indent=2))
    splits = make_splits(images, cfg.data)
    train = to_model(splits.train, splits.mean)
    rng = torch.Generator().manual_seed(noise_seed)
    evaluations = [(int(r["step"]), cfg.eval.n_samples) for r in read_jsonl(run.metrics_path)]
    for step, n_samples in evaluations + [(int(s), int(n)) for s, n in refinements]:
        chosen = [i for i, at in sorted(first_copy.items()) if at <= step]
        copies = train[torch.tensor(chosen, dtype=torch.long).repeat_interleave(copies_per_image)]
        if len(copies) > n_samples:
            raise ValueError(f"{len(copies)} planted copies at step {step} exceed the {n_samples} samples")
        noise = torch.rand((n_samples - len(copies), *train.shape[1:]), generator=rng) - splits.mean
        samples = torch.cat([copies, noise])
        result = memorized_fraction(samples, train, threshold=cfg.eval.mem_threshold, n_boot=1)
        append_copies(run, result, samples, splits.mean, step, cfg.eval.seed, len(train))
