"""Shared pytest fixtures.

* ``celeba_root``: a factory that writes a small CelebA copy in torchvision's layout (see its docstring).
* every test gets its own $DIFFMEM_CACHE folder, so no test reads or writes the user's ~/.cache/diffmem.
* under pytest-xdist every worker computes with one CPU thread, and so do the processes it starts
  (:func:`pytest_configure`).
* ``--cpu-profile=FILE``: where the suite's time goes on the CPU, per test (:func:`pytest_runtest_protocol`).
"""
from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# (width, height) of the fake images, cycled: CelebA's aligned 178x218 first, then other sizes and aspect ratios.
CELEBA_FAKE_SIZES = ((178, 218), (218, 178), (100, 150), (64, 64), (250, 120), (31, 47))


def make_celeba(base: Path, n: int = 40, with_partition: bool = True, nested: bool = True,
                partitions: Sequence[int] | None = None, seed: int = 0) -> Path:
    """Write a fake CelebA copy under ``base`` and return its root.

    nested=True: torchvision's layout ``root/celeba/img_align_celeba/000001.jpg ...`` and
    ``root/celeba/list_eval_partition.txt``; nested=False: ``root/img_align_celeba/`` and ``root/list_eval_partition.txt``.
    Images: n RGB JPEGs named 000001.jpg .. of the sizes in CELEBA_FAKE_SIZES (cycled), smooth random colour fields
    plus noise, seeded by ``seed``. Partitions: ``partitions`` (one 0/1/2 per image) or, by default, a seeded random
    assignment (half 0, a quarter each 1 and 2; all three for n >= 4) not sorted by filename.
    """
    rng = np.random.default_rng(seed)
    root = base / f"celeba_root_{seed}_{n}_{int(nested)}_{int(with_partition)}"
    celeba_dir = root / "celeba" if nested else root
    image_dir = celeba_dir / "img_align_celeba"
    image_dir.mkdir(parents=True)
    names = [f"{k + 1:06d}.jpg" for k in range(n)]
    for k, name in enumerate(names):
        width, height = CELEBA_FAKE_SIZES[k % len(CELEBA_FAKE_SIZES)]
        coarse = rng.uniform(0, 255, size=(4, 4, 3)).astype(np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR), dtype=np.float64)
        pixels = np.clip(field + rng.normal(0, 12, size=field.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(image_dir / name, quality=90)
    if with_partition:
        if partitions is None:
            partitions = np.resize([0, 0, 1, 2], n)
            rng.shuffle(partitions)
        if len(partitions) != n:
            raise ValueError(f"partitions has {len(partitions)} entries, expected one per image (n = {n})")
        lines = [f"{name} {int(p)}" for name, p in zip(names, partitions)]
        (celeba_dir / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def celeba_root(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``celeba_root(n=40, with_partition=True, nested=True, partitions=None, seed=0) -> root`` under
    tmp_path (see :func:`make_celeba`); call it several times for several copies."""

    def make(n: int = 40, with_partition: bool = True, nested: bool = True,
             partitions: Sequence[int] | None = None, seed: int = 0) -> Path:
        return make_celeba(tmp_path, n=n, with_partition=with_partition, nested=nested,
                           partitions=partitions, seed=seed)

    return make


@pytest.fixture(autouse=True)
def isolated_diffmem_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $DIFFMEM_CACHE at a fresh folder (outside tmp_path) for every test."""
    cache = tmp_path_factory.mktemp("diffmem_cache")
    monkeypatch.setenv("DIFFMEM_CACHE", str(cache))
    return cache


def pytest_configure(config: pytest.Config) -> None:
    """One compute thread per xdist worker and per process it starts. The suite runs on two workers: two torch
    processes with a thread per core each oversubscribe 2 cores, and OpenMP's waiting threads then slow both by
    10-30x (a 15 s training test took 264 s, another 482 s, in full runs). A test that sets train.num_threads still
    gets that count inside its run.

    Subprocesses get OMP_NUM_THREADS=1, read by torch and the BLAS libraries when they load. In this process they are
    loaded already (numpy by this file), so torch's count is set directly and the BLAS pools (OpenBLAS under numpy and
    scipy, whose reductions the FD uses) through threadpoolctl: a test that compares a run trained here with the same
    run in a subprocess (tests/test_reliability.py, the kill campaign) needs both on the same thread counts, down to
    the last digit of the FD.

    With ``--cpu-profile=FILE`` the main process empties FILE first, before any worker starts."""
    profile = config.getoption("--cpu-profile")
    if profile and not os.environ.get("PYTEST_XDIST_WORKER"):
        Path(profile).write_text("")  # each run's own lines (workers start after this)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(1)
        threadpool_limits(limits=1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (long end-to-end campaigns); CI leaves them out")
    parser.addoption("--cpu-profile", metavar="FILE", default=None,
                     help="write one JSON line per test to FILE (wall seconds, CPU seconds of the test's process and "
                          "of the subprocesses it waited for) and print the totals and the 10 largest at the end; give "
                          "it as --cpu-profile=FILE (written apart, pytest-xdist's workers take FILE for a path to "
                          "test, root the run there and miss this option)")


def _cpu_seconds() -> tuple[float, float]:
    """(this process's, its waited-for children's) user + system CPU seconds so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``--cpu-profile=FILE``: one line per test (setup, call and teardown together) appended to FILE, from the
    worker that ran it. CPU of processes the test did not wait for (Slurm's jobs, a killed job's orphans) is not
    counted; wall seconds on 2 shared cores also include waiting for the other worker."""
    path = item.config.getoption("--cpu-profile")
    if path is None:
        yield
        return
    wall, (own, children) = time.perf_counter(), _cpu_seconds()
    yield
    wall, (own_end, children_end) = time.perf_counter() - wall, _cpu_seconds()
    line = {"test": item.nodeid, "wall_s": round(wall, 3), "cpu_s": round(own_end - own, 3),
            "subprocess_cpu_s": round(children_end - children, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER")}
    with open(path, "a") as f:  # one short line per write, appended: workers do not interleave within a line
        f.write(json.dumps(line) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """With ``--cpu-profile=FILE``, in the main process: the totals over FILE's lines and its 10 largest by CPU."""
    path = config.getoption("--cpu-profile")
    if path is None or os.environ.get("PYTEST_XDIST_WORKER") or not Path(path).is_file():
        return
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    cpu = lambda r: r["cpu_s"] + r["subprocess_cpu_s"]
    terminalreporter.write_sep("=", f"cpu profile ({path})")
    terminalreporter.write_line(f"{len(rows)} tests: wall {sum(r['wall_s'] for r in rows):.0f} s, CPU "
                                f"{sum(map(cpu, rows)):.0f} s ({sum(r['cpu_s'] for r in rows):.0f} s in the tests' "
                                f"processes, {sum(r['subprocess_cpu_s'] for r in rows):.0f} s in the subprocesses they "
                                "waited for)")
    for r in sorted(rows, key=cpu, reverse=True)[:10]:
        terminalreporter.write_line(f"{cpu(r):7.1f} s CPU ({r['subprocess_cpu_s']:6.1f} s in subprocesses) "
                                    f"{r['wall_s']:7.1f} s wall  {r['test']}")


TIER_MARKERS = ("e2e", "slurm", "slow")
"""The tiers (docs/architecture.md, "Tests"): ``e2e`` runs the real CLI in a subprocess, trains beyond a few steps or
drives several runs end to end; ``slurm`` needs the real one-node Slurm cluster the tests start; ``slow`` are long
campaigns left out unless ``--runslow``. Every other test is ``unit`` (marked here): ``python -m pytest -m unit``."""


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, which then sees the unit marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of no other tier ``unit``; skip the tests marked ``slow`` unless ``--runslow`` is given."""
    skip_slow = pytest.mark.skip(reason="slow: run it with --runslow")
    for item in items:
        if not any(item.get_closest_marker(name) for name in TIER_MARKERS):
            item.add_marker(pytest.mark.unit)
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
