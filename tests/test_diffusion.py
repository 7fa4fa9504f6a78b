"""The DDPM schedule, the DSM loss and the DDIM sampler against closed forms."""
import math

import torch

from diffmem.config import DiffusionConfig
from diffmem.diffusion import Diffusion


def test_schedule_is_linear_1e4_to_2e2_and_matches_closed_form():
    d = Diffusion(DiffusionConfig())
    betas = torch.linspace(1e-4, 2e-2, 1000, dtype=torch.float64)
    expected = torch.cumprod(1 - betas, 0).float()
    assert torch.allclose(d.alpha_bar("cpu"), expected, atol=1e-6)


def test_add_noise_matches_diffusers_and_formula():
    d = Diffusion()
    x, n = torch.randn(5, 1, 8, 8), torch.randn(5, 1, 8, 8)
    t = torch.tensor([0, 1, 40, 500, 999])
    ab = d.alpha_bar("cpu")[t].view(-1, 1, 1, 1)
    assert torch.allclose(d.add_noise(x, n, t), ab.sqrt() * x + (1 - ab).sqrt() * n)
    assert torch.allclose(d.add_noise(x, n, t), d.ddpm.add_noise(x, n, t))


def test_step_for_time_inverts_exp_minus_2t():
    d = Diffusion()
    k = d.step_for_time(0.01)
    assert k == 40  # the paper's "t = 0.01, about DDPM step 40"
    ab = d.alpha_bar("cpu")
    assert abs(ab[k] - math.exp(-0.02)) <= min(abs(ab[k - 1] - math.exp(-0.02)), abs(ab[k + 1] - math.exp(-0.02)))


class ConstantNoise(torch.nn.Module):
    """A 'model' that predicts a fixed value: its DSM loss is known in closed form."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x, t):
        return type("Out", (), {"sample": torch.full_like(x, self.value)})


def test_dsm_loss_of_a_constant_predictor_is_one_plus_c_squared():
    # E (c - eps)^2 = 1 + c^2 for eps ~ N(0, 1)
    d = Diffusion()
    g = torch.Generator().manual_seed(0)
    loss = d.loss(ConstantNoise(0.5), torch.zeros(4096, 1, 8, 8), generator=g)
    assert abs(loss.item() - 1.25) < 0.01
    per_image = d.loss(ConstantNoise(0.0), torch.zeros(3, 1, 4, 4), generator=g, t=torch.tensor([1, 2, 3]),
                       reduction="none")
    assert per_image.shape == (3,)


class OracleForGaussian(torch.nn.Module):
    """The exact noise predictor for data x0 ~ N(0, s^2 I): eps = sqrt(1-ab) x_t / (ab s^2 + 1 - ab)."""

    def __init__(self, d, s):
        super().__init__()
        self.ab, self.s = d.alpha_bar("cpu"), s

    def forward(self, x, t):
        ab = self.ab[t].view(-1, 1, 1, 1)
        return type("Out", (), {"sample": (1 - ab).sqrt() * x / (ab * self.s ** 2 + 1 - ab)})


def test_ddim_with_exact_score_samples_the_data_distribution():
    # With the exact score, deterministic DDIM's only error is discretization: it shrinks as steps grow.
    d, s = Diffusion(), 0.3
    errors = []
    for steps in (20, 100, 1000):
        x = d.sample(OracleForGaussian(d, s), 2000, (1, 4, 4), torch.Generator().manual_seed(0), kind="ddim",
                     steps=steps, clip_sample=False, batch_size=700)
        assert x.shape == (2000, 1, 4, 4) and abs(x.mean().item()) < 0.02
        errors.append(abs(x.std().item() - s))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.01


def test_sampling_is_deterministic_given_the_seed():
    d = Diffusion()
    model = OracleForGaussian(d, 0.5)
    a = d.sample(model, 10, (1, 4, 4), torch.Generator().manual_seed(3), steps=10)
    b = d.sample(model, 10, (1, 4, 4), torch.Generator().manual_seed(3), steps=10)
    c = d.sample(model, 10, (1, 4, 4), torch.Generator().manual_seed(3), steps=10, kind="ddpm")
    assert torch.equal(a, b) and c.shape == a.shape
