"""The paper's protocol as the official code runs it: each convention pinned by a test that fails if it is undone,
and docs/fidelity.md held against the experiment files."""
from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.models.attention_processor import Attention
from diffusers.models.resnet import ResnetBlock2D

from diffmem.cli import main
from diffmem.config import (DiffusionConfig, RunConfig, config_from_dict, load_config, upgrade_stored_config)
from diffmem.diffusion import Diffusion
from diffmem.metrics.fid import OFFLINE_EXTRACTOR, fid, fid_sets
from diffmem.model import build_from_config, build_unet, count_parameters, official_parameter_count
from diffmem.eval_grid import evaluation_steps, paper_grid
from diffmem.rundir import RunConfigMismatch, check_same_config
from diffmem.train import train
from diffmem.rundir import RunDir
from tiny_runs import sets, tiny_config

ROOT = Path(__file__).resolve().parents[1]
PAPER_PARAMS_M = {8: 0.26, 16: 1.0, 32: 4.1, 48: 9.1, 64: 16.1}


# --- model ----------------------------------------------------------------------------------------------------------

def official_unet_parameters(width: int, timesteps: int = 1000, channels: int = 1, mult=(1, 2, 4),
                             attention=(False, True, True), blocks: int = 2) -> int:
    """Parameters of the official U-Net counted block by block from its description (frozen sinusoid table
    included, as the official script counts it): GroupNorm 2C, conv k x k: k^2 C_in C_out + C_out, Linear: in out +
    out, MultiheadAttention: 4 C^2 + 4 C."""
    emb = 4 * width
    conv = lambda cin, cout, k=3: k * k * cin * cout + cout  # noqa: E731
    lin = lambda cin, cout: cin * cout + cout  # noqa: E731

    def resnet(cin: int, cout: int, attn: bool) -> int:
        p = 2 * cin + conv(cin, cout) + lin(emb, cout) + 2 * cout + conv(cout, cout)
        p += conv(cin, cout, 1) if cin != cout else 0
        return p + (2 * cout + 4 * cout * cout + 4 * cout if attn else 0)

    total = timesteps * width + lin(width, emb) + lin(emb, emb) + conv(channels, width)
    skips, c = [width], width
    for level, m in enumerate(mult):
        for _ in range(blocks):
            total += resnet(c, width * m, attention[level])
            c = width * m
            skips.append(c)
        if level < len(mult) - 1:
            total += conv(c, c)
            skips.append(c)
    total += resnet(c, c, True) + resnet(c, c, False)
    for level in reversed(range(len(mult))):
        for _ in range(blocks + 1):
            total += resnet(skips.pop() + c, width * mult[level], attention[level])
            c = width * mult[level]
        if level > 0:
            total += conv(c, c)
    return total + 2 * width + conv(width, channels)


@pytest.mark.parametrize("width", sorted(PAPER_PARAMS_M))
def test_parameters_equal_the_official_unet_and_the_paper_within_3_percent(width):
    model = build_unet(width, 32)
    official = official_unet_parameters(width)
    assert count_parameters(model) == official - 1000 * width  # trainable: identical
    assert official_parameter_count(model) == official
    assert abs(official / 1e6 - PAPER_PARAMS_M[width]) / PAPER_PARAMS_M[width] < 0.03


def test_dropout_drops_whole_channels():
    model = build_unet(8, 16, attention=False, dropout=0.5).train()
    blocks = [m for m in model.modules() if isinstance(m, ResnetBlock2D)]
    assert blocks and all(isinstance(b.dropout, torch.nn.Dropout2d) and b.dropout.p == 0.5 for b in blocks)
    seen = []
    blocks[0].dropout.register_forward_hook(lambda mod, inp, out: seen.append((inp[0], out)))
    torch.manual_seed(0)
    model(torch.randn(4, 1, 16, 16), torch.tensor([5, 50, 500, 900]))
    x, y = seen[0]
    zero = (y == 0).flatten(2).all(-1)  # (B, C): the whole feature map dropped
    kept = torch.isclose(y, x * 2).flatten(2).all(-1)  # the whole map kept and scaled by 1 / (1 - p)
    assert bool((zero | kept).all()) and zero.any() and kept.any()
    element = build_unet(8, 16, attention=False, dropout_type="element")
    assert all(type(b.dropout) is torch.nn.Dropout for b in element.modules() if isinstance(b, ResnetBlock2D))


