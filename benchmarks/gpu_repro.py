"""Reproducibility on a GPU (issue 45), run by benchmarks/gpu_check.sh; about 2-4 minutes on one H100 (estimated:
not yet run on a GPU).

1. kill and resume: `diffmem train` with train.deterministic on, stopped by SIGTERM (Slurm's preemption path) once it
   has passed its third evaluation step, then rerun to the end, against the same run trained without a stop:
   bit-identical final weights expected;
2. determinism off: two uninterrupted runs with train.deterministic = false: how far apart their weights end;
3. a GPU state resumed on the CPU: the interrupted run's folder copied and continued for 3 steps with
   train.device = cpu: the warning it gives and the `reseeded` record in its config.json;
4. the speed cost of determinism: `diffmem bench train` (W = 32, 32x32, attention, batch 512) with and without it.

Every figure goes to OUT/gpu_repro.json (OUT: --out, else $OUT, else a new temporary folder) and is printed as one
JSON line. ``--cpu-dry-run`` runs the same steps on a tiny CPU run in seconds, to check the script's logic (on a CPU
nothing is reseeded: the state is a CPU one).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from diffmem.config import load_config
from diffmem.rundir import RunDir
from diffmem.throughput import bench_train
from diffmem.train import train

GPU_RUN = ["data.source=lfw_faces", "data.image_size=32", "data.n=64", "data.n_heldout=36", "model.width=32",
           "model.attention=true", "train.optimizer=adam", "train.lr=1e-4", "train.batch_size=32",
           "train.steps=1500", "train.device=cuda", "eval.inline=false", "eval.times=4"]
DRY_RUN = ["data.source=lfw_faces", "data.image_size=16", "data.n=8", "data.n_heldout=36", "model.width=8",
           "model.attention=false", "model.norm_groups=1", "train.optimizer=adam", "train.lr=1e-3",
           "train.batch_size=4", "train.steps=100", "train.device=cpu", "train.num_threads=1", "eval.inline=false",
           "eval.times=4"]


def cli_train(work: Path, folder: Path, overrides: list[str]) -> subprocess.Popen:
    """`diffmem train` of ``folder`` in a child process (this checkout's code), started, not awaited."""
    config = work / "empty.toml"
    config.write_text("")
    args = [sys.executable, "-c", "import sys; from diffmem.cli import main; sys.exit(main(sys.argv[1:]))",
            "train", str(config), "--no-progress", "--out", str(folder)]
    for item in overrides:
        args += ["--set", item]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL)


def finish(process: subprocess.Popen, what: str) -> None:
    if process.wait() != 0:
        raise SystemExit(f"{what}: diffmem train exited with {process.returncode}")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(RunDir(folder).state_path, map_location="cpu", weights_only=True)["model"]


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Whether two runs' final weights are bit-identical, and their largest absolute difference."""
    wa, wb = weights(a), weights(b)
    diff = max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)
    return {"bit_identical": all(torch.equal(wa[k], wb[k]) for k in wa), "max_abs_diff": diff}


def kill_and_resume(work: Path, overrides: list[str]) -> dict[str, Any]:
    """The run stopped by SIGTERM once its third checkpoint exists, copied aside (for the CPU resume), rerun."""
    folder = work / "cut"
    process = cli_train(work, folder, overrides)
    while process.poll() is None and len(RunDir(folder).checkpoint_steps()) < 3:
        time.sleep(0.05)
    interrupted = process.poll() is None
    if interrupted:
        process.send_signal(signal.SIGTERM)
    finish(process, "the run to interrupt")
    step = int(torch.load(RunDir(folder).state_path, map_location="cpu", weights_only=True)["step"])
    shutil.copytree(folder, work / "gpu_state_on_cpu")
    start = time.perf_counter()
    finish(cli_train(work, folder, overrides), "the resumed run")
    return {"interrupted": interrupted, "stopped_at_step": step, "resume_s": time.perf_counter() - start}


def resume_on_cpu(work: Path, overrides: list[str]) -> dict[str, Any]:
    """Continue the copy of the interrupted run's folder on the CPU for 3 steps; the warnings it gave."""
    folder = work / "gpu_state_on_cpu"
    cfg, _ = load_config(None, overrides + ["train.device=cpu"])
    step = int(torch.load(RunDir(folder).state_path, map_location="cpu", weights_only=True)["step"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(cfg, folder, progress=False, stop_at_step=step + 3, log=lambda _m: None)
    meta = json.loads(RunDir(folder).config_path.read_text())
    return {"status": result.status, "from_step": step, "to_step": result.step,
            "warnings": [str(w.message) for w in caught if "saved on" in str(w.message)],
            "reseeded": meta.get("reseeded", [])}


def determinism_cost(device: str, dry: bool) -> dict[str, Any]:
    """images/s of diffmem's training step with and without train.deterministic, and their ratio."""
    size = dict(width=8, image_size=16, batch=8, steps=3, warmup=1) if dry else \
        dict(width=32, image_size=32, batch=512, steps=30, warmup=5)
    out = {}
    for flag in (True, False):
        r = bench_train(size["width"], size["image_size"], size["batch"], size["steps"], device=device,
                        attention=not dry, warmup=size["warmup"], deterministic=flag, threads=1 if dry else 0,
                        peak_matmul_n=256 if dry else 0)
        out["deterministic" if flag else "nondeterministic"] = {k: r[k] for k in ("images_per_s", "s_per_step")}
    out["deterministic_over_nondeterministic"] = (out["deterministic"]["images_per_s"]
                                                 / out["nondeterministic"]["images_per_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="a tiny CPU run, to check the script itself")
    parser.add_argument("--out", help="folder of gpu_repro.json (default $OUT, else a temporary folder)")
    args = parser.parse_args()
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here; run it on one, or add --cpu-dry-run to check the script on a CPU")
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_repro."))
    out.mkdir(parents=True, exist_ok=True)
    base = DRY_RUN if dry else GPU_RUN
    figures: dict[str, Any] = {"device": "cpu (dry run)" if dry else torch.cuda.get_device_name(0),
                               "torch": torch.__version__, "config": base}
    with tempfile.TemporaryDirectory(prefix="gpu_repro.") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        finish(cli_train(work, work / "straight", base), "the uninterrupted run")
        figures["straight_s"] = time.perf_counter() - start
        figures["kill_and_resume"] = kill_and_resume(work, base)
        figures["kill_and_resume"] |= compare(work / "straight", work / "cut")
        fast = base + ["train.deterministic=false"]
        for name in ("fast_a", "fast_b"):
            finish(cli_train(work, work / name, fast), f"the run {name} without determinism")
        figures["determinism_off_two_runs"] = compare(work / "fast_a", work / "fast_b")
        figures["gpu_state_resumed_on_cpu"] = resume_on_cpu(work, base)
    figures["speed"] = determinism_cost("cpu" if dry else "cuda", dry)
    (out / "gpu_repro.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
