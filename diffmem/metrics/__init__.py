"""Metrics of one checkpoint's samples, one module each.

- ``memorization``: nearest / second-nearest training images, d1/d2 ratio, memorized fraction with a bootstrap CI.
- ``fid``: Frechet distance by torch-fidelity (Inception when its weights are on disk, else an offline extractor),
  with cached reference statistics; ``extractor_names``: the extractors' names and ``metric_label``, which names the
  number ("FID" or "FD (<extractor>)") without loading torch.
- ``losses``: the denoising loss at a fixed diffusion time on train and held-out images (the loss gap).
- ``pairs``: two models on disjoint train sets sampled from the same noise: pair distance, bias toward the own train
  set, own fraction, with bootstrap CIs (docs/split-pairs.md).

The modules are imported on use (``from diffmem.metrics.fid import fid``), so importing one does not load the others.
"""
