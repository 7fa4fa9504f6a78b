#!/usr/bin/env python3
"""A plain DDPM training loop, used as the yardstick for diffmem's training speed.

It is written the way diffusers' unconditional-image example trains a model, with none of diffmem's shortcuts:

* the images sit in a ``torch.utils.data.Dataset`` as uint8 arrays and every item is converted to a float tensor in
  [-1, 1] when it is fetched (what ``ToTensor`` + ``Normalize([0.5], [0.5])`` do);
* a shuffling ``DataLoader`` (no workers, full batches only) assembles the batches;
* the noisy input comes from ``DDPMScheduler.add_noise`` with timesteps drawn uniformly from [0, T);
* the optimizer is ``torch.optim.AdamW`` (lr 1e-4) stepped together with diffusers' constant learning-rate scheduler.

The network is the one diffmem trains, ``diffmem.model.build_unet(width, image_size, attention)``, and
``diffmem bench train`` uses Adam at the same learning rate, so the ratio of the two speeds compares the training
loops, not the models. Images are random (seed 0): their content does not change the cost of a step.

The last line printed is one JSON object with the keys ``impl`` ("reference"), ``width``, ``image_size``, ``batch``,
``steps``, ``s_per_step``, ``images_per_s``, ``params`` and ``threads``, the same keys that the comparison scripts
read from ``diffmem bench train``.

Usage, from the repository root: python benchmarks/reference_train.py --width 8 --image-size 16 --batch 32 --steps 30
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    """uint8 grayscale images of shape (M, S, S); an item is a float tensor (1, S, S) scaled to [-1, 1]."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        image = torch.from_numpy(self.pixels[index]).to(torch.float32) / 255.0
        return (image * 2.0 - 1.0).unsqueeze(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="time a plain diffusers-style DDPM training loop on diffmem's U-Net")
    parser.add_argument("--width", type=int, default=8, help="U-Net base width W (default 8)")
    parser.add_argument("--image-size", type=int, default=16, help="image side S in pixels (default 16)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first (default 3)")
    parser.add_argument("--attention", action="store_true", help="keep the U-Net's attention layers")
    parser.add_argument("--n-images", type=int, default=1024, help="size of the random image set (default 1024)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's choice)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("need --steps >= 1, --warmup >= 0 and --batch >= 1")
    if args.n_images < args.batch:
        parser.error(f"--n-images {args.n_images} is smaller than --batch {args.batch}: the loader keeps full "
                     "batches only, so no step could run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from diffusers import DDPMScheduler
    from diffusers.optimization import get_scheduler

    from diffmem.model import build_unet

    torch.manual_seed(0)
    pixels = np.random.default_rng(0).integers(0, 256, size=(args.n_images, args.image_size, args.image_size),
                                               dtype=np.uint8)
    loader = DataLoader(RandomImages(pixels), batch_size=args.batch, shuffle=True, drop_last=True, num_workers=0)

    model = build_unet(args.width, args.image_size, args.attention)
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=2e-2, beta_schedule="linear")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lr_schedule = get_scheduler("constant", optimizer=optimizer)
    model.train()

    total = args.warmup + args.steps
    done = 0
    start = time.perf_counter() if args.warmup == 0 else None
    while done < total:  # whole epochs over the shuffled loader until enough steps have run
        for clean in loader:
            noise = torch.randn_like(clean)
            t = torch.randint(0, scheduler.config.num_train_timesteps, (clean.shape[0],), dtype=torch.long)
            noisy = scheduler.add_noise(clean, noise, t)
            loss = torch.nn.functional.mse_loss(model(noisy, t).sample, noise)
            loss.backward()
            optimizer.step()
            lr_schedule.step()
            optimizer.zero_grad()
            done += 1
            if done == args.warmup:  # the clock starts once the untimed steps are over
                start = time.perf_counter()
            if done == total:
                break
    elapsed = time.perf_counter() - start

    result = {
        "impl": "reference",
        "width": args.width,
        "image_size": args.image_size,
        "batch": args.batch,
        "steps": args.steps,
        "s_per_step": elapsed / args.steps,
        "images_per_s": args.steps * args.batch / elapsed,
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
