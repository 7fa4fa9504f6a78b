"""The spectrum of U: the paper's predicted supports (Theorem 3.2) and the measured eigenvalues.

Regime I (psi_p > psi_n >> 1), rho(lambda) = (1 - (1 + psi_n)/psi_p) delta(lambda - s_t^2) + (psi_n/psi_p) rho_1
+ (1/psi_p) rho_2, with

- the delta peak at s_t^2 (directions orthogonal to the data and to W: they change no loss);
- rho_1, the n-dependent bulk, on [s_t^2 + v_t^2 (1 - sqrt(psi_p/psi_n))^2, s_t^2 + v_t^2 (1 + sqrt(psi_p/psi_n))^2]
  (the psi_n >> 1 limit of the saddle-point equations; at psi_n = 4 a few eigenvalues leak below its left edge);
- rho_2, the population bulk: the d non-trivial eigenvalues of E_X[U] = mu1^2 W W^T / d + (v_t^2 + s_t^2) I, whose
  W W^T / d part is Marchenko-Pastur: [beta + mu1^2 (sqrt(psi_p) - 1)^2, beta + mu1^2 (sqrt(psi_p) + 1)^2],
  beta = v_t^2 + s_t^2 (on the scale psi_p, independent of n; the finite-n sample spreads it wider).

Regime II (psi_n > psi_p): no delta peak; rho = (1 - 1/psi_p) rho_1 + (1/psi_p) rho_2.
The slowest memorization mode sits at the left edge of rho_1, hence tau_mem = psi_p / (Delta_t lambda_min).

:func:`predicted_density` solves the full equations (Theorem 3.1, for N(0, I) data) instead of their asymptotics:
with q = (1/p) Tr (U - z)^{-1} and s = (1/(p d)) Tr W^T (U - z)^{-1} W at z = lambda + i eps,

    s = 1 / (b_t^2 psi_p + 1/q + psi_p a_t^2 e^{-2t} / D),   D = 1 + (a_t^2 e^{-2t} psi_p/psi_n) s + (psi_p v_t^2/psi_n) q,
    psi_p (s_t^2 - z) + psi_p v_t^2 / D + (1 - psi_p)/q - s/q^2 = 0,

and rho(lambda) = Im q / pi. It is solved by Newton's method on the two complex unknowns, for every lambda at once,
with eps lowered geometrically from a large value (where q = s = -1/z) so that each solve starts next to the physical
branch. It also predicts the small bulk of d eigenvalues just above s_t^2 that the asymptotic supports miss.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from diffmem.theory.constants import GaussianEquivalence, gaussian_equivalence


@dataclass(frozen=True)
class Support:
    """One predicted part of the spectrum: [lo, hi] (lo == hi for the delta peak) holding ``weight`` of the mass."""

    name: str
    lo: float
    hi: float
    weight: float

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


def predicted_supports(ge: GaussianEquivalence, psi_p: float, psi_n: float) -> list[Support]:
    """The delta peak (when psi_p > 1 + psi_n), rho_1 and rho_2 of the paper (see the module docstring)."""
    ratio = psi_p / psi_n
    rho1 = Support("rho_1 (n-dependent bulk)", ge.s2 + ge.v2 * (1 - math.sqrt(ratio)) ** 2,
                   ge.s2 + ge.v2 * (1 + math.sqrt(ratio)) ** 2,
                   psi_n / psi_p if psi_p > psi_n else 1 - 1 / psi_p)
    beta = ge.v2 + ge.s2
    rho2 = Support("rho_2 (population bulk)", beta + ge.mu1_sq * (math.sqrt(psi_p) - 1) ** 2,
                   beta + ge.mu1_sq * (math.sqrt(psi_p) + 1) ** 2, 1 / psi_p)
    out = [rho1, rho2]
    if psi_p > 1 + psi_n:
        out.insert(0, Support("delta at s_t^2", ge.s2, ge.s2, 1 - (1 + psi_n) / psi_p))
    return out


def lambda_min(ge: GaussianEquivalence, psi_p: float, psi_n: float) -> float:
    """The left edge of rho_1, s_t^2 + v_t^2 (1 - sqrt(psi_p / psi_n))^2."""
    return ge.s2 + ge.v2 * (1 - math.sqrt(psi_p / psi_n)) ** 2


def predicted_tau_mem(ge: GaussianEquivalence, psi_p: float, psi_n: float) -> float:
    """tau_mem = psi_p / (Delta_t lambda_min), the paper's timescale of the slowest memorization mode."""
    return psi_p / (ge.delta * lambda_min(ge, psi_p, psi_n))


