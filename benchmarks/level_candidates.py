"""How a level crossing's value enters the fit's interval (issue #39): candidates on the same simulated experiments
(the draws of ``diffmem coverage --study levels``: same settings, seed and generator; each run's f_mem curve planted
and read by the suite's own ``tau_mem_level``). docs/coverage.md, "The level crossings", gives what this printed.

A crossing is interpolated between two evaluations; its interval also spans f_mem's sampling noise. The candidates:

- ``adopted``: the fit's rule (``diffmem.analysis.cellfit.law_least_squares``) with each crossing's bracket the two
  evaluations it is interpolated between (``Estimate.bracket``): its variance from that step, runs that cross in one
  step sharing its error, no worst case (the crossings are not rounded midpoints);
- ``whole interval``: the rule before it: the bracket is the crossing's whole interval, each run's error
  independent, and the worst case of the brackets when they explain all the scatter;
- ``step, worst case``: the step as the bracket, errors independent, with the worst case;
- ``step alone``: the step as the bracket, errors independent, no worst case;
- ``curvature``: the bracket narrowed from the step to the interpolation's own error (:func:`curvature_bracket`:
  the first-order error of the log-time linear interpolation, from f_mem's curvature at the evaluations around the
  step), errors independent, no worst case: what carrying f_mem at the evaluations into the fits could give;
- ``curvature, bias bound``: the same with the bound of that error's effect on the exponent added to the half width,
  ``sum_i |C_i| w_i`` (``C``: the slope's row of ``(X'X)^-1 X'``, ``w_i`` the mean width of cell i's brackets,
  log10): the error is one-signed and shared across x on one grid, so it shifts the fit rather than scattering it;
- ``curvature, one-signed bound``: the same fit, its interval moved by the range of that error's effect on the
  exponent instead: each run's error lies within its curvature bracket, so the slope's bias lies in ``[min, max]`` of
  ``sum_i C_i e_i`` over those ranges (:func:`one_signed_bias`) and the interval is ``[a - max, b - min]``: as wide as
  the t part plus ``sum_i |C_i| w_i`` once, not twice, and on the side the bias can fall;
- ``pooled curvature, one-signed bound``: as the last, with f'' read as one least-squares quadratic through the
  evaluations of both triples (:func:`pooled_curvature_bracket`) instead of the larger of the two triples' readings:
  on a fine grid each triple's second difference is mostly f_mem's binomial noise, and the larger of two noisy
  readings is biased up;
- ``pooled where it holds, one-signed bound``: as the last, but where the two triples' readings of f'' differ by
  more than their sampling noise allows (:func:`pooled_where_it_holds`: by more than 1.96 standard errors of the
  difference, from f_mem's binomial intervals), the curvature changes within the evaluations read and a first-order
  reading does not hold: the bracket is then the whole step, on either side;
- ``plain t``: the t interval on the residual scatter alone.

Run from the repository root:

    python benchmarks/level_candidates.py [--n-sim 400] [--jobs 2]

One markdown table (per setting and candidate: coverage % and median width), then per candidate the lowest coverage
and the widest ratio of its median width to the plain t's where the plain t covered (at least 93 %).
"""
from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from diffmem.analysis.cellfit import (RunBrackets, cell_index, cell_least_squares, design_matrix, design_weights,
                                      law_least_squares, make_cells, z_quantile)
from diffmem.analysis.coverage import (Setting, level_experiments, level_settings, markdown_table, measured_crossing,
                                       planted_f_mem, planted_f_mem_curve)
from diffmem.analysis.timescales import Estimate

CANDIDATES = ("adopted", "whole interval", "step, worst case", "step alone", "curvature", "curvature, bias bound",
              "curvature, one-signed bound", "pooled curvature, one-signed bound",
              "pooled where it holds, one-signed bound", "plain t")