def test_time_embedding_is_the_official_sinusoid_then_linear_gelu_linear():
    width, model = 16, build_unet(16, 16, attention=False)
    t = torch.tensor([0, 1, 7, 40, 500, 999])
    half = width // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / (half - 1))
    expected = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], dim=1)
    assert torch.allclose(model.time_proj(t).double(), expected, atol=1e-4)
    mlp = model.time_embedding
    x = torch.randn(3, width)
    ref = mlp.linear_2(torch.nn.functional.gelu(mlp.linear_1(x)))
    assert torch.allclose(mlp(x), ref)
    silu = build_unet(16, 16, attention=False, time_act="silu", time_embedding="diffusers")
    assert not torch.allclose(silu.time_proj(t).double(), expected, atol=1e-2)


def test_every_attention_layer_has_four_heads():
    torch.manual_seed(0)
    model = build_unet(8, 16)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    assert {a.inner_dim for a in layers} == {16, 32} and all(a.heads == 4 for a in layers)
    for attn in layers:
        c = attn.inner_dim
        mha = torch.nn.MultiheadAttention(c, 4, batch_first=True)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([attn.to_q.weight, attn.to_k.weight, attn.to_v.weight]))
            mha.in_proj_bias.copy_(torch.cat([attn.to_q.bias, attn.to_k.bias, attn.to_v.bias]))
            mha.out_proj.weight.copy_(attn.to_out[0].weight)
            mha.out_proj.bias.copy_(attn.to_out[0].bias)
            for p in (attn.to_q.weight, attn.to_k.weight):  # sharpen the softmax so that the head split matters
                p.mul_(8.0)
            mha.in_proj_weight[:2 * c].mul_(8.0)
            x = torch.randn(2, c, 4, 4)
            h = attn.group_norm(x).flatten(2).transpose(1, 2)
            ref = x + mha(h, h, h, need_weights=False)[0].transpose(1, 2).reshape(x.shape)
            assert torch.allclose(attn(x), ref, atol=1e-4)
            two_heads = torch.nn.MultiheadAttention(c, 2, batch_first=True)
            two_heads.load_state_dict(mha.state_dict())
            other = x + two_heads(h, h, h, need_weights=False)[0].transpose(1, 2).reshape(x.shape)
            assert not torch.allclose(attn(x), other, atol=1e-4)


# --- initialization: the official layers are default-initialized, its attention is nn.MultiheadAttention's -----------

def attention_tensors(attn: Attention) -> dict[str, torch.Tensor]:
    """The weights and biases of a diffusers attention layer under the names of nn.MultiheadAttention's split."""
    return {"q.weight": attn.to_q.weight, "k.weight": attn.to_k.weight, "v.weight": attn.to_v.weight,
            "out.weight": attn.to_out[0].weight, "q.bias": attn.to_q.bias, "k.bias": attn.to_k.bias,
            "v.bias": attn.to_v.bias, "out.bias": attn.to_out[0].bias}


def multihead_tensors(mha: torch.nn.MultiheadAttention) -> dict[str, torch.Tensor]:
    """The same tensors of an nn.MultiheadAttention: in_proj split in rows [0, C), [C, 2C), [2C, 3C)."""
    (qw, kw, vw), (qb, kb, vb) = mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)
    return {"q.weight": qw, "k.weight": kw, "v.weight": vw, "out.weight": mha.out_proj.weight,
            "q.bias": qb, "k.bias": kb, "v.bias": vb, "out.bias": mha.out_proj.bias}


