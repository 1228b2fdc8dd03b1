"""The supervised fine-tuning run: load the model, attach the method, train with TRL, save results.

Reads top to bottom: :func:`run_sft` is the story; the ``_setup_*`` helpers below it each do one step.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .. import constants as C
from ..errors import TrainError
from ..events import RunDir, make_event
from ..spec import TuneJob

__all__ = ["run_sft", "load_tokenizer", "find_resume_checkpoint", "complete_checkpoints", "device_info", "oom_advice"]


def run_sft(job: TuneJob, model_path: Path, prepared: Any, run: RunDir, *, tokenizer: Any = None, sync: Any = None) -> dict:
    """Train ``job`` on ``prepared`` data starting from the model at ``model_path``.

    Writes checkpoints under ``run/checkpoints`` (each marked complete when fully written), the
    adapter or model into the run directory, and emits progress events.

    Returns:
        The result metrics (train/eval loss, tokens, tokens/s, runtime, best checkpoint).

    Raises:
        TrainError: out of memory (with advice), NaN loss, or a resume path that does not exist.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    is_main = int(os.environ.get("RANK", "0")) == 0
    device = device_info()
    tokenizer = tokenizer or load_tokenizer(job, model_path)
    model = _setup_model(job, model_path, device)
    resume = find_resume_checkpoint(job, run, emit=is_main)
    args = _setup_args(job, run, device, has_eval=prepared.eval is not None)
    progress = _ProgressCallback(run, job, device, emit=is_main, sync=sync)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=prepared.train,
        eval_dataset=prepared.eval,
        processing_class=tokenizer,
        callbacks=[progress],
    )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # progress goes through our events instead
    started = time.time()
    try:
        train_out = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except torch.OutOfMemoryError as e:
        raise TrainError(f"out of memory while training: {str(e).splitlines()[0]}", hint=oom_advice(job)) from None
    except MemoryError:
        raise TrainError("the host ran out of memory while training", hint=oom_advice(job)) from None
    if progress.stop_reason:
        raise TrainError(progress.stop_reason, hint="lower training.learning_rate or check the data for broken rows")
    runtime = time.time() - started

    metrics: dict[str, Any] = {"train_loss": train_out.training_loss, "global_step": trainer.state.global_step}
    if prepared.eval is not None:
        ev = trainer.evaluate()
        metrics["eval_loss"] = ev.get("eval_loss")
        metrics["perplexity"] = math.exp(min(ev["eval_loss"], 50)) if ev.get("eval_loss") is not None else None
        if is_main:
            run.emit(make_event("metrics", f"eval_loss={ev.get('eval_loss'):.4f}", step=trainer.state.global_step, eval_loss=ev.get("eval_loss")))
    tokens = int(trainer.state.num_input_tokens_seen or 0) - progress.tokens_at_start
    metrics.update(
        tokens=tokens,
        tokens_per_second=round(tokens / progress.train_seconds, 1) if progress.train_seconds else None,
        runtime_seconds=round(runtime, 2),
        train_seconds=round(progress.train_seconds, 2),
        resumed_from=str(resume) if resume else None,
        best_checkpoint=trainer.state.best_model_checkpoint,
        losses=progress.losses,
        peak_memory_mb=progress.peak_memory_mb,
        device=device["type"],
    )
    if is_main:
        _save_outputs(job, trainer, tokenizer, run)
    return metrics


# --- setup -----------------------------------------------------------------------------------
def device_info() -> dict:
    """What the job trains on: cuda (with bf16 support) or cpu."""
    import torch

    if torch.cuda.is_available():
        return {"type": "cuda", "bf16": torch.cuda.is_bf16_supported(), "name": torch.cuda.get_device_name(0)}
    return {"type": "cpu", "bf16": False, "name": "cpu"}


def _torch_dtype(job: TuneJob, device: dict):
    import torch

    if job.model.dtype == "auto":
        return torch.bfloat16 if device["bf16"] else torch.float32
    return getattr(torch, job.model.dtype)


