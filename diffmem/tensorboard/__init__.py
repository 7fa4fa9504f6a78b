"""TensorBoard event files of runs and split pairs, so that ``tensorboard --logdir EXPERIMENT_DIR`` shows a sweep.

* :mod:`diffmem.tensorboard.eventdir`: one TensorBoard run's event files, made to show a set of points, each step of
  a tag once and in step order (needs the ``tensorboard`` package);
* :mod:`diffmem.tensorboard.points`: what a run folder and a split pair hold, as points (the tags);
* :mod:`diffmem.tensorboard.live`: the hooks of training and evaluation (``train.tensorboard``), never a reason for
  a run to stop;
* :mod:`diffmem.tensorboard.rebuild`: ``diffmem tensorboard EXP``, the event files of an existing folder.

Where they go: ``<run>/tensorboard/`` (TensorBoard's run ``<run name>/tensorboard``, so its run filter selects a
cell, an N or a W by the run name, e.g. ``n00064``, ``w08``) and ``<experiment>/pairs_tensorboard/<pair>/``.
Only :mod:`~diffmem.tensorboard.live` may be imported without the ``tensorboard`` package.
"""
