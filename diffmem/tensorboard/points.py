"""What a run folder holds, as TensorBoard points (:class:`~diffmem.tensorboard.eventdir.Point`); steps are optimizer
steps.

Tags of a run (one TensorBoard run per run folder):

* ``memorization/f_mem``, ``memorization/f_mem_lo``, ``memorization/f_mem_hi``: the memorized fraction and its 95 %
  interval (metrics.jsonl);
* ``quality/FID`` (or ``quality/FD (<extractor>)``, named as in the figures by
  :func:`diffmem.metrics.extractor_names.metric_label`) and ``quality/FID standard error``
  (:func:`diffmem.analysis.runfiles.quality_se`);
* ``loss_gap/train_loss``, ``loss_gap/test_loss``, ``loss_gap/gap`` (test - train) at the fixed diffusion time
  ``eval.loss_t``, and ``loss_gap/t=<t>`` (test - train) at each diffusion time ``t`` of ``eval.loss_ts`` (written
  ``%g``: ``loss_gap/t=0.01``);
* ``membership_auc/combined``, ``membership_auc/combined_lo``, ``membership_auc/combined_hi``: the membership AUC
  of the levels combined and its 95 % DeLong interval, and ``membership_auc/t=<t>`` the AUC at each level;
* ``training/images_per_second``: images seen / training seconds (evaluations excluded) up to that evaluation;
* ``training/loss``: the mean training loss since the previous check (every 100 steps and at each evaluation), only
  written live by ``diffmem train`` (the run folder does not keep it);
* ``samples/grid``: ``samples/step_*.png`` as it is (samples above their nearest training images, copies framed);
* ``timescales`` (text, step 0): tau_gen, tau_mem, tau_gap and the level crossings of the run's row of the
  experiment's ``summary.csv``, once ``diffmem analyze`` has written it;
* the hyperparameters (step 0) for TensorBoard's HPARAMS view.

A split pair (``pairs.jsonl``) has a TensorBoard run of its own, with ``pairs/bias``, ``pairs/bias_lo``,
``pairs/bias_hi``, ``pairs/pair_distance``, ``pairs/pair_distance_lo``, ``pairs/pair_distance_hi`` and
``pairs/own_fraction``.
"""
from __future__ import annotations

import csv
import io
import math
import warnings
from pathlib import Path
from typing import Any, Sequence

from PIL import Image
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from tensorboard.plugins.hparams.summary_v2 import hparams_pb
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.text.metadata import create_summary_metadata

from diffmem.analysis.runfiles import latest_per_step, quality_se
from diffmem.metrics.extractor_names import metric_label
from diffmem.rundir import RunDir
from diffmem.tensorboard.eventdir import Point

TRAINING_LOSS_TAG = "training/loss"
SAMPLES_TAG = "samples/grid"
TIMESCALES_TAG = "timescales"
SUMMARY_FILE = "summary.csv"  # <experiment>/summary.csv, written by `diffmem analyze`
PAIR_KEYS = ("bias", "bias_lo", "bias_hi", "pair_distance", "pair_distance_lo", "pair_distance_hi", "own_fraction")
TIMESCALE_KEYS = ("tau_gen", "tau_mem", "tau_gap")  # and every tau_mem_at_<level> / tau_bias_at_<level> column


def scalar(tag: str, step: int, value: Any) -> Point | None:
    """A scalar point, or None when ``value`` is missing or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return Point(int(step), Summary.Value(tag=tag, simple_value=float(value)))


def text(tag: str, step: int, markdown: str) -> Point:
    """A text point (TensorBoard's TEXT view renders it as markdown)."""
    tensor = TensorProto(dtype="DT_STRING", string_val=[markdown.encode("utf-8")], tensor_shape=TensorShapeProto())
    return Point(int(step), Summary.Value(tag=tag, metadata=create_summary_metadata("", ""), tensor=tensor))


def training_loss_point(step: int, loss: float) -> Point | None:
    """The live training loss (mean over the steps since the previous check) at optimizer step ``step``."""
    return scalar(TRAINING_LOSS_TAG, step, loss)


MAX_GRID_PIXELS = 4096 * 4096
"""The most pixels a sample grid's header may claim (a grid of 32 pairs of 64x64 images is under 2 % of it); a
larger claim is a damaged or hostile file, not decoded."""


def image(tag: str, step: int, png: bytes, source: str = "the image") -> Point | None:
    """An image point holding the PNG file ``png`` as it is; None, with one warning naming ``source``, when it is
    not a PNG, cannot be read, or its header claims more than :data:`MAX_GRID_PIXELS` (only the header is read:
    no pixel is decoded here)."""
    try:
        with Image.open(io.BytesIO(png)) as picture:
            kind = picture.format
            width, height = picture.size
            channels = len(picture.getbands())
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        warnings.warn(f"{source}: not a readable PNG ({type(e).__name__}); its image is left out of TensorBoard")
        return None
    if kind != "PNG" or width * height > MAX_GRID_PIXELS:
        warnings.warn(f"{source}: {'a ' + str(kind) if kind != 'PNG' else 'a PNG'} of {width}x{height} pixels, not a "
                      "sample grid; its image is left out of TensorBoard")
        return None
    encoded = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=png)
    return Point(int(step), Summary.Value(tag=tag, image=encoded))


