"""Failure help: out-of-memory advice that names spec fields, NaN loss, zero gradients, tracking packages."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from kubetune import constants as C
from kubetune.events import RunDir
from kubetune.spec import load_spec

from .conftest import events, small, status


def _raise_in_training_step(monkeypatch, exc):
    import trl

    def boom(self, *a, **kw):
        raise exc

    monkeypatch.setattr(trl.SFTTrainer, "training_step", boom)


def test_cuda_oom_fails_with_advice_naming_spec_fields(tiny_job, run_inprocess, monkeypatch):
    _raise_in_training_step(monkeypatch, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB total capacity)"))
    rc, run_dir, result = run_inprocess(small(tiny_job, training={"batch_size": 8, "max_seq_length": 512}))
    assert rc == 2 and result is None  # a user-actionable failure, not a bug
    st = status(run_dir)
    assert st["state"] == C.STATE_FAILED
    reason = st["reason"]
    assert "out of memory while training (CUDA out of memory. Tried to allocate 2.00 GiB" in reason
    for advice in (
        "training.batch_size=4 and training.gradient_accumulation_steps=2",
        "training.gradient_checkpointing=true",
        "training.max_seq_length (now 512), e.g. to 256",
        "method.type to qlora",
    ):
        assert advice in reason, reason
    assert "Traceback" not in reason


def test_host_memory_error_and_global_batch_advice(tiny_job, run_inprocess, monkeypatch):
    _raise_in_training_step(monkeypatch, MemoryError())
    spec = small(tiny_job, training={"batch_size": 4, "global_batch_size": 16, "gradient_checkpointing": True}, method={"type": "full"})
    rc, run_dir, _ = run_inprocess(spec)
    assert rc == 2
    reason = status(run_dir)["reason"]
    assert reason.startswith("the host ran out of memory while training")
    assert "training.batch_size=2 (training.global_batch_size=16 stays; accumulation doubles)" in reason
    assert "gradient_checkpointing" not in reason  # already on: no useless advice


def test_cpu_allocator_failure_counts_as_oom_but_other_errors_stay_bugs():
    from kubetune.training.sft import is_out_of_memory

    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_nan_loss_stops_before_saving_broken_weights(tiny_job, run_inprocess, monkeypatch):
    import trl

    real = trl.SFTTrainer.training_step

    def poisoned(self, *a, **kw):
        loss = real(self, *a, **kw)
        return loss * float("nan") if self.state.global_step >= 2 else loss  # the 3rd step goes bad

    monkeypatch.setattr(trl.SFTTrainer, "training_step", poisoned)
    rc, run_dir, _ = run_inprocess(small(tiny_job, training={"max_steps": 6, "save_steps": 1}))
    assert rc == 2
    reason = status(run_dir)["reason"]
    assert "loss became nan at step 3" in reason and "training.learning_rate" in reason
    ckpts = sorted(p.name for p in (run_dir / C.CHECKPOINTS_DIR).glob("checkpoint-*"))
    assert ckpts == ["checkpoint-1", "checkpoint-2"]  # nothing saved from the NaN step on: a rerun resumes at 2


def test_zero_grad_norm_warns_after_several_steps(tiny_job, tmp_path):
    from kubetune.training.progress import ZERO_GRAD_STEPS, Plan, ProgressCallback

    job = load_spec(small(tiny_job))
    run = RunDir(tmp_path / "run")
    cb = ProgressCallback(run, job, {"type": "cpu", "bf16": False, "name": "cpu"}, Plan(10, 4, 3, 9, 3, None), emit=True)
    state = SimpleNamespace(global_step=0, max_steps=9, num_input_tokens_seen=0, epoch=0.0)
    control = SimpleNamespace(should_training_stop=False, should_save=False, should_evaluate=False)
    args = SimpleNamespace(fp16=False)
    cb.on_train_begin(args, state, control)
    for step in range(1, ZERO_GRAD_STEPS + 2):
        state.global_step = step
        cb.on_log(args, state, control, logs={"loss": 2.0, "grad_norm": 0.0, "learning_rate": 1e-3})
    warnings = [e["message"] for e in run.read_events() if e["type"] == "warning"]
    assert len(warnings) == 1 and f"gradient norm has been 0 for {ZERO_GRAD_STEPS} logged steps" in warnings[0]
    assert not control.should_training_stop  # a warning, not a stop


def test_report_to_tensorboard_writes_event_files(tiny_job, run_inprocess):
    pytest.importorskip("tensorboard")
    rc, run_dir, _ = run_inprocess(small(tiny_job, training={"max_steps": 2, "report_to": ["tensorboard"]}))
    assert rc == 0
    files = list((run_dir / C.LOGS_DIR / "tensorboard").rglob("events.out.tfevents.*"))
    assert files and files[0].stat().st_size > 0


def test_report_to_without_the_package_says_what_to_install(tiny_job, run_inprocess):
    if importlib.util.find_spec("mlflow"):
        pytest.skip("mlflow is installed here")
    rc, run_dir, _ = run_inprocess(small(tiny_job, training={"report_to": ["mlflow"]}))
    assert rc == 2
    reason = status(run_dir)["reason"]
    assert "training.report_to: 'mlflow' needs the mlflow package" in reason and "kubetune[tracking]" in reason


def test_report_to_names_are_checked_at_load(tiny_job):
    from kubetune.errors import SpecError

    with pytest.raises(SpecError, match="training.report_to.0"):
        load_spec(small(tiny_job, training={"report_to": ["tensorbored"]}))
