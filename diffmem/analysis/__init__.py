"""Analysis of finished or running experiments, from the files on disk only.

- :mod:`~diffmem.analysis.timescales`: tau_mem, tau_gen, tau_gap of one run (exact rules in its docstring)
- :mod:`~diffmem.analysis.scaling`: every run -> summary.csv, power-law fits -> fits.json (`diffmem analyze`)
- :mod:`~diffmem.analysis.signals`: sampling-free signals (tau_gap per noise level, tau_auc) and their lag to tau_mem
- :mod:`~diffmem.analysis.powerlaw`: the power-law fit with its bootstrap interval; reading fits.json
- :mod:`~diffmem.analysis.advise`: fitted (or the paper's) laws -> a stopping step for a given (N, W)
- :mod:`~diffmem.analysis.runfiles`: reading run folders, atomic writes of the analysis files
- :mod:`~diffmem.analysis.synthetic`: synthetic experiment folders with planted timescales (tests, docs)
"""
from __future__ import annotations

import importlib
from typing import Any

_HOME = {"fit_power_law": "powerlaw", "load_fits": "powerlaw", "Summary": "scaling", "analyze": "scaling",
         "Estimate": "timescales", "tau_gap": "timescales", "tau_gen": "timescales", "tau_mem": "timescales"}

__all__ = ["Estimate", "Summary", "analyze", "fit_power_law", "load_fits", "tau_gap", "tau_gen", "tau_mem"]


def __getattr__(name: str) -> Any:
    """The package's face, imported on first use (PEP 562): importing one module of the package, as the commands that
    only read run folders do (``diffmem.analysis.runfiles``), does not import the fits and scipy.stats with it."""
    if name in _HOME:
        return getattr(importlib.import_module(f"diffmem.analysis.{_HOME[name]}"), name)
    raise AttributeError(f"module 'diffmem.analysis' has no attribute {name!r}")
