"""Checkpoints and resume: kill -9 mid-run, rerun the same spec, get the uninterrupted run's result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kubetune import constants as C
from kubetune.events import RunDir
from kubetune.spec import load_spec
from kubetune.training.checkpoints import complete_checkpoints, find_resume_checkpoint, incomplete_checkpoints, rotate_checkpoints
from kubetune.errors import TrainError

from .conftest import events, run_worker_subprocess, small, worker_command, write_spec

C_EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"

STEPS = 12


def _fault_spec(tiny_job, out_dir):
    spec = small(
        tiny_job,
        training={"max_steps": STEPS, "save_steps": 3, "batch_size": 8, "max_seq_length": 96, "save_total_limit": 3},
        method={"type": "lora", "lora": {"dropout": 0.1}},  # dropout: the RNG state must be restored too
    )
    spec["output"] = {"dir": str(out_dir)}
    return spec


def _kill_after_first_checkpoint(spec_file, run_dir) -> int:
    """Start the worker, SIGKILL it right after its first complete checkpoint; return the newest step on disk."""
    proc = subprocess.Popen(worker_command(spec_file), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            if complete_checkpoints(run_dir / C.CHECKPOINTS_DIR):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            assert proc.poll() is None, "the worker ended before its first checkpoint"
            time.sleep(0.02)
        else:
            pytest.fail("no checkpoint within 240s")
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / C.DONE_FILE).exists() and not (run_dir / C.RESULT_FILE).exists()
    steps = [int(p.name.split("-")[1]) for p in complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)]
    assert steps and max(steps) < STEPS - 1, "killed too late: the run had (nearly) finished"
    return max(steps)


def test_kill_9_mid_run_then_rerun_matches_an_uninterrupted_run(tiny_job, tmp_path):
    # The uninterrupted reference, same seed.
    ref_dir = tmp_path / "reference"
    ref = run_worker_subprocess(write_spec(_fault_spec(tiny_job, ref_dir), tmp_path / "ref.yaml"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = json.loads((ref_dir / C.RESULT_FILE).read_text())

    run_dir = tmp_path / "faulty"
    spec_file = write_spec(_fault_spec(tiny_job, run_dir), tmp_path / "faulty.yaml")
    newest = _kill_after_first_checkpoint(spec_file, run_dir)

    # A half-written newer checkpoint left in place (as a crash during a save leaves it): no marker, torn file.
    torn = run_dir / C.CHECKPOINTS_DIR / f"checkpoint-{STEPS - 1}"
    shutil.copytree(run_dir / C.CHECKPOINTS_DIR / f"checkpoint-{newest}", torn)
    (torn / C.CHECKPOINT_COMPLETE).unlink()
    weights = torn / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    rerun = run_worker_subprocess(spec_file)  # the same spec, unchanged: training.resume is auto
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    result = json.loads((run_dir / C.RESULT_FILE).read_text())

    evs = events(run_dir)
    warnings = [e["message"] for e in evs if e["type"] == "warning"]
    assert any(f"ignoring incomplete checkpoint {torn.name}" in w for w in warnings), warnings
    resumed = [e for e in evs if e["type"] == "checkpoint" and (e.get("data") or {}).get("resume")]
    assert resumed and resumed[-1]["data"]["step"] == newest  # the newest complete one, not the torn one
    assert result["resumed_from"].endswith(f"checkpoint-{newest}") and result["resumed_at_step"] == newest

    # It ends at the planned step count with the uninterrupted run's numbers.
    assert result["global_step"] == result["total_steps"] == reference["global_step"] == STEPS
    assert [x["step"] for x in result["losses"]] == list(range(1, STEPS + 1))
    for mine, theirs in zip(result["losses"], reference["losses"]):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-5), mine["step"]
    assert result["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-4)
    assert result["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-4)
    assert result["best_checkpoint"]["step"] == reference["best_checkpoint"]["step"]
    status = json.loads((run_dir / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_SUCCEEDED and status["step"] == STEPS
    assert not incomplete_checkpoints(run_dir / C.CHECKPOINTS_DIR)


def test_rerun_of_a_finished_run_does_not_train_again(tiny_job, run_inprocess, capsys):
    spec = small(tiny_job, training={"max_steps": 2, "save_steps": 2})
    rc, run_dir, first = run_inprocess(spec)
    assert rc == 0
    kept = (run_dir / C.RESULT_FILE).read_bytes()
    seen = len(events(run_dir))
    rc, _, second = run_inprocess(spec)
    assert rc == 0
    assert "already holds a finished run of this spec: nothing to do" in capsys.readouterr().out
    assert (run_dir / C.RESULT_FILE).read_bytes() == kept and second == first  # the result is the first run's
    assert len(events(run_dir)) == seen  # nothing ran: no new events, no new checkpoints
    assert [p.name for p in complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)] == ["checkpoint-2"]


def test_resume_never_starts_over_and_a_path_must_be_complete(tiny_job, tmp_path):
    job = load_spec(small(tiny_job))
    run = RunDir(job.output_dir)
    ckpts = run.checkpoints_dir
    for step in (2, 4):
        (ckpts / f"checkpoint-{step}").mkdir(parents=True)
        (ckpts / f"checkpoint-{step}" / C.CHECKPOINT_COMPLETE).write_text(json.dumps({"step": step}))
    (ckpts / "checkpoint-6").mkdir()  # incomplete
    assert find_resume_checkpoint(job, run).name == "checkpoint-4"
    assert not (ckpts / "checkpoint-6").exists()  # removed, never loaded

    never = load_spec(small(tiny_job, training={"resume": "never"}))
    assert find_resume_checkpoint(never, run) is None
    assert not complete_checkpoints(ckpts)  # earlier checkpoints cannot be picked up by mistake later

    (tmp_path / "half").mkdir()
    bad = load_spec(small(tiny_job, training={"resume": str(tmp_path / "half")}))
    with pytest.raises(TrainError, match="training.resume: .* is not a complete checkpoint directory"):
        find_resume_checkpoint(bad, run)


def test_a_checkpoint_of_another_method_is_refused(tiny_job):
    job = load_spec(small(tiny_job))
    run = RunDir(job.output_dir)
    ck = run.checkpoints_dir / "checkpoint-2"
    ck.mkdir(parents=True)
    (ck / C.CHECKPOINT_COMPLETE).write_text(json.dumps({"step": 2, "fingerprint": "0123456789abcdef"}))
    with pytest.raises(TrainError, match="different model or method"):
        find_resume_checkpoint(job, run)


def test_rotation_keeps_the_newest_and_the_best(tmp_path):
    for step, loss in ((2, 1.0), (4, 0.5), (6, 0.9), (8, 0.8)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / C.CHECKPOINT_COMPLETE).write_text(json.dumps({"step": step, "eval_loss": loss}))
    removed = rotate_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["checkpoint-2"]
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]


@pytest.mark.parametrize("method", ["lora", "dora", "qlora", "full"])
def test_loading_the_model_never_changes_the_spec_or_its_fingerprint(tiny_job, tiny_model, method):
    """PEFT extends LoraConfig's lists in place; a spec list handed to it made every checkpoint unresumable
    whenever modules_to_save was set (the quickstart included): the fingerprint changed during training."""
    from kubetune.training.checkpoints import checkpoint_fingerprint
    from kubetune.training.model import device_info, load_model

    lora = {"r": 8, "alpha": 16, "modules_to_save": ["embed_tokens"], "target_modules": ["q_proj", "v_proj"]}
    job = load_spec(tiny_job(method={"type": method, **({"lora": lora} if method != "full" else {})}))
    before = (checkpoint_fingerprint(job), job.method.model_dump(mode="json"))
    load_model(job, tiny_model, device_info())
    assert (checkpoint_fingerprint(job), job.method.model_dump(mode="json")) == before


def test_the_quickstart_spec_resumes_from_its_own_checkpoint(tmp_path):
    """The quickstart's spec (modules_to_save: [embed_tokens]), interrupted after a checkpoint, continues from it."""
    from kubetune.worker import run_worker

    quick = load_spec(str(C_EXAMPLES / "quickstart.yaml"), ["training.epochs=1", "training.save_steps=4", "training.max_steps=8",
                                                       f"output.dir={tmp_path / 'run'}"])
    assert run_worker(quick.with_overrides(["training.max_steps=4"])) == 0
    (tmp_path / "run" / C.DONE_FILE).unlink()  # as if it had been stopped right after that checkpoint
    assert run_worker(quick) == 0
    resumed = [ev for ev in RunDir(tmp_path / "run").read_events() if (ev.get("data") or {}).get("resume")]
    assert resumed and resumed[-1]["data"]["step"] == 4


