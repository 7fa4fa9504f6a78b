"""benchmarks/interval_candidates.py, the study of the candidate intervals (docs/coverage.md): its censored-likelihood
interval against closed forms and a direct maximization, and its closed-form candidates against the bracket-variance
rule they start from."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from diffmem.analysis.cellfit import Cell, RunBrackets, cell_least_squares, law_least_squares
from scripts import load_benchmark


@pytest.fixture(scope="module")
def candidates():
    return load_benchmark("interval_candidates")


def design_of(x: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(x.size), np.log10(x)])


def direct_max_log_likelihood(lo: np.ndarray, hi: np.ndarray, design: np.ndarray, fixed: tuple[int, float] | None
                              = None) -> float:
    """The censored log-likelihood maximized by Nelder-Mead from several starts (coefficients, log s), with
    coefficient ``fixed[0]`` held at ``fixed[1]``: the reference for the batched Newton solver."""
    p = design.shape[1]
    free = [j for j in range(p) if fixed is None or j != fixed[0]]

    def negative(params):
        coef = np.zeros(p)
        coef[free] = params[:-1]
        if fixed is not None:
            coef[fixed[0]] = fixed[1]
        s = math.exp(params[-1])
        mu = design @ coef
        prob = stats.norm.cdf((hi - mu) / s) - stats.norm.cdf((lo - mu) / s)
        return -float(np.sum(np.log(np.maximum(prob, 1e-300))))

    mid = (lo + hi) / 2
    if fixed is not None:
        mid = mid - fixed[1] * design[:, fixed[0]]
    start = np.linalg.lstsq(design[:, free], mid, rcond=None)[0]
    best = min((optimize.minimize(negative, [*start, log_s], method="Nelder-Mead",
                                  options=dict(xatol=1e-11, fatol=1e-13, maxiter=40000))
                for log_s in (-2.0, -5.0, -9.0)), key=lambda r: r.fun)
    return -float(best.fun)


def test_zero_width_brackets_give_exactly_the_t_interval(candidates):
    rng = np.random.default_rng(3)
    for n in (3, 5, 9):
        x = 16.0 * 2.0 ** np.arange(n)
        y = np.log10(800 * (x / 16)) + rng.normal(0, 0.05, n)
        design = design_of(x)
        lo, hi = candidates.profile_interval(y[None], y[None].copy(), design[None], 1)
        cells = [Cell((float(v),), (), float(m), None) for v, m in zip(x, y)]
        ref = cell_least_squares(cells, 0.95).interval(1)
        assert lo[0] == pytest.approx(ref[0], abs=1e-5) and hi[0] == pytest.approx(ref[1], abs=1e-5)


def test_the_batched_maximization_matches_a_direct_one(candidates):
    rng = np.random.default_rng(7)
    x = 16.0 * 2.0 ** np.arange(5)
    design = design_of(x)
    width = np.log10(1.2)
    cases = []
    for scatter in (0.002, 0.05, 0.2):  # the first: a line passes through every bracket (the supremum 0)
        true = np.log10(1000 * (x / 16) ** 0.7) + rng.normal(0, scatter, x.size)
        lo = np.floor(true / width) * width
        cases.append((lo, lo + width))
    lo, hi = (np.array(v) for v in zip(*cases))
    batch = np.broadcast_to(design, (len(cases), *design.shape)).copy()
    found = candidates.max_log_likelihood(lo, hi, batch)
    for k, (a, b) in enumerate(cases):
        assert found[k] == pytest.approx(direct_max_log_likelihood(a, b, design), abs=2e-4)
    assert found[0] == pytest.approx(0.0, abs=1e-4)
    # the profile at a fixed exponent: the solver on the data less that exponent's column
    for c in (0.5, 0.7, 0.9):
        shifted = candidates.max_log_likelihood(lo - c * batch[:, :, 1], hi - c * batch[:, :, 1], batch[:, :, :1])
        for k, (a, b) in enumerate(cases):
            assert shifted[k] == pytest.approx(direct_max_log_likelihood(a, b, design, (1, c)), abs=2e-4)


def test_the_censored_interval_holds_every_line_through_the_brackets(candidates):
    x = 16.0 * 2.0 ** np.arange(4)
    design = design_of(x)
    width = np.log10(1.2)
    true = np.log10(1000 * (x / 16))
    lo = np.floor(true / width) * width
    hi = lo + width
    a, b = candidates.profile_interval(lo[None], hi[None], design[None], 1)
    # the steepest and shallowest lines through every bracket (a small linear program per end)
    ends = []
    for sign in (1.0, -1.0):
        res = optimize.linprog([0.0, sign], A_ub=np.vstack([design, -design]), b_ub=np.concatenate([hi, -lo]),
                               bounds=[(None, None), (None, None)])
        ends.append(res.x[1])
    assert a[0] <= min(ends) and max(ends) <= b[0]


def test_the_closed_form_candidates_start_from_the_bracket_variance_rule(candidates):
    rng = np.random.default_rng(11)
    x = 16.0 * 2.0 ** np.arange(6)
    variance = np.full(x.size, np.log10(1.2) ** 2 / 12)
    z_worst = stats.norm.ppf(0.975) * float(np.abs(np.linalg.pinv(design_of(x))[1]) @ np.sqrt(variance))
    for scatter in (0.001, 0.1):  # the rule's b^2 = 0 branch, then b^2 > 0
        means = np.log10(1000 * (x / 16)) + rng.normal(0, scatter, x.size)
        cells = [Cell((float(v),), (), float(m), None) for v, m in zip(x, means)]
        fit = cell_least_squares(cells, 0.95, variance)
        found = candidates.closed_form_candidates(cells, variance, 1)
        assert found["bracket variance"] == pytest.approx(fit.interval(1))
        for name in ("floor always", "limit at 0"):  # never narrower than the rule
            assert found[name][0] <= fit.interval(1)[0] + 1e-12 and found[name][1] >= fit.interval(1)[1] - 1e-12
        assert (found["floor always"][1] - found["floor always"][0]) / 2 >= z_worst - 1e-12
        if fit.floor is None:
            assert found["limit at 0"] == pytest.approx(fit.interval(1))


def test_the_misses_are_located_by_branch(candidates):
    x = 16.0 * 2.0 ** np.arange(3)
    grid = 1.1
    # taus whose brackets' log-midpoints are exactly on a line of slope 8 log(1.1) / log(2) (~1.1): no residual
    lo = 1000.0 * grid ** (8.0 * np.arange(3))
    hi = lo * grid
    value = np.sqrt(lo * hi)
    text = candidates.fit_misses([(value, lo, hi)], x[:, None], 1, 0.5)  # a planted exponent far outside
    assert text.startswith("b^2 = 0 in 1 draws (1 missed; 1 with the cell means exactly on a line, 1 missed)")
    assert text.endswith("b^2 > 0 in 0 (0 missed)")


BRANCH_X = 16.0 * 2.0 ** np.arange(5)
BRANCH_RATIO = np.array([1.2, 1.5, 2.0, 1.3, 1.1])
"""Five taus at x = 16..256, each the log-midpoint of a bracket of its own width (ratio hi / lo)."""


def fits_in_each_branch():
    """The adopted fit of BRANCH_X's taus with no noise (on one line), a little (b^2 = 0 off the line) and much
    (b^2 > 0), with the branch's name."""
    for noise in (np.zeros(5), np.array([0, 0.004, -0.003, 0.002, 0.0]), np.array([0, 0.3, -0.2, 0.4, 0.0])):
        value = 100 * BRANCH_X * 10 ** noise
        runs = RunBrackets.of(np.arange(5), value, value / np.sqrt(BRANCH_RATIO), value * np.sqrt(BRANCH_RATIO))
        cells = [Cell((float(a),), (), float(np.log10(b)), None) for a, b in zip(BRANCH_X, value)]
        ls = law_least_squares(cells, runs, 0.95)
        yield ls, "collinear" if ls.collinear else "zero" if ls.floor is not None else "positive"


