"""The U-Net matches the paper's parameter counts and shapes, and its two inits draw what they say."""
import pytest
import torch
from diffusers import UNet2DModel
from diffusers.models.attention_processor import Attention

from diffmem.model import build_unet, count_parameters, official_parameter_count

PAPER_PARAMS_M = {8: 0.26, 16: 1.0, 32: 4.1, 48: 9.1, 64: 16.1}


@pytest.mark.parametrize("width", sorted(PAPER_PARAMS_M))
def test_parameter_counts_match_the_paper(width):
    model = build_unet(width, 32)
    params = official_parameter_count(model)  # trainable + the official code's frozen sinusoid table
    print(f"W={width}: {count_parameters(model) / 1e6:.3f} M trainable, {params / 1e6:.3f} M counted as the "
          f"official code does (paper {PAPER_PARAMS_M[width]} M)")
    assert abs(params / 1e6 - PAPER_PARAMS_M[width]) / PAPER_PARAMS_M[width] < 0.03


def test_structure_follows_the_paper():
    model = build_unet(8, 32)
    cfg = model.config
    assert tuple(cfg.block_out_channels) == (8, 16, 32) and cfg.layers_per_block == 2 and cfg.norm_num_groups == 8
    assert tuple(cfg.down_block_types) == ("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D")
    assert cfg.add_attention and cfg.dropout == 0.1
    assert model.time_embedding.linear_1.out_features == 4 * 8  # time-embedding MLP of width 4W


def test_attention_can_be_switched_off_and_shapes_hold():
    with_attn, without = build_unet(8, 16, attention=True), build_unet(8, 16, attention=False)
    assert count_parameters(without) < count_parameters(with_attn)
    assert not any(isinstance(m, Attention) for m in without.modules())
    assert sum(isinstance(m, Attention) for m in with_attn.modules()) == 2 * 2 + 2 * 3 + 1  # down, up, mid
    x = torch.randn(3, 1, 16, 16)
    assert without(x, torch.tensor([0, 10, 999])).sample.shape == x.shape


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="divisible by 4"):
        build_unet(8, 18)
    with pytest.raises(ValueError, match="multiple of norm_groups"):
        build_unet(12, 16)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("width,attention,head_dim", [(8, True, 0), (16, True, 0), (8, True, 8), (8, False, 0)])
def test_diffusers_init_is_bit_for_bit_what_diffusers_unet2dmodel_draws(width, attention, head_dim):
    """init = "diffusers" is the model as diffmem built it before model.init existed: diffusers' UNet2DModel with the
    same config, from the same seed, bit for bit, and it leaves the RNG where UNet2DModel leaves it (the conventions
    swapped in after construction draw nothing)."""
    torch.manual_seed(11)
    model = build_unet(width, 16, attention, attention_head_dim=head_dim, init="diffusers")
    after = torch.rand(3)
    torch.manual_seed(11)
    reference = UNet2DModel.from_config(model.config)
    assert torch.equal(after, torch.rand(3))
    assert_same_weights(weights(model), weights(reference))


def test_official_init_changes_only_the_attention_weights():
    torch.manual_seed(5)
    official = weights(build_unet(8, 16, init="official"))
    torch.manual_seed(5)
    diffusers = weights(build_unet(8, 16, init="diffusers"))
    changed = {k for k in official if not torch.equal(official[k], diffusers[k])}
    attention = {k for k in official if ".attentions." in k and (".to_q." in k or ".to_k." in k or ".to_v." in k
                                                                 or ".to_out." in k)}
    assert changed == attention and len(attention) == 8 * 11  # 4 projections x (weight, bias) x 11 layers


def test_without_attention_both_inits_give_identical_weights():
    """With model.attention = false (experiments/cpu_digits.toml, the demo) there is no attention layer to redraw:
    "official" and "diffusers" give the same model for the same seed."""
    torch.manual_seed(2)
    official = weights(build_unet(8, 16, attention=False, init="official"))
    torch.manual_seed(2)
    assert_same_weights(official, weights(build_unet(8, 16, attention=False, init="diffusers")))


def test_an_unknown_init_is_refused():
    with pytest.raises(ValueError, match="init='xavier'"):
        build_unet(8, 16, init="xavier")
