"""The cluster engine: where the jobs of a sweep run.

* :mod:`diffmem.cluster.base`: the options of a cluster, the tasks an executor is handed, the results it returns;
* :mod:`diffmem.cluster.slurm`: Slurm submission (sbatch scripts, job arrays, dependencies), job states
  (``scontrol``, ``sacct``) and waiting for jobs;
* :mod:`diffmem.cluster.runstate`: where each run of an experiment stands (its folder and its latest job), what
  ``diffmem status`` prints and what a sweep and its executors wait on;
* :mod:`diffmem.cluster.executors`: the debug, local and slurm executors behind one interface.
"""
