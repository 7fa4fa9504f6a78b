"""The memorization galleries ``gallery_n{N:05d}_w{W:02d}``: per cell (N, W), one run's stored sample grids
(diffmem.samplegrid: samples above their nearest training images, copies framed in red) before tau_gen, inside the
window and after tau_mem, upscaled without smoothing."""
from __future__ import annotations

import math
from typing import Any, Sequence

import matplotlib.image
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from diffmem.analysis.runfiles import RunRecord
from diffmem.figures.experiment_files import ExperimentFiles
from diffmem.figures.style import FigureOutput, FigureResult


GALLERY_PHASES = ("before tau_gen", "inside the window", "after tau_mem")
"""The three checkpoints of a gallery (keys of :func:`gallery_steps`)."""

GALLERY_WIDTH_PX = 1200
"""A gallery panel is upscaled by the integer factor that brings the stored grid nearest this width (pixels)."""


def grid_steps(record: RunRecord) -> list[int]:
    """The steps (optimizer steps, increasing) at which the run folder holds a stored sample grid
    ``samples/step_XXXXXXXXX.png`` (diffmem.samplegrid)."""
    folder = record.path / "samples"
    steps = []
    for path in folder.glob("step_*.png") if folder.is_dir() else ():
        digits = path.stem[len("step_"):]
        if digits.isdigit():
            steps.append(int(digits))
    return sorted(steps)


def _nearest_in_log(steps: Sequence[int], target: float) -> int | None:
    return min(steps, key=lambda s: abs(math.log(s / target))) if steps else None


def usable_timescales(row: dict[str, Any]) -> str | None:
    """Why a summary row's timescales cannot place a gallery's checkpoints (None: they can): tau_gen and tau_mem must
    both be measured, not censored."""
    for key in ("tau_gen", "tau_mem"):
        if row.get(key) is None:
            return f"no {key}"
        if row.get(f"{key}_censored"):
            bound = "lower" if row.get(f"{key}_hi") is None else "upper"
            return f"{key} is censored (only a {bound} bound, {row[key]:.4g} steps)"
    return None


def gallery_steps(steps: Sequence[int], row: dict[str, Any]) -> dict[str, int | None]:
    """The stored grid shown for each of :data:`GALLERY_PHASES` (None: no stored grid in that range), from a
    summary row whose tau_gen and tau_mem are measured (:func:`usable_timescales`); ``steps``: the grids' steps.

    - before tau_gen: among the grids before tau_gen's interval (step < ``tau_gen_lo``), the one nearest in log step
      to the log-middle of [first grid, tau_gen_lo] (a model still learning, not an untrained one);
    - inside the window: among the grids in [tau_gen, tau_mem], the one nearest the window's log-middle
      sqrt(tau_gen * tau_mem) (None when tau_mem <= tau_gen: no window);
    - after tau_mem: the last grid, if it lies at or after ``tau_mem_hi`` (the first evaluation with detectable
      copies), so that it shows memorization at its most developed."""
    steps = sorted(steps)
    gen, mem = row["tau_gen"], row["tau_mem"]
    gen_lo = row.get("tau_gen_lo") or gen
    mem_hi = row.get("tau_mem_hi") or mem
    before = [s for s in steps if s < gen_lo]
    inside = [s for s in steps if gen <= s <= mem]
    return {
        "before tau_gen": _nearest_in_log(before, math.sqrt(before[0] * gen_lo)) if before else None,
        "inside the window": _nearest_in_log(inside, math.sqrt(gen * mem)) if inside and gen < mem else None,
        "after tau_mem": steps[-1] if steps and steps[-1] >= mem_hi else None,
    }


def _evaluation_at(record: RunRecord, step: int) -> dict[str, Any]:
    return next((e for e in record.evaluations if int(e["step"]) == step), {})


GALLERY_TITLES = {"before tau_gen": r"before $\tau_\mathrm{gen}$", "inside the window": "inside the window",
                  "after tau_mem": r"after $\tau_\mathrm{mem}$"}


