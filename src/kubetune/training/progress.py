"""Live progress of a training run: trainer callbacks -> kubetune events, checkpoint completion, health checks.

Every logging step emits a ``metrics`` event with step/total, loss, learning rate, grad norm, tokens/s,
ETA, peak memory and the devices' telemetry (:mod:`.telemetry`: utilization, memory, power) (events.jsonl
and status.json; ``kubetune run`` and ``kubetune status`` show them).
Every evaluation emits eval loss and perplexity. A NaN/inf loss stops the run (and its checkpoint is not
saved); a grad norm of exactly zero for several logged steps is warned about. A preemption
(:mod:`kubetune.preemption`) saves a checkpoint at the next step boundary and stops the run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import preemption
from ..events import EventType, RunDir, make_event
from ..spec import TuneJob
from . import distributed
from .checkpoints import checkpoint_fingerprint, mark_complete, rotate_checkpoints
from .devices import describe
from .telemetry import DeviceSampler, device_text

__all__ = ["Plan", "ProgressCallback", "ZERO_GRAD_STEPS", "perplexity", "peak_memory_mb"]

# Logged steps in a row with a zero grad norm before kubetune warns that nothing is learning.
ZERO_GRAD_STEPS = 5


@dataclass(frozen=True)
class Plan:
    """The run's step budget, computed before training starts."""

    samples: int  # training sequences (rows, or packed sequences)
    global_batch: int  # sequences per optimizer step over all processes
    steps_per_epoch: int  # ceil(samples / global_batch)
    total_steps: int  # max_steps, else ceil(epochs x steps_per_epoch)
    save_steps: int  # checkpoint interval (the last step is always saved)
    eval_steps: int | None  # evaluation interval (None: no evaluation data)

    def describe(self, job: TuneJob) -> str:
        """One line: how many steps, from what (max_steps, or epochs x samples / global batch), and the batch shape."""
        t = job.training
        how = f"training.max_steps={t.max_steps}" if t.max_steps else f"{t.epochs:g} epochs x ceil({self.samples} / {self.global_batch})"
        return f"{self.total_steps} steps ({how}); global batch {self.global_batch} = {t.batch_size} x {job.resources.world_size} process(es) x {job.accumulation_steps} accumulation"


def perplexity(loss: float | None) -> float | None:
    """exp(loss), capped to stay finite; None for None."""
    if loss is None or math.isnan(loss):
        return None
    return round(math.exp(min(loss, 50.0)), 4)


