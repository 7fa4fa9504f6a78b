"""When to stop training for a given (N, W): predicted tau_gen and tau_mem and a stopping step (`diffmem advise`).

Predictions come from the laws an experiment measured (fits.json, see :mod:`diffmem.analysis.scaling`) or, without
one, from the laws measured in the paper (Bonnaire et al. 2025, arXiv 2505.17638; CelebA 32x32 grayscale, U-Net,
SGD momentum 0.95, lr 0.01, batch min(N, 512)): at W = 32, tau_gen ~ 1e5 steps for every N and tau_mem ~ 300 N
steps (the f_mem curves collapse against tau / N and rise at tau / N ~ 300); both scale as 1 / W, so
tau_gen = 1e5 * 32 / W and tau_mem = 300 * N * 32 / W. The paper gives no interval for these laws, so their
predictions carry none.

:func:`advise_measured` applies the same rule to the timescales one run measured (its own brackets, no law): the
step at which that run, or a repeat of it, should stop.

Which fitted law predicts (first that applies; every law in N or in W is one over comparable runs, fits.json's
``by_width`` or ``by_n``, never one over runs that differ in the other setting):
- tau_mem: ``tau_mem_vs_n`` of width W; else ``tau_mem_vs_n_over_width`` at N / W (assumes tau_mem depends on N / W
  only, as in the paper, when W was not measured).
- tau_gen: ``tau_gen_vs_n`` of width W; else ``tau_gen_vs_width`` of N (or of the measured N nearest to it in log:
  assumes tau_gen flat in N, as in the paper); else ``tau_gen_vs_n`` of the width W0 nearest to W in log, rescaled by
  W0 / W (the paper's 1 / W law).
- the level crossings ``tau_mem_at_L`` (the step at which f_mem reaches L, which unlike the onset does not depend on
  the number of samples per evaluation): ``tau_mem_at_L_vs_n`` of width W, for each L the experiment fitted. They are
  printed beside the onset; the stopping rule uses the onset (the first detectable copies).
An x outside the fitted range gives an extrapolation warning.

Stopping rule (docs/analysis.md copies it), with [lo, hi] the predictions' 95% intervals:
- window open (tau_gen_hi < tau_mem_lo): stop at sqrt(tau_gen_hi * tau_mem_lo), the log-midpoint of the part of the
  window that both intervals agree on: FID has plateaued and memorization has not started, with a margin of
  sqrt(tau_mem_lo / tau_gen_hi) on each side.
- window unresolved (tau_gen < tau_mem but the intervals overlap): stop at sqrt(tau_gen * tau_mem), with a warning.
- window empty (tau_mem <= tau_gen): stop at tau_mem_lo / 2, before memorization, and say that FID will not have
  reached its plateau; more data (N) or a smaller W opens the window.

Which model to keep: with an open window, the advice also says to keep checkpoints from tau_gen_hi to the stop and to
use the one with the best FID (``Advice.keep_from``). Every step of that range lies inside the window, but the
quality of the model at one given step is not the plateau's: at full batch with the paper's optimizer it moves
between neighbouring steps by much more than the FID's sampling noise (docs/analysis.md, "Advice").
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from diffmem.analysis.powerlaw import FIT_NAMES, FitSet, PowerLawFit, load_fits
from diffmem.analysis.timescales import Estimate

PAPER_SOURCE = ("paper laws (Bonnaire et al. 2025, arXiv 2505.17638; CelebA 32x32 grayscale, U-Net, SGD momentum "
                "0.95, lr 0.01, batch min(N, 512)): tau_gen ~ 1e5 * 32/W steps, tau_mem ~ 300 * N * 32/W steps")
PAPER_TAU_GEN_W32 = 1e5  # steps, flat in N
PAPER_TAU_MEM_PER_N_W32 = 300.0  # steps per training image
PAPER_WIDTH = 32
PAPER_WIDTHS = (8, 64)  # base widths the paper measured


class AdviceError(ValueError):
    """Bad input to advise(); the message says what to pass."""


@dataclass(frozen=True)
class Prediction:
    """A predicted timescale in optimizer steps with its 95% interval (None = unknown) and where it came from."""

    value: float | None
    lo: float | None
    hi: float | None
    source: str

    @property
    def known(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class Advice:
    """Predicted timescales for (N, W), the generalization window and a recommended stopping step."""

    n: int
    width: int
    tau_gen: Prediction
    tau_mem: Prediction
    window: str  # "open" | "unresolved" | "empty" | "unknown"
    stop_step: float | None
    stop_rule: str
    laws: str  # PAPER_SOURCE (the paper's laws and their source) or the fits.json they came from
    warnings: tuple[str, ...] = field(default_factory=tuple)
    keep_from: float | None = None  # open window: keep checkpoints from this step (tau_gen_hi) to the stop
    levels: tuple[tuple[float, Prediction], ...] = ()  # (L, predicted tau_mem_at_L) for each fitted f_mem level

    def format(self) -> str:
        """The advice as plain text for a terminal."""
        def show(p: Prediction) -> str:
            if not p.known:
                return f"unknown ({p.source})"
            ci = f" [{p.lo:.3g}, {p.hi:.3g}]" if p.lo is not None and p.hi is not None and p.lo != p.hi else ""
            return f"{p.value:.3g} steps{ci}  ({p.source})"

        lines = [f"Advice for N = {self.n}, W = {self.width} (laws: {self.laws})",
                 f"  tau_gen (FID plateau):         {show(self.tau_gen)}",
                 f"  tau_mem (memorization starts): {show(self.tau_mem)}"]
        lines += [f"  f_mem reaches {level:g}:{' ' * max(1, 15 - len(f'{level:g}'))}{show(p)}"
                  for level, p in self.levels]
        window_text = {
            "open": "open: FID plateaus before memorization starts",
            "unresolved": "open at the predicted values, but their intervals overlap",
            "empty": "EMPTY: memorization is predicted to start before FID plateaus",
            "unknown": "unknown",
        }[self.window]
        lines.append(f"  generalization window: {window_text}")
        if self.stop_step is not None:
            lines.append(f"  recommended stop: step {self.stop_step:.3g}  (rule: {self.stop_rule})")
            if self.keep_from is not None:
                lines.append(f"  keep: the checkpoints from step {math.ceil(self.keep_from):.3g} to the stop, and use "
                             "the one with the best FID (one step's quality can be off the plateau)")
        else:
            lines.append(f"  recommended stop: none ({self.stop_rule})")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# --- predictions ----------------------------------------------------------------------------------------------------

def _from_fit(fit: PowerLawFit, x: float, label: str, warnings: list[str], scale: float = 1.0) -> Prediction:
    value, lo, hi = (float(v) * scale for v in fit.predict(x))
    x_min, x_max = fit.x_range
    if not x_min <= x <= x_max:
        warnings.append(f"extrapolating {fit.quantity}: {fit.x_name} = {x:.4g} is outside the fitted range "
                        f"[{x_min:.4g}, {x_max:.4g}]")
    if fit.ci_note and fit.exponent_lo is not None:  # an interval kept with a caveat (e.g. collinear cell means)
        warnings.append(f"{fit.quantity} vs {fit.x_name}: {fit.ci_note}")
    if note := fit.resolution_note():  # the prediction's interval is the evaluations' resolution: denser ones narrow it
        warnings.append(f"{fit.quantity} vs {fit.x_name}: {note}")
    return Prediction(value, lo, hi, label)


def _nearest_group(fit_set: FitSet, value: int) -> tuple[int, PowerLawFit] | None:
    """The fitted law of ``fit_set``'s group (a width of a law in N, an N of a law in W) nearest to ``value`` in log
    (``value`` itself when it has one), with that group's value; None when no group has a fitted law."""
    fitted = [(int(k), fit) for k, fit in fit_set.groups.items() if fit.fitted]
    if not fitted:
        return None
    return min(fitted, key=lambda item: (abs(math.log(item[0] / value)), item[0]))