# --- resume with every method, modules_to_save, and the quickstart -----------------------------
def _method_spec(tiny_job, method: str, out_dir):
    lora = {"modules_to_save": ["embed_tokens"]} if method != "full" else {}
    return small(
        tiny_job,
        method={"type": method, "lora": lora} if lora else {"type": method},
        training={"max_steps": 4, "save_steps": 2, "batch_size": 2, "max_seq_length": 48},
        output={"dir": str(out_dir)},
    )


@pytest.mark.parametrize("method", ["full", "lora", "qlora", "dora"])
def test_every_method_resumes_from_its_checkpoint_and_matches_an_uninterrupted_run(tiny_job, tmp_path, method):
    """Issue 14: PEFT extended the spec's modules_to_save in place, so no checkpoint's fingerprint matched again.

    The interrupted run is the reference's run directory as it was right after checkpoint-2 (its newer
    checkpoint and outputs removed): exactly what a worker killed after that checkpoint leaves.
    """
    from kubetune.worker import run_worker

    ref_dir = tmp_path / "reference"
    job = load_spec(_method_spec(tiny_job, method, ref_dir))
    before = job.model_dump(mode="json")
    old = signal.getsignal(signal.SIGTERM)
    try:
        assert run_worker(job) == 0, (ref_dir / C.EVENTS_FILE).read_text()[-3000:]
    finally:
        signal.signal(signal.SIGTERM, old)
    assert job.model_dump(mode="json") == before  # no library changed the spec it was handed
    reference = json.loads((ref_dir / C.RESULT_FILE).read_text())

    run_dir = tmp_path / "interrupted"
    shutil.copytree(ref_dir, run_dir)
    for name in ("checkpoint-4",):
        shutil.rmtree(run_dir / C.CHECKPOINTS_DIR / name)
    for name in (C.RESULT_FILE, C.DONE_FILE):
        (run_dir / name).unlink()
    rerun = load_spec(_method_spec(tiny_job, method, run_dir))  # a fresh load of the same spec, as a rerun does
    try:
        rc = run_worker(rerun)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert rc == 0, (run_dir / C.EVENTS_FILE).read_text()[-3000:]
    result = json.loads((run_dir / C.RESULT_FILE).read_text())
    assert result["resumed_at_step"] == 2 and result["global_step"] == 4
    for mine, theirs in zip(result["losses"], reference["losses"], strict=True):
        assert mine["step"] == theirs["step"] and mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4, abs=1e-5), mine
    assert result["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-4)
    # issue 14 (12h): the whole run's tokens, not only those trained after the resume
    assert reference["tokens"] > 0 and result["tokens"] == reference["tokens"]


def test_the_quickstart_run_twice_recognises_and_resumes_its_own_checkpoints(tmp_path, kubetune_cli):
    """`kubetune run examples/quickstart.yaml` twice, then the README's SDK snippet on the same run directory."""
    import kubetune

    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    out = tmp_path / "quickstart"
    short = [f"output.dir={out}", "training.save_steps=1"]
    cmd = [*kubetune_cli, "run", str(quickstart), *(a for o in [*short, "training.max_steps=2"] for a in ("--set", o))]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # the same command again
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "different model or method" not in second.stdout + second.stderr
    again = json.loads((out / C.RESULT_FILE).read_text())
    assert again["global_step"] == 2 and again["resumed_at_step"] is None  # recognised: not trained again
    assert "nothing to do" in second.stdout + second.stderr

    # the README's SDK snippet, continuing from the quickstart's own checkpoint in a new run directory
    client = kubetune.Client("local")  # README: client.submit(kubetune.load_spec("examples/quickstart.yaml", [...]))
    ckpt = out / C.CHECKPOINTS_DIR / "checkpoint-2"
    more = tmp_path / "more"
    ref = client.submit(kubetune.load_spec(quickstart, [f"output.dir={more}", f"training.resume={ckpt}", "training.max_steps=3"]))
    st = client.wait(ref, timeout=600)
    assert st.state == C.STATE_SUCCEEDED, st.reason
    resumed = json.loads((more / C.RESULT_FILE).read_text())
    assert resumed["resumed_at_step"] == 2 and resumed["global_step"] == 3  # it continued from step 2