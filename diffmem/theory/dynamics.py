"""The exact gradient-descent dynamics of the random-features score, from the eigen-decomposition of U.

With B = A / sqrt p, gradient descent A <- A - lr * grad L_train on the DSM loss at one diffusion time is linear in
B; from A(0) = 0 (THEORY.md, paper eq. 9-11)

    B(tau) = -Delta_t^{-1/2} V^T U^{-1} (I - exp(-2 Delta_t U tau / psi_p)),   tau = k * lr / d^2,

the gradient flow. Plain gradient descent with a finite step is solved as exactly: B_k = B_inf (I - (I - eps U)^k),
eps = 2 lr Delta_t / (p d). In the eigenbasis U = sum_k lam_k P_k P_k^T, B(tau) = -Delta_t^{-1/2} Cm diag(f(tau))
P^T with Cm = V^T P (d x r) and the mode filter f_k(tau) = (1 - exp(-2 Delta_t lam_k tau / psi_p)) / lam_k.

Every quantity of the paper is a quadratic function of B, (1/d) E || alpha B sigma + T ||^2 for a target T, and so
a :class:`QuadraticMetric` of the filter: (1/d) [alpha^2 / Delta_t f^T H f - 2 alpha / sqrt(Delta_t) f.g + const]
with H = (Cm^T Cm) o (P^T E[sigma sigma^T] P), g_k = (P^T E[sigma T^T] Cm)_kk and const = E||T||^2. No
step-by-step simulation is needed; :func:`simulate_gd` runs one anyway, on the real network, to check this.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Eigenbasis:
    """U restricted to the directions B(tau) can reach.

    ``lam``: the r eigenvalues of U whose eigenvectors P (p x r) span V's columns (the other eigenvectors are
    orthogonal to V, so B(tau) never moves along them and they change no loss); ``cm``: V^T P (d x r), V's
    coordinates in those eigenvectors; ``p`` features, ``d`` dimensions, ``delta`` = Delta_t.
    """

    lam: torch.Tensor
    cm: torch.Tensor
    d: int
    p: int
    delta: float

    @property
    def psi_p(self) -> float:
        return self.p / self.d

    def filters(self, taus: np.ndarray | torch.Tensor, lr: float | None = None) -> torch.Tensor:
        """The mode filter f (len(taus) x r) at training times ``taus``; ``inf`` gives the limit 1 / lam.

        ``lr`` None: the gradient flow. A learning rate: plain gradient descent with that step, at k = tau d^2 / lr
        steps (tau must then be a multiple of lr / d^2 for k to be an integer step count).
        """
        tau = torch.as_tensor(np.asarray(taus, dtype=float), dtype=self.lam.dtype, device=self.lam.device)[:, None]
        lam = self.lam[None, :]
        finite = torch.isfinite(tau)
        tau0 = torch.where(finite, tau, torch.zeros_like(tau))
        if lr is None:
            f = -torch.expm1(-2.0 * self.delta * lam * tau0 / self.psi_p) / lam
        else:
            eps = 2.0 * lr * self.delta / (self.p * self.d)
            steps = torch.round(tau0 * self.d ** 2 / lr)
            f = -torch.expm1(steps * torch.log1p(-eps * lam)) / lam
        return torch.where(finite, f, (1.0 / lam).expand_as(f))

    def weights(self, taus: np.ndarray | torch.Tensor, lr: float | None = None) -> torch.Tensor:
        """B(tau) in the eigenbasis, -Delta_t^{-1/2} Cm diag(f(tau)) (len(taus) x d x r): B(tau) = result @ P^T."""
        f = self.filters(taus, lr)
        return -(self.cm[None, :, :] * f[:, None, :]) / math.sqrt(self.delta)


@dataclass(frozen=True)
class QuadraticMetric:
    """(1/d) E || alpha B(tau) sigma + T ||^2 in the eigenbasis (see the module docstring).

    ``h``: (r x r) or its diagonal (r,); ``g``: (r,); ``const`` = E||T||^2 (a float).
    """

    name: str
    alpha: float
    h: torch.Tensor
    g: torch.Tensor
    const: float

    @classmethod
    def from_moments(cls, name: str, alpha: float, basis: Eigenbasis, sigma_sigma: torch.Tensor,
                     sigma_target: torch.Tensor, target_sq: float) -> QuadraticMetric:
        """From the projected moments P^T E[sigma sigma^T] P (r x r, or its diagonal) and P^T E[sigma T^T] (r x d)."""
        gram = basis.cm.T @ basis.cm if sigma_sigma.ndim == 2 else (basis.cm ** 2).sum(0)
        h = gram * sigma_sigma
        g = (sigma_target * basis.cm.T).sum(1)
        return cls(name=name, alpha=alpha, h=h, g=g, const=float(target_sq))

    def evaluate(self, basis: Eigenbasis, f: torch.Tensor) -> np.ndarray:
        """The metric at each row of the filter ``f`` (T x r) -> (T,) float64 array."""
        if self.h.ndim == 1:
            quad = (f * f * self.h[None, :]).sum(1)
        else:
            quad = ((f @ self.h) * f).sum(1)
        lin = (f * self.g[None, :]).sum(1)
        value = (self.alpha ** 2 / basis.delta * quad - 2.0 * self.alpha / math.sqrt(basis.delta) * lin
                 + self.const) / basis.d
        return value.detach().cpu().numpy().astype(np.float64)


def evaluate_metrics(basis: Eigenbasis, metrics: dict[str, QuadraticMetric], taus: np.ndarray,
                     lr: float | None = None) -> dict[str, np.ndarray]:
    """Every metric at the training times ``taus`` (flow, or gradient descent with step ``lr``)."""
    f = basis.filters(taus, lr)
    return {name: m.evaluate(basis, f) for name, m in metrics.items()}


def log_times(tau_min: float, tau_max: float, n: int) -> np.ndarray:
    """``n`` log-spaced training times in [tau_min, tau_max] (tau = steps * lr / d^2)."""
    return np.logspace(math.log10(tau_min), math.log10(tau_max), n)


def simulate_gd(features_train: torch.Tensor, noise_train: torch.Tensor, features_test: torch.Tensor,
                noise_test: torch.Tensor, *, delta: float, lr: float, steps: int,
                record: list[int]) -> dict[str, np.ndarray]:
    """Plain gradient descent on the random-features DSM loss, step by step, with autograd.

    ``features_*``: sigma(W x_t / sqrt d) of the noisy inputs (m x p); ``noise_*``: the xi that made them (m x d).
    The train loss averages over the given training draws (fixed), the test loss over the test draws. A (d x p)
    starts at 0; the losses are recorded after each step count in ``record``. Returns tau (= k lr / d^2) and both
    losses per recorded step.
    """
    d, p = noise_train.shape[1], features_train.shape[1]
    a = torch.zeros(d, p, dtype=features_train.dtype, device=features_train.device, requires_grad=True)
    root = math.sqrt(delta)

    def loss(features: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        out = root * features @ a.T / math.sqrt(p) + noise
        return (out * out).sum(1).mean() / d

    wanted = sorted(set(record))
    out = {"step": [], "tau": [], "train_loss": [], "test_loss": []}

    def write(k: int) -> None:
        with torch.no_grad():
            out["step"].append(k)
            out["tau"].append(k * lr / d ** 2)
            out["train_loss"].append(float(loss(features_train, noise_train)))
            out["test_loss"].append(float(loss(features_test, noise_test)))

    if 0 in wanted:
        write(0)
    for k in range(1, max(wanted) + 1):
        value = loss(features_train, noise_train)
        (grad,) = torch.autograd.grad(value, a)
        with torch.no_grad():
            a -= lr * grad
        if k in wanted:
            write(k)
    return {key: np.asarray(v, dtype=float) for key, v in out.items()}
