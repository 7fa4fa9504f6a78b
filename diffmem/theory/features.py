"""One draw of the random-features problem: W, the data, U's eigen-decomposition and the quadratic metrics.

Two ways to do the noise expectation E_xi in U = (1/n) sum_nu E_xi[sigma sigma^T] and V = (1/n) sum_nu E_xi[sigma xi^T]
(``noise``), with sigma = tanh(W x_t / sqrt d), x_t = e^{-t} x + sqrt(Delta_t) xi:

- ``"gaussian-equivalent"`` (default): the paper's Gaussian equivalence (appendix C),
  U = G G^T / n + b_t^2 W W^T / d + s_t^2 I, G = a_t e^{-t} W X / sqrt d + v_t Omega, V = b_t W / sqrt d, and the
  population moments E_x[U] = mu1^2 W W^T / d + (v_t^2 + s_t^2) I. Exact in the high-dimensional limit; U - s_t^2 I
  has rank n + d, so its eigen-decomposition comes from the (n + d) x (n + d) Gram matrix of [G / sqrt n, b W / sqrt d]
  and costs O(p (n + d)^2), not O(p^3).
- ``"monte-carlo"``: the real tanh features, with E_xi replaced by an average over ``noise_draws`` fixed draws per
  training sample (the model then trains on exactly those draws, which :func:`diffmem.theory.dynamics.simulate_gd`
  reproduces step by step); test quantities average over ``test_draws`` fresh samples.

Metrics (all divided by d; the paper's eq. 4 and 8):

- ``train_loss``: (1/d)(1/n) sum_nu E_xi || sqrt(Delta_t) s_A(x_t^nu) + xi ||^2
- ``test_loss``: the same over fresh data (the population)
- ``score_error``: (1/d) E || s_A(x) - grad log P_t(x) ||^2, x from the noised data law, N(0, I_d) for N(0, I_d)
  data, whose score is -x (generalization: the distance to the exact score)
- ``memorization_error``: (1/d) E || s_A(x) - s_emp(x) ||^2 with x from the noised *training* distribution and
  s_emp the exact score of the noised empirical distribution (the empirical optimal score, the minimiser of the
  train loss over all functions; memorization). Monte Carlo over ``test_draws`` draws in both modes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from diffmem.theory.constants import GaussianEquivalence, gaussian_equivalence
from diffmem.theory.dynamics import Eigenbasis, QuadraticMetric

RANK_TOL = 1e-10
"""Gram eigenvalues below RANK_TOL * the largest are null directions of the feature matrix and are dropped."""

METRICS = ("train_loss", "test_loss", "score_error", "memorization_error")


@dataclass
class RandomFeaturesInstance:
    """One draw (W, data, noise) at one diffusion time, ready for the closed-form dynamics.

    ``spectrum``: all p eigenvalues of U (ascending, numpy); ``basis``: the eigen-pairs that move B;
    ``metrics``: the :data:`METRICS` as quadratic functions of B; ``raw``: the arrays a step-by-step simulation needs
    (monte-carlo mode only: features, noises and inputs of the training, test and memorization draws, the
    empirical optimal score at the memorization draws, the eigenvectors P).
    """

    d: int
    p: int
    n: int
    t: float
    seed: int
    noise: str
    constants: GaussianEquivalence
    basis: Eigenbasis
    spectrum: np.ndarray
    metrics: dict[str, QuadraticMetric]
    raw: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def psi_p(self) -> float:
        return self.p / self.d

    @property
    def psi_n(self) -> float:
        return self.n / self.d


def _gram_eigen(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-pairs (S^2, Y) of F^T F with the null directions dropped (ascending)."""
    s2, y = torch.linalg.eigh(f.T @ f)
    keep = s2 > RANK_TOL * s2.max().clamp_min(torch.finfo(s2.dtype).tiny)
    return s2[keep], y[:, keep]


def _empirical_score(y: torch.Tensor, x_train: torch.Tensor, c: float, delta: float,
                     chunk: int = 1024) -> torch.Tensor:
    """Score of the noised empirical law (1/n) sum_nu N(c x^nu, Delta I) at the rows of ``y`` (m x d) -> (m x d)."""
    out = torch.empty_like(y)
    centers = c * x_train  # n x d
    for i in range(0, y.shape[0], chunk):
        part = y[i:i + chunk]
        logits = -torch.cdist(part, centers).pow(2) / (2.0 * delta)
        weights = torch.softmax(logits, dim=1)
        out[i:i + chunk] = -(part - weights @ centers) / delta
    return out


def _memorization_metric(basis: Eigenbasis, projected: torch.Tensor, target: torch.Tensor) -> QuadraticMetric:
    """``memorization_error`` from projected features P^T sigma (r x m) and T = -s_emp (m x d)."""
    m = projected.shape[1]
    return QuadraticMetric.from_moments("memorization_error", 1.0, basis, projected @ projected.T / m,
                                        projected @ target / m, float((target * target).sum() / m))


