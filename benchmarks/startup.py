"""How long the commands that only read run folders take, whole (interpreter start to exit), against the import of
torch and diffusers that a training process pays first.

On a planted experiment written to a temporary folder (4 N x 2 seeds, ``diffmem.analysis.synthetic``), each round
runs, one after the other and each in a fresh interpreter with one thread: ``python -c "import torch, diffusers"``,
``diffmem status``, ``diffmem advise --from`` and ``diffmem analyze --no-figures`` (``python -m diffmem.cli``). It
prints the median wall seconds of each over the rounds and its ratio to the import; the last line is one JSON object.
The diffmem measured is the one the interpreter imports: to time another checkout, run from outside this one with
``PYTHONPATH`` set to it (``cd /tmp && PYTHONPATH=/path/to/other python /path/to/benchmarks/startup.py``).

    python benchmarks/startup.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import diffmem
from diffmem.analysis.synthetic import write_synthetic_experiment

BASELINE = "import torch, diffusers"


def commands(experiment: Path) -> dict[str, list[str]]:
    """The command lines timed, by name; the baseline first."""
    cli = [sys.executable, "-m", "diffmem.cli"]
    return {
        BASELINE: [sys.executable, "-c", "import torch, diffusers"],
        "diffmem status": cli + ["status", str(experiment)],
        "diffmem advise": cli + ["advise", "--n", "2048", "--width", "32", "--from", str(experiment)],
        "diffmem analyze --no-figures": cli + ["analyze", str(experiment), "--no-figures"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs every command once (default 5)")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        experiment = Path(tmp) / "exp"
        write_synthetic_experiment(experiment, ns=[128, 256, 512, 1024], widths=[32], seeds=[0, 1],
                                   steps=lambda n, w: 3000 * n)
        lines = commands(experiment)
        subprocess.run(lines["diffmem analyze --no-figures"], check=True, capture_output=True, env=env)  # fits.json
        seconds: dict[str, list[float]] = {name: [] for name in lines}
        for _ in range(args.rounds):
            for name, argv in lines.items():
                start = time.perf_counter()
                subprocess.run(argv, check=True, capture_output=True, env=env)
                seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, median in medians.items():
        print(f"{name:30s} {median:6.2f} s  ({median / medians[BASELINE]:.2f}x the import; median of {args.rounds})")
    print(json.dumps({"rounds": args.rounds, "median_s": {k: round(v, 3) for k, v in medians.items()},
                      "diffmem": str(Path(diffmem.__file__).parent)}))


if __name__ == "__main__":
    main()
