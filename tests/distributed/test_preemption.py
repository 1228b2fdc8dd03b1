"""Preemption of a multi-process job: SIGTERM to kubetune's launcher (what the kubelet sends the pod's main process)
makes every rank save the same step and the job end `preempted`; a rank whose own node was not signalled joins
in; `kubetune cancel` stays a cancel."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from kubetune import Client
from kubetune import constants as C
from kubetune.training.checkpoints import checkpoint_step, complete_checkpoints, verify_checkpoint

from .conftest import ENV, cli_env, dist_spec, events, kubetune_run, result, status, wait_for, write_spec

pytestmark = pytest.mark.slow

SAVE_STEPS = 5


def _launch(spec_file, *extra: str, env: dict | None = None, log=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kubetune.launch", *extra, "-m", "kubetune.worker", "--spec", str(spec_file)],
        stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env or cli_env(),
    )


def _check_preempted(run_dir) -> int:
    st = status(run_dir)
    assert st["state"] == C.STATE_PREEMPTED, st
    saved = complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)[-1]
    step = checkpoint_step(saved)
    assert step > SAVE_STEPS and step % SAVE_STEPS, step  # newer than the last periodic checkpoint
    assert verify_checkpoint(saved) is None
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in saved.iterdir()}  # both ranks saved that step
    assert not (run_dir / C.RESULT_FILE).exists()
    return step


def test_sigterm_to_the_launcher_preempts_every_rank_at_one_step_and_a_rerun_resumes(tmp_path):
    run_dir = tmp_path / "run"
    spec_file = write_spec(dist_spec(run_dir, procs=2, max_steps=40, save_steps=SAVE_STEPS), tmp_path / "spec.yaml")
    with open(tmp_path / "launcher.out", "w") as log:
        launcher = _launch(spec_file, "--standalone", "--nproc-per-node=2", log=log)
    try:
        wait_for(lambda: complete_checkpoints(run_dir / C.CHECKPOINTS_DIR), 240, "a periodic checkpoint", launcher)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=C.PREEMPT_SAVE_TIMEOUT_S + 30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    out = (tmp_path / "launcher.out").read_text()
    assert launcher.returncode == 128 + signal.SIGTERM, out[-3000:]
    step = _check_preempted(run_dir)
    assert "the launcher received SIGTERM" in status(run_dir)["reason"]

    rerun = kubetune_run(spec_file)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    res = result(run_dir)
    assert res["resumed_at_step"] == step and res["global_step"] == 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_preempted_node_stops_the_whole_job_at_one_step(tmp_path):
    """Two nodes on this machine; only node 1's launcher is signalled (its pod was evicted): node 0's rank agrees
    at the next step end, both save, and node 0's launcher (which owns the run directory) records `preempted`."""
    run_dir = tmp_path / "run"
    spec = dist_spec(run_dir, procs=1, max_steps=40, save_steps=SAVE_STEPS)
    spec["resources"]["nodes"] = 2
    spec_file = write_spec(spec, tmp_path / "spec.yaml")
    port = _free_port()
    common = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
    logs = [open(tmp_path / f"node{i}.out", "w") for i in (0, 1)]
    nodes = [_launch(spec_file, *common, f"--node-rank={i}", log=logs[i]) for i in (0, 1)]
    try:
        wait_for(lambda: complete_checkpoints(run_dir / C.CHECKPOINTS_DIR), 240, "a periodic checkpoint", nodes[0])
        nodes[1].send_signal(signal.SIGTERM)
        for p in nodes:
            p.wait(timeout=C.PREEMPT_SAVE_TIMEOUT_S + 30)
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    outs = [(tmp_path / f"node{i}.out").read_text()[-3000:] for i in (0, 1)]
    assert [p.returncode for p in nodes] == [143, 143], "\n\n".join(outs)
    _check_preempted(run_dir)
    assert status(run_dir)["extra"]["launcher_pid"] == nodes[0].pid


def test_kubetune_cancel_of_a_two_process_job_is_a_cancel(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    for key, value in ENV.items():  # the workers inherit this process's environment
        monkeypatch.setenv(key, value)
    client = Client()
    ref = client.submit(dist_spec(run_dir, procs=2, max_steps=5000, save_steps=1000))
    wait_for(lambda: client.status(ref).step >= 2, 240, "training steps")
    client.cancel(ref)
    st = client.status(ref)
    assert st.state == C.STATE_CANCELLED, st
    assert not complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)  # nothing saved on the way out
    assert not any((e.get("data") or {}).get("preempted") for e in events(run_dir))