def curvature_bracket(steps: np.ndarray, f: np.ndarray, crossing: Estimate) -> tuple[float, float]:
    """The steps between which the crossing lies once the interpolation's first-order error is allowed for.

    In x = ln(step), the linear interpolant p of f between evaluations a < b lies above f by ``p(x) - f(x) = (x - x_a)
    (x_b - x) f''/2`` (up to the variation of f'' in the step); where p = LEVEL at x^, f = LEVEL at about
    ``x^ + (x^ - x_a)(x_b - x^) f'' / (2 g)``, g = the step's secant slope. f'' is read as the second divided
    differences of the evaluations around the step (the two triples that hold it, where they exist): the bracket runs
    from x^ towards later steps by the largest positive curvature and towards earlier ones by the largest negative one,
    clipped to the step. ``steps``: evaluated steps (> 0 here), ``f``: f_mem at each; the whole step where no triple
    exists."""
    x = np.log(steps)
    i = int(np.searchsorted(steps, crossing.bracket[1]))
    curvature = [2.0 * ((f[k + 1] - f[k]) / (x[k + 1] - x[k]) - (f[k] - f[k - 1]) / (x[k] - x[k - 1]))
                 / (x[k + 1] - x[k - 1]) for k in (i - 1, i) if 1 <= k < len(x) - 1]
    if not curvature:
        return crossing.bracket
    return bracket_from_curvature(x, f, i, crossing, max(curvature), min(curvature))


def pooled_curvature_bracket(steps: np.ndarray, f: np.ndarray, crossing: Estimate) -> tuple[float, float]:
    """:func:`curvature_bracket` with f'' read once, as twice the leading coefficient of the least-squares quadratic
    in x = ln(step) through the evaluations of both triples around the step (the evaluations i-2 .. i+1 that exist,
    the step being i-1 .. i): the bracket then lies on one side of x^ only. The whole step where fewer than three
    evaluations exist."""
    x = np.log(steps)
    i = int(np.searchsorted(steps, crossing.bracket[1]))
    around = [k for k in range(i - 2, i + 2) if 0 <= k < len(x)]
    if len(around) < 3:
        return crossing.bracket
    curvature = 2.0 * float(np.polyfit(x[around] - math.log(crossing.value), f[around], 2)[0])
    return bracket_from_curvature(x, f, i, crossing, curvature, curvature)


def pooled_where_it_holds(steps: np.ndarray, f: np.ndarray, f_lo: np.ndarray, f_hi: np.ndarray,
                          crossing: Estimate) -> tuple[float, float]:
    """:func:`pooled_curvature_bracket` where the two triples around the step read one curvature within their noise,
    else the whole step (``crossing.bracket``): each triple's second divided difference is a linear combination of
    its three f values, whose standard deviations are read from their 95 % intervals (``(f_hi - f_lo) / (2 z)``); the
    readings disagree when their difference exceeds ``z`` times its standard error (z = 1.96). The whole step too
    where fewer than two triples exist."""
    x = np.log(steps)
    i = int(np.searchsorted(steps, crossing.bracket[1]))
    triples = [k for k in (i - 1, i) if 1 <= k < len(x) - 1]
    if len(triples) < 2:
        return crossing.bracket
    z = z_quantile(0.95)
    sd = (f_hi - f_lo) / (2.0 * z)
    readings = []
    for k in triples:
        h1, h2 = x[k] - x[k - 1], x[k + 1] - x[k]
        w = 2.0 / (h1 + h2) * np.array([1.0 / h1, -1.0 / h1 - 1.0 / h2, 1.0 / h2])
        readings.append((float(w @ f[k - 1:k + 2]), w, k))
    (c1, w1, k1), (c2, w2, k2) = readings
    # the difference's weights on evaluations k1 - 1 .. k2 + 1 (the triples share two of them)
    weights = np.zeros(len(x))
    weights[k1 - 1:k1 + 2] += w1
    weights[k2 - 1:k2 + 2] -= w2
    if abs(c1 - c2) > z * math.sqrt(float((weights ** 2) @ (sd ** 2))):
        return crossing.bracket
    return pooled_curvature_bracket(steps, f, crossing)


def bracket_from_curvature(x: np.ndarray, f: np.ndarray, i: int, crossing: Estimate, largest: float,
                           smallest: float) -> tuple[float, float]:
    """The crossing's bracket (steps) from the readings of f'' around its step (evaluations ``i - 1``, ``i``; ``x`` =
    ln step): later by the ``largest`` positive one, earlier by the ``smallest`` negative one, clipped to the step."""
    a, b = crossing.bracket
    xv = math.log(crossing.value)
    reach = (xv - x[i - 1]) * (x[i] - xv) / 2.0 / ((f[i] - f[i - 1]) / (x[i] - x[i - 1]))
    later, earlier = reach * max(largest, 0.0), reach * max(-smallest, 0.0)
    return max(math.exp(xv - earlier), a), min(math.exp(xv + later), b)


