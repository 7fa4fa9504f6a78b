"""The Frechet distance's feature extractors by name, and how a number from each is labelled.

Apart from :mod:`diffmem.metrics.fid`, which computes the distance (torch, torch-fidelity), so that what only reads
run folders and names their numbers (``diffmem status``, the figures, TensorBoard's curves) does not load them.
"""
from __future__ import annotations

INCEPTION_EXTRACTOR = "inception-v3-compat"
"""torch-fidelity's port of the TF Inception-v3 of the original FID (asked for as "inception")."""
OFFLINE_EXTRACTOR = "diffmem-randconv-v1"
"""The fixed-seed random convolutional network shipped with diffmem (no file, no download)."""
PIXEL_EXTRACTOR = "diffmem-pixels"
"""The grayscale pixels themselves as features."""


def metric_label(extractor: str) -> str:
    """How to name a number from ``extractor`` in tables and plots: "FID" only for Inception features, "FD
    (<extractor>)" for any other (e.g. "FD (diffmem-randconv-v1)")."""
    if extractor in ("inception", INCEPTION_EXTRACTOR):
        return "FID"
    return f"FD ({extractor})"