def pooled_attention_values(init: str, seeds: range) -> dict[tuple[int, str], np.ndarray]:
    """Every value of each attention tensor of build_unet(8, 16) over ``seeds``, pooled per (channels C, name)."""
    pooled: dict[tuple[int, str], list[np.ndarray]] = {}
    for seed in seeds:
        torch.manual_seed(seed)
        for attn in (m for m in build_unet(8, 16, init=init).modules() if isinstance(m, Attention)):
            for name, tensor in attention_tensors(attn).items():
                pooled.setdefault((attn.inner_dim, name), []).append(tensor.detach().flatten().numpy())
    return {key: np.concatenate(values) for key, values in pooled.items()}


def test_official_init_draws_the_attention_as_nn_multihead_attention_does():
    """Per tensor, diffmem's attention at init = "official" against real nn.MultiheadAttention layers of the same C
    built the way the official Unet.py builds them: the two-sample KS test accepts every weight, every bias is 0; the
    same test rejects diffusers' init of the q/k/v weights (0.82x the spread) and its biases are not 0."""
    from scipy.stats import ks_2samp

    official, diffusers = pooled_attention_values("official", range(4)), pooled_attention_values("diffusers", range(4))
    reference: dict[tuple[int, str], list[np.ndarray]] = {}
    for seed in range(100, 140):  # seeds disjoint from the model's
        torch.manual_seed(seed)
        for c in (16, 32):
            mha = torch.nn.MultiheadAttention(c, 4, batch_first=True)
            for name, tensor in multihead_tensors(mha).items():
                reference.setdefault((c, name), []).append(tensor.detach().flatten().numpy())
    assert set(official) == set(reference) and len(official) == 16
    for (c, name), values in official.items():
        ref = np.concatenate(reference[(c, name)])
        if name.endswith("bias"):
            assert not values.any() and not ref.any(), (c, name)
            assert np.abs(diffusers[(c, name)]).max() > 0, (c, name)
            continue
        assert ks_2samp(values, ref).pvalue > 1e-3, (c, name)
        bound = math.sqrt(6 / (4 * c)) if name != "out.weight" else 1 / math.sqrt(c)  # Xavier (3C, C) | nn.Linear
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.98 * bound, (c, name)
        if name != "out.weight":
            assert ks_2samp(diffusers[(c, name)], ref).pvalue < 1e-6, (c, name)
            assert diffusers[(c, name)].std() / ref.std() == pytest.approx(math.sqrt(2 / 3), rel=0.05)


@pytest.mark.parametrize("c", [16, 32, 64])
def test_official_init_equals_nn_multihead_attention_exactly_from_the_same_rng_state(c):
    """nn.MultiheadAttention(C) draws out_proj's nn.Linear init, then Xavier over the stacked (3C, C) in_proj;
    init_attention_as_multihead draws the same in the same order, so from one seed every tensor is equal."""
    from diffmem.model import init_attention_as_multihead

    model = build_unet(8 if c <= 32 else 16, 16)  # channels W, 2W, 4W: attention at 2W and 4W
    attn = next(m for m in model.modules() if isinstance(m, Attention) and m.inner_dim == c)
    for seed in (0, 7, 12345):
        torch.manual_seed(seed)
        init_attention_as_multihead(attn)
        after = torch.rand(1)
        torch.manual_seed(seed)
        mha = torch.nn.MultiheadAttention(c, 4, batch_first=True)
        assert torch.equal(after, torch.rand(1))  # the same number of draws
        for name, tensor in multihead_tensors(mha).items():
            assert torch.equal(attention_tensors(attn)[name], tensor), (c, seed, name)


def uniform_cdf(bound: float):
    return lambda x: np.clip((np.asarray(x) + bound) / (2 * bound), 0.0, 1.0)


