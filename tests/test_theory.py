"""The random-features theory: constants, closed-form dynamics against gradient descent, limits, spectrum, sweep."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from diffmem.cli import main
from diffmem.config import ConfigError, load_theory_config
from diffmem.theory.constants import gaussian_equivalence
from diffmem.theory.dynamics import evaluate_metrics, log_times, simulate_gd
from diffmem.theory.features import build_instance
from diffmem.theory.spectrum import (mass_in, monte_carlo_spectrum, predicted_density, predicted_supports,
                                     predicted_tau_mem)
from diffmem.theory.psi_sweep import run_theory_sweep
from diffmem.theory.curve_timescales import gap_rise_time


@pytest.mark.parametrize("t", [0.01, 0.1, 1.0])
def test_constants_match_monte_carlo(t):
    """Quadrature constants against the defining expectations by Monte Carlo (2M draws)."""
    ge = gaussian_equivalence(t)
    rng = np.random.default_rng(0)
    u, v, w = rng.standard_normal((3, 2_000_000))
    c, root = math.exp(-t), math.sqrt(ge.delta)
    h1, h2 = np.tanh(c * u + root * v), np.tanh(c * u + root * w)
    a = np.mean(h1 * u) / c
    b = np.mean(h1 * v)
    v2 = np.mean(h1 * h2) - a * a * c * c
    s2 = np.mean(np.tanh(math.sqrt(c * c + ge.delta) * u) ** 2) - a * a * c * c - v2 - b * b
    assert ge.a == pytest.approx(a, abs=2e-3)
    assert ge.b == pytest.approx(b, abs=2e-3)
    assert ge.v2 == pytest.approx(v2, abs=2e-3)
    assert ge.s2 == pytest.approx(s2, abs=2e-3)
    assert ge.b == pytest.approx(math.sqrt(ge.delta) * ge.a, rel=1e-12)  # Stein's lemma
    assert ge.s2 > 0 and ge.v2 > 0


@pytest.fixture(scope="module")
def mc_instance():
    """Real tanh features, 2 noise draws per sample: n k = 80 < p = 160 (the Gram route)."""
    return build_instance(20, 160, 40, 0.1, 1, noise="monte-carlo", noise_draws=2, test_draws=3000)


def _stable_lr(inst, ratio: float) -> float:
    """The GD step with eps * lam_max = ratio, eps = 2 lr Delta / (p d)."""
    return ratio * inst.p * inst.d / (2 * inst.constants.delta * float(inst.basis.lam.max()))


@pytest.mark.e2e
@pytest.mark.parametrize("draws", [2, 16])  # 2: Gram route (n k < p); 16: p-space route (n k > p)
def test_closed_form_equals_gradient_descent(draws):
    """Plain GD on the real network (autograd, step by step) = the closed form with the same step, to 1e-9."""
    inst = build_instance(20, 160, 40, 0.1, 1, noise="monte-carlo", noise_draws=draws, test_draws=2000)
    lr = _stable_lr(inst, 0.5)
    sim = simulate_gd(inst.raw["features_train"], inst.raw["noise_train"], inst.raw["features_test"],
                      inst.raw["noise_test"], delta=inst.constants.delta, lr=lr, steps=2000,
                      record=[0, 1, 7, 60, 500, 2000])
    closed = evaluate_metrics(inst.basis, inst.metrics, sim["tau"], lr=lr)
    np.testing.assert_allclose(closed["train_loss"], sim["train_loss"], rtol=1e-9)
    np.testing.assert_allclose(closed["test_loss"], sim["test_loss"], rtol=1e-9)
    assert sim["train_loss"][-1] < 0.5 * sim["train_loss"][0]  # it did train


def test_gradient_flow_is_the_small_step_limit(mc_instance):
    """With eps * lam_max = 0.005 the flow and plain GD agree to 1% (the error is O(eps lam))."""
    lr = _stable_lr(mc_instance, 0.005)
    taus = lr / mc_instance.d ** 2 * np.array([10, 100, 1000, 5000])
    gd = evaluate_metrics(mc_instance.basis, mc_instance.metrics, taus, lr=lr)
    flow = evaluate_metrics(mc_instance.basis, mc_instance.metrics, taus)
    for name in gd:
        np.testing.assert_allclose(flow[name], gd[name], rtol=1e-2)


def test_limits_zero_and_least_squares(mc_instance):
    """tau = 0: A = 0, so each loss is E||xi||^2 / d; tau -> inf: the least-squares solution of the regression."""
    inst = mc_instance
    at = evaluate_metrics(inst.basis, inst.metrics, np.array([0.0, np.inf]))
    feats, noise = inst.raw["features_train"], inst.raw["noise_train"]
    assert at["train_loss"][0] == pytest.approx(float((noise ** 2).sum(1).mean()) / inst.d, rel=1e-12)
    test_noise = inst.raw["noise_test"]
    assert at["test_loss"][0] == pytest.approx(float((test_noise ** 2).sum(1).mean()) / inst.d, rel=1e-12)
    # min_B mean || sqrt(D) B phi + xi ||^2: least squares of -xi / sqrt(D) on phi (minimum-norm solution)
    root = math.sqrt(inst.constants.delta)
    b = torch.linalg.lstsq(feats, -noise / root, driver="gelsd").solution.T  # d x p
    best = float(((root * feats @ b.T + noise) ** 2).sum(1).mean()) / inst.d
    assert at["train_loss"][1] == pytest.approx(best, rel=1e-8)
    late = evaluate_metrics(inst.basis, inst.metrics, np.array([1e12]))
    assert late["train_loss"][0] == pytest.approx(at["train_loss"][1], rel=1e-8)


def test_memorization_and_score_errors_against_direct_evaluation(mc_instance):
    """The quadratic forms equal the distances computed from B(tau) in p-space on the same draws."""
    inst = mc_instance
    taus = np.array([1.0, 30.0, 1e3, np.inf])
    closed = evaluate_metrics(inst.basis, inst.metrics, taus)
    coords = inst.basis.weights(taus)  # T x d x r
    p_basis = inst.raw["basis_vectors"]
    feats_test, noise_test = inst.raw["features_test"], inst.raw["noise_test"]
    root = math.sqrt(inst.constants.delta)
    for i in range(taus.size):
        b = coords[i] @ p_basis.T  # d x p
        test = float(((root * feats_test @ b.T + noise_test) ** 2).sum(1).mean()) / inst.d
        score = float(((feats_test @ b.T + inst.raw["inputs_test"]) ** 2).sum(1).mean()) / inst.d
        mem = float(((inst.raw["features_mem"] @ b.T - inst.raw["empirical_score_mem"]) ** 2).sum(1).mean()) / inst.d
        assert closed["test_loss"][i] == pytest.approx(test, rel=1e-9)
        assert closed["score_error"][i] == pytest.approx(score, rel=1e-9)
        assert closed["memorization_error"][i] == pytest.approx(mem, rel=1e-9)



def test_gaussian_equivalent_gram_route_matches_explicit_matrices():
    """The (n + d)-dimensional Gram route equals building U, V, E_x[U] in p-space and B(tau) = V^T U^-1 (...)."""
    d, p, n, t = 12, 96, 30, 0.05
    inst = build_instance(d, p, n, t, 3, test_draws=50)
    ge = inst.constants
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(p, d, generator=gen, dtype=torch.float64)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    torch.randn(50, d, generator=gen, dtype=torch.float64)  # the memorization draws come next in build_instance
    omega = torch.randn(p, n, generator=gen, dtype=torch.float64)
    g = ge.a * ge.c * (w @ x.T) / math.sqrt(d) + math.sqrt(ge.v2) * omega
    u = g @ g.T / n + ge.b ** 2 * w @ w.T / d + ge.s2 * torch.eye(p, dtype=torch.float64)
    v = ge.b * w / math.sqrt(d)
    pop = ge.mu1_sq * w @ w.T / d + (ge.v2 + ge.s2) * torch.eye(p, dtype=torch.float64)
    lam, vecs = torch.linalg.eigh(u)
    np.testing.assert_allclose(np.sort(lam.numpy()), inst.spectrum, rtol=1e-9, atol=1e-12)
    taus = np.array([0.3, 10.0, 1e3, 1e5])
    closed = evaluate_metrics(inst.basis, inst.metrics, taus)
    root = math.sqrt(ge.delta)
    for i, tau in enumerate(taus):
        filt = -torch.expm1(-2 * ge.delta * lam * tau / (p / d)) / lam
        b = -(v.T @ vecs * filt) @ vecs.T / root
        train = (ge.delta * torch.trace(b @ u @ b.T) + 2 * root * torch.trace(b @ v) + d) / d
        test = (ge.delta * torch.trace(b @ pop @ b.T) + 2 * root * torch.trace(b @ v) + d) / d
        assert closed["train_loss"][i] == pytest.approx(float(train), rel=1e-9)
        assert closed["test_loss"][i] == pytest.approx(float(test), rel=1e-9)
    # N(0, I) data: test_loss = Delta * score_error + 1 - Delta exactly (E[xi | x_t] = sqrt(Delta) x_t)
    np.testing.assert_allclose(closed["test_loss"], ge.delta * closed["score_error"] + 1 - ge.delta, rtol=1e-10)


def test_gaussian_equivalent_spectrum_matches_real_features():
    """GEP eigenvalues of the two bulks agree with those of U built from real tanh features (many noise draws)."""
    d, p, n, t = 40, 640, 80, 0.1
    ge_eig = build_instance(d, p, n, t, 0, test_draws=20).spectrum
    real = monte_carlo_spectrum(d, p, n, t, 0, 200, dtype=torch.float64)
    # rho_1 (n eigenvalues below the top d) and rho_2 (the top d). Measured: the Gaussian-equivalent rho_1 sits
    # 9% above the real one here (6% at the paper's t = 0.01, psi_n = 8), rho_2 agrees to 3%.
    rho1, rho2 = slice(p - n - d, p - d), slice(p - d, p)
    assert np.median(real[rho1]) == pytest.approx(np.median(ge_eig[rho1]), rel=0.15)
    assert np.median(real[rho2]) == pytest.approx(np.median(ge_eig[rho2]), rel=0.05)
    supports = predicted_supports(gaussian_equivalence(t), p / d, n / d)
    delta_peak = supports[0]
    assert mass_in(ge_eig, delta_peak, rel=1e-9) == pytest.approx(delta_peak.weight, abs=1 / p)


@pytest.mark.parametrize("t, psi_p, psi_n", [(0.01, 16, 4), (0.1, 8, 2), (0.1, 4, 8)])  # the last: regime II
def test_theorem_density_predicts_the_eigenvalue_counts(t, psi_p, psi_n):
    """The saddle-point density integrates to the fraction of Gaussian-equivalent eigenvalues in each bulk (within
    finite-size error at d = 50) and, with the delta peak, to 1."""
    d = 50
    p, n = psi_p * d, psi_n * d
    eig = build_instance(d, p, n, t, 0, test_draws=10).spectrum
    grid = np.geomspace(eig[eig > 0].min() / 3, eig.max() * 3, 3000)
    ge = gaussian_equivalence(t)
    rho = predicted_density(ge, psi_p, psi_n, grid)
    delta_mass = max(0.0, 1 - (1 + psi_n) / psi_p)
    away = np.abs(grid / ge.s2 - 1) > 1e-2  # the delta peak: a Lorentzian of width eps_min, not integrable on a grid
    assert np.trapezoid(rho[away], grid[away]) + delta_mass == pytest.approx(1.0, abs=2e-3)
    sorted_eig = np.sort(eig)
    groups = [slice(p - d, p)]  # the top d eigenvalues: rho_2
    if psi_p > 1 + psi_n:
        groups.append(slice(p - n - d, p - d))  # the n below them: rho_1
    for group in groups:
        lo, hi = sorted_eig[group][0], sorted_eig[group][-1]
        lo_mid = 0.5 * (lo + sorted_eig[group.start - 1])  # halfway to the neighbouring eigenvalue
        inside = (grid >= lo_mid) & (grid <= hi * 1.05)
        assert np.trapezoid(rho[inside], grid[inside]) == pytest.approx((group.stop - group.start) / p, rel=0.03)


def test_gap_rise_time_on_an_exponential():
    """L_gen = 1 - exp(-tau / 50) reaches half its limit at 50 ln 2 (within the grid's log-interpolation)."""
    taus = log_times(0.1, 1e5, 400)
    gap = 1 - np.exp(-taus / 50.0)
    est = gap_rise_time(taus, np.zeros_like(taus), gap, 1.0, 0.5)
    assert est.value == pytest.approx(50 * math.log(2), rel=5e-3)
    assert est.lo <= est.value <= est.hi and not est.censored
    assert gap_rise_time(taus, np.zeros_like(taus), gap * 0.1, 1.0, 0.5).censored  # never reached: lower bound


@pytest.mark.e2e
def test_tau_mem_linear_in_psi_n_when_p_much_larger_than_n(tmp_path):
    """psi_p = 256 >> psi_n: the measured tau_mem grows linearly in psi_n (CI holds 1), tau_gen far slower."""
    cfg = load_theory_config(overrides=["theory.d=30", "theory.psi_p=256", "theory.psi_n=[2,4,8]",
                                        "theory.seeds=[0,1]", "theory.n_tau=161", "theory.test_draws=200",
                                        "theory.spectrum_psi_n=2", "theory.spectrum_noise_draws=0"])
    summary = run_theory_sweep(cfg, tmp_path / "th")
    mem, gen = summary.fits["tau_mem_vs_psi_n"], summary.fits["tau_gen_vs_psi_n"]
    assert mem.fitted and mem.exponent_lo <= 1.0 <= mem.exponent_hi, mem.describe()
    assert 0.8 < mem.exponent < 1.2
    assert gen.exponent < 0.4, gen.describe()
    with (tmp_path / "th" / "curves.csv").open() as fh:
        first = [r for r in csv.DictReader(fh) if float(r["psi_n"]) == 2 and int(r["seed"]) == 0]
    # exact expectation over the noise: training moves the score towards the empirical optimal one
    assert float(first[-1]["memorization_error"]) < 0.5 * float(first[0]["memorization_error"])
    for row in summary.rows:  # the paper's prediction is within a factor 3 of the measured half-rise time
        assert 1 / 3 < row["tau_mem"] / row["tau_mem_pred"] < 3
        assert row["tau_gen"] < row["tau_mem"] / 20


@pytest.mark.e2e
def test_cli_quick_sweep_writes_every_file(tmp_path, capsys):
    out = tmp_path / "theory"
    assert main(["theory", "sweep", "--quick", "--out", str(out)]) == 0
    for name in ("config.json", "curves.csv", "summary.csv", "fits.json", "spectrum.json",
                 "figures/spectrum.png", "figures/loss_curves.pdf", "figures/timescales.png"):
        assert (out / name).is_file(), name
    fits = json.loads((out / "fits.json").read_text())
    assert set(fits) == {"tau_mem_vs_psi_n", "tau_gen_vs_psi_n", "tau_mem_pred_vs_psi_n", "score_error_min_vs_psi_n"}
    assert "theory sweep: 2 runs" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--set", "theory.noise=exact"], "theory.noise"),
    (["--set", "theory.psi_n=[]"], "theory.psi_n"),
    (["--set", "theory.gap_fraction=1.5"], "gap_fraction"),
    (["--set", "theory.dd=3"], "did you mean 'd'"),
    (["--compare", "/nonexistent"], "summary.csv not found"),
])
def test_cli_bad_input_is_one_line(tmp_path, capsys, args, message):
    out = tmp_path / "theory"
    assert main(["theory", "sweep", "--quick", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_theory_config_rejects_other_sections(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[train]\nsteps = 3\n")
    with pytest.raises(ConfigError, match="only a \\[theory\\] section"):
        load_theory_config(path)


def test_predicted_tau_mem_is_linear_for_large_psi_p():
    """psi_p / (Delta lambda_min) -> psi_n / (Delta v_t^2) when psi_p >> psi_n."""
    ge = gaussian_equivalence(0.1)
    ratio = predicted_tau_mem(ge, 1e6, 20.0) / predicted_tau_mem(ge, 1e6, 10.0)
    assert ratio == pytest.approx(2.0, rel=1e-2)
