"""Two processes (DDP over gloo) train what one process trains: same global batch and seed, same losses.

The 2-process run goes through `kubetune run`, as a user starts it; the 1-process run takes its batch of 8
as 4 x 2 accumulation steps, the 2-process run as 4 x 2 processes.
"""

from __future__ import annotations

import pytest

from kubetune import constants as C

from .conftest import dist_spec, events, kubetune_run, result, status, write_spec

pytestmark = pytest.mark.slow


def test_two_processes_log_the_losses_of_one_with_the_same_global_batch(two_process_run, tmp_path):
    proc, two_dir = two_process_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one = kubetune_run(write_spec(dist_spec(tmp_path / "one", procs=1), tmp_path / "one.yaml"))
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    r1, r2 = result(tmp_path / "one"), result(two_dir)

    assert r1["global_batch"] == r2["global_batch"] == 8
    assert [x["step"] for x in r1["losses"]] == [x["step"] for x in r2["losses"]] == [1, 2, 3, 4]
    for a, b in zip(r1["losses"], r2["losses"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-4), f"step {a['step']}: 1 process {a['loss']}, 2 processes {b['loss']}"
    assert r2["losses"][-1]["loss"] < r2["losses"][0]["loss"]  # it learned: the match is not two flat lines
    # every process counted: the tokens trained are the same, and the eval loss (gathered over ranks) too
    assert r2["tokens"] == r1["tokens"] > 0
    assert r2["eval_loss"] == pytest.approx(r1["eval_loss"], rel=1e-3)


def test_kubetune_run_with_two_processes_shows_live_progress_and_writes_once(two_process_run):
    proc, run_dir = two_process_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # the plan names the topology, then one line per logged step, as for one process
    assert "global batch 8 = 4 x 2 process(es) x 1" in " ".join(out.split())
    for step in (1, 2, 3, 4):
        assert f"step {step}/4 loss=" in out, out
    assert "succeeded" in out

    st = status(run_dir)
    assert st["state"] == C.STATE_SUCCEEDED and st["extra"]["world_size"] == 2
    # only rank 0 writes: one metrics event per step, one checkpoint event per save, one adapter
    steps = [e["data"]["step"] for e in events(run_dir) if e["type"] == "metrics" and "loss" in (e.get("data") or {})]
    assert steps == [1, 2, 3, 4]
    saved = [e["data"]["step"] for e in events(run_dir) if e["type"] == "checkpoint" and not e["data"].get("removed") and not e["data"].get("resume")]
    assert saved == [2, 4]
    assert (run_dir / C.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    # each rank's RNG state is in the checkpoint, so a resumed run continues every rank where it was
    assert {p.name for p in (run_dir / C.CHECKPOINTS_DIR / "checkpoint-2").glob("rng_state*")} == {"rng_state_0.pth", "rng_state_1.pth"}
