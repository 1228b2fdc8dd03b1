"""Preemption: SIGTERM (an eviction, a spot node going away, `kubetune run` killed) saves a checkpoint at the next
step boundary and ends the job `preempted`; a rerun resumes from it. `kubetune cancel` stays a cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kubetune import Client
from kubetune import constants as C
from kubetune import preemption
from kubetune.training.checkpoints import checkpoint_step, complete_checkpoints, verify_checkpoint
from kubetune.training.distributed import terminated_state

from .conftest import events, run_worker_subprocess, small, status, worker_command, write_spec

SAVE_STEPS = 10


def _long_spec(tiny_job, max_steps: int = 60, save_steps: int = SAVE_STEPS):
    return small(
        tiny_job,
        dataset={"eval_split": 0.0},
        training={"max_steps": max_steps, "save_steps": save_steps, "batch_size": 2, "max_seq_length": 48},
    )


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process ended (exit {proc.returncode}) before {what}")
        time.sleep(0.02)
    pytest.fail(f"no {what} within {timeout:.0f}s")


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _group_members(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.strip().splitlines() if line.strip() and "Z" not in line.split()[1]]


def test_sigterm_mid_training_saves_a_checkpoint_ends_preempted_and_a_rerun_resumes(tiny_job, tmp_path):
    run_dir = tmp_path / "run"
    spec_file = write_spec(_long_spec(tiny_job), tmp_path / "job.yaml")
    ckpts = run_dir / C.CHECKPOINTS_DIR
    log = tmp_path / "worker.out"
    with open(log, "w") as f:
        proc = subprocess.Popen(worker_command(spec_file), stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: complete_checkpoints(ckpts), 240, "a periodic checkpoint", proc)
        os.kill(proc.pid, signal.SIGTERM)  # what the kubelet does on eviction
        proc.wait(timeout=C.PREEMPT_SAVE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "Traceback" not in out
    st = status(run_dir)
    assert st["state"] == C.STATE_PREEMPTED and st["extra"]["exit_code"] == 143
    saved = complete_checkpoints(ckpts)[-1]
    step = checkpoint_step(saved)
    assert SAVE_STEPS < step < 60 and step % SAVE_STEPS, step  # newer than the last periodic one
    assert verify_checkpoint(saved) is None and st["extra"]["checkpoint"] == str(saved)
    assert f"saved {saved.name} at step {step}" in st["reason"]
    assert not (run_dir / C.RESULT_FILE).exists() and not (run_dir / C.DONE_FILE).exists()
    assert any((e.get("data") or {}).get("preempted") for e in events(run_dir) if e["type"] == "warning")

    rerun = run_worker_subprocess(spec_file)  # the same spec: training.resume is auto
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    result = json.loads((run_dir / C.RESULT_FILE).read_text())
    assert result["resumed_at_step"] == step and result["global_step"] == 60
    assert [x["step"] for x in result["losses"]] == list(range(1, 61))
    assert status(run_dir)["state"] == C.STATE_SUCCEEDED


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_kubetune_run_killed_in_the_foreground_stops_its_worker_after_a_checkpoint(tiny_job, tmp_path, kubetune_cli, sig):
    run_dir = tmp_path / "run"
    spec_file = write_spec(_long_spec(tiny_job, max_steps=5000), tmp_path / "job.yaml")  # output.dir: tmp_path / "run"
    log = tmp_path / "cli.out"
    with open(log, "w") as f:
        cli = subprocess.Popen([*kubetune_cli, "run", str(spec_file)], stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: (run_dir / C.STATUS_FILE).is_file() and status(run_dir).get("step", 0) >= 2, 240, "training steps", cli)
        worker = status(run_dir)["pid"]
        assert _alive(worker)
        cli.send_signal(sig)  # the terminal closed, or the shell / a supervisor stopped `kubetune run`
        cli.wait(timeout=C.PREEMPT_SAVE_TIMEOUT_S + 30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    out = log.read_text()
    assert cli.returncode == 128 + sig, out[-3000:]
    assert not _alive(worker) and not _group_members(worker)  # no worker trains on, orphaned
    st = status(run_dir)
    assert st["state"] == C.STATE_PREEMPTED, st
    saved = complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)
    assert saved and checkpoint_step(saved[-1]) >= 2 and verify_checkpoint(saved[-1]) is None


def test_kubetune_cancel_stays_a_cancel_and_saves_nothing(tiny_job):
    client = Client()
    # no periodic save within reach: any checkpoint found afterwards was written because of the cancel
    ref = client.submit(_long_spec(tiny_job, max_steps=5000, save_steps=4000))
    run_dir = ref.run_dir
    _wait(lambda: client.status(ref).step >= 2, 240, "training steps")
    client.cancel(ref)
    st = client.status(ref)
    assert st.state == C.STATE_CANCELLED
    assert not complete_checkpoints(Path(run_dir) / C.CHECKPOINTS_DIR)  # a cancel does not wait for a save
    assert not any((e.get("data") or {}).get("preempted") for e in client.events(ref))
    assert not _group_members(ref.extra["pid"])


def test_what_a_sigterm_means(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert preemption.sigterm_kind(tmp_path) == "preempt"
    preemption.request_cancel(tmp_path, os.getpid())
    assert preemption.sigterm_kind(tmp_path) == "cancel"
    preemption.request_cancel(tmp_path, 999999999)  # a stale request for another process is not ours
    assert preemption.sigterm_kind(tmp_path) == "preempt"
    # under torchrun: only a preempted kubetune launcher makes a SIGTERM a preemption
    marker = tmp_path / "preempted-launcher"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv(C.ENV_PREEMPT_FILE, str(marker))
    assert preemption.sigterm_kind(tmp_path) == "stopped"
    marker.touch()
    assert preemption.sigterm_kind(tmp_path) == "preempt"
    monkeypatch.setenv(C.ENV_LAUNCHER_PID, "4242")
    preemption.request_cancel(tmp_path, 4242)  # `kubetune cancel` signals the launcher
    assert preemption.sigterm_kind(tmp_path) == "cancel"

    assert terminated_state(signal.SIGTERM, "cancel")[0] == C.STATE_CANCELLED
    assert terminated_state(signal.SIGTERM, "preempt")[0] == C.STATE_PREEMPTED
    assert terminated_state(signal.SIGTERM, "stopped")[0] == C.STATE_FAILED  # torchrun ending the survivors
    assert C.STATE_PREEMPTED in C.TERMINAL_STATES
    assert C.K8S_TERMINATION_GRACE_SECONDS > C.PREEMPT_SAVE_TIMEOUT_S


def test_outside_the_training_loop_a_preemption_is_not_deferred():
    preemption.disarm()
    assert not preemption.request(signal.SIGTERM)  # the worker leaves at once: nothing newer to save
    preemption.arm()
    try:
        assert preemption.request(signal.SIGTERM) and preemption.agreed() and preemption.in_progress()
        assert 0 < preemption.seconds_left() <= C.PREEMPT_SAVE_TIMEOUT_S
    finally:
        preemption.arm()  # forgets it
        preemption.disarm()
    assert not preemption.in_progress()
