"""How many CPU threads torch uses for a job (or a model served) on the CPU.

torch starts as many intra-op threads as the machine has cores, whatever else runs there. On a busy machine
those threads wait for each other at every operator (OpenMP barriers on oversubscribed cores): on a busy 2-core
machine the tiny job trained 10-30 times slower with 2 threads than with 1 (docs/benchmarks.md). So kubetune chooses
the count from the cores that are actually free, unless the user chose:

1. ``training.cpu_threads`` in the spec (per process);
2. ``OMP_NUM_THREADS`` in the environment (a sweep sets it per trial; torchrun's default of 1 counts only
   under a plain ``torchrun``: kubetune's launcher marks it as not the user's, ``KUBETUNE_CPU_THREADS_AUTO``);
3. otherwise: the cores this process may run on (``sched_getaffinity``) minus the cores busy with other work,
   measured from ``/proc/stat`` over half a second (the 1-minute load average where that cannot be read: it
   lags, so a job started right after another one, or after ``kubetune chat``, would see cores as busy that
   are already free), rounded, at least 1, at most the cgroup's CPU quota (``cpu.max``, or ``cpu.cfs_quota_us`` on cgroup v1),
   divided between the processes on this node (``LOCAL_WORLD_SIZE``).

:func:`choose_threads` is the pure decision (tested on its own); :func:`cpu_threads` gathers its inputs from
this machine; :func:`apply_threads` hands the number to torch. GPU runs leave torch's default alone.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from . import constants as C
from . import ranks

__all__ = ["ThreadChoice", "choose_threads", "cpu_threads", "busy_cores", "cgroup_cpu_quota", "apply_threads"]

SPEC_FIELD = "training.cpu_threads"  # the knob's name in messages


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count for this process and why."""

    threads: int  # torch intra-op threads for this process
    available: int  # CPUs this process may use: its affinity, capped by the cgroup quota
    source: str  # "spec" (training.cpu_threads), "env" (OMP_NUM_THREADS) or "auto"
    reason: str  # why, in words: "load average 1.4", "OMP_NUM_THREADS=1", ...

    def describe(self, knobs: str = f"{SPEC_FIELD} or OMP_NUM_THREADS") -> str:
        """One line for the run's log: ``using 1 of 2 CPU threads: load average 1.4 (... sets it)``;
        ``knobs`` names what sets the count where the choice was automatic."""
        if self.source == "auto":
            noun = "thread" if self.available == 1 else "threads"
            return f"using {self.threads} of {self.available} CPU {noun}: {self.reason} ({knobs} sets it)"
        return f"using {self.threads} CPU {'thread' if self.threads == 1 else 'threads'}: {self.reason}"


