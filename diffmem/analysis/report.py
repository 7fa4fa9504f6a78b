"""The report page of an experiment: ``<experiment>/report.md``, written by `diffmem analyze` from the folder's files.

Markdown that GitHub and any editor show as it is. Every number comes from the experiment's own files: the settings
from the runs' ``config.json``, the timescales from ``summary.csv``, the laws from ``fits.json``, the figures and
galleries from ``figures/index.json`` (:data:`diffmem.analysis.runfiles.FIGURE_INDEX`, written by diffmem.figures;
links are relative, so the page works wherever the folder is copied). Sections:

1. settings: the config the runs share, section by section, and what varies between them (N, W, seed, steps, ...);
2. timescales: one row per run, each tau with its 95 % interval ``value [lo, hi]``; a censored tau is shown as a
   bound, ``> value`` (lower) or ``< value`` (upper);
3. laws: every law of fits.json over comparable runs (a law in N per width, a law in W per N: FitSet.laws; the
   joint laws over the whole grid), each with the runs it covers, its exponent, 95 % interval, prefactor, runs and
   cells, goodness of fit (lack-of-fit p-value or why none) and the fit method;
4. split pairs, only when summary.csv has pair columns (pairs.jsonl, `diffmem pairs`): one row per pair with
   tau_bias and its bracket beside both members' tau_gen and tau_mem and whether tau_bias comes before tau_mem, the
   tau_bias laws of fits.json, the pairs figure;
   then, only when the runs recorded the per-level losses, the sampling-free signals and their calibration against
   tau_mem (:mod:`diffmem.analysis.signals_report`);
   then, only when some run has copies.jsonl, "Which images are copied" (fits.json's ``images`` section,
   :func:`diffmem.analysis.images.images_section`): per cell a sentence on the copied fraction and on which images
   are copied first, and the agreement of the order across seeds and N;
5. figures, then 6. galleries: each drawn figure as an image with a link to its PDF;
7. what the analysis could not resolve: censored timescales (tau_bias included), runs still training, laws not
   fitted with the reason, fitted laws whose goodness of fit flags a problem (no line through every interval, lack
   of fit, an outlier), the notes of fits.json, figures skipped with the reason.

Steps are optimizer steps throughout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from diffmem import __version__
from diffmem.analysis.goodness import GoodnessOfFit
from diffmem.analysis.markdown import estimate_text, steps_text, table as _table
from diffmem.analysis.copy_rules import rules_section
from diffmem.analysis.fit_order import fit_order_section
from diffmem.analysis.images import images_section
from diffmem.analysis.powerlaw import JointLawFit, PowerLawFit, load_fits
from diffmem.analysis.runfiles import RunRecord, read_csv, read_experiment, read_figure_index, read_json
from diffmem.analysis.scaling import level_keys, level_of
from diffmem.analysis.signals_report import signals_section
from diffmem.config import EXECUTION_KEYS
from diffmem.io import atomic_write_text

REPORT_NAME = "report.md"

TIMESCALES = (("tau_gen", "tau_gen (quality plateau)"), ("tau_mem", "tau_mem (onset of copies)"),
              ("tau_gap", "tau_gap (loss gap opens)"))
"""The summary.csv columns of the timescale table and their headers (the level crossings tau_mem_at_L follow)."""

FIGURE_CAPTIONS = {
    "window": "Quality and f_mem against the training step for every N at one width, and the window "
              "[tau_gen, tau_mem] of each N with the 95 % intervals of both ends.",
    "collapse": "The memorized fraction f_mem against step / N: the curves fall on one another when tau_mem ~ N.",
    "scaling": "The onset tau_mem, its level crossings and tau_gen against N, with the fitted laws, their 95 % "
               "bands and the paper's slopes.",
    "width": "The timescales tau_gen and tau_mem / N against the width W, with the fitted laws and the paper's 1/W.",
    "phase": "Which cells memorize, generalize or still learn, against training time.",
    "loss_gap": "Train and test denoising loss at a fixed diffusion time, tau_gap marked.",
    "pairs": "Split pairs: the bias ln(d_other / d_own) (0: no preference), the distance between the two models' "
             "samples from the same noise and the fraction of samples nearer their own train set (0.5: no "
             "preference) against the step; tau_bias, tau_gen and tau_mem marked on each pair's bias curve.",
    "signals_gap": "The loss gap (test / train loss - 1) over the training step and the noise level t, first seed of "
                   "each N; tau_gen and tau_mem as vertical lines, each level's tau_gap(t) as a white circle.",
    "signals_auc": "The membership AUC (noise levels combined) against the step with its 95 % band, each seed of each "
                   "N; tau_auc as a circle on its curve, tau_mem as a dashed line, 0.5 (chance) dotted.",
    "signals_calibration": "The sampling-free timescales tau_auc and tau_gap_first against tau_mem per run, with their "
                           "intervals, on log-log axes; the identity line (no lag) and the lines of constant lag.",
    "copied_fraction": "The fraction of the training set that an evaluation's samples copy against the step, mean "
                       "over each cell's seeds with its 95 % bootstrap band.",
    "first_copy": "When each training image is first copied against its most telling descriptor (every seed of "
                  "each cell); images never copied at the right edge.",
    "copied_images": "The first and the last training images to be copied (the training images themselves, not "
                     "their copies), each with its first-copy step.",
    "gallery": "Generated samples (top rows) above their nearest training images, copies framed in red, before "
               "tau_gen, inside the window and after tau_mem.",
}
"""One sentence per figure kind, keyed by the figure name or its prefix before '_' (window_w08, gallery_n..)."""


COMPARABLE_RUNS = ("A law in one variable is fitted over runs that agree on the other setting the grid varies: a law in "
                   "n over the runs of one width, a law in width over the runs of one n (column runs). Over runs "
                   "that differ in both it would mix their effects, so there is none; the laws over every run are "
                   "the joint laws (x = n and width) and `tau_mem_vs_n_over_width`, which assumes tau_mem depends on "
                   "N / W only.")
"""The Laws section's sentence on which runs each law covers (docs/analysis.md, "The laws fitted")."""


