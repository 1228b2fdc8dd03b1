"""Checkpoint integrity: the marker records every file's size and digest, resume verifies them, falls back past a
damaged checkpoint, and a checkpoint that cannot be loaded is one clear error (exit 2), never a traceback."""

from __future__ import annotations

import json
import time

import pytest

from kubetune import constants as C
from kubetune.events import RunDir
from kubetune.spec import load_spec
from kubetune.storage import OutputSync
from kubetune.training.checkpoints import (
    complete_checkpoints,
    find_resume_checkpoint,
    mark_complete,
    read_marker,
    verify_checkpoint,
)
from kubetune.errors import TrainError

from .conftest import events, run_worker_subprocess, small, status, write_spec


def _spec(tiny_job, **training):
    return small(tiny_job, training={"max_steps": 4, "save_steps": 2, "batch_size": 2, "max_seq_length": 48, **training})


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _forget_outputs(run_dir) -> None:
    """The run directory as a worker killed after its checkpoints leaves it (no result, no DONE)."""
    for name in (C.RESULT_FILE, C.DONE_FILE):
        (run_dir / name).unlink(missing_ok=True)


def test_the_marker_records_every_file_with_its_size_and_sha256(tiny_job, run_inprocess):
    rc, run_dir, _ = run_inprocess(_spec(tiny_job))
    assert rc == 0
    for ckpt in complete_checkpoints(run_dir / C.CHECKPOINTS_DIR):
        files = read_marker(ckpt)["files"]
        on_disk = {p.relative_to(ckpt).as_posix(): p for p in ckpt.rglob("*") if p.is_file() and p.name != C.CHECKPOINT_COMPLETE}
        assert set(files) == set(on_disk) and {"adapter_model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(files)
        for rel, rec in files.items():
            assert rec["size"] == on_disk[rel].stat().st_size
            assert len(rec["sha256"]) == 64  # the tiny model's files are all below CHECKPOINT_DIGEST_MAX_BYTES
        assert verify_checkpoint(ckpt) is None


@pytest.mark.parametrize("damaged", ["adapter_model.safetensors", "optimizer.pt"])
def test_a_truncated_newest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before(tiny_job, run_inprocess, damaged):
    """Issue 14: a truncated adapter was a SafetensorError traceback on every rerun, forever."""
    spec = _spec(tiny_job)
    rc, run_dir, first = run_inprocess(spec)
    assert rc == 0
    ckpts = run_dir / C.CHECKPOINTS_DIR
    _truncate(ckpts / "checkpoint-4" / damaged)  # a torn copy, a disk that lost the tail
    _forget_outputs(run_dir)

    rc, _, result = run_inprocess(spec)
    assert rc == 0, (run_dir / C.EVENTS_FILE).read_text()[-3000:]
    assert result["resumed_at_step"] == 2 and result["global_step"] == 4
    assert [x["loss"] for x in result["losses"]] == pytest.approx([x["loss"] for x in first["losses"]], rel=1e-4)
    warnings = [e for e in events(run_dir) if e["type"] == "warning" and "damaged" in e.get("message", "")]
    assert len(warnings) == 1
    assert str(ckpts / "checkpoint-4") in warnings[0]["message"] and f"{damaged} has" in warnings[0]["message"]
    aside = ckpts / f"{C.CHECKPOINT_QUARANTINE_PREFIX}checkpoint-4"
    assert warnings[0]["data"]["moved_to"] == str(aside) and aside.is_dir()  # kept for inspection, out of the way
    assert [p.name for p in complete_checkpoints(ckpts)] == ["checkpoint-2", "checkpoint-4"]  # 4 trained again
    assert verify_checkpoint(ckpts / "checkpoint-4") is None


def test_a_checkpoint_whose_bytes_changed_but_not_its_size_is_caught_by_its_digest(tiny_job, run_inprocess):
    rc, run_dir, _ = run_inprocess(_spec(tiny_job))
    assert rc == 0
    weights = run_dir / C.CHECKPOINTS_DIR / "checkpoint-4" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in the tensor data: same size, still loads, wrong weights
    weights.write_bytes(bytes(data))
    assert verify_checkpoint(weights.parent) == "adapter_model.safetensors does not match the sha256 recorded when it was written"
    job = load_spec(_spec(tiny_job))
    assert find_resume_checkpoint(job, RunDir(run_dir)).name == "checkpoint-2"


def test_no_intact_checkpoint_is_a_clear_error_naming_them(tiny_job, tmp_path):
    run_dir = tmp_path / "run"
    spec_file = write_spec(_spec(tiny_job), tmp_path / "job.yaml")  # output.dir is tmp_path / "run"
    first = run_worker_subprocess(spec_file)
    assert first.returncode == 0, first.stderr[-3000:]
    for ckpt in complete_checkpoints(run_dir / C.CHECKPOINTS_DIR):
        _truncate(ckpt / "adapter_model.safetensors")
    _forget_outputs(run_dir)

    again = run_worker_subprocess(spec_file)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "Traceback" not in again.stdout + again.stderr
    st = status(run_dir)
    assert st["state"] == C.STATE_FAILED
    assert "no checkpoint in" in st["reason"] and "is intact" in st["reason"] and "checkpoint-4: adapter_model.safetensors has" in st["reason"]
    assert "training.resume=never" in again.stderr  # the hint says what to do
    assert [p.name for p in complete_checkpoints(run_dir / C.CHECKPOINTS_DIR)] == ["checkpoint-2", "checkpoint-4"]  # left in place


@pytest.mark.parametrize("damaged", ["adapter_model.safetensors", "optimizer.pt", "rng_state.pth"])
def test_a_checkpoint_that_cannot_be_loaded_is_a_clear_error_not_a_traceback(tiny_job, tmp_path, damaged):
    """A marker without file records (written before kubetune recorded them) is accepted unverified; when the
    files behind it are damaged, loading them fails with a TrainError naming the checkpoint."""
    run_dir = tmp_path / "run"
    spec_file = write_spec(_spec(tiny_job), tmp_path / "job.yaml")  # output.dir is tmp_path / "run"
    first = run_worker_subprocess(spec_file)
    assert first.returncode == 0, first.stderr[-3000:]
    newest = run_dir / C.CHECKPOINTS_DIR / "checkpoint-4"
    old_marker = {k: v for k, v in read_marker(newest).items() if k != "files"}
    (newest / C.CHECKPOINT_COMPLETE).write_text(json.dumps(old_marker))
    assert verify_checkpoint(newest) is None  # unverifiable, hence accepted
    _truncate(newest / damaged)
    (run_dir / C.RESULT_FILE).unlink()
    spec = load_spec(spec_file, ["training.max_steps=6"])  # a longer run: checkpoint-4 must be loaded to continue
    write_spec(spec.model_dump(mode="json"), spec_file)

    again = run_worker_subprocess(spec_file)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-3000:]
    assert "Traceback" not in again.stdout + again.stderr
    reason = status(run_dir)["reason"]
    assert f"checkpoint {newest} cannot be loaded to resume from" in reason, reason
    assert f"move {newest} aside" in again.stderr