def _panel_title(phase: str, step: int, evaluation: dict[str, Any]) -> str:
    f, lo, hi = (evaluation.get(k) for k in ("f_mem", "f_mem_lo", "f_mem_hi"))
    text = f"{GALLERY_TITLES[phase]}: step {step}"
    if f is not None:
        text += f", $f_\\mathrm{{mem}}$ = {f:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None
                                                    else "")
        if evaluation.get("n_samples"):
            text += f" of {evaluation['n_samples']} samples"
    return text


def plot_gallery(data: ExperimentFiles, n: int, width: int, out: FigureOutput) -> FigureResult:
    """The memorization gallery of one cell (N, W): the stored sample grids of one of its runs at the three
    checkpoints of :func:`gallery_steps`, one panel each (titled with its step and f_mem with its 95 % interval),
    upscaled by an integer factor without smoothing (nearest neighbour). The run is the cell's lowest seed that has
    stored grids and measured tau_gen and tau_mem; skipped with a reason when none has."""
    name = f"gallery_n{n:05d}_w{width:02d}"
    rows = sorted((r for r in data.rows if r["n"] == n and r["width"] == width), key=lambda r: r["seed"])
    reasons = []
    for row in rows:
        record = data.records[row["run"]]
        steps = grid_steps(record)
        why = "no stored sample grids (samples/step_*.png)" if not steps else usable_timescales(row)
        if why is None:
            chosen = gallery_steps(steps, row)
            if any(chosen.values()):
                return _draw_gallery(record, row, chosen, out, name)
            why = "no stored grid before tau_gen, inside the window or after tau_mem"
        reasons.append(f"{row['run']}: {why}")
    return FigureResult(name, skipped="; ".join(reasons))


def _draw_gallery(record: RunRecord, row: dict[str, Any], chosen: dict[str, int | None], out: FigureOutput,
                  name: str) -> FigureResult:
    images = {phase: matplotlib.image.imread(record.path / "samples" / f"step_{step:09d}.png")
              for phase, step in chosen.items() if step is not None}
    height, grid_width = next(iter(images.values())).shape[:2]
    scale = max(1, round(GALLERY_WIDTH_PX / grid_width))
    fig_width = 7.0
    panel_height = fig_width * height / grid_width + 0.35
    fig = Figure(figsize=(fig_width, len(chosen) * panel_height + 0.7), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(chosen), 1, squeeze=False).ravel().tolist()
    for ax, (phase, step) in zip(axes, chosen.items()):
        ax.set_axis_off()
        if step is None:
            ax.text(0.5, 0.5, f"{phase}: no stored sample grid in that range", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="0.3")
            continue
        big = np.repeat(np.repeat(images[phase], scale, axis=0), scale, axis=1)
        ax.imshow(big, interpolation="nearest")
        ax.set_title(_panel_title(phase, step, _evaluation_at(record, step)), fontsize=8, loc="left")
    threshold = record.mem_threshold if record.mem_threshold is not None else 1 / 3
    fig.suptitle(f"{record.name}: N = {row['n']}, W = {row['width']}; $\\tau_\\mathrm{{gen}}$ = {row['tau_gen']:.0f}, "
                 f"$\\tau_\\mathrm{{mem}}$ = {row['tau_mem']:.0f} steps\n"
                 f"rows of samples, each above its nearest training image; red frame: a copy "
                 f"($d_1/d_2 < {threshold:.2g}$)", fontsize=8)
    return out.save(fig, name)


def plot_galleries(data: ExperimentFiles, out: FigureOutput) -> list[FigureResult]:
    """One :func:`plot_gallery` per cell (N, W); one skipped result named ``gallery`` when no run of the experiment
    has stored sample grids."""
    if not any(grid_steps(rec) for rec in data.records.values()):
        return [FigureResult("gallery", skipped="no run has stored sample grids (samples/step_*.png)")]
    cells = sorted({(r["n"], r["width"]) for r in data.rows}, key=lambda c: (c[1], c[0]))
    return [plot_gallery(data, n, w, out) for n, w in cells]
