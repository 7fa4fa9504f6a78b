"""The paper's U-Net score model, built as a diffusers ``UNet2DModel`` and set to the official code's conventions.

Paper and official code (tbonnair/Why-Diffusion-Models-Don-t-Memorize, Experiments/src/Utils/Unet.py): 3 resolution
levels with channels (W, 2W, 4W), 2 ResNet blocks per level (3 on the way up), GroupNorm(8), SiLU, self-attention
after every ResNet block of the two coarsest levels and in the bottleneck (block, attention, block), a sinusoidal time
embedding of W numbers followed by an MLP to 4W, and dropout 0.1 before the second convolution of each ResNet block.
diffusers' ``UNet2DModel`` has exactly this block structure and the same trainable parameters; five conventions
differ, and ``build_unet`` sets each to the official one unless asked otherwise (``docs/fidelity.md``):

- ``dropout_type="channel"``: the official blocks use ``nn.Dropout2d`` (whole feature maps are dropped); diffusers'
  ``ResnetBlock2D`` uses ``nn.Dropout`` (single elements). The module is swapped after construction.
- ``time_embedding="official"``: [sin, cos] with frequencies 10000^(-k / (W/2 - 1)), k = 0 .. W/2 - 1 (diffusers'
  ``flip_sin_to_cos=False, freq_shift=1``); diffusers' UNet default is [cos, sin] with 10000^(-k / (W/2)).
- ``time_act="gelu"``: the activation between the MLP's two linear layers is GELU in the official code (SiLU in
  diffusers' ``TimestepEmbedding``, which ``UNet2DModel`` gives no option for, so it is swapped after construction).
- ``attention_head_dim=0``: every attention layer has ``attention_heads`` heads (official: 4 at 2W and 4W channels);
  diffusers fixes the channels per head instead, giving half as many heads at 2W. Heads are set per layer.
- ``init="official"``: the official attention layers are ``nn.MultiheadAttention``, which starts its stacked (3C, C)
  q/k/v in-projection Xavier-uniform with zero biases and its output projection with PyTorch's ``nn.Linear`` default
  weights and a zero bias; diffusers' separate ``to_q``/``to_k``/``to_v``/``to_out[0]`` keep PyTorch's ``nn.Linear``
  default (q/k/v weights with 0.82x the official standard deviation, non-zero biases). ``init_attention_as_multihead``
  redraws each attention layer after construction. Every other layer (``Conv2d``, ``Linear``, ``GroupNorm``) keeps
  PyTorch's default init in both codes: the official ``Unet.py`` and ``run_Unet.py`` hold no init code, and the
  layer shapes, hence the fans of the default init, are the same.

The official code counts the frozen sinusoid lookup table (T x W numbers, ``nn.Embedding.from_pretrained``) among
its parameters; diffusers computes the sinusoid on the fly. ``official_parameter_count`` adds that table, which is
what the paper's p = 0.26 .. 16.1 M are.
"""
from __future__ import annotations

import torch
from diffusers import UNet2DModel
from diffusers.models.attention_processor import Attention
from diffusers.models.resnet import ResnetBlock2D

from diffmem.config import ModelConfig