def read_with_curvature(rng: np.random.Generator, steps: np.ndarray,
                        tau_level: float) -> tuple[Estimate, tuple[float, ...]] | None:
    """The study's reading of one run (the draws of ``planted_level_crossing``) with its :func:`curvature_bracket`,
    :func:`pooled_curvature_bracket` and :func:`pooled_where_it_holds` (their six ends, steps)."""
    observed, f_lo, f_hi = planted_f_mem(rng, steps, tau_level)
    est = measured_crossing(steps, observed, f_lo, f_hi)
    if est is None:
        return None
    return est, (*curvature_bracket(steps, observed, est), *pooled_curvature_bracket(steps, observed, est),
                 *pooled_where_it_holds(steps, observed, f_lo, f_hi, est))


def read_with_exact_error(rng: np.random.Generator, steps: np.ndarray,
                          tau_level: float) -> tuple[Estimate, tuple[float, ...]] | None:
    """:func:`read_with_curvature` with the pooled candidate's bracket replaced by the one a perfect reading of the
    curve would give (``--exact-error``, a diagnosis, not a candidate): from the crossing to the crossing shifted by
    the interpolation's error on the planted curve itself (``tau_level`` / the crossing read from the noise-free
    curve on the same steps)."""
    read = read_with_curvature(rng, steps, tau_level)
    if read is None:
        return None
    est, ends = read
    exact = planted_f_mem_curve(steps, tau_level)
    noise_free = measured_crossing(steps, exact, exact, exact)
    shift = 1.0 if noise_free is None else tau_level / noise_free.value
    return est, (*ends[:2], *sorted((est.value, est.value * shift)), *ends[4:])


def independent_errors(runs: RunBrackets, n_cells: int) -> np.ndarray:
    """The cell means' bracket covariance with every run's error independent of the others': diagonal, the cells'
    bracket variances (:meth:`RunBrackets.cell_variance`)."""
    return np.diag(runs.cell_variance(n_cells))


def one_signed_bias(slope_row: np.ndarray, runs: RunBrackets, n_cells: int) -> tuple[float, float]:
    """The range (smallest, largest) of the slope's bias ``sum_i C_i e_i`` (``slope_row``: C, shape (cells,)) when
    each run's error (its value minus the truth, log10) may be anything within its bracket, ``[value - hi, value -
    lo]``, and a cell's error is its runs' mean."""
    sizes = np.bincount(runs.cell_of, minlength=n_cells)
    ends = [np.bincount(runs.cell_of, weights=np.where(runs.known, runs.value - end, 0.0), minlength=n_cells) / sizes
            for end in (runs.hi, runs.lo)]
    low, high = slope_row * ends[0], slope_row * ends[1]
    return float(np.minimum(low, high).sum()), float(np.maximum(low, high).sum())


def exponent_intervals(xs: np.ndarray, rows: np.ndarray) -> dict[str, tuple[float, float]]:
    """Each candidate's interval of the exponent for one experiment (``rows``: one crossing per run, its value,
    interval, step, :func:`curvature_bracket`, :func:`pooled_curvature_bracket` and :func:`pooled_where_it_holds`)."""
    value, lo, hi, b_lo, b_hi, c_lo, c_hi, p_lo, p_hi, h_lo, h_hi = rows.T
    cells = make_cells(xs[:, None], np.log10(value), [str(i) for i in range(xs.size)])
    cell_of = cell_index(cells, xs[:, None])
    n = len(cells)
    step = RunBrackets.of(cell_of, value, b_lo, b_hi)
    whole = RunBrackets.of(cell_of, value, lo, hi)
    curved = RunBrackets.of(cell_of, value, c_lo, c_hi)
    pooled = RunBrackets.of(cell_of, value, p_lo, p_hi)
    holds = RunBrackets.of(cell_of, value, h_lo, h_hi)

    def independent(runs: RunBrackets, worst_case: bool = True):
        """The fit with every run's error independent; without the worst case where ``worst_case`` is False."""
        return cell_least_squares(cells, 0.95, runs.cell_variance(n), independent_errors(runs, n),
                                  None if worst_case else np.zeros(n))

    out = {name: ls.interval(1) for name, ls in {
        "adopted": law_least_squares(cells, step, 0.95),
        "whole interval": independent(whole),
        "step, worst case": independent(step),
        "step alone": independent(step, worst_case=False),
        "curvature": independent(curved, worst_case=False),
        "plain t": cell_least_squares(cells, 0.95),
    }.items()}
    slope_row = design_weights(design_matrix(cells))[0][1]
    low, high = one_signed_bias(slope_row, curved, n)
    a, b = out["curvature"]
    out["curvature, bias bound"] = (a - (high - low), b + (high - low))  # high - low = sum_i |C_i| w_i
    out["curvature, one-signed bound"] = (a - high, b - low)
    for name, runs in (("pooled curvature", pooled), ("pooled where it holds", holds)):
        a, b = independent(runs, worst_case=False).interval(1)
        low, high = one_signed_bias(slope_row, runs, n)
        out[f"{name}, one-signed bound"] = (a - high, b - low)
    return out


