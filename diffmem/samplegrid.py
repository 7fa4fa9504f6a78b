"""The sample grid of one evaluation: generated samples above their nearest training images, copies framed in red;
and the strip of first copies: one copy of each training image first copied at that evaluation.

``write_sample_grid`` draws it with torchvision's ``make_grid`` and writes ``<run>/samples/step_XXXXXXXXX.png``
atomically (``diffmem.evaluate`` at every evaluation; ``diffmem.analysis.synthetic`` for planted runs). Layout, in
pixels, for images of S x S: every image becomes a tile of (S + 2) x (S + 2) (a 1-pixel frame: red
:data:`COPY_FRAME` for a memorized sample, grey :data:`OTHER_FRAME` for the others, white around the training images),
tiles are separated by 1 white pixel, and the rows alternate: up to :data:`GRID_COLUMNS` samples, then the nearest
training image of each right below it. The galleries of ``diffmem.figures`` show these files as they are.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.utils import make_grid, save_image

from diffmem.io import atomic_write_bytes

GRID_PAIRS = 32
"""Samples shown in each sample grid (the first ones drawn), each above its nearest training image."""

GRID_COLUMNS = 16
"""Samples per row of the grid."""

COPY_FRAME = (1.0, 0.1, 0.1)
"""RGB in [0, 1] of the frame around a memorized sample (d1/d2 below the memorization threshold)."""

OTHER_FRAME = (0.5, 0.5, 0.5)
"""RGB in [0, 1] of the frame around a sample that is not a copy."""


def sample_grid(samples: torch.Tensor, nearest: torch.Tensor, memorized: torch.Tensor) -> torch.Tensor:
    """The grid image (3, H, W) in [0, 1] of the first :data:`GRID_PAIRS` samples.

    ``samples`` and ``nearest``: (k, C, S, S) pixels in [0, 1] (C = 1 or 3), ``nearest[i]`` the training image closest
    to ``samples[i]``; ``memorized``: (k,) booleans, True frames sample i in red."""
    k = min(GRID_PAIRS, len(samples))
    shown, nearest = samples[:k].float().cpu(), nearest[:k].float().cpu()
    colors = torch.where(memorized[:k].cpu().view(-1, 1), torch.tensor(COPY_FRAME), torch.tensor(OTHER_FRAME))

    def framed(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """(b, C, S, S) images -> (b, 3, S+2, S+2) with a 1-pixel frame of the colors ``frame`` (b, 3)."""
        out = frame.view(-1, 3, 1, 1).expand(-1, -1, x.shape[2] + 2, x.shape[3] + 2).clone()
        out[:, :, 1:-1, 1:-1] = x.expand(-1, 3, -1, -1)
        return out

    per_row = min(GRID_COLUMNS, k)
    rows = []
    for start in range(0, k, per_row):
        part = slice(start, start + per_row)
        rows += [framed(shown[part], colors[part]),
                 F.pad(nearest[part], (1, 1, 1, 1), value=1.0).expand(-1, 3, -1, -1)]
    tiles = torch.cat([torch.cat([r, torch.ones(per_row - len(r), *r.shape[1:])]) for r in rows])
    return make_grid(tiles, nrow=per_row, padding=1, pad_value=1.0)


def write_sample_grid(path: str | Path, samples: torch.Tensor, nearest: torch.Tensor,
                      memorized: torch.Tensor) -> Path:
    """Write :func:`sample_grid` of these images as a PNG at ``path``, atomically; returns ``path``."""
    buffer = io.BytesIO()
    save_image(sample_grid(samples, nearest, memorized), buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


FIRST_COPY_TILES = 64
"""At most this many first copies are kept per evaluation (the training images first copied there, in index order)."""


def write_first_copies(path: str | Path, copies: torch.Tensor) -> Path:
    """Write the (k, C, S, S) copies (pixels in [0, 1]) as one PNG row of k tiles of S x S, no padding, atomically:
    ``<run>/samples/first_copies_step_XXXXXXXXX.png``; tile j is the copy of the j-th image of the copies.jsonl
    line's ``first_copies``."""
    buffer = io.BytesIO()
    save_image(make_grid(copies.float().cpu(), nrow=len(copies), padding=0), buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


def read_first_copies(path: str | Path, count: int, size: int) -> torch.Tensor | None:
    """The ``count`` tiles (count, 3, size, size) uint8 of a first-copies strip, or None when the file is missing,
    unreadable or not ``count`` tiles of ``size`` x ``size`` (a folder from someone else: decoded by Pillow as an
    image, within its decompression-bomb limit, and never trusted for its shape)."""
    try:
        with Image.open(path) as image:
            strip = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    if tuple(strip.shape) != (3, size, size * count):
        return None
    return strip.reshape(3, size, count, size).permute(2, 0, 1, 3).contiguous()