def test_markers_without_file_records_are_accepted_and_a_bad_marker_is_not(tmp_path):
    old = tmp_path / "checkpoint-2"
    old.mkdir()
    (old / "optimizer.pt").write_bytes(b"x")
    (old / C.CHECKPOINT_COMPLETE).write_text(json.dumps({"step": 2, "fingerprint": "0123456789abcdef"}))
    assert verify_checkpoint(old) is None
    (old / C.CHECKPOINT_COMPLETE).write_text("{not json")
    assert "marker is missing or unreadable" in verify_checkpoint(old)


def test_a_damaged_remote_checkpoint_is_not_pulled_and_an_older_intact_one_is(tmp_path):
    """output.uri checkpoints are verified after the download, against the marker written beside them."""
    remote = tmp_path / "remote"
    run = tmp_path / "run"
    events_seen = []
    sync = OutputSync(f"file://{remote}", emit=events_seen.append)
    for step in (2, 4):
        ckpt = run / C.CHECKPOINTS_DIR / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_model.safetensors").write_bytes(bytes(range(256)) * step)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        mark_complete(ckpt, "0123456789abcdef", step=step)
        sync.checkpoint_saved(ckpt)
        assert sync.wait(30)
    sync.close(30)
    _truncate(remote / C.CHECKPOINTS_DIR / "checkpoint-4" / "adapter_model.safetensors")

    fresh = RunDir(tmp_path / "rerun")
    from kubetune.training.checkpoints import pull_checkpoint

    pulled = pull_checkpoint(OutputSync(f"file://{remote}"), fresh)
    assert pulled == fresh.checkpoints_dir / "checkpoint-2" and verify_checkpoint(pulled) is None
    assert [p.name for p in fresh.checkpoints_dir.iterdir()] == ["checkpoint-2"]  # nothing damaged, no scratch
    warned = [e["message"] for e in fresh.read_events() if e["type"] == "warning"]
    assert len(warned) == 1 and "remote checkpoint-4 is damaged (adapter_model.safetensors has" in warned[0]

    # a damaged local copy does not shadow an intact remote one of the same step
    _truncate(pulled / "adapter_model.safetensors")
    again = pull_checkpoint(OutputSync(f"file://{remote}"), fresh)
    assert again == pulled and verify_checkpoint(again) is None


def test_digests_cost_little_on_the_tiny_model(tiny_job, run_inprocess):
    """The marker's hashing runs in the training loop: measure it on a real checkpoint (printed, not a timing test)."""
    rc, run_dir, _ = run_inprocess(_spec(tiny_job, max_steps=2))
    assert rc == 0
    ckpt = run_dir / C.CHECKPOINTS_DIR / "checkpoint-2"
    size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    started = time.perf_counter()
    mark_complete(ckpt, read_marker(ckpt)["fingerprint"], step=2)
    print(f"mark_complete: {size / 2**20:.1f} MiB in {time.perf_counter() - started:.3f}s")
    assert verify_checkpoint(ckpt) is None