def _caption(name: str) -> str:
    for prefix in sorted(FIGURE_CAPTIONS, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "_"):
            return FIGURE_CAPTIONS[prefix]
    return ""


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, values in config.items() for key, value in values.items()}


# --- sections -------------------------------------------------------------------------------------------------------

def settings_section(records: Sequence[RunRecord]) -> list[str]:
    """The config keys every run shares (grouped by section; execution keys such as the device left out) and the
    keys whose values differ between runs, with their values."""
    flats = [_flat(r.config.to_dict()) for r in records]
    keys = [k for k in flats[0] if k not in EXECUTION_KEYS]
    shared = {k: flats[0][k] for k in keys if all(f.get(k) == flats[0][k] for f in flats)}
    varying = [k for k in keys if k not in shared]
    lines = ["## Settings", "", f"{len(records)} run(s), from their `config.json`. What varies between the runs:", ""]
    def order(value: Any) -> tuple:
        return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))
    rows = [[f"`{k}`", ", ".join(str(v) for v in sorted({_hashable(f.get(k)) for f in flats}, key=order))]
            for k in varying]
    lines += _table(["setting", "values"], rows) if rows else ["(nothing: one run)"]
    lines += ["", "What every run shares:", ""]
    sections: dict[str, list[str]] = {}
    for key, value in shared.items():
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"{name} = {value}")
    lines += _table(["section", "settings"], [[f"`{s}`", ", ".join(v)] for s, v in sections.items()])
    return lines + [""]


