"""``diffmem status EXPERIMENT_DIR``: the table of where every run of an experiment stands. The states are read by
:mod:`diffmem.cluster.runstate` (which documents them); this module only formats them. Writes nothing.
"""
from __future__ import annotations

from pathlib import Path

from diffmem.cluster.runstate import STATES, RunStatus


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _relative(path: str | None, root: Path) -> str:
    if not path:
        return "-"
    try:
        return str(Path(path).relative_to(root.absolute()))
    except ValueError:
        return path


def format_status(rows: list[RunStatus], experiment_dir: str | Path) -> str:
    """The status table (one line per run), a count per state, and the error line of every failed run."""
    root = Path(experiment_dir)
    header = ["run", "state", "step/total", "evals", "f_mem", "FID/FD", "job", "log"]
    table = [header]
    for r in rows:
        total = "?" if r.total is None else str(r.total)
        fid = _fmt(r.fid, ".2f") + ("" if r.fid is None or r.fid_label == "FID" else "*")
        table.append([r.name, r.state, f"{r.step}/{total}", f"{r.evaluated}/{r.checkpoints}" if r.checkpoints else str(r.evaluated), _fmt(r.f_mem, ".3f"),
                      fid, r.job_id or "-", _relative(r.log, root)])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    counts = {s: sum(r.state == s for r in rows) for s in STATES}
    lines.append("")
    lines.append(f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    labels = sorted({r.fid_label for r in rows if r.fid_label and r.fid_label != "FID"})
    if labels:
        lines.append("* " + ", ".join(labels) + ": a Frechet distance of other features, not Inception FID")
    if counts["cancelled"]:
        lines.append(f"{counts['cancelled']} cancelled run(s): rerun the same `diffmem sweep` command to continue "
                     "them from their state.pt")
    for r in rows:
        if r.state == "failed":
            where = f" (log: {_relative(r.error_log, root)})" if r.error_log else ""
            lines.append(f"{r.name} failed: {r.error}{where}")
    return "\n".join(lines)
