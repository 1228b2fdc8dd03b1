"""The supervised fine-tuning run: plan the steps, load the model with its method, train with TRL, save.

Reads top to bottom: :func:`run_sft` is the story; the helpers below it each do one step. Model setup is
in :mod:`.model`, checkpoint bookkeeping in :mod:`.checkpoints`, live progress in :mod:`.progress`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from .. import constants as C
from .. import ranks
from ..errors import TrainError
from ..events import EventType, RunDir, make_event
from ..preemption import Preempted
from ..spec import TuneJob
from . import distributed
from .checkpoints import best_checkpoint, checkpoint_step, complete_checkpoints, find_resume_checkpoint
from .model import count_parameters, device_info, load_model, load_tokenizer, precision
from .progress import Plan, ProgressCallback, log_history_losses, mean_loss, perplexity

__all__ = ["run_sft", "plan_run", "load_tokenizer", "find_resume_checkpoint", "complete_checkpoints", "device_info", "oom_advice", "is_out_of_memory"]

# Packages each training.report_to integration needs (checked before training, for a clear message).
_TRACKING_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "mlflow": ("mlflow",), "wandb": ("wandb",)}


def run_sft(
    job: TuneJob, model_path: Path, prepared: Any, run: RunDir, *, tokenizer: Any = None, sync: Any = None, reference_path: Path | None = None
) -> dict:
    """Train ``job`` on ``prepared`` data starting from the model at ``model_path``.

    Every ``method.objective`` trains here: SFT with TRL's SFTTrainer, DPO and ORPO with TRL's preference
    trainers (:mod:`.preference`; ``reference_path`` is the local ``method.dpo.reference`` of a full DPO fine-tune).

    Writes checkpoints under ``run/checkpoints`` (each marked complete once fully written), the adapter
    (``adapter/``) or model (``model/``) into the run directory, and progress events.

    Returns:
        The result metrics: losses, eval loss and perplexity, best checkpoint, tokens, tokens/s, runtime.

    Raises:
        TrainError: out of memory (with advice naming spec fields), NaN loss, a bad resume path, a checkpoint
            that cannot be loaded, or a missing optional package.
        Preempted: a SIGTERM (not a user's cancel) stopped the run after it saved a checkpoint.
    """
    from transformers import set_seed
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    is_main = ranks.is_main_process()
    device = device_info()
    distributed.setup(job, device)  # the process group with the job's collective timeout (several processes)
    tokenizer = tokenizer or load_tokenizer(job, model_path)
    plan = plan_run(job, prepared)
    if is_main:
        msg = f"plan: {plan.describe(job)}"
        run.emit(make_event(EventType.METRICS, msg, step=0, **dataclasses.asdict(plan)))
        print(f"[kubetune] {msg}", flush=True)
    resume = find_resume_checkpoint(job, run, emit=is_main)
    started = time.time()
    with _out_of_memory_advice(job), _tracking(job, run):
        set_seed(job.training.seed)  # adapter initialisation draws from the global RNG
        progress = ProgressCallback(run, job, device, plan, emit=is_main, sync=sync)  # before any library sees the spec
        model = load_model(job, model_path, device)
        trainable, total = count_parameters(model)
        args = _setup_args(job, run, device, plan, has_eval=prepared.eval is not None)
        if job.method.preference:  # DPO / ORPO: TRL's preference trainers over the same loop (training/preference.py)
            from .preference import make_preference_trainer

            trainer = make_preference_trainer(
                job, model, args, prepared, tokenizer, [progress], model_path=model_path, reference_path=reference_path
            )
        else:
            trainer = SFTTrainer(
                model=model, args=args, train_dataset=prepared.train, eval_dataset=prepared.eval,
                processing_class=tokenizer, callbacks=[progress],
            )  # fmt: skip
        trainer.remove_callback(PrinterCallback)  # progress goes through our events instead
        resume = distributed.resume_point(resume)  # every rank resumes from rank 0's checkpoint
        if resume is not None:
            _keep_training_dtypes(trainer)
            _guard_checkpoint_loading(trainer, resume)
        if resume is not None and checkpoint_step(resume) >= plan.total_steps:
            _load_finished(trainer, resume, run, emit=is_main)  # trained already; it stopped before publishing
        else:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        if progress.stop_reason:
            raise TrainError(
                progress.stop_reason,
                hint="lower training.learning_rate, keep training.max_grad_norm > 0, use model.dtype bfloat16 rather "
                "than float16, or check the data for broken rows",
            )
        if progress.preempted_at is not None:
            distributed.barrier()  # rank 0 has marked the checkpoint complete before any rank leaves
            newest = complete_checkpoints(run.checkpoints_dir)
            raise Preempted(progress.preempted_at, newest[-1] if newest else None)
        final_eval = _final_evaluation(trainer, progress, has_eval=prepared.eval is not None)

    losses = log_history_losses(trainer.state.log_history)
    metrics: dict[str, Any] = {
        "method": job.method.type,
        "objective": job.method.objective,
        "train_loss": mean_loss(losses),
        "final_loss": losses[-1]["loss"] if losses else None,
        "eval_loss": final_eval,
        "perplexity": None if job.method.preference else perplexity(final_eval),  # a preference loss is no likelihood
        "global_step": trainer.state.global_step,
        "total_steps": plan.total_steps,
        "steps_per_epoch": plan.steps_per_epoch,
        "global_batch": plan.global_batch,
        "samples": plan.samples,
        "trainable_parameters": trainable,
        "total_parameters": total,
        # The whole run's tokens: the trainer state carries the count through checkpoints, so a resumed run adds
        # to what it resumed from. tokens/s is this session's (its tokens over its training time).
        "tokens": int(trainer.state.num_input_tokens_seen or 0),
        "tokens_per_second": round(progress.tokens / progress.train_seconds, 1) if progress.train_seconds else None,
        "train_seconds": round(progress.train_seconds, 2),
        "runtime_seconds": round(time.time() - started, 2),
        "resumed_from": str(resume) if resume else None,
        "resumed_at_step": checkpoint_step(resume) if resume else None,
        "best_checkpoint": best_checkpoint(run.checkpoints_dir),
        "evals": progress.evals,
        "losses": losses,
        "peak_memory_mb": progress.peak_memory_mb,
        "devices": progress.device_summary(),  # per device: peak memory, mean/max utilization, mean/peak power
        "device": device["name"],
        "device_type": device["type"],
        "precision": dataclasses.asdict(precision(job, device)),
    }
    if job.method.preference:
        from .preference import preference_metrics

        metrics["preference"] = preference_metrics(job, trainer.state.log_history)
        # The headline numbers at the top level too, where sweeps rank and tabulate trials (sweep.objective).
        found = {**metrics["preference"]["train"], **metrics["preference"]["eval"]}
        metrics.update({k: found[k] for k in C.PREFERENCE_STATUS_KEYS if k in found})
    if is_main:
        _save_outputs(job, trainer, tokenizer, run)
    elif job.training.strategy == "fsdp":  # the weights are sharded: every rank takes part in gathering them
        _save_outputs(job, trainer, tokenizer, run, is_main=False)
    return metrics


# --- planning --------------------------------------------------------------------------------
def plan_run(job: TuneJob, prepared: Any) -> Plan:
    """The step budget, known before training: total steps, checkpoint and evaluation intervals."""
    t = job.training
    samples = len(prepared.train)
    if samples == 0:
        raise TrainError("no training rows left after preparing the data", hint="check dataset.source and dataset.length_handling")
    per_epoch = job.steps_per_epoch(samples)
    total = job.planned_steps(samples)
    save = t.save_steps or per_epoch
    return Plan(
        samples=samples,
        global_batch=job.global_batch,
        steps_per_epoch=per_epoch,
        total_steps=total,
        save_steps=save,
        eval_steps=(t.eval_steps or save) if prepared.eval is not None else None,
    )


# --- setup -----------------------------------------------------------------------------------
def _setup_args(job: TuneJob, run: RunDir, device: dict, plan: Plan, *, has_eval: bool):
    from trl import SFTConfig

    t = job.training
    fields = SFTConfig.__dataclass_fields__
    prec = precision(job, device)
    compat: dict[str, Any] = {}
    # Names changed across transformers versions: pass whichever this one knows.
    ckpt = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    compat[ckpt] = t.gradient_checkpointing
    compat[f"{ckpt}_kwargs"] = {"use_reentrant": False} if t.gradient_checkpointing else None
    if t.warmup_steps:
        compat["warmup_steps"] = t.warmup_steps
    elif "warmup_ratio" in fields:
        compat["warmup_ratio"] = t.warmup_ratio
    else:
        compat["warmup_steps"] = t.warmup_ratio  # a float below 1 is a ratio
    common: dict[str, Any] = dict(
        output_dir=str(run.checkpoints_dir),
        run_name=job.name,
        per_device_train_batch_size=t.batch_size,
        per_device_eval_batch_size=t.batch_size,
        gradient_accumulation_steps=job.accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim=t.optimizer,
        seed=t.seed,
        data_seed=t.seed,
        num_train_epochs=t.epochs,
        max_steps=plan.total_steps,  # the planned count, shown before training starts
        logging_steps=t.logging_steps,
        logging_nan_inf_filter=False,  # a NaN loss must reach our health check, not be averaged away
        eval_strategy="steps" if has_eval else "no",
        eval_steps=plan.eval_steps,
        save_strategy="steps",
        save_steps=plan.save_steps,
        save_total_limit=None,  # kubetune rotates, counting complete checkpoints only (progress.py)
        report_to=list(t.report_to) or "none",
        bf16=prec.amp == "bf16",
        fp16=prec.amp == "fp16",
        use_cpu=device["type"] == "cpu",
        disable_tqdm=True,
        max_length=t.max_seq_length,
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        **compat,
        **distributed.trainer_args(job, device),  # backend, collective timeout, ddp/fsdp
    )
    if job.method.preference:
        from .preference import preference_config

        return preference_config(job, common)
    return SFTConfig(
        **common,
        # packing (owned by data/packing.py): rows arrive packed with seq_lengths; packing=True makes TRL use its
        # padding-free collator, whose position_ids restart per row, so transformers masks across rows (sdpa,
        # eager) and flash-attention gets cu_seq_lens. skip_prepare_dataset keeps TRL from packing again.
        packing=job.training.packing,
        dataset_kwargs={"skip_prepare_dataset": True},  # rows arrive tokenized with their loss masks
    )


@contextlib.contextmanager
def _tracking(job: TuneJob, run: RunDir) -> Iterator[None]:
    """Check the report_to integrations are installed; while training, point their files into the run directory."""
    import importlib.util

    for name in job.training.report_to:
        needs = _TRACKING_PACKAGES.get(name, (name,))
        if not any(importlib.util.find_spec(pkg) for pkg in needs):
            raise TrainError(
                f"training.report_to: '{name}' needs the {needs[0]} package, which is not installed",
                hint="pip install 'kubetune[tracking]' (tensorboard, mlflow), or remove it from training.report_to",
            )
    env = {}
    if "tensorboard" in job.training.report_to:
        env["TENSORBOARD_LOGGING_DIR"] = str(run.logs_dir / "tensorboard")
    if "mlflow" in job.training.report_to:
        env["MLFLOW_EXPERIMENT_NAME"] = job.name
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if saved[k] is None})  # the user's own settings win
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


# --- training --------------------------------------------------------------------------------
# The Trainer's methods that read a checkpoint's files when it resumes (weights, optimizer and scheduler, loss
# scaler, RNG states). Their errors (a truncated safetensors or torch file, a shape mismatch) become one TrainError.
_CHECKPOINT_LOADERS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler", "_load_rng_state")


def _guard_checkpoint_loading(trainer: Any, ckpt: Path) -> None:
    """Make a checkpoint that cannot be loaded a TrainError naming it, instead of the library's traceback.

    Raises:
        TrainError: its trainer state is not readable JSON (checked here, before anything loads).
    """
    import functools
    import json

    try:
        json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _unloadable(ckpt, e) from None

    def guarded(load):
        @functools.wraps(load)
        def run(*args, **kwargs):
            try:
                return load(*args, **kwargs)
            except Exception as e:
                if isinstance(e, TrainError) or is_out_of_memory(e):
                    raise
                raise _unloadable(ckpt, e) from e

        return run

    for name in _CHECKPOINT_LOADERS:
        load = getattr(trainer, name, None)
        if load is not None:
            setattr(trainer, name, guarded(load))  # an instance attribute: the Trainer's own calls go through it


def _keep_training_dtypes(trainer: Any) -> None:
    """Resume with the trainable weights in the dtype training used, not the one the loader picks.

    TRL trains a QLoRA adapter in bf16 (the checkpoint stores bf16), while PEFT's ``load_adapter`` upcasts the
    loaded adapter to fp32: a resumed run would train in another precision than the run it continues, and its
    losses would drift from the uninterrupted run's.
    """
    import functools

    load = trainer._load_from_checkpoint

    @functools.wraps(load)
    def run(*args, **kwargs):
        model = trainer.model
        before = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
        out = load(*args, **kwargs)
        for name, param in model.named_parameters():
            if name in before and param.dtype != before[name]:
                param.data = param.data.to(before[name])
        return out

    trainer._load_from_checkpoint = run


def _unloadable(ckpt: Path, e: BaseException) -> TrainError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return TrainError(
        f"checkpoint {ckpt} cannot be loaded to resume from ({type(e).__name__}: {first})",
        hint=f"move {ckpt} aside (or delete it) to resume from the checkpoint before it, or set training.resume=never "
        "to start over; a checkpoint written by another kubetune, transformers or peft version may not load",
    )


def _load_finished(trainer: Any, ckpt: Path, run: RunDir, *, emit: bool) -> None:
    """Take the weights and state of a checkpoint that already reached the planned step count."""
    from transformers.trainer_callback import TrainerState

    trainer._load_from_checkpoint(str(ckpt))  # guarded by _guard_checkpoint_loading
    trainer.state = TrainerState.load_from_json(str(ckpt / "trainer_state.json"))
    if emit:
        run.emit(make_event(EventType.STAGE, f"{ckpt.name} already reached the planned steps: not training again", stage=C.STAGE_TRAIN))


def _final_evaluation(trainer: Any, progress: ProgressCallback, *, has_eval: bool) -> float | None:
    """Eval loss of the final weights (the trainer evaluates at the last step; evaluate if it did not)."""
    if not has_eval:
        return None
    if progress.evals and progress.evals[-1]["step"] == trainer.state.global_step:
        return progress.evals[-1]["eval_loss"]
    return trainer.evaluate().get("eval_loss")


# --- failure help ----------------------------------------------------------------------------
def is_out_of_memory(e: BaseException) -> bool:
    """True for CUDA/accelerator OOM, the host's MemoryError, and torch's CPU allocator failures."""
    if isinstance(e, MemoryError):
        return True
    try:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - torch < 2.5
        pass
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text.lower() or "can't allocate memory" in text)


@contextlib.contextmanager
def _out_of_memory_advice(job: TuneJob) -> Iterator[None]:
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        where = "the host ran out of memory" if isinstance(e, MemoryError) or "allocate memory" in str(e) else "out of memory"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainError(f"{where} while training ({first})", hint=oom_advice(job)) from None


def oom_advice(job: TuneJob) -> str:
    """Concrete spec changes that reduce memory, drawn from the job's current values (most effective first)."""
    t = job.training
    tips = []
    if t.batch_size > 1:
        half = t.batch_size // 2
        if t.global_batch_size is not None:
            tips.append(f"set training.batch_size={half} (training.global_batch_size={t.global_batch_size} stays; accumulation doubles)")
        else:
            tips.append(f"set training.batch_size={half} and training.gradient_accumulation_steps={job.accumulation_steps * 2} (same global batch)")
    if not t.gradient_checkpointing:
        tips.append("set training.gradient_checkpointing=true")
    if t.max_seq_length > 256:
        tips.append(f"shorten training.max_seq_length (now {t.max_seq_length}), e.g. to {t.max_seq_length // 2}")
    if job.method.type in ("full", "lora", "dora"):
        tips.append("switch method.type to qlora (4-bit base model)")
    if job.method.type != "full" and job.method.lora.modules_to_save:
        tips.append(f"drop method.lora.modules_to_save ({', '.join(job.method.lora.modules_to_save)}: trained in full)")
    if job.method.type != "full" and job.method.lora.r > 16:
        tips.append(f"lower method.lora.r (now {job.method.lora.r})")
    return "; ".join(tips) or "use a machine with more memory"


# --- outputs ---------------------------------------------------------------------------------
def _save_outputs(job: TuneJob, trainer: Any, tokenizer: Any, run: RunDir, *, is_main: bool = True) -> None:
    """adapter/ (PEFT: adapter_config.json + adapter_model.safetensors) or model/, with the tokenizer."""
    target = run.path / (C.MODEL_DIR if job.method.type == "full" else C.ADAPTER_DIR)
    tmp = target.with_name(f".{target.name}.tmp")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    if job.training.strategy == "fsdp":  # gathers the full weights from every rank; rank 0 writes them
        trainer.save_model(str(tmp))
        if not is_main:
            return
        (tmp / "training_args.bin").unlink(missing_ok=True)
    else:
        trainer.model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    run.emit(make_event(EventType.STAGE, f"saved {target.name}/", stage=C.STAGE_PUBLISH, path=str(target)))