def timescales_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One row per run of summary.csv: N, W, seed, state, steps trained and every timescale with its interval."""
    levels = level_keys(rows)
    header = ["run", "N", "W", "seed", "state", "steps"] + [h for _, h in TIMESCALES]
    header += [f"tau_mem at f_mem = {level_of(k):g}" for k in levels]
    table = [[r["run"], r["n"], r["width"], r["seed"], r["state"], steps_text(r["steps"])]
             + [estimate_text(r, k) for k, _ in TIMESCALES] + [estimate_text(r, k) for k in levels] for r in rows]
    return (["## Timescales", "",
             "From `summary.csv`, in optimizer steps: `value [lo, hi]` with the 95 % interval; `> value` is a lower "
             "bound (not reached by the last evaluation), `< value` an upper bound (already there at the first). "
             "The rules are in diffmem's docs/analysis.md, section Timescales.", ""]
            + _table(header, table) + [""])


def _fit_row(law: str, group: str, fit: PowerLawFit) -> list[str]:
    if fit.exponent_lo is not None:
        exponent = f"{fit.exponent:.3f} [{fit.exponent_lo:.3f}, {fit.exponent_hi:.3f}]"
        if fit.ci_note:
            exponent += " (see its interval note below)"
    else:
        exponent = f"{fit.exponent:.3f} (no interval" + (f": {fit.ci_note})" if fit.ci_note else ")")
    gof = fit.gof.summary() if fit.gof is not None else "-"
    if fit.gof is not None and fit.gof.note:
        gof += f" ({fit.gof.note})"
    return [f"`{law}`", group, f"{fit.x_name}", exponent, f"{fit.prefactor:.3g}",
            f"{fit.n_runs} runs in {len(fit.cells)} cells" + (f", {len(fit.censored)} censored left out"
                                                              if fit.censored else ""), gof]


NARROWING = "how: diffmem's docs/analysis.md, section When the brackets set the interval"
"""Where a report sends a reader whose law's interval the brackets set (:func:`fits_made`)."""


def fits_made(fits_json: dict[str, Any], fits: dict[str, Any]) -> tuple[list[list[str]], list[str], list[str]]:
    """(table rows of the fitted laws, lines of the laws not fitted with the reason, lines of the fitted laws whose
    goodness of fit flags a problem (:meth:`GoodnessOfFit.flagged`) or whose interval carries a caveat (its
    ``ci_note``), each line with its own prefix)."""
    rows, not_fitted, flagged = [], [], []
    for name, fit_set in fits.items():
        for group, fit in fit_set.laws():
            if fit.fitted:
                rows.append(_fit_row(name, group, fit))
                flags = fit.gof.flagged() if fit.gof is not None else []
                if flags:
                    flagged.append(f"goodness of fit: `{name}` ({group}): " + "; ".join(flags))
                if fit.exponent_lo is not None and fit.ci_note:
                    flagged.append(f"interval: `{name}` ({group}): {fit.ci_note}")
                if note := fit.resolution_note():
                    flagged.append(f"interval: `{name}` ({group}): {note} ({NARROWING})")
            else:
                not_fitted.append(f"`{name}` ({group}): {fit.reason}")
    for name, d in fits_json.items():
        if name in fits or not isinstance(d, dict) or not isinstance(d.get("x"), list):
            continue
        if d.get("exponents") is None:
            not_fitted.append(f"`{name}`: {d.get('reason')}")
            continue
        terms = [f"{x}: {d['exponents'][x]:.3f}" + (f" [{d['exponents_lo'][x]:.3f}, {d['exponents_hi'][x]:.3f}]"
                                                     if d["exponents_lo"][x] is not None else "") for x in d["x"]]
        gof = GoodnessOfFit.from_dict(d["goodness_of_fit"]).summary() if d.get("goodness_of_fit") else "-"
        rows.append([f"`{name}`", "all runs", " and ".join(d["x"]), "; ".join(terms), f"{d['prefactor']:.3g}",
                     f"{d['n_runs']} runs in {len(d.get('cells', []))} cells", gof])
        if note := JointLawFit.from_dict(d).resolution_note():
            flagged.append(f"interval: `{name}` (all runs): {note} ({NARROWING})")
    return rows, not_fitted, flagged


def laws_section(fits_json: dict[str, Any], rows: Sequence[list[str]]) -> list[str]:
    """The fitted laws tau = prefactor * x^exponent with their 95 % intervals and goodness of fit."""
    lines = ["## Laws", "",
             f"From `fits.json`: tau = prefactor * x^exponent, fitted by `{fits_json.get('method_name')}`: "
             f"{fits_json.get('method', '')}", "", COMPARABLE_RUNS, ""]
    if not rows:
        return lines + ["No law could be fitted (see below).", ""]
    return lines + _table(["law", "runs", "x", "exponent [95 %]", "prefactor", "data", "goodness of fit"],
                          rows) + [""]


