"""The report page's section "Sampling-free signals" (:func:`signals_section`), written by
:mod:`diffmem.analysis.report` only when the runs recorded the per-level losses (summary.csv has the columns of
:data:`diffmem.analysis.signals.SIGNAL_COLUMNS`, fits.json a ``calibration``):

- per run: tau_gap (at the run's ``loss_t``), tau_gap_first with its diffusion time, tau_auc, tau_mem and the lags
  tau_mem / signal, each with its 95 % interval;
- per run: the no-member control next to them (:func:`control_lines`): where each signal's control left its null,
  and the flags;
- per run and noise level: tau_gap(t) and tau_auc(t);
- per cell (N, W): each lag's geometric mean over the seeds with its interval (fits.json ``calibration.cells``);
- the laws of the signals in N and of their lags, and for each lag law the plain sentence of
  :func:`diffmem.analysis.signals.verdict` (an early warning with a constant lag, or not, or not resolved).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from diffmem.analysis.markdown import estimate_text, table
from diffmem.analysis.powerlaw import FitSet
from diffmem.analysis.signals import FITTED_SIGNALS, SIGNALS


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _estimate(d: Mapping[str, Any] | None) -> str:
    """A calibration estimate (value, lo, hi, censored) as the report writes a timescale."""
    if not d:
        return "-"
    return estimate_text({"x": d.get("value"), "x_lo": d.get("lo"), "x_hi": d.get("hi"),
                          "x_censored": d.get("censored")}, "x")


def run_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The per-run table's rows from summary.csv."""
    out = []
    for r in rows:
        first = estimate_text(r, "tau_gap_first")
        if r.get("tau_gap_first_t") is not None:
            first += f" (t = {r['tau_gap_first_t']:g})"
        out.append([r["run"], r["n"], r["width"], r["seed"], estimate_text(r, "tau_gap"), first,
                    estimate_text(r, "tau_auc"), estimate_text(r, "tau_mem")]
                   + [estimate_text(r, lag) for lag in SIGNALS.values()])
    return out


