"""What the report pages write in markdown: a number of steps, a timescale with its interval, a table (used by
:mod:`diffmem.analysis.report` and :mod:`diffmem.analysis.signals_report`)."""
from __future__ import annotations

from typing import Any, Sequence


def steps_text(value: float | None) -> str:
    """A number of steps for the tables: whole steps from 100 on, 3 significant digits below; '-' for none."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def estimate_text(row: dict[str, Any], key: str) -> str:
    """``value [lo, hi]`` of a summary.csv timescale; ``> value`` / ``< value`` when censored (a lower / upper
    bound); '-' when empty."""
    value = row.get(key)
    if value is None:
        return "-"
    if row.get(f"{key}_censored"):
        return ("> " if row.get(f"{key}_hi") is None else "< ") + steps_text(value)
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    return steps_text(value) + (f" [{steps_text(lo)}, {steps_text(hi)}]" if lo is not None and hi is not None else "")


def correlation_text(c: dict[str, Any] | None, undefined: str = "-") -> str:
    """A rank correlation of fits.json (``rho``, ``lo``, ``hi``) as ``0.42 [0.10, 0.70]``; ``undefined`` without
    one."""
    if not c or c.get("rho") is None:
        return undefined
    return f"{c['rho']:.2f}" + (f" [{c['lo']:.2f}, {c['hi']:.2f}]" if c.get("lo") is not None else "")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table (``|`` in a cell escaped, newlines made spaces)."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
    return [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]