def _from_own_width(fits: Mapping[str, FitSet], name: str, n: int, width: int,
                    warnings: list[str]) -> Prediction | None:
    """The prediction at N = ``n`` of the law ``name`` (an ``..._vs_n`` fit set) fitted at width ``width`` itself,
    or None when that width has no fitted law."""
    own = fits[name].groups.get(str(width))
    if own is None or not own.fitted:
        return None
    return _from_fit(own, n, f"{name} at W={width}, exponent {own.exponent:.2f}", warnings)


def _predict_tau_mem(fits: Mapping[str, FitSet], n: int, width: int, warnings: list[str]) -> Prediction:
    own = _from_own_width(fits, "tau_mem_vs_n", n, width, warnings)
    if own is not None:
        return own
    combined = fits["tau_mem_vs_n_over_width"].all_runs
    if combined.fitted:
        measured = sorted(fits["tau_mem_vs_n"].groups, key=float)
        if str(width) not in measured:
            warnings.append(f"W = {width} was not measured (widths {', '.join(measured)}): tau_mem assumed to depend "
                            "on N / W only (paper)")
        return _from_fit(combined, n / width, f"tau_mem_vs_n_over_width, exponent {combined.exponent:.2f}", warnings)
    return Prediction(None, None, None, f"no fitted tau_mem law at W = {width} and no tau_mem_vs_n_over_width: "
                                        + (combined.reason or ""))