@pytest.mark.parametrize("init", ["official", "diffusers"])
def test_every_other_layer_starts_as_pytorchs_default_like_the_official_unet(init):
    """The official Unet.py and run_Unet.py hold no init code: its Conv2d and Linear layers start from PyTorch's
    default, weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (Kaiming-uniform with a = sqrt(5)), its GroupNorms
    from weight 1, bias 0, and its sinusoid table is frozen. diffmem's layers outside attention have the same shapes
    (the parameter count test), so the same fans: each tensor is checked against that closed form (its range, and a
    KS test for tensors of >= 200 values), at both inits."""
    from scipy.stats import kstest

    torch.manual_seed(3)
    model = build_unet(16, 16, init=init)
    attention_linears = {id(lin) for m in model.modules() if isinstance(m, Attention)
                         for lin in (m.to_q, m.to_k, m.to_v, m.to_out[0])}
    checked = {torch.nn.Conv2d: 0, torch.nn.Linear: 0, torch.nn.GroupNorm: 0}
    for module in model.modules():
        if isinstance(module, torch.nn.GroupNorm):
            assert torch.equal(module.weight, torch.ones_like(module.weight)) and not module.bias.any()
            checked[torch.nn.GroupNorm] += 1
        elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)) and id(module) not in attention_linears:
            fan_in = module.weight[0].numel()
            bound = 1 / math.sqrt(fan_in)
            for tensor in (module.weight, module.bias):
                values = tensor.detach().flatten().numpy()
                assert np.abs(values).max() <= bound
                if values.size >= 200:
                    assert kstest(values, uniform_cdf(bound)).pvalue > 1e-4
            checked[type(module)] += 1
    assert all(checked.values()), checked
    assert len([p for p in model.parameters()]) == 2 * sum(checked.values()) + 8 * sum(
        isinstance(m, Attention) for m in model.modules())  # every parameter was looked at


# --- loss and sampler -----------------------------------------------------------------------------------------------

class RecordSteps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.steps = []

    def forward(self, x, t):
        self.steps.append(t.clone())
        return type("Out", (), {"sample": torch.zeros_like(x)})


def test_training_loss_draws_t_from_1_to_999():
    assert DiffusionConfig().t_min == 1
    model, g = RecordSteps(), torch.Generator().manual_seed(0)
    Diffusion().loss(model, torch.zeros(20000, 1, 2, 2), generator=g)
    t = model.steps[0]
    assert int(t.min()) == 1 and int(t.max()) == 999
    legacy = RecordSteps()
    Diffusion(DiffusionConfig(t_min=0)).loss(legacy, torch.zeros(20000, 1, 2, 2), generator=g)
    assert int(legacy.steps[0].min()) == 0


def test_official_ddim_sequence_and_updates():
    d = Diffusion()
    seq = d.official_ddim_timesteps(100)
    assert len(seq) == 100 and seq[:3] == [999, 988, 978] and seq[-3:] == [20, 10, 0]
    assert 60 in seq and 61 not in seq  # floor(6 * 999 / 99) = 60, where rounding would give 61
    model = RecordSteps()
    d.sample(model, 3, (1, 2, 2), torch.Generator().manual_seed(0), steps=100)
    assert [int(t[0]) for t in model.steps] == seq[:-1]  # 99 network calls, the last from step 10


class GaussianOracle(torch.nn.Module):
    """The exact noise predictor for x0 ~ N(0, s^2 I)."""

    def __init__(self, ab, s):
        super().__init__()
        self.ab, self.s = ab, s

    def forward(self, x, t):
        ab = self.ab[t].view(-1, 1, 1, 1).to(x.dtype)
        return type("Out", (), {"sample": (1 - ab).sqrt() * x / (ab * self.s ** 2 + 1 - ab)})