def level_rows(calibration: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the per-level table: per run, ``tau_gap(t) / tau_auc(t)`` at each diffusion time."""
    levels = sorted({t for r in calibration.get("runs", []) for t in r.get("loss_ts", [])})
    rows = []
    for r in calibration.get("runs", []):
        at = {t: (g, a) for t, g, a in zip(r.get("loss_ts", []), r.get("tau_gap_t", []), r.get("tau_auc_t", []))}
        rows.append([r["run"]] + [f"{_estimate(at[t][0])} / {_estimate(at[t][1])}" if t in at else "-"
                                  for t in levels])
    return ["run"] + [f"t = {t:g}" for t in levels], rows


def cell_rows(calibration: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the per-cell calibration: one row per (N, W), one column per lag."""
    cells = calibration.get("cells", [])
    lags = list(dict.fromkeys(c["lag"] for c in cells))
    grid: dict[tuple[int, int], dict[str, Mapping[str, Any]]] = {}
    for c in cells:
        grid.setdefault((c["n"], c["width"]), {})[c["lag"]] = c
    rows = []
    for (n, width), by_lag in sorted(grid.items()):
        seeds = max(len(c["runs"]) for c in by_lag.values())
        row = [n, width, seeds]
        for lag in lags:
            c = by_lag.get(lag)
            if c is None or c["geometric_mean"] is None:
                row.append("-" if c is None or not c["censored"] else f"censored ({len(c['censored'])})")
            else:
                ends = f" [{_ratio(c['lo'])}, {_ratio(c['hi'])}]" if c["lo"] is not None and c["hi"] else ""
                row.append(f"{_ratio(c['geometric_mean'])}{ends} ({c['measured']})")
        rows.append(row)
    return ["N", "W", "seeds"] + [f"`{lag}`" for lag in lags], rows


def law_rows(fits_json: Mapping[str, Any]) -> list[list[str]]:
    """The laws in N of the signals (over comparable runs: FitSet.laws)."""
    out = []
    for signal in FITTED_SIGNALS:
        name = f"{signal}_vs_n"
        if name not in fits_json:
            continue
        for group, fit in FitSet.from_dict(fits_json[name]).laws():
            if fit.fitted:
                ci = (f" [{fit.exponent_lo:.3f}, {fit.exponent_hi:.3f}]" if fit.exponent_lo is not None
                      else " (no interval)")
                out.append([f"`{name}`", group, f"{fit.exponent:.3f}{ci}", f"{fit.prefactor:.3g}",
                            f"{fit.n_runs} runs in {len(fit.cells)} cells"])
            else:
                out.append([f"`{name}`", group, f"not fitted: {fit.reason}", "-", "-"])
    return out


def verdict_rows(calibration: Mapping[str, Any]) -> list[list[str]]:
    """One row per lag law in N: law, runs, exponent with interval, verdict, early warning."""
    out = []
    for law in calibration.get("laws", []):
        if law["exponent"] is None:
            exponent = "-"
        elif law["exponent_lo"] is None:
            exponent = f"{law['exponent']:.3f} (no interval)"
        else:
            exponent = f"{law['exponent']:.3f} [{law['exponent_lo']:.3f}, {law['exponent_hi']:.3f}]"
        early = {True: "yes", False: "no", None: "not resolved"}[law["early_warning"]]
        out.append([f"`{law['law']}`", law["runs"], exponent, law["verdict"], early])
    return out


def control_lines(rows: Sequence[dict[str, Any]], calibration: Mapping[str, Any]) -> list[str]:
    """The no-member control next to the signals: per run the control images, the step from which each signal's
    control left its null (by the signal's own rule, either way) and the flags; a sentence when no run has one."""
    runs = {r["run"]: r for r in calibration.get("runs", [])}
    with_control = [r for r in rows if r.get("control_n")]
    lines = ["", "**The no-member control.** Each signal's rule applied to the control block (never trained on, "
             "drawn as the train set) in the train set's place, above and below its null: it must never open. A "
             "signal whose control opened is flagged: it measures how the image sets were drawn as much as "
             "memorization, keeps its value above, and enters no law.", ""]
    if not with_control:
        return lines + ["No run recorded the control (folders written before it, or a training part of one block): "
                        "these signals are not checked against their null."]

    def left(value: Any) -> str:
        return "held" if value is None else f"left from ~{value:.4g}"

    table_rows = []
    for r in with_control:
        flags = runs.get(r["run"], {}).get("flags", {})
        levels = runs.get(r["run"], {}).get("control") or {}
        opened = [f"{t:g}" for t, c in zip(runs.get(r["run"], {}).get("loss_ts", []), levels.get("tau_gap_t", []))
                  if c.get("left") is not None]
        table_rows.append([r["run"], r["control_n"], left(r.get("tau_gap_control")), left(r.get("tau_auc_control")),
                           ", ".join(opened) or "none", "; ".join(f"{k}: {v}" for k, v in flags.items()) or "none"])
    return lines + table(["run", "control images", "control of tau_gap", "control of tau_auc",
                          "levels whose gap control opened (t)", "flags"], table_rows)


def signals_section(rows: Sequence[dict[str, Any]], fits_json: Mapping[str, Any]) -> list[str]:
    """The section's lines (module docstring); [] when the runs did not record the per-level losses."""
    calibration = fits_json.get("calibration")
    if not calibration or not any(r.get("tau_gap_first") is not None or r.get("tau_auc") is not None for r in rows):
        return []
    recorded = [r for r in rows if r.get("tau_gap_first") is not None or r.get("tau_auc") is not None]
    lines = ["## Sampling-free signals", "",
             "Timescales read from the denoising losses, without drawing a sample (diffmem's docs/analysis.md, "
             "section Sampling-free signals): tau_gap, where the train/held-out loss gap opens at the run's fixed "
             "diffusion time; tau_gap_first, the earliest gap over the noise levels `eval.loss_ts` (its diffusion "
             "time t in brackets); tau_auc, from which the membership AUC of the per-image losses (levels combined) "
             "stays above 0.5 by its 95 % interval. Each lag is tau_mem / signal (> 1: the signal comes first), with "
             "the interval of the two brackets, [tau_mem_lo / signal_hi, tau_mem_hi / signal_lo]; `gap_lag`, "
             "`gap_first_lag`, `auc_lag` against the onset, `..._at_L` against the level crossing tau_mem_at_L.", ""]
    lines += table(["run", "N", "W", "seed", "tau_gap", "tau_gap_first (t)", "tau_auc", "tau_mem", "gap lag",
                    "gap_first lag", "auc lag"], run_rows(recorded))
    lines += control_lines(recorded, calibration)
    header, level_table = level_rows(calibration)
    lines += ["", "Per noise level t: tau_gap(t) / tau_auc(t) (the AUC of that level alone).", ""]
    lines += table(header, level_table)
    header, cells = cell_rows(calibration)
    lines += ["", "Per cell: each lag's geometric mean over the seeds whose lag is measured (their count in "
              "brackets) with its 95 % interval: Student t on the log lags, at least the seeds' own brackets; "
              "with one seed, its own interval.", ""]
    lines += table(header, cells)
    laws = law_rows(fits_json)
    if laws:
        lines += ["", "The signals' laws in N (the fit method of every law):", ""]
        lines += table(["law", "runs", "exponent [95 %]", "prefactor", "data"], laws)
    verdicts = verdict_rows(calibration)
    lines += ["", "The lags' laws in N: the exponent is tau_mem's minus the signal's, so a constant lag (the signal "
              "scales with N as tau_mem does) is an exponent interval that holds 0; an early warning is a lag "
              "interval above 1 in every cell.", ""]
    lines += table(["law", "runs", "exponent [95 %]", "verdict", "early warning"], verdicts) if verdicts else \
        ["No lag law (no run has both a signal and tau_mem measured)."]
    onsets = [law for law in calibration.get("laws", []) if law["reference"] == "tau_mem"]
    if onsets:
        lines += ["", "In words (against the onset tau_mem):", ""] + [f"- {law['runs']}: {law['sentence']}"
                                                                      for law in onsets]
    return lines + [""]