def _predict_levels(fits: Mapping[str, FitSet], n: int, width: int,
                    warnings: list[str]) -> tuple[tuple[float, Prediction], ...]:
    """(L, tau_mem_at_L) from each fitted ``tau_mem_at_L_vs_n`` law of width W, by level."""
    out = []
    for name in sorted((k for k in fits if k.startswith("tau_mem_at_") and k.endswith("_vs_n")),
                       key=lambda k: float(k[len("tau_mem_at_"):-len("_vs_n")])):
        own = _from_own_width(fits, name, n, width, warnings)
        if own is not None:
            out.append((float(name[len("tau_mem_at_"):-len("_vs_n")]), own))
    return tuple(out)


def _predict_tau_gen(fits: Mapping[str, FitSet], n: int, width: int, warnings: list[str]) -> Prediction:
    own = _from_own_width(fits, "tau_gen_vs_n", n, width, warnings)
    if own is not None:
        return own
    at_n = _nearest_group(fits["tau_gen_vs_width"], n)
    if at_n is not None:
        n0, fit = at_n
        if n0 != n:
            warnings.append(f"tau_gen's width law measured at N = {n0}: assumed flat in N (paper)")
        return _from_fit(fit, width, f"tau_gen_vs_width at N={n0}, exponent {fit.exponent:.2f}", warnings)
    at_width = _nearest_group(fits["tau_gen_vs_n"], width)
    if at_width is not None:
        w0, fit = at_width
        warnings.append(f"tau_gen measured against N at W = {w0}: rescaled by {w0}/{width} (paper: tau_gen ~ 1/W)")
        return _from_fit(fit, n, f"tau_gen_vs_n at W={w0} rescaled to W={width}", warnings, scale=w0 / width)
    reason = fits["tau_gen_vs_n"].all_runs.reason or "no width law either"
    return Prediction(None, None, None, f"no fitted tau_gen law: {reason}")


def _paper_predictions(n: int, width: int, warnings: list[str]) -> tuple[Prediction, Prediction]:
    scale = PAPER_WIDTH / width
    if not PAPER_WIDTHS[0] <= width <= PAPER_WIDTHS[1]:
        warnings.append(f"W = {width} is outside the widths the paper measured ({PAPER_WIDTHS[0]}..{PAPER_WIDTHS[1]})")
    warnings.append("the paper's laws hold for its setup (CelebA 32x32, SGD); for other data, resolutions or "
                    "optimizers measure them: `diffmem sweep` then `diffmem advise --from EXPERIMENT_DIR`")
    gen = PAPER_TAU_GEN_W32 * scale
    mem = PAPER_TAU_MEM_PER_N_W32 * n * scale
    return (Prediction(gen, gen, gen, "paper: 1e5 * 32/W, no interval given"),
            Prediction(mem, mem, mem, "paper: 300 * N * 32/W, no interval given"))


def _resolve_fits(fits: Mapping[str, Any] | str | Path) -> tuple[dict[str, FitSet], str]:
    if isinstance(fits, (str, Path)):
        path = Path(fits)
        return load_fits(path), str(path / "fits.json" if path.is_dir() else path)
    if all(isinstance(v, FitSet) for v in fits.values()) and all(k in fits for k in FIT_NAMES):
        return dict(fits), "fits given"
    missing = [k for k in FIT_NAMES if k not in fits]
    if missing:
        raise AdviceError(f"fits lacks {', '.join(missing)}; pass the content of fits.json or its path")
    return {k: FitSet.from_dict(fits[k]) for k in FIT_NAMES}, "fits given"


# --- the rule -------------------------------------------------------------------------------------------------------