def test_official_ddim_equals_a_step_by_step_reference_and_does_not_clip():
    d = Diffusion()
    ab = d.alpha_bar("cpu")
    model = GaussianOracle(ab, 2.0)  # data std 2: the predicted clean images leave [-1, 1]
    x = d.sample(model, 64, (1, 2, 2), torch.Generator().manual_seed(1), steps=50)
    ref = torch.randn((64, 1, 2, 2), generator=torch.Generator().manual_seed(1)).double()
    times = np.linspace(0, 999, 50).astype(int)[::-1]
    abd = ab.double()
    for t, t_prev in zip(times[:-1], times[1:]):
        eps = GaussianOracle(abd, 2.0)(ref, torch.full((64,), int(t))).sample
        x0 = (ref - (1 - abd[t]).sqrt() * eps) / abd[t].sqrt()
        ref = abd[t_prev].sqrt() * x0 + (1 - abd[t_prev]).sqrt() * eps
    assert torch.allclose(x.double(), ref, atol=1e-3)
    assert x.abs().max() > 2  # nothing clipped
    clipped = d.sample(model, 64, (1, 2, 2), torch.Generator().manual_seed(1), steps=50, clip_sample=True)
    assert clipped.abs().max() < 1.5


def test_diffusers_ddim_schedule_stays_available():
    d = Diffusion()
    x = d.sample(GaussianOracle(d.alpha_bar("cpu"), 0.3), 500, (1, 2, 2), torch.Generator().manual_seed(0),
                 steps=50, schedule="diffusers")
    assert abs(x.std().item() - 0.3) < 0.03


# --- evaluation grid, budgets, FID reference sets ----------------------------------------------------------------------

def test_paper_grid_is_the_official_generation_grid():
    grid = paper_grid()
    assert len(grid) == 45 and grid[:6] == [250, 750, 1750, 4250, 10000, 20000] and grid[-1] == 8855000
    assert all(s % 250 == 0 for s in grid) and all(s % 5000 == 0 for s in grid if s >= 10000)
    assert max(b / a for a, b in zip(grid[20:], grid[21:])) < 1.3
    assert evaluation_steps("paper", 51200) == [250, 750, 1750, 4250, 10000, 20000, 30000, 40000, 50000, 51200]


def test_paper_budget_reaches_past_300_n_for_every_n():
    cfg, sweep = load_config(ROOT / "experiments" / "paper_celeba32.toml")
    budgets = {n: sweep.run_steps(n, cfg.train.steps) for n in sweep.n}
    assert all(b > 300 * n and b >= 2_000_000 for n, b in budgets.items())
    assert budgets[128] == 2_000_000 and 11e6 < budgets[32768] < 12e6


@pytest.mark.e2e
def test_fid_sets_equal_one_fid_per_set(tmp_path):
    g = torch.Generator().manual_seed(0)
    samples = torch.randint(0, 256, (40, 1, 16, 16), generator=g, dtype=torch.uint8)
    refs = [torch.randint(0, 200, (30, 1, 16, 16), generator=g, dtype=torch.uint8) for _ in range(3)]
    keys = [f"test-set-{k}" for k in range(3)]
    many = fid_sets(samples, refs, keys, tmp_path, extractor=OFFLINE_EXTRACTOR)
    for ref, key, result in zip(refs, keys, many):
        one = fid(samples, ref, key + "-alone", tmp_path, extractor=OFFLINE_EXTRACTOR)
        assert result.value == pytest.approx(one.value, rel=1e-6) and result.reference == key