def load_tokenizer(job: TuneJob, model_path: Path):
    """The model's tokenizer, with a pad token (EOS when it has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=job.model.trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _setup_model(job: TuneJob, model_path: Path, device: dict):
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": _torch_dtype(job, device), "trust_remote_code": job.model.trust_remote_code}
    if job.model.attn_implementation != "auto":
        kwargs["attn_implementation"] = job.model.attn_implementation
    if job.method.type == "qlora":
        kwargs["quantization_config"] = _bnb_config(device)
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    if job.training.gradient_checkpointing:
        model.config.use_cache = False
    if job.method.type == "full":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if job.method.type == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=job.training.gradient_checkpointing)
    lora = job.method.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        use_rslora=lora.use_rslora,
        modules_to_save=lora.modules_to_save or None,
        bias=lora.bias,
        use_dora=job.method.type == "dora",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _bnb_config(device: dict):
    import torch
    from transformers import BitsAndBytesConfig

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise TrainError(
            "method.type qlora needs bitsandbytes, which is not installed",
            hint="pip install 'kubetune[qlora]' (or pip install bitsandbytes)",
        ) from None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16 if device["bf16"] or device["type"] == "cpu" else torch.float16,
    )


def _setup_args(job: TuneJob, run: RunDir, device: dict, *, has_eval: bool):
    from trl import SFTConfig

    t = job.training
    eval_strategy = "no"
    if has_eval:
        eval_strategy = "steps" if t.eval_steps else "epoch"
    return SFTConfig(
        output_dir=str(run.checkpoints_dir),
        per_device_train_batch_size=t.batch_size,
        per_device_eval_batch_size=t.batch_size,
        gradient_accumulation_steps=job.accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_steps if t.warmup_steps else t.warmup_ratio,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim=t.optimizer,
        seed=t.seed,
        data_seed=t.seed,
        num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        logging_steps=t.logging_steps,
        eval_strategy=eval_strategy,
        eval_steps=t.eval_steps,
        save_strategy="steps" if t.save_steps else "epoch",
        save_steps=t.save_steps or 500,
        save_total_limit=t.save_total_limit,
        report_to=t.report_to or "none",
        gradient_checkpointing=t.gradient_checkpointing,
        bf16=_torch_dtype(job, device).__repr__() == "torch.bfloat16" and device["type"] == "cuda",
        use_cpu=device["type"] == "cpu",
        disable_tqdm=True,
        max_length=t.max_seq_length,
        packing=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


# --- checkpoints -----------------------------------------------------------------------------
def complete_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Checkpoints under ``ckpt_dir`` that carry the completion marker, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = []
    for p in ckpt_dir.iterdir():
        if p.is_dir() and p.name.startswith("checkpoint-") and (p / C.CHECKPOINT_COMPLETE).is_file():
            try:
                found.append((int(p.name.split("-", 1)[1]), p))
            except ValueError:
                continue
    return [p for _, p in sorted(found)]


def find_resume_checkpoint(job: TuneJob, run: RunDir, *, emit: bool = True) -> Path | None:
    """The checkpoint to resume from, per ``training.resume``; incomplete checkpoints are removed."""
    mode = job.training.resume
    if mode == "never":
        return None
    if mode != "auto":
        p = Path(mode).expanduser()
        if not (p / C.CHECKPOINT_COMPLETE).is_file() and not (p / "trainer_state.json").is_file():
            raise TrainError(f"training.resume: '{mode}' is not a complete checkpoint directory")
        return p
    ckpts = run.checkpoints_dir
    fingerprint = checkpoint_fingerprint(job)
    if ckpts.is_dir() and emit:
        for p in ckpts.iterdir():
            if p.is_dir() and p.name.startswith("checkpoint-") and not (p / C.CHECKPOINT_COMPLETE).is_file():
                run.emit(make_event("warning", f"ignoring incomplete checkpoint {p.name} (removed)", path=str(p)))
                shutil.rmtree(p, ignore_errors=True)
    complete = complete_checkpoints(ckpts)
    if complete:
        recorded = _read_marker(complete[-1]).get("fingerprint")
        if recorded and recorded != fingerprint:
            raise TrainError(
                f"{complete[-1]} was written by a job with a different model or method, so it cannot be resumed",
                hint=f"set training.resume=never to start over in {run.path}, or choose another output.dir",
            )
    if complete and emit:
        run.emit(make_event("checkpoint", f"resuming from {complete[-1].name}", path=str(complete[-1]), resume=True))
    return complete[-1] if complete else None


def checkpoint_fingerprint(job: TuneJob) -> str:
    """What a checkpoint must agree on to be resumed: the model and the method (not epochs or lr)."""
    import hashlib
    import json

    key = {"model": job.model.source, "method": job.method.model_dump(mode="json") if job.method.type != "full" else "full"}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _read_marker(ckpt: Path) -> dict:
    import json

    try:
        data = json.loads((ckpt / C.CHECKPOINT_COMPLETE).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def oom_advice(job: TuneJob) -> str:
    """Concrete changes to the spec that reduce memory, drawn from its current values."""
    t = job.training
    tips = []
    if t.batch_size > 1:
        acc = job.accumulation_steps * 2
        tips.append(f"set training.batch_size={t.batch_size // 2} and training.gradient_accumulation_steps={acc} (same global batch)")
    if not t.gradient_checkpointing:
        tips.append("set training.gradient_checkpointing=true")
    if t.max_seq_length > 256:
        tips.append(f"shorten training.max_seq_length (now {t.max_seq_length}), e.g. to {t.max_seq_length // 2}")
    if job.method.type in ("full", "lora", "dora"):
        tips.append("switch method.type to qlora (4-bit base model)")
    return "; ".join(tips) or "use a machine with more memory"


# --- outputs ---------------------------------------------------------------------------------
def _save_outputs(job: TuneJob, trainer: Any, tokenizer: Any, run: RunDir) -> None:
    target = run.path / (C.MODEL_DIR if job.method.type == "full" else C.ADAPTER_DIR)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    run.emit(make_event("stage", f"saved {target.name}/", stage=C.STAGE_PUBLISH, path=str(target)))


# --- progress --------------------------------------------------------------------------------
def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class _ProgressCallback(_callback_base()):  # type: ignore[misc]
    """Turns trainer logs into kubetune events; marks checkpoints complete; stops on NaN loss."""

    def __init__(self, run: RunDir, job: TuneJob, device: dict, *, emit: bool, sync: Any = None) -> None:
        self.run, self.job, self.device, self.emit, self.sync = run, job, device, emit, sync
        self.t0 = None
        self.step0 = 0
        self.tokens_at_start = 0
        self.train_seconds = 0.0
        self.losses: list[dict] = []
        self.peak_memory_mb: float | None = None
        self.stop_reason: str | None = None
        self._zero_grad_steps = 0

    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.time()
        self.step0 = state.global_step
        self.tokens_at_start = int(state.num_input_tokens_seen or 0)
        if self.emit:
            self.run.emit(
                make_event("metrics", f"training {state.max_steps} steps", step=state.global_step, total_steps=state.max_steps)
            )

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        now = time.time()
        self.train_seconds = now - (self.t0 or now)
        step, total = state.global_step, state.max_steps
        if "loss" in logs:
            loss = float(logs["loss"])
            done = step - self.step0
            eta = (self.train_seconds / done) * (total - step) if done > 0 else None
            tokens = int(state.num_input_tokens_seen or 0) - self.tokens_at_start
            tps = tokens / self.train_seconds if self.train_seconds > 0 else None
            self.peak_memory_mb = _peak_memory_mb(self.device)
            grad_norm = logs.get("grad_norm")
            rec = dict(
                step=step,
                total_steps=total,
                epoch=round(state.epoch or 0, 3),
                loss=loss,
                learning_rate=logs.get("learning_rate"),
                grad_norm=float(grad_norm) if grad_norm is not None else None,
                tokens_per_second=round(tps, 1) if tps else None,
                eta_seconds=round(eta, 1) if eta is not None else None,
                peak_memory_mb=self.peak_memory_mb,
            )
            self.losses.append({"step": step, "loss": loss})
            if self.emit:
                self.run.emit(make_event("metrics", f"step {step}/{total} loss={loss:.4f}", **rec))
                print(f"[kubetune] step {step}/{total} loss={loss:.4f} lr={rec['learning_rate'] or 0:.3g} tokens/s={rec['tokens_per_second']} eta={rec['eta_seconds']}s", flush=True)
            if math.isnan(loss) or math.isinf(loss):
                self.stop_reason = f"loss became {loss} at step {step}"
                control.should_training_stop = True
            if grad_norm is not None and float(grad_norm) == 0.0:
                self._zero_grad_steps += 1
                if self._zero_grad_steps == 5 and self.emit:
                    self.run.emit(make_event("warning", "grad norm has been 0 for 5 logged steps: nothing is learning (check the loss mask and learning rate)"))
            else:
                self._zero_grad_steps = 0
        if "eval_loss" in logs and self.emit:
            self.run.emit(make_event("metrics", f"eval_loss={logs['eval_loss']:.4f}", step=step, total_steps=total, eval_loss=logs["eval_loss"]))

    def on_save(self, args, state, control, **kw):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.emit and ckpt.is_dir():
            import json

            marker = {"step": state.global_step, "fingerprint": checkpoint_fingerprint(self.job), "time": time.time()}
            (ckpt / C.CHECKPOINT_COMPLETE).write_text(json.dumps(marker), encoding="utf-8")
            self.run.emit(make_event("checkpoint", f"saved {ckpt.name}", path=str(ckpt), step=state.global_step))
            if self.sync is not None:
                self.sync.checkpoint_saved(ckpt)


def _peak_memory_mb(device: dict) -> float | None:
    if device["type"] == "cuda":
        import torch

        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    try:
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
    except Exception:  # pragma: no cover - not on Linux
        return None