def predicted_tau_gen(ge: GaussianEquivalence, psi_p: float) -> float:
    """psi_p / (Delta_t lambda) at the centre of rho_2, ~ 1 / (Delta_t mu1^2): independent of n."""
    centre = ge.v2 + ge.s2 + ge.mu1_sq * (psi_p + 1)
    return psi_p / (ge.delta * centre)


def in_support(values: np.ndarray, support: Support, rel: float = 0.05) -> np.ndarray:
    """Mask of the ``values`` inside ``support`` widened by ``rel`` (relative; the delta peak by rel * s2)."""
    return (values >= support.lo * (1 - rel)) & (values <= support.hi * (1 + rel))


def mass_in(eigenvalues: np.ndarray, support: Support, rel: float = 0.05) -> float:
    """Fraction of ``eigenvalues`` inside ``support`` widened by ``rel`` (see :func:`in_support`)."""
    return float(np.mean(in_support(eigenvalues, support, rel)))


def density_mass_in(lambdas: np.ndarray, rho: np.ndarray, support: Support, rel: float = 0.05) -> float:
    """The mass of ``support``: the integral of the density ``rho`` over it (trapezoid on the grid ``lambdas``,
    widened by ``rel`` as :func:`in_support`), or its weight for the delta peak, which a grid cannot integrate."""
    if support.lo == support.hi:
        return support.weight
    inside = in_support(lambdas, support, rel)
    return float(np.trapezoid(rho[inside], lambdas[inside]))


def predicted_density(ge: GaussianEquivalence, psi_p: float, psi_n: float, lambdas: np.ndarray, *,
                      eps_min: float = 1e-11, continuation_steps: int = 80, newton_steps: int = 8) -> np.ndarray:
    """The continuous part of rho(lambda) at ``lambdas`` from the saddle-point equations (module docstring).

    Its integral is 1 minus the delta peak's mass. Raises ArithmeticError when the equations are not solved to 1e-8.
    """
    lam = np.asarray(lambdas, dtype=float)
    ac2 = ge.a ** 2 * ge.c ** 2
    alpha, beta = ac2 * psi_p / psi_n, psi_p * ge.v2 / psi_n
    q = s = None
    for eps in np.geomspace(10.0 * max(1.0, float(lam.max())), eps_min, continuation_steps):
        z = lam + 1j * eps
        if q is None:
            q, s = -1 / z, -1 / z
        for _ in range(newton_steps):
            d = 1 + alpha * s + beta * q
            g = ge.b ** 2 * psi_p + 1 / q + psi_p * ac2 / d
            f1 = s - 1 / g
            f2 = psi_p * (ge.s2 - z) + psi_p * ge.v2 / d + (1 - psi_p) / q - s / q ** 2
            j11 = (-1 / q ** 2 - psi_p * ac2 * beta / d ** 2) / g ** 2
            j12 = 1 + (-psi_p * ac2 * alpha / d ** 2) / g ** 2
            j21 = -psi_p * ge.v2 * beta / d ** 2 - (1 - psi_p) / q ** 2 + 2 * s / q ** 3
            j22 = -psi_p * ge.v2 * alpha / d ** 2 - 1 / q ** 2
            det = j11 * j22 - j12 * j21
            q, s = q + (f2 * j12 - f1 * j22) / det, s + (f1 * j21 - f2 * j11) / det
    residual = max(float(np.abs(f1).max()), float(np.abs(f2).max()) / psi_p)
    if not residual < 1e-8:
        raise ArithmeticError(f"the spectral equations were not solved (residual {residual:.2g}); "
                              "use more continuation_steps")
    return q.imag / np.pi


def monte_carlo_spectrum(d: int, p: int, n: int, t: float, seed: int, draws: int, *,
                         device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> np.ndarray:
    """Eigenvalues of U for the real tanh features, E_xi replaced by ``draws`` noise draws per sample (ascending).

    Memory: one p x p matrix; time O(p^2 n draws + p^3). The finite number of draws spreads the delta peak into a
    Marchenko-Pastur bulk of ratio p / (n draws) around s_t^2.
    """
    ge = gaussian_equivalence(t)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    w = torch.randn(p, d, generator=gen, dtype=dtype).to(device)
    x = torch.randn(n, d, generator=gen, dtype=dtype).to(device)
    u = torch.zeros(p, p, dtype=dtype, device=device)
    for _ in range(draws):
        xi = torch.randn(n, d, generator=gen, dtype=dtype).to(device)
        phi = torch.tanh((ge.c * x + math.sqrt(ge.delta) * xi) @ w.T / math.sqrt(d))
        u += phi.T @ phi
    u /= n * draws
    return torch.linalg.eigvalsh(u).double().cpu().numpy()