def stopping_step(tau_gen: Prediction, tau_mem: Prediction) -> tuple[str, float | None, str]:
    """(window, stop step, rule text) from two predictions (see the module docstring for the rule)."""
    if not tau_mem.known:
        return "unknown", None, "tau_mem is unknown, so no step is known to be safe"
    mem_lo = tau_mem.lo if tau_mem.lo is not None else tau_mem.value
    if not tau_gen.known:
        return ("unknown", mem_lo / 2,
                "tau_gen unknown: tau_mem_lo / 2, before memorization; FID may not have plateaued")
    gen_hi = tau_gen.hi if tau_gen.hi is not None else tau_gen.value
    if gen_hi < mem_lo:
        return "open", math.sqrt(gen_hi * mem_lo), "sqrt(tau_gen_hi * tau_mem_lo), the middle of the safe window"
    if tau_gen.value < tau_mem.value:
        return ("unresolved", math.sqrt(tau_gen.value * tau_mem.value),
                "sqrt(tau_gen * tau_mem); the intervals overlap, so check f_mem while training")
    return ("empty", mem_lo / 2,
            "tau_mem_lo / 2, before memorization starts; FID will not have reached its plateau "
            "(a larger N or a smaller W opens the window)")


def advise(n: int, width: int, fits: Mapping[str, Any] | str | Path | None = None) -> Advice:
    """Predicted tau_gen and tau_mem for training set size ``n`` and base width ``width``, and when to stop.

    ``fits``: None (the paper's laws), a path to fits.json or to an experiment folder holding it, the parsed
    fits.json dict, or the result of :func:`diffmem.analysis.powerlaw.load_fits`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise AdviceError(f"n = {n!r} must be an integer >= 2 (training images)")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise AdviceError(f"width = {width!r} must be an integer >= 1 (the U-Net base width W)")
    warnings: list[str] = []
    if fits is None:
        tau_gen, tau_mem = _paper_predictions(n, width, warnings)
        laws = PAPER_SOURCE
    else:
        fit_sets, laws = _resolve_fits(fits)
        tau_gen = _predict_tau_gen(fit_sets, n, width, warnings)
        tau_mem = _predict_tau_mem(fit_sets, n, width, warnings)
        levels = _predict_levels(fit_sets, n, width, warnings)
        return dataclasses.replace(_advice(n, width, tau_gen, tau_mem, laws, warnings), levels=levels)
    return _advice(n, width, tau_gen, tau_mem, laws, warnings)


def advise_measured(n: int, width: int, tau_gen: Estimate, tau_mem: Estimate, run: str) -> Advice:
    """The same stopping rule applied to the timescales measured in one run (``tau_gen``/``tau_mem`` from
    :mod:`diffmem.analysis.timescales`, each with its bracket), for continuing or repeating that run: no law, no
    extrapolation. A censored or missing estimate counts as unknown (a bound is not a window edge)."""
    def measured(e: Estimate, name: str) -> Prediction:
        if not e.measured:
            return Prediction(None, None, None, f"{name} not measured in {run}")
        return Prediction(e.value, e.lo, e.hi, f"measured in {run}")

    return _advice(n, width, measured(tau_gen, "tau_gen"), measured(tau_mem, "tau_mem"),
                   f"the timescales measured in {run}", [])


def _advice(n: int, width: int, tau_gen: Prediction, tau_mem: Prediction, laws: str,
            warnings: list[str]) -> Advice:
    for name, p in (("tau_gen", tau_gen), ("tau_mem", tau_mem)):
        bad = [v for v in (p.value, p.lo, p.hi) if v is not None and not (math.isfinite(v) and v > 0)]
        if bad:  # a law whose exponent or prefactor is absurd (a damaged or edited fits.json) predicts nothing
            raise AdviceError(f"the {name} predicted for N = {n}, W = {width} from {laws} is {bad[0]!r}, not a "
                              "finite number of steps; check the law in fits.json (or run `diffmem analyze` again)")
    window, stop, rule = stopping_step(tau_gen, tau_mem)
    if window == "empty":
        warnings.insert(0, f"no generalization window for N = {n}, W = {width}: memorization is predicted at "
                           f"{tau_mem.value:.3g} steps, before the FID plateau at {tau_gen.value:.3g}")
    if window == "unresolved":
        warnings.insert(0, "the window is not resolved within the 95% intervals; watch f_mem "
                           "(diffmem.monitor.MemorizationMonitor) instead of trusting the step")
    keep_from = None
    if window == "open":
        keep_from = tau_gen.hi if tau_gen.hi is not None else tau_gen.value
    return Advice(n, width, tau_gen, tau_mem, window, stop, rule, laws, tuple(warnings), keep_from)