def level_row(s: Setting, n_sim: int, seed: int = 0,
              exact_error: bool = False) -> tuple[Setting, dict[str, tuple[float, float]]]:
    """(setting, candidate -> (coverage, median width)) over the study's ``n_sim`` experiments of ``s``;
    ``exact_error``: read with :func:`read_with_exact_error`."""
    hits = {c: 0 for c in CANDIDATES}
    widths: dict[str, list[float]] = {c: [] for c in CANDIDATES}
    read = read_with_exact_error if exact_error else read_with_curvature
    for xs, crossings, _ in level_experiments(s, n_sim, seed, read):
        rows = np.array([(e.value, e.lo, e.hi, *e.bracket, *curved) for e, curved in crossings], dtype=float)
        for name, (a, b) in exponent_intervals(xs, rows).items():
            hits[name] += a <= s.exponent <= b
            widths[name].append(b - a)
    return s, {c: (hits[c] / n_sim, float(np.median(widths[c]))) for c in CANDIDATES}


def label(s: Setting) -> str:
    return (f"{s.grid}{' refined' if s.refined else ''} {s.seeds} seed{'s' if s.seeds > 1 else ''} "
            f"{100 * s.scatter:.0f} % {s.n_x} x")


def summary(results: list[tuple[Setting, dict[str, tuple[float, float]]]]) -> list[str]:
    """Per candidate: its lowest coverage, and its widest median width against the plain t's where that covered."""
    lines = []
    for c in CANDIDATES:
        low_s, low = min(((s, r[c][0]) for s, r in results), key=lambda p: p[1])
        ratios = [(s, r[c][1] / r["plain t"][1]) for s, r in results if r["plain t"][0] >= 0.93]
        line = f"- {c}: lowest coverage {100 * low:.1f} % ({label(low_s)})"
        if ratios:
            wide_s, wide = max(ratios, key=lambda p: p[1])
            above = sum(ratio > 1.25 for _, ratio in ratios)
            line += (f"; where the plain t covered ({len(ratios)} settings) width at most {wide:.2f}x its "
                     f"({label(wide_s)}), above 1.25x in {above}")
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-sim", type=int, default=400, help="simulated experiments per setting")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", metavar="SETTING",
                        help='run only this setting, as the table names it (e.g. "paper 1 seed 15 %% 3 x"); repeatable')
    parser.add_argument("--exact-error", action="store_true",
                        help="diagnosis: the pooled candidate's bracket from the planted curve's own interpolation "
                             "error (read_with_exact_error)")
    args = parser.parse_args(argv)
    todo = level_settings()
    if args.only:
        todo = [s for s in todo if label(s) in args.only]
        missing = set(args.only) - {label(s) for s in todo}
        if missing:
            parser.error(f"no setting named {sorted(missing)}; names as in the table's first column")
    n = len(todo)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(level_row, todo, [args.n_sim] * n, [args.seed] * n, [args.exact_error] * n))
    print(f"{args.n_sim} simulated experiments per setting, seed {args.seed}\n")
    print(markdown_table(["setting", *(f"{c}: coverage % / width" for c in CANDIDATES)],
                         ([label(s), *(f"{100 * r[c][0]:.1f} / {r[c][1]:.3f}" for c in CANDIDATES)]
                          for s, r in results)))
    print()
    print("\n".join(summary(results)))


if __name__ == "__main__":
    main()