@pytest.mark.e2e
def test_evaluation_records_the_mean_and_spread_over_disjoint_reference_sets(tmp_path):
    cfg = tiny_config("eval.fid_reference_sets=3", "eval.times=[60]")
    train(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    (record,) = RunDir(tmp_path / "run").metrics()
    assert len(record["fid_sets"]) == 3 and record["fid"] == pytest.approx(statistics.fmean(record["fid_sets"]))
    assert record["fid_std"] == pytest.approx(statistics.stdev(record["fid_sets"]))
    starts = [re.match(r"heldout:(\d+)\+12@", key).group(1) for key in record["fid_reference"].split(",")]
    assert [int(s) for s in starts] == [64, 76, 88]  # 100 faces, the last 36 held out: 3 blocks of 12
    assert record["sampler_schedule"] == "official" and record["clip_sample"] is True


@pytest.mark.e2e
def test_the_fid_can_have_its_own_clipped_draw_while_f_mem_counts_the_unclipped_one(tmp_path):
    """eval.fid_clip_sample = true with clip_sample = false: f_mem and the sample grid from the unclipped draw (as a
    run without the key), the FD from a clipped draw of the same initial noise (as a clipped run); same weights."""
    def measure(name: str, *extra: str) -> dict:
        cfg = tiny_config("train.steps=20", "eval.times=[20]", *extra)
        train(cfg, tmp_path / name, progress=False, log=lambda s: None)
        (record,) = RunDir(tmp_path / name).metrics()
        return record

    unclipped = measure("unclipped", "eval.clip_sample=false")
    split = measure("split", "eval.clip_sample=false", "eval.fid_clip_sample=true")
    clipped = measure("clipped", "eval.clip_sample=true")
    assert split["train_loss"] == unclipped["train_loss"] == clipped["train_loss"]  # the same model
    assert (split["f_mem"], split["clip_sample"]) == (unclipped["f_mem"], False)
    assert split["fid"] == pytest.approx(clipped["fid"], rel=1e-6) and split["fid_clip_sample"] is True
    assert split["fid"] != pytest.approx(unclipped["fid"], rel=1e-3)
    assert unclipped["fid_clip_sample"] is False and clipped["fid_clip_sample"] is True


# --- old run folders and the paper file -------------------------------------------------------------------------------

OLD_RUN = ROOT / "tests" / "fixtures" / "run_diffmem_0.1"  # run n00008_w08_s0 of the faces demo, written by diffmem 0.1
OLD_DEMO = ROOT / "tests" / "fixtures" / "lfw_faces_demo_0.2.toml"  # that demo's experiment file in diffmem 0.2

def test_a_run_folder_written_before_the_conventions_reads_as_trained_and_names_the_changed_keys(tmp_path):
    old = OLD_RUN
    stored = json.loads((old / "config.json").read_text())["config"]
    assert "dropout_type" not in stored["model"]
    cfg = config_from_dict(stored)
    assert (cfg.model.dropout_type, cfg.model.time_embedding, cfg.model.time_act) == ("element", "diffusers", "silu")
    assert cfg.diffusion.t_min == 0 and cfg.eval.sampler_schedule == "diffusers" and cfg.eval.fid_reference_sets == 1
    run = tmp_path / "old"
    shutil.copytree(old, run)
    (run / "done").unlink()
    demo, sweep = load_config(OLD_DEMO, ["data.n=8", "train.steps=5200"])
    with pytest.raises(RunConfigMismatch, match=r"model\.dropout_type: 'element' -> 'channel'.*--set "
                                                r"model\.dropout_type=\"element\""):
        check_same_config(demo, RunDir(run))
    assert check_same_config(config_from_dict(stored), RunDir(run))  # its own protocol still continues
    assert upgrade_stored_config(cfg.to_dict()) == cfg.to_dict()


def test_a_rerun_of_an_old_folder_with_todays_defaults_is_one_line_exit_2(tmp_path, capsys):
    run = tmp_path / "old"
    shutil.copytree(OLD_RUN, run)
    (run / "done").unlink()
    code = main(["train", str(OLD_DEMO), "--set", "data.n=8", "--set", "train.steps=5200",
                 "--out", str(run), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "model.time_act: 'silu' -> 'gelu'" in err


@pytest.mark.e2e
def test_paper_file_smoke_run_on_a_celeba_layout_folder(tmp_path, celeba_root):
    root = celeba_root(n=40)
    code = main(["train", str(ROOT / "experiments" / "paper_celeba32.toml"), "--out", str(tmp_path / "run"),
                 "--no-progress", *sets([f"data.path={root}", "data.n=8", "data.n_heldout=20", "train.steps=3",
                                         "train.device=cpu", "eval.n_samples=4", "eval.batch_size=4",
                                         "eval.sampler_steps=3", "eval.n_boot=10", "eval.loss_n_test=8",
                                         f"eval.fid_extractor={OFFLINE_EXTRACTOR}", "eval.fid_reference_sets=2"])])
    assert code == 0
    (record,) = RunDir(tmp_path / "run").metrics()
    assert record["step"] == 3 and len(record["fid_sets"]) == 2
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert stored["params"] == count_parameters(build_unet(32, 32))


# --- docs/fidelity.md against the experiment files -------------------------------------------------------------------

PROTOCOL_ITEMS = ["data transform", "centering", "subsets", "held-out sets", "model blocks", "attention heads",
                  "widths and p", "time embedding", "dropout", "initialization", "schedule", "t range", "loss",
                  "optimizer", "batch", "budget", "evaluation grid", "sampler", "samples per checkpoint",
                  "f_mem rule and CI", "FID features", "reference sets", "loss-gap t and draws", "tau rules"]
KEY_VALUE = re.compile(r"`((?:data|model|diffusion|train|eval|sweep)\.\w+) = ([^`]+)`")


def fidelity_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "docs" / "fidelity.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 7 and cells[0] not in ("item", "---"):
            rows[cells[0]] = cells
    return rows


def values_in(cell: str) -> dict[str, object]:
    import tomllib
    return {key: tomllib.loads(f"v = {value}")["v"] for key, value in KEY_VALUE.findall(cell)}


def config_value(cfg: RunConfig, sweep, key: str):
    section, name = key.split(".")
    value = getattr(sweep if section == "sweep" else getattr(cfg, section), name)
    return list(value) if isinstance(value, tuple) else value


def test_the_fidelity_table_covers_every_protocol_item_and_agrees_with_the_files():
    rows = fidelity_rows()
    assert list(rows) == PROTOCOL_ITEMS
    paper = load_config(ROOT / "experiments" / "paper_celeba32.toml")
    demo = load_config(ROOT / "experiments" / "demo.toml")
    checked = 0
    for item, (_, _, official, paper_cell, demo_cell, match, why) in rows.items():
        assert match in ("same", "differs"), item
        if match == "differs":
            assert why, f"{item}: a difference needs its reason"
        else:
            assert values_in(official) == values_in(paper_cell), item
        for cell, (cfg, sweep) in ((paper_cell, paper), (demo_cell, demo)):
            for key, value in values_in(cell).items():
                assert config_value(cfg, sweep, key) == value, f"{item}: {key}"
                checked += 1
    assert checked >= 60


def test_the_cpu_reference_experiment_has_no_attention_so_model_init_changes_none_of_its_weights():
    """experiments/cpu_digits.toml sets no model.init (so "official" today) and model.attention = false: its models,
    and those of its run folders trained before the key (read as "diffusers"), are the same for every seed."""
    cfg, sweep = load_config(ROOT / "experiments" / "cpu_digits.toml")
    assert cfg.model.init == "official" and cfg.model.attention is False
    for width in sweep.width or [cfg.model.width]:
        for seed in sweep.seeds:
            drawn = []
            for init in ("official", "diffusers"):
                torch.manual_seed(seed)
                model = build_from_config(replace(cfg.model, width=width, init=init), cfg.data.image_size)
                drawn.append(model.state_dict())
            assert all(torch.equal(drawn[0][k], drawn[1][k]) for k in drawn[0]), (width, seed)
