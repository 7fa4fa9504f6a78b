"""Gaussian-equivalence constants of the tanh random features at diffusion time t (paper eq. 12-14).

With u, v, w i.i.d. N(0, 1), c = e^{-t} sigma_x, Delta_t = 1 - e^{-2t} and Gamma_t = c^2 + Delta_t (a variance):

- ``a``  = E[ sigma(c u + sqrt(Delta_t) v) u ] / c        (the linear response to the clean data)
- ``b``  = E[ sigma(c u + sqrt(Delta_t) v) v ]            (the linear response to the noise)
- ``v2`` = E[ sigma(c u + sqrt(Delta_t) v) sigma(c u + sqrt(Delta_t) w) ] - a^2 c^2   (sample-dependent part)
- ``s2`` = E[ sigma(sqrt(Gamma_t) u)^2 ] - a^2 c^2 - v2 - b^2                       (the isotropic rest)

The paper prints sigma(Gamma_t u) in s_t^2; the argument's standard deviation is sqrt(Gamma_t), which is what the
variance decomposition needs (and what reproduces the delta peak of the spectrum, tests/test_theory.py). The
expectations are computed by Gauss-Hermite quadrature (probabilists' nodes, nested for v2), exact to ~1e-12 for
tanh, not by Monte Carlo.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

QUADRATURE_NODES = 120
"""Gauss-Hermite nodes per dimension (tanh is analytic, so 120 nodes are exact to double precision)."""


@dataclass(frozen=True)
class GaussianEquivalence:
    """The constants of one diffusion time ``t`` for data of per-coordinate variance ``sigma_x2``."""

    t: float
    sigma_x2: float
    delta: float  # Delta_t = 1 - exp(-2t)
    a: float
    b: float
    v2: float
    s2: float

    @property
    def c(self) -> float:
        """e^{-t} sigma_x: the scale of the clean signal in x_t."""
        return math.exp(-self.t) * math.sqrt(self.sigma_x2)

    @property
    def mu1_sq(self) -> float:
        """a^2 c^2 + b^2: the linear part of the population feature covariance (mu_1(t)^2 when Gamma_t = 1)."""
        return self.a ** 2 * self.c ** 2 + self.b ** 2

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def gaussian_equivalence(t: float, sigma_x2: float = 1.0, nodes: int = QUADRATURE_NODES) -> GaussianEquivalence:
    """The constants a_t, b_t, v_t^2, s_t^2 of sigma = tanh at diffusion time ``t`` (see the module docstring)."""
    if t <= 0 or sigma_x2 <= 0:
        raise ValueError(f"t = {t} and sigma_x2 = {sigma_x2} must be > 0")
    z, w = hermegauss(nodes)
    w = w / w.sum()  # weights of E over N(0, 1)
    delta = 1.0 - math.exp(-2.0 * t)
    c = math.exp(-t) * math.sqrt(sigma_x2)
    gamma = c * c + delta
    h = np.tanh(math.sqrt(gamma) * z)
    a = float(np.sum(w * (1.0 - h ** 2)))  # Stein: E[sigma(c u + sqrt(D) v) u] = c E[sigma'], the same Gaussian
    b = float(math.sqrt(delta) * a)  # Stein again: E[sigma v] = sqrt(D) E[sigma']
    inner = np.tanh(c * z[:, None] + math.sqrt(delta) * z[None, :]) @ w  # E_v sigma(c u + sqrt(D) v), per node u
    v2 = float(np.sum(w * inner ** 2) - a * a * c * c)
    s2 = float(np.sum(w * h ** 2) - a * a * c * c - v2 - b * b)
    return GaussianEquivalence(t=t, sigma_x2=sigma_x2, delta=delta, a=a, b=b, v2=v2, s2=s2)
