"""The paper's U-Net score model, built as a diffusers ``UNet2DModel``.

Paper (and its official code): 3 resolution levels with channels (W, 2W, 4W), 2 ResNet blocks per level,
GroupNorm(8), SiLU, dropout 0.1, self-attention at the two coarsest levels and in the bottleneck, a sinusoidal time
embedding followed by an MLP of width 4W. diffusers' ``UNet2DModel`` has exactly this block structure; the one
difference is that diffusers fixes the channels *per head* (``attention_head_dim``) rather than the number of heads.
We use ``width * channel_mult[-1] / attention_heads`` channels per head, so the bottleneck and the coarsest level have
``attention_heads`` (default 4) heads and the middle level half as many; parameter counts do not depend on this.
"""
from __future__ import annotations

import torch
from diffusers import UNet2DModel

from diffmem.config import ModelConfig


def build_unet(width: int = 32, image_size: int = 32, attention: bool = True, *, channels: int = 1,
               channel_mult: tuple[int, ...] = (1, 2, 4), layers_per_block: int = 2, attention_heads: int = 4,
               norm_groups: int = 8, dropout: float = 0.1) -> UNet2DModel:
    """The paper's U-Net for ``channels`` x ``image_size`` x ``image_size`` images with base width ``width``.

    ``attention=False`` removes every attention layer (cheaper on CPU). Images must have a side divisible by
    ``2 ** (len(channel_mult) - 1)``. Returns a model whose ``forward(x, t).sample`` is the predicted noise, shape
    (B, channels, image_size, image_size), for integer DDPM timesteps ``t`` of shape (B,).
    """
    levels = len(channel_mult)
    if image_size % 2 ** (levels - 1):
        raise ValueError(f"image_size {image_size} must be divisible by {2 ** (levels - 1)}")
    if width % norm_groups:
        raise ValueError(f"width {width} must be a multiple of norm_groups {norm_groups}")
    # Attention at the coarsest levels: all but the first level when attention is on (the paper: False, True, True).
    attn_levels = [attention and i > 0 for i in range(levels)]
    down = tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in attn_levels)
    up = tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn_levels))
    head_dim = max(1, width * channel_mult[-1] // attention_heads)
    return UNet2DModel(
        sample_size=image_size,
        in_channels=channels,
        out_channels=channels,
        block_out_channels=tuple(width * m for m in channel_mult),
        layers_per_block=layers_per_block,
        down_block_types=down,
        up_block_types=up,
        add_attention=attention,  # the bottleneck's attention
        attention_head_dim=head_dim,
        norm_num_groups=norm_groups,
        dropout=dropout,
        act_fn="silu",
    )


def build_from_config(cfg: ModelConfig, image_size: int) -> UNet2DModel:
    """``build_unet`` with every architectural choice taken from a ``ModelConfig``."""
    return build_unet(cfg.width, image_size, cfg.attention, channel_mult=tuple(cfg.channel_mult),
                      layers_per_block=cfg.layers_per_block, attention_heads=cfg.attention_heads,
                      norm_groups=cfg.norm_groups, dropout=cfg.dropout)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
