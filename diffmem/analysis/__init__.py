"""Analysis of finished or running experiments, from the files on disk only.

- :mod:`~diffmem.analysis.timescales`: tau_mem, tau_gen, tau_gap of one run (exact rules in its docstring)
- :mod:`~diffmem.analysis.scaling`: every run -> summary.csv, power-law fits -> fits.json (`diffmem analyze`)
- :mod:`~diffmem.analysis.signals`: sampling-free signals (tau_gap per noise level, tau_auc) and their lag to tau_mem
- :mod:`~diffmem.analysis.powerlaw`: the power-law fit with its bootstrap interval; reading fits.json
- :mod:`~diffmem.analysis.advise`: fitted (or the paper's) laws -> a stopping step for a given (N, W)
- :mod:`~diffmem.analysis.runfiles`: reading run folders, atomic writes of the analysis files
- :mod:`~diffmem.analysis.synthetic`: synthetic experiment folders with planted timescales (tests, docs)
"""
from diffmem.analysis.powerlaw import fit_power_law, load_fits
from diffmem.analysis.scaling import Summary, analyze
from diffmem.analysis.timescales import Estimate, tau_gap, tau_gen, tau_mem

__all__ = ["Estimate", "Summary", "analyze", "fit_power_law", "load_fits", "tau_gap", "tau_gen", "tau_mem"]