def evaluation_points(record: dict[str, Any]) -> list[Point]:
    """The scalars of one metrics.jsonl record (one evaluation at ``record["step"]``)."""
    step = int(record["step"])
    extractor = record.get("fid_extractor")
    quality = metric_label(extractor) if isinstance(extractor, str) else "FID"
    train, test = record.get("train_loss"), record.get("test_loss")
    gap = test - train if isinstance(train, (int, float)) and isinstance(test, (int, float)) else None
    train_s, seen = record.get("train_s"), record.get("images_seen")
    speed = seen / train_s if isinstance(train_s, (int, float)) and train_s and isinstance(seen, (int, float)) else None
    points = [scalar("memorization/f_mem", step, record.get("f_mem")),
              scalar("memorization/f_mem_lo", step, record.get("f_mem_lo")),
              scalar("memorization/f_mem_hi", step, record.get("f_mem_hi")),
              scalar(f"quality/{quality}", step, record.get("fid")),
              scalar(f"quality/{quality} standard error", step, quality_se(record)),
              scalar("loss_gap/train_loss", step, train),
              scalar("loss_gap/test_loss", step, test),
              scalar("loss_gap/gap", step, gap),
              scalar("training/images_per_second", step, speed),
              scalar("membership_auc/combined", step, record.get("membership_auc")),
              scalar("membership_auc/combined_lo", step, record.get("membership_auc_lo")),
              scalar("membership_auc/combined_hi", step, record.get("membership_auc_hi"))]
    points += level_points(record)
    return [p for p in points if p is not None]


def level_points(record: dict[str, Any]) -> list[Point | None]:
    """The per-level scalars of one metrics.jsonl record (its ``loss_ts``): the gap test - train and the AUC at each
    diffusion time, as ``loss_gap/t=<t>`` and ``membership_auc/t=<t>``; [] for a record without levels."""
    levels = record.get("loss_ts") or []
    step, train, test, auc = (int(record["step"]), record.get("train_losses"), record.get("test_losses"),
                              record.get("auc"))
    points = []
    for k, t in enumerate(levels):
        if train is not None and test is not None:
            points.append(scalar(f"loss_gap/t={t:g}", step, test[k] - train[k]))
        if auc is not None:
            points.append(scalar(f"membership_auc/t={t:g}", step, auc[k]))
    return points


def hyperparameter_point(run: RunDir) -> Point | None:
    """The run's hyperparameters (N, W, seed, lr, batch, optimizer, data source, image size, split) from its
    config.json, at step 0; None for a folder without one."""
    stored = run.read_config()
    if stored is None:
        return None
    cfg = stored.config
    values = {"n": cfg.data.n, "width": cfg.model.width, "seed": cfg.train.seed, "lr": cfg.train.lr,
              "batch": cfg.batch_size, "optimizer": cfg.train.optimizer, "data_source": cfg.data.source,
              "image_size": cfg.data.image_size, "split": cfg.data.subset_index}
    value = hparams_pb(values, trial_id=run.path.name, start_time_secs=0).value[0]
    content = HParamsPluginData.FromString(value.metadata.plugin_data.content)  # a map: serialized in any order
    value.metadata.plugin_data.content = content.SerializeToString(deterministic=True)
    return Point(0, value)


def summary_row(experiment_dir: Path, run_name: str) -> dict[str, str] | None:
    """The row of ``run_name`` in ``<experiment_dir>/summary.csv`` (None when there is no such file or row)."""
    path = experiment_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    with path.open(newline="", encoding="utf-8") as f:
        return next((row for row in csv.DictReader(f) if row.get("run") == run_name), None)


def timescales_text(row: dict[str, str]) -> str:
    """A markdown table of the timescales of one summary.csv row (optimizer steps): value, 95 % interval, and
    whether it is only a bound (censored)."""
    keys = [k for k in TIMESCALE_KEYS if k in row]
    keys += [k for k in row if k.startswith(("tau_mem_at_", "tau_bias_at_"))
             and not k.endswith(("_lo", "_hi", "_censored", "_flag"))]
    lines = ["| timescale (steps) | value | 95 % interval | bound only |", "|---|---|---|---|"]
    for key in keys:
        lo, hi = row.get(f"{key}_lo") or "", row.get(f"{key}_hi") or ""
        interval = f"[{lo}, {hi}]" if lo or hi else ""
        lines.append(f"| {key} | {row[key] or 'not measured'} | {interval} | {row.get(f'{key}_censored') or ''} |")
    return "\n".join(lines)


def run_points(run_dir: str | Path) -> list[Point]:
    """Every point the run folder's own files hold: its evaluations (metrics.jsonl, the last line of a step wins),
    their sample grids (samples/step_*.png), its hyperparameters (config.json) and, once ``diffmem analyze`` has
    written the experiment's summary.csv, its timescales."""
    run = RunDir(run_dir)
    points = [p for p in [hyperparameter_point(run)] if p is not None]
    for record in latest_per_step([r for r in run.metrics() if isinstance(r.get("step"), int)]):
        points += evaluation_points(record)
        grid = run.samples_path(int(record["step"]))
        if grid.is_file() and not grid.is_symlink():
            picture = image(SAMPLES_TAG, int(record["step"]), grid.read_bytes(), str(grid))
            if picture is not None:
                points.append(picture)
    row = summary_row(run.path.parent, run.path.name)
    if row is not None:
        points.append(text(TIMESCALES_TAG, 0, timescales_text(row)))
    return points


def pair_points(lines: Sequence[dict[str, Any]]) -> list[Point]:
    """The points of one split pair's pairs.jsonl lines (each with a ``step``; a later line of a step wins)."""
    return [p for line in lines for key in PAIR_KEYS
            if (p := scalar(f"pairs/{key}", int(line["step"]), line.get(key))) is not None]