def test_no_worst_case_drops_only_the_worst_case_floor(candidates):
    """``no worst case``: the adopted interval without the brackets' worst case where the brackets explain all the
    scatter, the adopted one (factor included) where the cell means lie on one line, the adopted one where b^2 > 0."""
    seen = set()
    for ls, branch in fits_in_each_branch():
        found = candidates.without_worst_case(ls, 1)
        if branch != "zero":
            assert found == pytest.approx(ls.interval(1))
        else:
            half = max(ls.t * math.sqrt(ls.cov[1, 1]), stats.norm.ppf(0.975) * math.sqrt(ls.rounding_cov[1, 1]))
            assert found == pytest.approx((ls.coef[1] - half, ls.coef[1] + half))
            assert found[1] - found[0] <= ls.interval(1)[1] - ls.interval(1)[0] + 1e-12
        seen.add(branch)
    assert seen == {"collinear", "zero", "positive"}


def test_limit_alone_puts_the_independent_limit_where_the_worst_case_was(candidates):
    """``limit alone``: where b^2 = 0 off the line, the wider of the adopted t part, its shared floor and
    t * sqrt(sum_i (C_ji sd_i)^2) (no worst case); elsewhere the adopted interval."""
    c = np.linalg.pinv(design_of(BRANCH_X))[1]
    sd = np.log10(BRANCH_RATIO) / math.sqrt(12)
    seen = set()
    for ls, branch in fits_in_each_branch():
        found = candidates.limit_alone(ls, 1)
        if branch != "zero":
            assert found == pytest.approx(ls.interval(1))
        else:
            half = max(ls.t * math.sqrt(ls.cov[1, 1]), stats.norm.ppf(0.975) * math.sqrt(ls.rounding_cov[1, 1]),
                       stats.t.ppf(0.975, 3) * math.sqrt(float(((c * sd) ** 2).sum())))
            assert found == pytest.approx((ls.coef[1] - half, ls.coef[1] + half))
        seen.add(branch)
    assert seen == {"collinear", "zero", "positive"}


def test_the_calibrated_candidate_is_seeded_and_covers_where_the_brackets_explain_the_scatter(candidates):
    """``calibrated``: the adopted interval where b^2 > 0 or on one line; elsewhere an interval centred on the fit,
    the same on every call; over many draws on the paper's checkpoints (4 x values, one seed, 5 % scatter, where b^2
    = 0 off the line is common) it holds the planted exponent."""
    from diffmem.analysis.coverage import Setting, setting_rng, simulate_experiment

    s = Setting(0.5, 4, 1, 0.05, "paper")
    rng = setting_rng(21, 1.0)
    hits, zero = 0, 0
    for _ in range(150):
        xs, value, lo, hi = simulate_experiment(rng, s)
        cells = [Cell((float(a),), (), float(np.log10(b)), None) for a, b in zip(xs, value)]
        runs = RunBrackets.of(np.arange(xs.size), value, lo, hi)
        ls = law_least_squares(cells, runs, 0.95)
        found = candidates.calibrated(ls, cells, runs, 1)
        if ls.floor is None or ls.collinear:
            assert found == pytest.approx(ls.interval(1))
        else:
            zero += 1
            assert (found[0] + found[1]) / 2 == pytest.approx(ls.coef[1])
            assert candidates.calibrated(ls, cells, runs, 1) == found
        hits += found[0] <= 0.5 <= found[1]
    assert zero >= 10 and hits / 150 >= 0.9