def figures_section(title: str, entries: Sequence[dict[str, Any]], figures_dir: Path, link: str) -> list[str]:
    """Each drawn figure whose PNG exists: a heading, one sentence, the image and a link to the PDF."""
    drawn = [e for e in entries if not e.get("skipped") and any((figures_dir / f).is_file() for f in e["files"])]
    if not drawn:
        return []
    lines = [f"## {title}", ""]
    for e in drawn:
        png = next((f for f in e["files"] if f.endswith(".png") and (figures_dir / f).is_file()), None)
        pdf = next((f for f in e["files"] if f.endswith(".pdf") and (figures_dir / f).is_file()), None)
        lines += [f"### {e['name']}", ""]
        caption = _caption(e["name"])
        if caption:
            lines += [caption, ""]
        if png:
            lines += [f"![{e['name']}]({link}/{png})", ""]
        if pdf:
            lines += [f"[PDF]({link}/{pdf})", ""]
    return lines


def _bounds(row: dict[str, Any], key: str) -> tuple[float, float] | None:
    """What a summary.csv timescale says about where it lies (steps): its interval [lo, hi] (the value where an end is
    missing), [value, inf) for a lower bound, [0, value] for an upper bound; None when empty."""
    value = row.get(key)
    if value is None:
        return None
    if row.get(f"{key}_censored"):
        return (value, float("inf")) if row.get(f"{key}_hi") is None else (0.0, value)
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    return (value if lo is None else lo, value if hi is None else hi)


def bias_before_mem(pair_row: dict[str, Any], members: Sequence[dict[str, Any]]) -> str:
    """Whether a pair's tau_bias comes before its members' tau_mem, by their intervals (bounds included): "yes"
    when tau_bias's upper end is below both members' tau_mem lower ends, "no" when its lower end is above one
    member's tau_mem upper end, "undecided" otherwise (the intervals overlap); "-" without tau_bias or any tau_mem."""
    bias = _bounds(pair_row, "tau_bias")
    mems = [b for m in members if (b := _bounds(m, "tau_mem")) is not None]
    if bias is None or not mems:
        return "-"
    if bias[1] < min(m[0] for m in mems):
        return "yes"
    if any(bias[0] > m[1] for m in mems):
        return "no"
    return "undecided (intervals overlap)"


