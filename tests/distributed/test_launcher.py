"""The launcher's decisions, without training: which rank's failure is the job's reason, what the local
backend starts, what the topology does to the batch, and how a rendezvous that never completes ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kubetune import constants as C
from kubetune.backends.local import _worker_command
from kubetune.errors import BackendError, TrainError
from kubetune.events import RunDir
from kubetune.launch import RankFailure, failure_reason, launch, root_cause
from kubetune.spec import load_spec
from kubetune.training import distributed

from .conftest import cli_env, dist_spec, write_spec


# --- the root cause ----------------------------------------------------------------------------
def test_the_rank_with_its_own_error_is_the_cause_not_the_ranks_that_lost_it():
    own = RankFailure(rank=3, exitcode=1, message="RuntimeError: CUDA error: an illegal memory access", time=10.5)
    peer = RankFailure(rank=0, exitcode=1, message="RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:5555", time=10.1)
    stopped = RankFailure(rank=1, exitcode=-signal.SIGTERM, time=9.0)
    first, reason = failure_reason([peer, stopped, own])
    assert first is own  # although the peer error and the SIGTERM came earlier
    assert reason == "rank 3 failed: RuntimeError: CUDA error: an illegal memory access (2 other ranks stopped after it)"


def test_of_two_own_errors_the_earlier_one_wins_and_a_kill_is_explained():
    late = RankFailure(rank=0, exitcode=1, message="ValueError: late", time=20.0)
    killed = RankFailure(rank=2, exitcode=-signal.SIGKILL, time=12.0)
    first, reason = failure_reason([late, killed])
    assert first is killed
    assert reason.startswith("rank 2 was killed by SIGKILL (killed from outside, or by the kernel's out-of-memory killer")


def test_a_collective_timeout_names_the_setting_and_the_silent_rank():
    waited = RankFailure(rank=0, exitcode=1, message="RuntimeError: [gloo] Timed out waiting 10000ms for recv operation", time=5)
    silent = RankFailure(rank=1, exitcode=-signal.SIGTERM, time=6)
    first, reason = failure_reason([waited, silent], collective_timeout=10)
    assert first is waited
    assert reason.startswith("rank 0 timed out waiting for the other ranks (10 s, resources.collective_timeout_seconds): rank 1 stopped responding")


def test_only_peer_errors_say_the_cause_is_elsewhere():
    first, reason = failure_reason([RankFailure(rank=4, exitcode=1, message="DistBackendError: NCCL communicator was aborted")])
    assert first.rank == 4 and "another rank, which failed first" in reason and "that node's log" in reason
    assert root_cause([RankFailure(rank=1, exitcode=-signal.SIGTERM), RankFailure(rank=0, exitcode=-signal.SIGTERM)]).rank == 0


# --- topology ----------------------------------------------------------------------------------
@pytest.mark.parametrize("procs, accumulation", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_the_global_batch_is_the_same_whatever_the_topology(tmp_path, procs, accumulation):
    spec = dist_spec(tmp_path, procs=procs, batch_size=1)
    job = load_spec(spec)
    assert (job.global_batch, job.accumulation_steps, job.resources.world_size) == (8, accumulation, procs)
    assert job.steps_per_epoch(300) == 38  # so the step count, and the learning-rate schedule, do not change either


def test_a_global_batch_the_processes_cannot_share_is_refused(tmp_path):
    from kubetune.errors import SpecError

    with pytest.raises(SpecError, match=r"global_batch_size \(8\) must be a multiple of training.batch_size x processes \(4 x 3 = 12\)"):
        load_spec(dist_spec(tmp_path, procs=3))


def test_the_local_backend_starts_the_launcher_for_several_processes(tmp_path):
    run = RunDir(tmp_path / "run")
    one = _worker_command(load_spec(dist_spec(tmp_path, procs=1)), run)
    assert one[1:3] == ["-m", "kubetune.worker"]
    two = _worker_command(load_spec(dist_spec(tmp_path, procs=2)), run)
    assert two[1:3] == ["-m", "kubetune.launch"]
    assert "--standalone" in two and "--nproc-per-node=2" in two and "--max-restarts=0" in two
    assert two[two.index("--max-restarts=0") + 1 :][:2] == ["-m", "kubetune.worker"]

    nodes = dist_spec(tmp_path, procs=1)
    nodes["resources"]["nodes"] = 2
    with pytest.raises(BackendError, match="resources.nodes=2: the local backend runs one node") as e:
        _worker_command(load_spec(nodes), run)
    assert "docs/distributed.md" in str(e.value)


# --- strategies --------------------------------------------------------------------------------
def test_strategies_become_trainer_arguments(tmp_path):
    ddp = load_spec(dist_spec(tmp_path, procs=2))
    args = distributed.trainer_args(ddp, {"type": "cuda"})
    assert args == {"ddp_timeout": 1800}  # NCCL on GPUs is the trainer's default
    fsdp = load_spec(dist_spec(tmp_path, procs=2, strategy="fsdp"))
    args = distributed.trainer_args(fsdp, {"type": "cuda"})
    assert args["fsdp"] and args["fsdp_config"]["reshard_after_forward"] is True  # full shard
    with pytest.raises(TrainError, match="training.strategy fsdp needs GPUs"):
        distributed.setup(fsdp, {"type": "cpu"})


def test_fsdp_with_qlora_is_a_spec_error(tmp_path):
    from kubetune.errors import SpecError

    spec = dist_spec(tmp_path, procs=2, strategy="fsdp")
    spec["method"]["type"] = "qlora"
    with pytest.raises(SpecError, match="training.strategy fsdp does not support method.type qlora"):
        load_spec(spec)


# --- rendezvous --------------------------------------------------------------------------------
def test_a_node_whose_peers_never_come_fails_after_the_rendezvous_timeout(tmp_path):
    spec = dist_spec(tmp_path / "run", procs=1)
    spec["resources"]["rendezvous_timeout_seconds"] = 10
    spec_file = write_spec(spec, tmp_path / "spec.yaml")
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "kubetune.launch", "--nnodes=2", "--node-rank=0", "--nproc-per-node=1",
         "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "-m", "kubetune.worker", "--spec", str(spec_file)],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )
    took = time.time() - started
    assert proc.returncode == 1
    assert "error: the nodes did not all join within 10 s (resources.rendezvous_timeout_seconds)" in proc.stderr, proc.stderr[-3000:]
    assert "--node-rank" in proc.stderr  # the hint says how to start the other node
    assert 10 <= took < 60, took


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_launch_with_another_world_size_than_the_spec_is_refused(tmp_path, monkeypatch):
    job = load_spec(dist_spec(tmp_path, procs=2))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("WORLD_SIZE", "2")
    distributed.check_topology(job)  # as planned
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(TrainError, match=r"started 4 processes in all, but the spec says resources.nodes x resources.processes_per_node = 1 x 2 = 2") as e:
        distributed.setup(job, {"type": "cpu"})
    assert "--set resources.nodes=" in str(e.value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    distributed.check_topology(job)  # not under torchrun: nothing to compare


# --- the compatibility entry -------------------------------------------------------------------
def _usage(module: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                          env=cli_env(COLUMNS="100"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: "), proc.stdout[:500]
    words = proc.stdout.split()
    return " ".join(words[2:])  # without "usage:" and the program's name (distributed.py, launch.py)


def test_the_old_entry_point_is_the_same_launcher():
    """Pods rendered by older kubetune versions run `python -m kubetune.distributed`: same options, same help."""
    new = _usage("kubetune.launch")
    assert "--nproc-per-node" in new and "--rdzv-conf" in new  # torchrun's command line
    assert _usage("kubetune.distributed") == new


# --- CPU threads under the launcher ------------------------------------------------------------
@pytest.mark.parametrize("user_omp", [None, "3"])
def test_the_ranks_choose_their_threads_unless_the_user_set_omp_num_threads(tmp_path, monkeypatch, user_omp):
    """torchrun puts OMP_NUM_THREADS=1 into every rank when the user set none; kubetune's launcher marks that 1
    as torchrun's default, so each rank divides the free cores instead, while a user's own value is kept."""
    from torch.distributed import run as torchrun

    from kubetune.cpu import choose_threads

    # launch() writes these into os.environ (in its own process, where it runs for real): setenv first, so that
    # monkeypatch records them and takes them out again after the test, whatever launch() put there.
    for name in (C.ENV_LAUNCHER_PID, C.ENV_PREEMPT_FILE, C.ENV_THREADS_AUTO, "TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    if user_omp is not None:
        monkeypatch.setenv("OMP_NUM_THREADS", user_omp)
    seen: dict = {}

    def fake_torchrun(args):  # what torchrun does to the ranks' environment, then what a rank would choose
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        seen["choice"] = choose_threads(cores=8, load=0.0, processes=2, env=dict(os.environ))

    monkeypatch.setattr(torchrun, "run", fake_torchrun)
    spec = write_spec(dist_spec(tmp_path / "run", procs=2), tmp_path / "job.yaml")
    assert launch(["--standalone", "--nproc-per-node=2", "-m", "kubetune.worker", "--spec", str(spec)]) == 0
    choice = seen["choice"]
    if user_omp is None:
        assert (choice.threads, choice.source) == (4, "auto")  # 8 idle cores, 2 ranks
    else:
        assert (choice.threads, choice.reason) == (3, "OMP_NUM_THREADS=3")
