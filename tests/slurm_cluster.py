"""A one-node Slurm cluster for the tests: a slurm.conf in a fresh folder, ``slurmctld -D`` and ``slurmd -D`` as
child processes, stopped by their process ids.

Needs Debian's ``slurm-wlm`` (Slurm 22.05 on bookworm) and root (``SlurmUser=root``, slurmd runs jobs as their
user). No munged, no cgroups, no slurmdbd: ``auth/none`` + ``cred/none``, ``proctrack/linuxproc``, ``task/none``,
``accounting_storage/none`` (so ``sacct`` answers nothing, as on clusters without a database). Ports are picked
free, and every Slurm command is pointed at this cluster's conf through ``$SLURM_CONF``.

Used by tests/test_slurm.py (a session fixture); by hand::

    python tests/slurm_cluster.py /tmp/slurm1      # starts a cluster, prints the export line; Ctrl-C stops it
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "slurm-wlm"
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def find(program: str) -> str | None:
    """``program`` on PATH or in an sbin folder (slurmctld and slurmd live in /usr/sbin)."""
    found = shutil.which(program)
    if found:
        return found
    for folder in SBIN:
        path = Path(folder) / program
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def unavailable() -> str | None:
    """Why no test cluster can be started here, or None when it can."""
    missing = [p for p in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun") if not find(p)]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} not found): install Debian's '{PACKAGE}' package "
                f"(apt-get install {PACKAGE}) to run the real-cluster tests")
    if os.geteuid() != 0:
        return f"the one-node test cluster runs slurmd as root (SlurmUser=root); run the tests as root ({PACKAGE})"
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free now."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def node_resources() -> tuple[int, int]:
    """(CPUs, RealMemory in MB) as ``slurmd -C`` reports them for this machine."""
    out = subprocess.run([find("slurmd") or "slurmd", "-C"], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    fields = dict(word.split("=", 1) for word in out.split() if "=" in word)
    return int(fields.get("CPUs", os.cpu_count() or 1)), int(fields.get("RealMemory", 1000))


def default_mem_per_cpu_mb(cpus: int, memory_mb: int) -> int:
    """Memory (MB) of a job that asks for none: 4000, or the node's share per CPU when it has less."""
    return max(1, min(4000, memory_mb // max(cpus, 1)))


def slurm_conf(folder: Path, *, ctld_port: int, slurmd_port: int, node: str, cpus: int, memory_mb: int,
               cluster: str = "diffmemtest", kill_wait_s: int = 2) -> str:
    """The slurm.conf of a one-node cluster whose state, spool, logs and pid files are all under ``folder``."""
    return "\n".join([
        f"ClusterName={cluster}",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        # no munged: in 22.05 auth/none + cred/none work; cred_expire=10 lets a requeued job start again ~12 s later
        "AuthType=auth/none",
        "CredType=cred/none",
        "AuthInfo=cred_expire=10",
        # no cgroups in a container: track processes through /proc
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        # sample each job's memory every second and kill a job above its --mem (there is no cgroup to do it)
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=task=1",
        "JobAcctGatherParams=OverMemoryKill",
        # no slurmdbd: sacct has nothing to read, as on many clusters
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder}/jobcomp.txt",
        # cores and memory are consumable, so array tasks run side by side
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        # a job without --mem gets this much: importing torch (a CUDA build) and diffusers alone takes ~0.8 GB of
        # resident memory and a tiny run peaks near 1 GB, so the old 1000 MB once had a time-limited job killed
        f"DefMemPerCPU={default_mem_per_cpu_mb(cpus, memory_mb)}",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1,bf_interval=1,defer_batch",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        f"KillWait={kill_wait_s}",
        "MinJobAge=600",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "MessageTimeout=10",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName=cpu Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@dataclass
class SlurmCluster:
    """A running one-node cluster: ``env`` is os.environ plus ``SLURM_CONF``; stop() ends it."""

    folder: Path
    conf: Path
    node: str
    cpus: int
    memory_mb: int
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm command (``scontrol``, ``squeue``, ...) against this cluster."""
        return subprocess.run([find(argv[0]) or argv[0], *argv[1:]], env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def log_tail(self, lines: int = 30) -> str:
        """The end of both daemons' logs (for a failing test's message)."""
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.folder / name
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
            out += [f"--- {name}", *text]
        return "\n".join(out)

    def wait_idle(self, timeout: float = 60) -> bool:
        """Wait until the node is up and idle (no job running or pending); True when it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.processes:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}\n{self.log_tail()}")
            info = self.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=10)
            queue = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10)
            if info.returncode == 0 and info.stdout.strip() == "idle" and queue.returncode == 0 \
                    and not queue.stdout.strip():
                return True
            time.sleep(0.2)
        return False

    def jobs(self) -> dict[str, str]:
        """Job id -> job name of every job in the queue (pending, running or completing)."""
        queue = self.run("squeue", "-h", "-o", "%i|%j", check=False, timeout=10)
        return dict(line.strip().split("|", 1) for line in queue.stdout.splitlines() if "|" in line)

    def cancel_all(self, timeout: float = 60, keep: tuple[str, ...] = ()) -> None:
        """Cancel every job of this cluster except those named in ``keep``, and wait until they have left the
        queue."""
        def doomed() -> list[str]:
            return [i for i, name in self.jobs().items() if name not in keep]

        if not keep:
            self.run("scancel", "--user", str(os.getuid()), check=False, timeout=10)
        elif doomed():
            self.run("scancel", *doomed(), check=False, timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and doomed():
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel the jobs, end both daemons by their pids, then any process left that this cluster started."""
        try:
            if all(p.poll() is None for p in self.processes):
                self.cancel_all(timeout=30)
        finally:
            for p in reversed(self.processes):  # slurmd first, then slurmctld
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(timeout=15)
            for pid in self.leftover_pids():  # job steps (slurmstepd and their children) outlive slurmd
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def leftover_pids(self) -> list[int]:
        """Processes started by this cluster that are still alive: those whose environment names its conf (slurmd
        passes $SLURM_CONF to slurmstepd, and jobs inherit it from the submitter), this process excepted."""
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                pids.append(int(entry.name))
        return pids


def start_cluster(folder: str | Path, *, timeout: float = 60, kill_wait_s: int = 2) -> SlurmCluster:
    """Write the conf into the fresh folder ``folder`` and start slurmctld and slurmd; returns when the node is
    idle. Raises RuntimeError (with the daemons' logs) when it does not come up."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=False)  # a fresh state every time
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    node = socket.gethostname().split(".")[0]
    cpus, memory_mb = node_resources()
    ctld_port, slurmd_port = free_ports(2)
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, ctld_port=ctld_port, slurmd_port=slurmd_port, node=node, cpus=cpus,
                               memory_mb=memory_mb, kill_wait_s=kill_wait_s))
    cluster = SlurmCluster(folder, conf, node, cpus, memory_mb)
    env = cluster.env
    try:
        for daemon in ("slurmctld", "slurmd"):
            with open(folder / f"{daemon}.out", "wb") as log:
                cluster.processes.append(subprocess.Popen([find(daemon), "-D", "-f", str(conf)], env=env,
                                                          stdout=log, stderr=subprocess.STDOUT,
                                                          stdin=subprocess.DEVNULL))
            if daemon == "slurmctld":
                _wait_for_controller(cluster, timeout)
        if not cluster.wait_idle(timeout):
            raise RuntimeError(f"the one-node cluster in {folder} did not become idle in {timeout:.0f} s\n"
                               + cluster.log_tail())
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for_controller(cluster: SlurmCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.processes[0].poll() is not None:
            raise RuntimeError(f"slurmctld exited with {cluster.processes[0].returncode}\n" + cluster.log_tail())
        if cluster.run("scontrol", "ping", check=False, timeout=10).stdout.count("UP"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"slurmctld did not answer in {timeout:.0f} s\n" + cluster.log_tail())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} NEW_FOLDER")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    started = start_cluster(sys.argv[1])
    print(f"one-node Slurm cluster up (node {started.node}, {started.cpus} CPUs, {started.memory_mb} MB)")
    print(f"export SLURM_CONF={started.conf}")
    print(f"Ctrl-C (or kill {os.getpid()}) stops it", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        started.stop()
