"""A failing rank ends the whole job promptly, as `failed`, with that rank's error; a killed job resumes.

Faults are injected into one rank only (fault/sitecustomize.py, put on PYTHONPATH): its training step
raises, or never returns. Every job runs through `kubetune run`, as a user starts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kubetune import constants as C
from kubetune.training.checkpoints import complete_checkpoints

from .conftest import (
    cli_env, dist_spec, events, fault_env, kubetune_run, rank_pids, result, status, wait_for, write_spec,
)

pytestmark = pytest.mark.slow

# From the fault to the job's end: the other rank notices at its next collective, torchrun stops it.
BOUND_S = 60


def test_a_rank_that_raises_fails_the_job_with_its_error(tmp_path):
    run_dir = tmp_path / "run"
    spec = write_spec(dist_spec(run_dir, procs=2), tmp_path / "spec.yaml")
    proc = kubetune_run(spec, env=fault_env(rank=1, step=2, mode="raise"))

    assert proc.returncode == 1, proc.stdout[-3000:]
    st = status(run_dir)
    assert st["state"] == C.STATE_FAILED
    # rank 1's own error, not rank 0's "connection closed by peer" nor torchrun's SIGTERM to it
    assert st["reason"].startswith("rank 1 failed: RuntimeError: injected failure on rank 1 at step 2"), st["reason"]
    assert st["extra"]["failed_rank"] == 1
    assert "injected failure on rank 1" in proc.stdout  # `kubetune run` shows it too
    assert not (run_dir / C.DONE_FILE).exists() and not (run_dir / C.RESULT_FILE).exists()
    # the failure came at step 2: the run got that far, and it ended soon after (no hang)
    ev = events(run_dir)
    logged = [e["data"]["step"] for e in ev if e["type"] == "metrics" and "loss" in (e.get("data") or {})]
    assert logged == [1, 2] or logged == [1], logged
    failed_at = next(e["time"] for e in ev if e["type"] == "state" and e["data"].get("state") == C.STATE_FAILED)
    last_progress = max(e["time"] for e in ev if e["type"] in ("metrics", "checkpoint"))
    assert failed_at - last_progress < BOUND_S


def test_a_hung_rank_ends_the_job_after_the_collective_timeout(tmp_path):
    run_dir = tmp_path / "run"
    spec_dict = dist_spec(run_dir, procs=2)
    spec_dict["resources"]["collective_timeout_seconds"] = 10
    spec = write_spec(spec_dict, tmp_path / "spec.yaml")
    started = time.time()
    proc = kubetune_run(spec, env=fault_env(rank=1, step=2, mode="hang"), timeout=240)

    assert proc.returncode == 1, proc.stdout[-3000:]
    st = status(run_dir)
    assert st["state"] == C.STATE_FAILED
    reason = st["reason"]
    assert reason.startswith("rank 0 timed out waiting for the other ranks (10 s, resources.collective_timeout_seconds)"), reason
    assert "rank 1 stopped responding" in reason, reason
    # rank 1 hung at step 2 for an hour: the job ended within the timeout plus a bound instead
    ev = events(run_dir)
    hung_after = max(e["time"] for e in ev if e["type"] in ("metrics", "checkpoint"))
    failed_at = next(e["time"] for e in ev if e["type"] == "state" and e["data"].get("state") == C.STATE_FAILED)
    assert 10 <= failed_at - hung_after < 10 + BOUND_S, failed_at - hung_after
    assert time.time() - started < 240


def test_killing_one_rank_fails_the_job_and_a_rerun_resumes_from_its_checkpoint(tmp_path, two_process_run):
    """kill -9 of rank 1 after checkpoint-2 (a lost node, the OOM killer); the same command again resumes."""
    run_dir = tmp_path / "run"
    spec = write_spec(dist_spec(run_dir, procs=2), tmp_path / "spec.yaml")
    # rank 1 waits at step 3, after checkpoint-2 is complete, so the kill lands at a known point
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubetune.cli", "run", str(spec)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=fault_env(rank=1, step=3, mode="hang"),
    )
    try:
        wait_for(lambda: complete_checkpoints(run_dir / C.CHECKPOINTS_DIR), 240, "a complete checkpoint", proc)
        launcher = wait_for(lambda: (status(run_dir).get("extra") or {}).get("launcher_pid"), 30, "the launcher pid", proc)
        pids = wait_for(lambda: rank_pids(launcher) if len(rank_pids(launcher)) == 2 else None, 30, "both ranks", proc)
        os.kill(pids[1], signal.SIGKILL)
        killed = time.time()
        out, _ = proc.communicate(timeout=BOUND_S)
        assert time.time() - killed < BOUND_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out[-3000:]
    st = status(run_dir)
    assert st["state"] == C.STATE_FAILED
    assert st["reason"].startswith("rank 1 was killed by SIGKILL"), st["reason"]
    assert "out-of-memory killer" in st["reason"]  # the usual culprit, named
    assert "rank 1 was killed by SIGKILL" in out
    assert not (run_dir / C.RESULT_FILE).exists()
    assert [p.name for p in complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)] == ["checkpoint-2"]

    rerun = kubetune_run(spec)  # the same command, no fault: training.resume is auto
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    res = result(run_dir)
    assert res["resumed_at_step"] == 2 and res["global_step"] == 4
    assert status(run_dir)["state"] == C.STATE_SUCCEEDED
    # it continued where it stopped: steps 3 and 4 are those of the uninterrupted 2-process run
    ref_proc, ref_dir = two_process_run
    assert ref_proc.returncode == 0
    reference = {x["step"]: x["loss"] for x in result(ref_dir)["losses"]}
    assert [x["step"] for x in res["losses"]] == [1, 2, 3, 4]
    for x in res["losses"]:
        assert x["loss"] == pytest.approx(reference[x["step"]], rel=1e-4, abs=1e-5), x["step"]
    assert res["eval_loss"] == pytest.approx(result(ref_dir)["eval_loss"], rel=1e-4)


def test_fsdp_on_cpu_is_refused_with_a_clear_error(tmp_path):
    run_dir = tmp_path / "run"
    spec = dist_spec(run_dir, procs=2, strategy="fsdp")
    proc = kubetune_run(write_spec(spec, tmp_path / "spec.yaml"))
    assert proc.returncode == 2, proc.stdout[-3000:]
    reason = status(run_dir)["reason"]
    assert "training.strategy fsdp needs GPUs" in reason and "use training.strategy: ddp on CPU" in reason, reason
    assert "Traceback" not in proc.stdout + proc.stderr


def test_no_rank_outlives_a_launcher_killed_outright(tmp_path):
    """kill -9 of the launcher (the OOM killer, a user): its ranks, in sessions of their own, stop too."""
    run_dir = tmp_path / "run"
    spec = write_spec(dist_spec(run_dir, procs=2, max_steps=400), tmp_path / "spec.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubetune.cli", "run", str(spec)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(),
    )
    try:
        wait_for(lambda: run_dir.joinpath(C.STATUS_FILE).is_file() and (status(run_dir).get("step") or 0) >= 1, 240, "step 1", proc)
        launcher = status(run_dir)["extra"]["launcher_pid"]
        ranks = rank_pids(launcher)
        assert sorted(ranks) == [0, 1]
        os.kill(launcher, signal.SIGKILL)
        wait_for(lambda: not rank_pids(launcher), 10, "the ranks' end")
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in rank_pids(launcher).values() if "launcher" in locals() else ():
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert status(run_dir)["state"] == C.STATE_FAILED
    step = status(run_dir)["step"]
    time.sleep(2)
    assert status(run_dir)["step"] == step  # nothing trains on