def build_instance(d: int, p: int, n: int, t: float, seed: int, *, noise: str = "gaussian-equivalent",
                   noise_draws: int = 16, test_draws: int = 4000, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float64) -> RandomFeaturesInstance:
    """Draw W (p x d), n training samples of N(0, I_d) and the noise, and set up the closed-form dynamics."""
    if noise not in ("gaussian-equivalent", "monte-carlo"):
        raise ValueError(f"noise = {noise!r}: use 'gaussian-equivalent' or 'monte-carlo'")
    ge = gaussian_equivalence(t)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

    w = normal(p, d)
    x = normal(n, d)  # training data, one sample per row
    c, delta, root = ge.c, ge.delta, math.sqrt(ge.delta)
    # memorization draws: noisy versions of the training samples, cycling through them
    nu = torch.arange(test_draws, device=device) % n
    xi_mem = normal(test_draws, d)
    y_mem = c * x[nu] + root * xi_mem
    t_mem = -_empirical_score(y_mem, x, c, delta)
    if noise == "gaussian-equivalent":
        omega = normal(p, n)
        g = ge.a * c * (w @ x.T) / math.sqrt(d) + math.sqrt(ge.v2) * omega  # p x n
        f = torch.cat([g / math.sqrt(n), ge.b * w / math.sqrt(d)], dim=1)  # p x (n + d)
        s2, y = _gram_eigen(f)
        s = s2.sqrt()
        lam = ge.s2 + s2
        cm = y[n:, :] * s  # V = F[:, n:], so V^T P = Y[n:, :] S
        basis = Eigenbasis(lam=lam, cm=cm, d=d, p=p, delta=delta)
        pw = (s[:, None] * y[n:, :].T) / ge.b  # P^T W / sqrt d  (r x d)
        pg = math.sqrt(n) * s[:, None] * y[:n, :].T  # P^T G  (r x n)
        pop = ge.mu1_sq * pw @ pw.T + (ge.v2 + ge.s2) * torch.eye(lam.numel(), dtype=dtype, device=device)
        metrics = {
            "train_loss": QuadraticMetric.from_moments("train_loss", root, basis, lam, cm.T, d),
            "test_loss": QuadraticMetric.from_moments("test_loss", root, basis, pop, ge.b * pw, d),
            "score_error": QuadraticMetric.from_moments("score_error", 1.0, basis, pop,
                                                        (ge.a * c * c + ge.b * root) * pw, d * (c * c + delta)),
        }
        z_mem = pg[:, nu] + ge.b * pw @ xi_mem.T + math.sqrt(ge.s2) * normal(lam.numel(), test_draws)
        metrics["memorization_error"] = _memorization_metric(basis, z_mem, t_mem)
        rest = np.full(p - lam.numel(), ge.s2) if p > lam.numel() else np.empty(0)
        spectrum = np.sort(np.concatenate([lam.cpu().numpy(), rest]))
        return RandomFeaturesInstance(d, p, n, t, seed, noise, ge, basis, spectrum, metrics)

    # monte-carlo: the real tanh features with noise_draws fixed draws per training sample
    k = noise_draws
    xi = normal(n * k, d)
    x_rep = x.repeat_interleave(k, dim=0)
    phi = torch.tanh((c * x_rep + root * xi) @ w.T / math.sqrt(d))  # (n k) x p
    f = phi.T / math.sqrt(n * k)  # p x (n k);  U = F F^T, V = F Z with Z = xi / sqrt(n k)
    z = xi / math.sqrt(n * k)
    if n * k <= p:
        s2, y = _gram_eigen(f)
        lam = s2
        p_basis = f @ (y / s2.sqrt())  # p x r, orthonormal
        cm = z.T @ y * s2.sqrt()
    else:
        lam, p_basis = torch.linalg.eigh(f @ f.T)
        cm = (f @ z).T @ p_basis
    basis = Eigenbasis(lam=lam, cm=cm, d=d, p=p, delta=delta)
    x_test = normal(test_draws, d)
    xi_test = normal(test_draws, d)
    y_test = c * x_test + root * xi_test
    phi_test = torch.tanh(y_test @ w.T / math.sqrt(d))
    z_test = p_basis.T @ phi_test.T  # r x m
    m = float(test_draws)
    second = z_test @ z_test.T / m
    metrics = {
        "train_loss": QuadraticMetric.from_moments("train_loss", root, basis, lam, cm.T,
                                                   float((xi * xi).sum() / (n * k))),
        "test_loss": QuadraticMetric.from_moments("test_loss", root, basis, second, z_test @ xi_test / m,
                                                  float((xi_test * xi_test).sum() / m)),
        "score_error": QuadraticMetric.from_moments("score_error", 1.0, basis, second, z_test @ y_test / m,
                                                    float((y_test * y_test).sum() / m)),
    }
    phi_mem = torch.tanh(y_mem @ w.T / math.sqrt(d))
    z_mem = p_basis.T @ phi_mem.T
    metrics["memorization_error"] = _memorization_metric(basis, z_mem, t_mem)
    rest = np.zeros(p - lam.numel()) if p > lam.numel() else np.empty(0)
    spectrum = np.sort(np.concatenate([lam.cpu().numpy(), rest]))
    raw = {"features_train": phi, "noise_train": xi, "features_test": phi_test, "noise_test": xi_test,
           "inputs_test": y_test, "features_mem": phi_mem, "empirical_score_mem": -t_mem, "basis_vectors": p_basis}
    return RandomFeaturesInstance(d, p, n, t, seed, noise, ge, basis, spectrum, metrics, raw)