def choose_threads(
    *,
    cores: int,
    load: float | None,
    quota: float | None = None,
    processes: int = 1,
    requested: int | None = None,
    env: Mapping[str, str] | None = None,
    load_label: str = "load average",
) -> ThreadChoice:
    """Decide the CPU threads of one process (pure: every input is an argument).

    Args:
        cores: CPUs this process may run on (its affinity mask).
        load: the cores busy with other work: measured, or the 1-minute load average (None when unknown: counted
            as idle).
        quota: CPUs the cgroup's quota allows (None: no quota).
        processes: processes on this node sharing the cores (torchrun's ``LOCAL_WORLD_SIZE``).
        requested: ``training.cpu_threads`` (wins over everything).
        env: the environment; ``OMP_NUM_THREADS`` there is the user's choice, unless ``KUBETUNE_CPU_THREADS_AUTO=1``
            says kubetune's launcher found it unset (torchrun's 1 is its default, not the user's).
        load_label: what ``load`` is, in the reason (``load average``, ``busy cores``).

    Returns:
        The :class:`ThreadChoice`: at least 1 thread.
    """
    env = env or {}
    cores = max(1, int(cores))
    available = cores if quota is None else max(1, min(cores, math.floor(quota)))
    if requested is not None:
        return ThreadChoice(max(1, int(requested)), available, "spec", f"{SPEC_FIELD}={requested}")
    omp = _omp_threads(env)
    if omp is not None:
        return ThreadChoice(omp, available, "env", f"OMP_NUM_THREADS={env[C.ENV_OMP_NUM_THREADS].strip()}")
    processes = max(1, int(processes))
    busy = max(0.0, load) if load is not None else 0.0
    free = min(available, max(1, round(cores - busy)))
    threads = max(1, free // processes)
    why = [f"{load_label} {busy:.1f}" if load is not None else f"{load_label} unknown"]
    if available < cores:
        why.append(f"cgroup CPU quota {quota:g} of {cores} cores")
    if processes > 1:
        why.append(f"{processes} processes share {free} free core{'' if free == 1 else 's'}")
    return ThreadChoice(threads, available, "auto", "; ".join(why))


def _omp_threads(env: Mapping[str, str]) -> int | None:
    """``OMP_NUM_THREADS`` as the user's choice: its first number (OpenMP allows a list such as ``4,2``)."""
    raw = env.get(C.ENV_OMP_NUM_THREADS)
    if raw is None or env.get(C.ENV_THREADS_AUTO) == "1":
        return None
    head = raw.strip().split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) >= 1 else None  # unusable: chosen as if unset


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs this process's cgroup quota allows (the smallest quota on the way up to the root), None without one.

    Reads cgroup v2's ``cpu.max`` (``"200000 100000"`` is 2 CPUs, ``"max 100000"`` none) and cgroup v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (a quota of -1 is none).
    """
    v2, v1 = "/", "/"
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2 = path
            elif "cpu" in controllers.split(","):
                v1 = path
    except (OSError, ValueError):
        pass
    quotas = [q for d in _up(root, v2) if (q := _v2_quota(d / "cpu.max")) is not None]
    for base in (root / "cpu", root / "cpu,cpuacct"):
        quotas += [q for d in _up(base, v1) if (q := _v1_quota(d)) is not None]
    return min(quotas) if quotas else None


def _up(base: Path, path: str) -> list[Path]:
    """``base/path`` and every directory above it up to ``base``."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(f: Path) -> float | None:
    try:
        quota, period = f.read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def _v1_quota(d: Path) -> float | None:
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())
        period = int((d / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cpu_threads(requested: int | None = None) -> ThreadChoice:
    """:func:`choose_threads` with this machine's cores, load, quota, local processes and environment."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    label = "busy cores"
    load = None
    if requested is None and _omp_threads(os.environ) is None:  # only the automatic choice needs it
        load = busy_cores(_affinity())
    if load is None:
        label = "load average"
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # pragma: no cover - no load average on this system
            load = None
    return choose_threads(cores=cores, load=load, quota=cgroup_cpu_quota(), processes=ranks.local_world_size(),
                          requested=requested, env=os.environ, load_label=label)


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return None


def _cpu_times(stat: Path) -> dict[int, tuple[int, int]]:
    """Per CPU from ``/proc/stat``: (busy, total) jiffies; busy excludes idle and iowait."""
    out: dict[int, tuple[int, int]] = {}
    for line in stat.read_text().splitlines():
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        v = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is inside user)
        total = sum(v)
        out[int(name[3:])] = (total - v[3] - v[4], total)
    return out


def busy_cores(cpus: set[int] | None = None, interval: float = 0.5, stat: Path = Path("/proc/stat")) -> float | None:
    """How many of ``cpus`` (all when None) other work keeps busy now: the busy share of each CPU over
    ``interval`` seconds, summed (this process sleeps meanwhile). None where ``/proc/stat`` cannot be read."""
    import time

    try:
        before = _cpu_times(stat)
        time.sleep(interval)
        after = _cpu_times(stat)
    except (OSError, ValueError, IndexError):
        return None
    busy = 0.0
    for cpu_id, (b1, t1) in after.items():
        if (cpus is not None and cpu_id not in cpus) or cpu_id not in before:
            continue
        b0, t0 = before[cpu_id]
        if t1 > t0:
            busy += min(1.0, max(0.0, (b1 - b0) / (t1 - t0)))
    return busy if after else None


def apply_threads(choice: ThreadChoice) -> None:
    """Give torch the chosen number of intra-op threads (imports torch)."""
    import torch

    torch.set_num_threads(choice.threads)