def pair_groups(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """summary.csv rows of split pairs per pair id (the pair's split-0 run first); {} without pair columns."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("pair"):
            groups.setdefault(r["pair"], []).append(r)
    return {k: sorted(v, key=lambda r: r["run"] != k) for k, v in sorted(groups.items())}


def pairs_section(rows: Sequence[dict[str, Any]], fit_rows: Sequence[list[str]],
                  entries: Sequence[dict[str, Any]] | None, figures_dir: Path, link: str) -> list[str]:
    """The split pairs (summary.csv's pair columns): one row per pair with tau_bias beside both members' tau_gen and
    tau_mem and :func:`bias_before_mem`, the tau_bias laws (rows of :func:`fits_made`) and the pairs figure; []
    when the experiment has no pairs."""
    groups = pair_groups(rows)
    if not groups:
        return []
    levels = level_keys(rows, "tau_bias")
    table = []
    for pair, members in groups.items():
        a = members[0]
        b = members[1] if len(members) > 1 else {}
        table.append([pair, a["n"], a["width"], a["seed"], estimate_text(a, "tau_bias")]
                     + [estimate_text(a, k) for k in levels]
                     + [estimate_text(a, "tau_gen"), estimate_text(b, "tau_gen"), estimate_text(a, "tau_gap"),
                        estimate_text(b, "tau_gap"), estimate_text(a, "tau_mem"), estimate_text(b, "tau_mem"),
                        bias_before_mem(a, members), a.get("pair_evals", "-")])
    lines = ["## Split pairs", "",
             "Two runs of one N, W and seed on disjoint train sets (blocks 0 and 1; the pair is named after its "
             "block-0 run). tau_bias: the first evaluation from which the bias ln(d_other / d_own) of their samples "
             "stays above 0, with its bracket (when the bias becomes detectable); bias = L: the step at which the "
             "bias crosses the level L (samples about 100 L % nearer their own set), with the interval of its 95 % "
             "bounds; `tau_bias < tau_mem`: whether tau_bias's interval lies before both members' tau_mem (a "
             "detectable bias before any copy; the level crossings against the window say how large it is there). "
             "The definitions are in diffmem's docs/split-pairs.md.", ""]
    lines += _table(["pair", "N", "W", "seed", "tau_bias"] + [f"bias = {level_of(k):g}" for k in levels]
                    + ["tau_gen (block 0)", "tau_gen (block 1)", "tau_gap (block 0)", "tau_gap (block 1)",
                       "tau_mem (block 0)", "tau_mem (block 1)", "tau_bias < tau_mem", "paired evaluations"], table)
    laws = [r for r in fit_rows if r[0].startswith("`tau_bias")]
    lines += ["", "tau_bias's laws and those of its level crossings (one point per pair; also under Laws):", ""]
    lines += (_table(["law", "runs", "x", "exponent [95 %]", "prefactor", "data", "goodness of fit"], laws) if laws
              else ["none fitted (see below)."])
    figure = next((e for e in entries or () if e["name"] == "pairs"), None)
    png = next((f for f in figure["files"] if f.endswith(".png") and (figures_dir / f).is_file()), None) \
        if figure and not figure.get("skipped") else None
    lines += ["", f"The measures against the step: ![pairs]({link}/{png})" if png
              else "The pairs figure was not drawn (see below)."]
    return lines + [""]


def unresolved_section(rows: Sequence[dict[str, Any]], not_fitted: Sequence[str], flagged: Sequence[str],
                       fits_json: dict[str, Any], entries: Sequence[dict[str, Any]] | None) -> list[str]:
    """What the analysis could not resolve: censored timescales, runs still training, laws not fitted, fitted laws
    whose goodness of fit flags a problem or whose interval carries a caveat (``flagged``: lines of
    :func:`fits_made`), fits.json's notes, figures skipped (each with its reason)."""
    items = []
    for r in rows:
        for key in [k for k, _ in TIMESCALES] + level_keys(rows):
            if r.get(key) is not None and r.get(f"{key}_censored"):
                if r.get(f"{key}_hi") is None:
                    why = "a lower bound: not reached by the last evaluation"
                else:
                    why = "an upper bound: already reached at the first evaluation"
                items.append(f"censored: `{r['run']}` {key} {estimate_text(r, key)} steps ({why})")
            elif r.get(key) is None and key in ("tau_gen", "tau_mem"):
                items.append(f"not measured: `{r['run']}` {key} (the metric was not recorded or has too few values)")
        if r.get("pair") == r["run"] and r.get("tau_bias") is None:
            items.append(f"not measured: pair `{r['run']}` tau_bias (no usable paired evaluation)")
        elif r.get("pair") == r["run"] and r.get("tau_bias_censored"):
            why = ("a lower bound: the bias is not established at the last paired evaluation"
                   if r.get("tau_bias_hi") is None else "an upper bound: established from the first paired "
                   "evaluation on")
            items.append(f"censored: pair `{r['run']}` tau_bias {estimate_text(r, 'tau_bias')} steps ({why})")
        if r.get("pair") == r["run"]:
            for key in level_keys([r], "tau_bias"):
                if r.get(key) is not None and r.get(f"{key}_censored"):
                    why = ("a lower bound: not reached, or not established, by the last paired evaluation"
                           if r.get(f"{key}_hi") is None else "an upper bound: already reached at the first")
                    items.append(f"censored: pair `{r['run']}` {key} {estimate_text(r, key)} steps ({why})")
        if r.get("state") != "done":
            items.append(f"still training: `{r['run']}` ({r.get('state')}, {steps_text(r.get('steps'))} steps so far)")
    items += [f"not fitted: {line}" for line in not_fitted]
    items += list(flagged)
    items += [f"note: {note}" for note in fits_json.get("notes", [])]
    if entries is None:
        items.append("figures: none drawn (`diffmem analyze` ran with --no-figures or into --out)")
    else:
        items += [f"figure skipped: {e['name']}: {e['skipped']}" for e in entries if e.get("skipped")]
    lines = ["## What the analysis could not resolve", ""]
    return lines + ([f"- {item}" for item in items] if items else ["Nothing: every timescale is measured, every law "
                                                                    "fitted and every figure drawn."]) + [""]


# --- the page -------------------------------------------------------------------------------------------------------

def blind_section(fits_json: Mapping[str, Any]) -> list[str]:
    """The blind baseline (fits.json ``blind_baseline``, :mod:`diffmem.analysis.blind`): what the images alone tell
    of each train set against its non-members, before any signal of the model; [] without it."""
    blind = fits_json.get("blind_baseline")
    if not blind:
        return []
    rows = [[", ".join(s["runs"]), s["m"], s["n"], s["reference"], f"{s['mmd_p']:.3g}",
             f"{s['auc']:.3f} [{s['auc_lo']:.3f}, {s['auc_hi']:.3f}]"] for s in blind["sets"]]
    return ["## Blind baseline: the image sets without the model", "",
            "How well each train set can be told from the held-out images its signals are compared with, by the "
            "images alone (diffmem's docs/analysis.md, section Blind baseline): a kernel two-sample test (MMD, "
            "permutation p-value; small: the sets differ in distribution) and a distance-only membership score "
            "(each image's distance to the nearest training-part image the run does not train on; AUC 0.5 for "
            f"exchangeable sets). Method: {blind['method']}.", ""] + \
        _table(["runs (one image set)", "train images", "non-members", "reference images", "MMD p", "distance AUC"],
              rows) + [""]


def report_text(experiment_dir: str | Path, analysis_dir: str | Path | None = None) -> str:
    """The report page of ``experiment_dir`` (its run folders) analyzed into ``analysis_dir`` (default: the same
    folder; it holds summary.csv, fits.json and figures/)."""
    experiment_dir = Path(experiment_dir)
    analysis_dir = experiment_dir if analysis_dir is None else Path(analysis_dir)
    records = read_experiment(experiment_dir)
    rows = read_csv(analysis_dir / "summary.csv")
    fits_json = read_json(analysis_dir / "fits.json")
    fit_rows, not_fitted, flagged = fits_made(fits_json, load_fits(analysis_dir / "fits.json"))
    figures_dir = analysis_dir / "figures"
    entries = read_figure_index(figures_dir)
    figures = [e for e in entries or () if not e["name"].startswith("gallery")]
    galleries = [e for e in entries or () if e["name"].startswith("gallery")]
    only = fits_json.get("only_n_samples")
    lines = [f"# {experiment_dir.name}: report", "",
             f"Written by `diffmem analyze` (diffmem {__version__}) from this folder's own files: the runs' "
             "`config.json`, `summary.csv`, `fits.json` and `figures/`. Steps are optimizer steps; intervals are "
             "95 %." + (f" Only the evaluations that drew {only} samples are used." if only else ""), ""]
    lines += settings_section(records)
    lines += blind_section(fits_json)
    lines += timescales_section(rows)
    lines += laws_section(fits_json, fit_rows)
    lines += pairs_section(rows, fit_rows, entries, figures_dir, "figures")
    lines += signals_section(rows, fits_json)
    lines += fit_order_section(fits_json.get("fit_order"))
    lines += images_section(fits_json.get("images"))
    lines += rules_section(fits_json.get("copy_rules"))
    lines += figures_section("Figures", figures, figures_dir, "figures")
    lines += figures_section("Galleries", galleries, figures_dir, "figures")
    lines += unresolved_section(rows, not_fitted, flagged, fits_json, entries)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_report(experiment_dir: str | Path, analysis_dir: str | Path | None = None) -> Path:
    """Write :func:`report_text` as ``analysis_dir/report.md`` (default: in ``experiment_dir``), atomically;
    returns its path."""
    target = Path(experiment_dir if analysis_dir is None else analysis_dir) / REPORT_NAME
    atomic_write_text(target, report_text(experiment_dir, analysis_dir))
    return target
