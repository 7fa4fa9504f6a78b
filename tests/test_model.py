"""The U-Net matches the paper's parameter counts and shapes."""
import pytest
import torch
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
