"""kubetune.cpu: how many CPU threads torch gets (the spec, OMP_NUM_THREADS, else the free cores), and the knob."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubetune import SpecError, cpu, load_spec, ranks
from kubetune import constants as C
from kubetune.cpu import cgroup_cpu_quota, choose_threads
from kubetune.events import RunDir
from kubetune.spec import dump_spec

AUTO = {"KUBETUNE_CPU_THREADS_AUTO": "1"}


# --- the choice ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cores,load,threads",
    [
        (2, 0.2, 2),  # idle: every core
        (2, 1.3, 1),  # the machine: one core is busy, one thread
        (2, 1.4, 1),
        (2, 5.9, 1),  # overloaded: still one thread, never zero
        (16, 3.6, 12),  # 16 - 3.6 = 12.4, rounded
        (16, 3.5, 12),  # 12.5 rounds to the even 12
        (4, 0.0, 4),
    ],
)
def test_free_cores_are_the_cores_minus_the_load_average(cores, load, threads):
    c = choose_threads(cores=cores, load=load)
    assert (c.threads, c.available, c.source) == (threads, cores, "auto")
    assert c.reason == f"load average {load:.1f}"


def test_the_line_says_how_many_of_how_many_and_why():
    line = choose_threads(cores=2, load=1.4).describe()
    assert line == "using 1 of 2 CPU threads: load average 1.4 (training.cpu_threads or OMP_NUM_THREADS sets it)"
    assert choose_threads(cores=2, load=0.1).describe("OMP_NUM_THREADS").startswith("using 2 of 2 CPU threads: ")
    assert choose_threads(cores=2, load=0.1, requested=1).describe() == "using 1 CPU thread: training.cpu_threads=1"


def test_an_unknown_load_average_counts_as_idle():
    c = choose_threads(cores=8, load=None)
    assert c.threads == 8 and "load average unknown" in c.reason


@pytest.mark.parametrize(
    "cores,load,quota,threads,available",
    [
        (64, 0.5, 4.0, 4, 4),  # a container on a big idle host: the quota, not the host's cores
        (64, 62.0, 4.0, 2, 4),  # the host is busy too: the free cores are fewer than the quota
        (8, 0.0, 2.5, 2, 2),  # a fractional quota rounds down: a third thread would be throttled
        (8, 0.0, 0.5, 1, 1),  # less than a core: one thread
        (2, 0.0, 16.0, 2, 2),  # a quota above the cores changes nothing
    ],
)
def test_the_cgroup_quota_caps_the_threads(cores, load, quota, threads, available):
    c = choose_threads(cores=cores, load=load, quota=quota)
    assert (c.threads, c.available) == (threads, available)
    assert (f"cgroup CPU quota {quota:g} of {cores} cores" in c.reason) == (available < cores)


@pytest.mark.parametrize(
    "cores,load,processes,threads",
    [
        (16, 0.0, 4, 4),  # torchrun with 4 processes on 16 idle cores: 4 each
        (16, 8.0, 4, 2),  # 8 free cores, 4 processes
        (2, 0.0, 2, 1),
        (2, 1.2, 2, 1),  # one free core for two processes: still one thread each
        (6, 0.0, 4, 1),  # 6 // 4
    ],
)
def test_processes_on_one_node_divide_the_free_cores(cores, load, processes, threads):
    c = choose_threads(cores=cores, load=load, processes=processes)
    assert c.threads == threads
    assert f"{processes} processes share" in c.reason
    assert choose_threads(cores=2, load=1.2, processes=2).reason == "load average 1.2; 2 processes share 1 free core"


def test_the_spec_wins_over_omp_num_threads_and_the_load():
    c = choose_threads(cores=2, load=5.0, requested=3, env={"OMP_NUM_THREADS": "1"})
    assert (c.threads, c.source, c.reason) == (3, "spec", "training.cpu_threads=3")


@pytest.mark.parametrize("value,threads", [("1", 1), ("4", 4), (" 3 ", 3), ("4,2", 4)])
def test_omp_num_threads_is_the_user_s_choice(value, threads):
    c = choose_threads(cores=2, load=0.0, env={"OMP_NUM_THREADS": value})
    assert (c.threads, c.source) == (threads, "env")
    assert c.describe() == f"using {threads} CPU thread{'s' if threads > 1 else ''}: OMP_NUM_THREADS={value.strip()}"


@pytest.mark.parametrize("value", ["", "0", "abc", "-2"])
def test_an_unusable_omp_num_threads_is_chosen_as_if_unset(value):
    c = choose_threads(cores=4, load=0.0, env={"OMP_NUM_THREADS": value})
    assert (c.threads, c.source) == (4, "auto")


def test_torchrun_s_default_under_kubetune_s_launcher_is_not_the_user_s():
    # torchrun puts OMP_NUM_THREADS=1 into every rank when the user set none; kubetune's launcher says so
    c = choose_threads(cores=8, load=0.0, processes=2, env={"OMP_NUM_THREADS": "1", **AUTO})
    assert (c.threads, c.source) == (4, "auto")


# --- this machine's inputs ---------------------------------------------------------------------
def _cgroup(tmp_path: Path, lines: str) -> Path:
    f = tmp_path / "self-cgroup"
    f.write_text(lines)
    return f


def test_cgroup_v2_quota(tmp_path):
    root = tmp_path / "fs"
    (root / "kubepods" / "pod1").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (root / "kubepods" / "pod1" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(root, _cgroup(tmp_path, "0::/kubepods/pod1\n")) == 1.5  # the smallest on the way up
    assert cgroup_cpu_quota(root, _cgroup(tmp_path, "0::/kubepods\n")) == 4.0
    assert cgroup_cpu_quota(root, _cgroup(tmp_path, "0::/\n")) is None  # "max": no quota
    assert cgroup_cpu_quota(root, _cgroup(tmp_path, "0::/gone/elsewhere\n")) is None  # a path this namespace cannot see


def test_cgroup_v1_quota(tmp_path):
    cpu_dir = tmp_path / "fs" / "cpu"
    (cpu_dir / "docker" / "abc").mkdir(parents=True)
    for d, quota in ((cpu_dir, "-1"), (cpu_dir / "docker" / "abc", "200000")):
        (d / "cpu.cfs_quota_us").write_text(quota + "\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
    proc = _cgroup(tmp_path, "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(tmp_path / "fs", proc) == 2.0
    assert cgroup_cpu_quota(tmp_path / "fs", _cgroup(tmp_path, "1:cpu,cpuacct:/\n")) is None  # -1: none


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "nothing", tmp_path / "no-such-file") is None


def test_local_world_size_is_read_from_torchrun(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert ranks.local_world_size() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert ranks.local_world_size() == 4


class _Stat:
    """A /proc/stat that changes between reads, as the real one does while the caller sleeps."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def read_text(self) -> str:
        return self.texts.pop(0)