def build_unet(width: int = 32, image_size: int = 32, attention: bool = True, *, channels: int = 1,
               channel_mult: tuple[int, ...] = (1, 2, 4), layers_per_block: int = 2, attention_heads: int = 4,
               attention_head_dim: int = 0, norm_groups: int = 8, dropout: float = 0.1,
               dropout_type: str = "channel", time_embedding: str = "official",
               time_act: str = "gelu", init: str = "official") -> UNet2DModel:
    """The paper's U-Net for ``channels`` x ``image_size`` x ``image_size`` images with base width ``width``.

    ``attention=False`` removes every attention layer (cheaper on CPU). Images must have a side divisible by
    ``2 ** (len(channel_mult) - 1)``. Returns a model whose ``forward(x, t).sample`` is the predicted noise, shape
    (B, channels, image_size, image_size), for integer DDPM timesteps ``t`` of shape (B,). The keyword arguments
    after ``dropout`` choose between the official code's conventions (defaults) and diffusers' (module docstring).
    The initial weights are drawn from torch's global RNG; ``init="diffusers"`` draws exactly what diffusers'
    ``UNet2DModel`` draws, ``init="official"`` then redraws every attention layer (none when ``attention=False``, so
    both give the same weights there).
    """
    levels = len(channel_mult)
    if image_size % 2 ** (levels - 1):
        raise ValueError(f"image_size {image_size} must be divisible by {2 ** (levels - 1)}")
    if width % norm_groups:
        raise ValueError(f"width {width} must be a multiple of norm_groups {norm_groups}")
    if dropout_type not in ("channel", "element") or time_embedding not in ("official", "diffusers") \
            or time_act not in ("gelu", "silu") or init not in ("official", "diffusers"):
        raise ValueError(f"unknown convention: dropout_type={dropout_type!r}, time_embedding={time_embedding!r}, "
                         f"time_act={time_act!r}, init={init!r}")
    # Attention at the coarsest levels: all but the first level when attention is on (the paper: False, True, True).
    attn_levels = [attention and i > 0 for i in range(levels)]
    down = tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in attn_levels)
    up = tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn_levels))
    head_dim = attention_head_dim or max(1, width * channel_mult[-1] // attention_heads)
    official_time = time_embedding == "official"
    model = UNet2DModel(
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
        flip_sin_to_cos=not official_time,
        freq_shift=1 if official_time else 0,
    )
    if time_act == "gelu":
        model.time_embedding.act = torch.nn.GELU()
    for module in model.modules():
        if dropout_type == "channel" and isinstance(module, ResnetBlock2D):
            module.dropout = torch.nn.Dropout2d(dropout)
        if attention_head_dim == 0 and isinstance(module, Attention):
            set_attention_heads(module, attention_heads)
        if init == "official" and isinstance(module, Attention):
            init_attention_as_multihead(module)
    return model


def set_attention_heads(attn: Attention, heads: int) -> None:
    """Split a diffusers self-attention layer into ``heads`` heads (its weights do not depend on the split)."""
    if attn.inner_dim % heads:
        raise ValueError(f"{attn.inner_dim} attention channels cannot be split into {heads} heads")
    attn.heads = attn.sliceable_head_dim = heads
    attn.scale = (attn.inner_dim // heads) ** -0.5 if attn.scale_qk else 1.0


def init_attention_as_multihead(attn: Attention) -> None:
    """Redraw a diffusers self-attention layer of C channels as ``nn.MultiheadAttention(C, heads)`` initializes
    itself, drawing from torch's global RNG in the same order: the output projection's ``nn.Linear`` default init
    (weight (C, C) Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(C), 1/sqrt(C)); its bias drawn, then zeroed), then
    one Xavier-uniform (3C, C) matrix, U(-sqrt(6 / 4C), sqrt(6 / 4C)), whose row blocks [0, C), [C, 2C), [2C, 3C) become
    ``to_q``, ``to_k``, ``to_v``; their biases are zero. From the same RNG state the four weights equal
    ``in_proj_weight`` split in three and ``out_proj.weight`` of a freshly built ``nn.MultiheadAttention``."""
    q, k, v, out = attn.to_q, attn.to_k, attn.to_v, attn.to_out[0]
    c = q.in_features
    if any(not isinstance(m, torch.nn.Linear) or m.weight.shape != (c, c) for m in (q, k, v, out)):
        raise ValueError(f"init_attention_as_multihead needs (C, C) q/k/v/out projections, as nn.MultiheadAttention "
                         f"has; got {[tuple(m.weight.shape) for m in (q, k, v, out)]}")
    with torch.no_grad():
        out.reset_parameters()  # what MultiheadAttention's out_proj = Linear(C, C) draws when it is built
        stacked = torch.nn.init.xavier_uniform_(torch.empty(3 * c, c, dtype=q.weight.dtype, device=q.weight.device))
        for layer, block in zip((q, k, v), stacked.chunk(3)):
            layer.weight.copy_(block)
        for layer in (q, k, v, out):
            if layer.bias is not None:
                layer.bias.zero_()


def build_from_config(cfg: ModelConfig, image_size: int) -> UNet2DModel:
    """``build_unet`` with every architectural choice taken from a ``ModelConfig``."""
    return build_unet(cfg.width, image_size, cfg.attention, channel_mult=tuple(cfg.channel_mult),
                      layers_per_block=cfg.layers_per_block, attention_heads=cfg.attention_heads,
                      attention_head_dim=cfg.attention_head_dim, norm_groups=cfg.norm_groups, dropout=cfg.dropout,
                      dropout_type=cfg.dropout_type, time_embedding=cfg.time_embedding, time_act=cfg.time_act,
                      init=cfg.init)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def official_parameter_count(model: UNet2DModel, num_train_timesteps: int = 1000) -> int:
    """The parameter count the official code prints for the same U-Net: the trainable parameters plus its frozen
    sinusoid lookup table of ``num_train_timesteps`` x W numbers (``sum(p.numel() for p in model.parameters())``
    there counts frozen parameters too)."""
    return count_parameters(model) + num_train_timesteps * model.config.block_out_channels[0]