def peak_memory_mb(device: dict) -> float | None:
    """Peak accelerator memory torch allocated (CUDA/ROCm, XPU, HPU; what the MPS driver holds on Apple) or
    peak resident memory of this process (CPU), in MiB."""
    if device["type"] != "cpu":
        import torch

        try:
            if device["type"] == "mps":
                return round(torch.mps.driver_allocated_memory() / 2**20, 1)
            return round(getattr(torch, device["type"]).max_memory_allocated() / 2**20, 1)
        except Exception:  # a device module without allocator statistics
            return None
    try:
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
    except Exception:  # pragma: no cover - not on Linux
        return None


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class ProgressCallback(_callback_base()):  # type: ignore[misc]
    """Turns trainer logs into kubetune events, marks checkpoints complete, and watches the run's health.

    Build it before the model is loaded: it takes the job's checkpoint fingerprint then, before any library
    has seen the spec.

    Args:
        run: the run directory events go to.
        job: the job (fingerprint and rotation settings).
        device: from :func:`kubetune.training.model.device_info`.
        plan: the step budget.
        emit: this process writes the run directory (rank 0).
        sync: an OutputSync that mirrors complete checkpoints to output.uri, or None.
    """

    def __init__(self, run: RunDir, job: TuneJob, device: dict, plan: Plan, *, emit: bool, sync: Any = None) -> None:
        self.run, self.job, self.device, self.plan, self.emit, self.sync = run, job, device, plan, emit, sync
        self.fingerprint = checkpoint_fingerprint(job)
        self.preempted_at: int | None = None  # the step a preemption stopped the run at
        self.t0: float | None = None
        self.step0 = 0
        self.tokens_at_start = 0
        self.tokens = 0
        self.train_seconds = 0.0
        self.peak_memory_mb: float | None = None
        self.stop_reason: str | None = None
        self.evals: list[dict] = []  # {"step", "eval_loss", "perplexity"}
        self._zero_grad_steps = 0
        self.telemetry = DeviceSampler(device)  # started on rank 0 when training begins

    def device_summary(self) -> list[dict]:
        """Per device over the run (result.json's ``devices``): peak memory, mean/max utilization, power."""
        return self.telemetry.summary()

    # -- the run starts ------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kw):
        """Start the clocks and token counters (a resumed run counts from its checkpoint's step)."""
        self.t0 = time.time()
        self.step0 = state.global_step
        self.tokens_at_start = int(state.num_input_tokens_seen or 0)
        preemption.arm()
        if not self.emit:
            return
        self.telemetry.start()
        where = f"device: {describe(self.device)}"
        self.run.emit(make_event(EventType.METRICS, where, device=describe(self.device), device_type=self.device["type"],
                                 platform=self.device.get("platform"), telemetry=self.telemetry.source, devices=self.telemetry.latest))
        print(f"[kubetune] {where}", flush=True)
        if state.max_steps != self.plan.total_steps:
            self.run.emit(make_event(EventType.WARNING, f"the trainer plans {state.max_steps} steps, kubetune planned {self.plan.total_steps}"))
        if state.global_step:
            print(f"[kubetune] continuing at step {state.global_step}/{state.max_steps}", flush=True)

    # -- preemption ----------------------------------------------------------------------------
    def on_step_end(self, args, state, control, **kw):
        """When every rank agreed on a preemption (SIGTERM), save a checkpoint now and stop training."""
        if self.preempted_at is not None or not preemption.agreed():  # every rank asks at every step end
            return
        self.preempted_at = state.global_step
        control.should_save = True  # this step's checkpoint, then stop (on_save marks it complete)
        control.should_training_stop = True
        control.should_evaluate = False  # the grace period is for saving
        if self.emit:
            msg = f"preempted (SIGTERM): saving checkpoint-{state.global_step} at this step boundary, then stopping"
            self.run.emit(make_event(EventType.WARNING, msg, step=state.global_step, preempted=True))
            print(f"[kubetune] {msg}", flush=True)

    def on_train_end(self, args, state, control, **kw):
        """Note a preemption that arrived after the last step, and stop deferring SIGTERM."""
        if self.preempted_at is None and preemption.agreed():  # after the last step end: nothing newer to save
            self.preempted_at = state.global_step
        preemption.disarm()
        if self.emit:
            self.telemetry.stop()

    # -- every logging step --------------------------------------------------------------------
    def on_log(self, args, state, control, logs=None, **kw):
        """Emit a ``metrics`` event for a training log: step/total, loss, learning rate, tokens/s and ETA."""
        logs = logs or {}
        if "loss" not in logs:
            return
        now = time.time()
        self.train_seconds = now - (self.t0 or now)
        step, total = state.global_step, state.max_steps
        loss = float(logs["loss"])
        done = step - self.step0
        eta = (self.train_seconds / done) * max(0, total - step) if done > 0 else None
        self.tokens = int(state.num_input_tokens_seen or 0) - self.tokens_at_start
        tps = self.tokens / self.train_seconds if self.train_seconds > 0 else None
        self.peak_memory_mb = peak_memory_mb(self.device)
        grad_norm = logs.get("grad_norm")
        grad_norm = float(grad_norm) if grad_norm is not None else None
        rec = dict(
            step=step,
            total_steps=total,
            epoch=round(state.epoch or 0, 3),
            loss=loss,
            learning_rate=logs.get("learning_rate"),
            grad_norm=grad_norm,
            tokens_per_second=round(tps, 1) if tps else None,
            eta_seconds=round(eta, 1) if eta is not None else None,
            peak_memory_mb=self.peak_memory_mb,
            devices=self.telemetry.latest if self.emit else None,
            **_preference(logs),  # DPO / ORPO: reward accuracy and margin, rewards and log-probabilities
        )
        pref = f" reward_accuracy={rec['reward_accuracy']:.3f} reward_margin={rec['reward_margin']:.4f}" if "reward_margin" in rec else ""
        if self.emit:
            self.run.emit(make_event(EventType.METRICS, f"step {step}/{total} loss={loss:.4f}{pref}", **rec))
            print(
                f"[kubetune] step {step}/{total} loss={loss:.4f} lr={rec['learning_rate'] or 0:.3g} "
                f"grad_norm={grad_norm if grad_norm is None else round(grad_norm, 4)} tokens/s={rec['tokens_per_second']} "
                f"eta={rec['eta_seconds']}s{pref}{_devices_text(rec['devices'])}",
                flush=True,
            )
        self._check_health(step, loss, grad_norm, control, loss_scaling=bool(getattr(args, "fp16", False)))

    def _check_health(self, step: int, loss: float, grad_norm: float | None, control, *, loss_scaling: bool) -> None:
        # Under fp16 loss scaling an infinite grad norm is routine: the scaler skips that step and backs off.
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm) and not loss_scaling):
            what = f"loss became {loss}" if not math.isfinite(loss) else f"the gradient norm became {grad_norm}"
            self.stop_reason = f"{what} at step {step}: training stopped (the last complete checkpoint is kept)"
            control.should_training_stop = True
            control.should_save = False  # never checkpoint broken weights: a rerun resumes before them
            control.should_evaluate = False
            return
        if grad_norm is not None and grad_norm == 0.0:
            self._zero_grad_steps += 1
            if self._zero_grad_steps == ZERO_GRAD_STEPS and self.emit:
                self.run.emit(
                    make_event(
                        EventType.WARNING,
                        f"the gradient norm has been 0 for {ZERO_GRAD_STEPS} logged steps (up to step {step}): nothing is "
                        "learning; check that the answers are not all masked (dataset.train_on_inputs) and training.learning_rate",
                        step=step,
                    )
                )
        else:
            self._zero_grad_steps = 0

    # -- evaluation ----------------------------------------------------------------------------
    def on_evaluate(self, args, state, control, metrics=None, **kw):
        """Emit a ``metrics`` event with the evaluation loss and perplexity."""
        loss = (metrics or {}).get("eval_loss")
        if loss is None:
            return
        rec = {"step": state.global_step, "eval_loss": float(loss), "perplexity": None if self.job.method.preference else perplexity(float(loss)), **_preference(metrics, prefix="eval_")}
        self.evals.append(rec)
        if self.emit:
            pref = f" reward_accuracy={rec['eval_reward_accuracy']:.3f} reward_margin={rec['eval_reward_margin']:.4f}" if "eval_reward_margin" in rec else ""
            ppl = "" if self.job.method.preference else f" perplexity={rec['perplexity']}"
            self.run.emit(make_event(EventType.METRICS, f"eval_loss={loss:.4f}{ppl}{pref}", total_steps=state.max_steps, **rec))
            print(f"[kubetune] eval at step {state.global_step}: loss={loss:.4f}{ppl}{pref}", flush=True)

    # -- checkpoints ---------------------------------------------------------------------------
    def on_save(self, args, state, control, **kw):
        """Mark the checkpoint complete (sizes and digests) once every rank wrote its part, then rotate old ones."""
        distributed.barrier()  # every rank has written its part (RNG state, shards) before the checkpoint is complete
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not self.emit or not ckpt.is_dir():
            return
        eval_loss = self.evals[-1]["eval_loss"] if self.evals and self.evals[-1]["step"] == state.global_step else None
        mark_complete(ckpt, self.fingerprint, step=state.global_step, eval_loss=eval_loss)
        self.run.emit(make_event(EventType.CHECKPOINT, f"saved {ckpt.name}", path=str(ckpt), step=state.global_step, eval_loss=eval_loss))
        for old in rotate_checkpoints(ckpt.parent, self.job.training.save_total_limit):
            self.run.emit(make_event(EventType.CHECKPOINT, f"removed {old.name} (training.save_total_limit={self.job.training.save_total_limit})", path=str(old), removed=True))
        if self.sync is not None:
            self.sync.checkpoint_saved(ckpt)


def _devices_text(devices: list[dict] | None) -> str:
    """`` | NVIDIA H200 87% 20.1/139.0 GiB 412 W``: the devices' latest sample for the progress line."""
    return (" | " + ", ".join(device_text(d) for d in devices)) if devices else ""


def _preference(logs: dict, *, prefix: str = "") -> dict:
    """The preference metrics of a DPO/ORPO log under kubetune's names (empty for SFT)."""
    from .preference import log_metrics

    return log_metrics(logs, prefix=prefix)


def log_history_losses(log_history: list[dict]) -> list[dict]:
    """``[{"step", "loss"}]`` from the trainer's log history (which a resumed run inherits from its checkpoint)."""
    return [{"step": int(e["step"]), "loss": float(e["loss"])} for e in log_history if "loss" in e and "step" in e]


def mean_loss(losses: list[dict]) -> float | None:
    """Mean training loss over the logged steps, each log weighted by the steps it covers."""
    total = weight = 0.0
    prev = 0
    for rec in losses:
        span = max(1, rec["step"] - prev)
        prev = rec["step"]
        total += rec["loss"] * span
        weight += span
    return total / weight if weight else None