def _stat(*cpus: tuple[int, int, int]) -> str:
    """A /proc/stat with per-CPU (user, idle, iowait) jiffies (the aggregate line and other fields are there too)."""
    lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]
    lines += [f"cpu{i} {u} 0 0 {idle} {io} 0 0 0 0 0" for i, (u, idle, io) in enumerate(cpus)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"


def test_busy_cores_sums_each_cpu_s_busy_share_over_the_interval():
    before = _stat((100, 100, 0), (100, 100, 0), (100, 100, 0))
    after = _stat((200, 100, 0), (150, 140, 10), (100, 200, 0))  # cpu0 all busy, cpu1 half (iowait is idle), cpu2 idle
    assert cpu.busy_cores(interval=0, stat=_Stat(before, after)) == pytest.approx(1.5)
    assert cpu.busy_cores({1, 2}, interval=0, stat=_Stat(before, after)) == pytest.approx(0.5), "only this process's CPUs"
    assert cpu.busy_cores(interval=0, stat=_Stat("garbage\n", "garbage\n")) is None


def test_busy_cores_measures_a_spinning_process():
    import subprocess
    import sys

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.5)
        assert cpu.busy_cores(interval=0.5) >= 0.7  # one core kept busy by the spinner (and a little by others)
    finally:
        spinner.kill()
        spinner.wait()


def test_cpu_threads_prefers_the_measured_busy_cores_to_the_lagging_load_average(monkeypatch):
    """Right after another job (or `kubetune chat`) ends, the 1-minute load average still counts it: measured now,
    the cores are free."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 1.0, 0.5))
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: None)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(C.ENV_THREADS_AUTO, raising=False)
    monkeypatch.setattr(cpu, "busy_cores", lambda cpus=None, interval=0.5: 0.1)
    c = cpu.cpu_threads()
    assert (c.threads, c.reason) == (2, "busy cores 0.1")
    monkeypatch.setattr(cpu, "busy_cores", lambda cpus=None, interval=0.5: None)  # no /proc/stat: the load average
    c = cpu.cpu_threads()
    assert (c.threads, c.reason) == (1, "load average 1.6")


def test_cpu_threads_gathers_affinity_load_quota_processes_and_environment(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 1.0, 0.5))
    monkeypatch.setattr(cpu, "busy_cores", lambda cpus=None, interval=0.5: None)  # the load average decides here
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(C.ENV_THREADS_AUTO, raising=False)  # set only under kubetune's launcher
    assert cpu.cpu_threads().threads == 3  # (8 - 2.2 -> 6) // 2
    monkeypatch.setattr(cpu, "cgroup_cpu_quota", lambda: 2.0)
    assert cpu.cpu_threads().threads == 1  # min(6, 2) // 2
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert cpu.cpu_threads().threads == 5
    assert cpu.cpu_threads(requested=2).threads == 2


def test_apply_threads_sets_torch_s_thread_count():
    import torch

    before = torch.get_num_threads()
    try:
        cpu.apply_threads(choose_threads(cores=2, load=0.0, requested=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# --- the spec's knob -----------------------------------------------------------------------------
def _spec(**training):
    return {"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "data.jsonl"}, "training": training}


def test_training_cpu_threads_is_validated_and_bounded():
    assert load_spec(_spec()).training.cpu_threads is None
    assert load_spec(_spec(cpu_threads=4)).training.cpu_threads == 4
    for bad in (0, -1, 5000, 2.5):
        with pytest.raises(SpecError, match="training.cpu_threads"):
            load_spec(_spec(cpu_threads=bad))


def test_a_finished_run_is_the_same_run_whatever_its_cpu_threads(tmp_path):
    from kubetune.worker import previous_run

    before = load_spec(_spec(max_steps=2, seed=1) | {"output": {"dir": str(tmp_path / "run")}})
    run = RunDir(before.output_dir)
    run.init()
    run.spec_file.write_text(dump_spec(before), encoding="utf-8")
    run.write_result({"train_loss": 1.0})
    run.mark_done()
    assert previous_run(before, run) == ("same", [])
    threads = load_spec(_spec(max_steps=2, seed=1, cpu_threads=2) | {"output": {"dir": str(tmp_path / "run")}})
    assert previous_run(threads, run) == ("same", [])  # how many threads computed it is not what the run is
    other = load_spec(_spec(max_steps=3, seed=1) | {"output": {"dir": str(tmp_path / "run")}})
    assert previous_run(other, run)[0] == "different"
