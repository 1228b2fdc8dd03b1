"""llama-stack's post-training API in kubetune's terms, as plain dicts (no llama-stack import: the jobs server
uses this without it).

* :func:`sft_spec` / :func:`dpo_spec`: a ``supervised_fine_tune`` / ``preference_optimize`` request -> a kubetune
  spec, plus the notes on what the request asked that kubetune does not do (logged as warnings, never silent);
* :func:`normalize_rows`: rows from llama-stack's ``datasetio`` (its ``instruct`` and ``dialog`` shapes, with
  JSON-encoded columns) -> rows kubetune's format detection reads; any other row shape (``messages``,
  prompt/completion, Alpaca, ShareGPT, text) passes as it is;
* :func:`job_status` / :func:`checkpoints`: a kubetune status and its events -> llama-stack's job status and
  ``Checkpoint`` objects.

The field mapping table is in docs/llama-stack.md; keep the two together.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from datetime import datetime, timezone
from typing import Any, Iterable

from ... import constants as C
from ...errors import SpecError
from ...spec.validate import merge_specs

__all__ = ["MappingError", "plain", "write_jsonl", "sft_spec", "dpo_spec", "normalize_rows", "job_status", "checkpoints", "job_name", "LLAMA_STATUS"]


class MappingError(SpecError):
    """A request kubetune cannot honour (an unsupported algorithm, a malformed row); names the field."""


# torchtune's attention module names (llama-stack's lora_attn_modules) -> transformers' Llama names; an HF name
# passes as it is.
_ATTN_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj", "o_proj": "o_proj"}
_MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]  # torchtune's w1/w3/w2
_OUTPUT_MODULE = "lm_head"
# llama-stack's OptimizerType -> transformers' optimizer names. Adam is AdamW's update with decoupled weight decay
# (identical when weight_decay is 0); torchtune's recipes use AdamW for both.
_OPTIMIZERS = {"adamw": "adamw_torch", "adam": "adamw_torch", "sgd": "sgd"}
# llama-stack's dtype strings -> model.dtype. bf16 (llama-stack's default) -> auto: bf16 on every device that has
# it, fp32 on a CPU instead of failing there.
_DTYPES = {"bf16": "auto", "bfloat16": "auto", "fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16"}
# kubetune states -> llama-stack's JobStatus values.
LLAMA_STATUS = {C.STATE_PENDING: "scheduled", C.STATE_RUNNING: "in_progress", C.STATE_SUCCEEDED: "completed",
                C.STATE_FAILED: "failed", C.STATE_CANCELLED: "cancelled", C.STATE_PREEMPTED: "failed"}
_NAME_MAX = 50


def job_name(job_uuid: str) -> str:
    """A kubetune job name (a DNS label) for a llama-stack ``job_uuid``: readable, and unique per uuid."""
    slug = re.sub(r"[^a-z0-9]+", "-", job_uuid.lower()).strip("-")
    digest = hashlib.sha256(job_uuid.encode()).hexdigest()[:8]
    base = f"ls-{slug}"[: _NAME_MAX - 9].rstrip("-")
    return f"{base}-{digest}"


def write_jsonl(path, rows: Iterable[dict]):
    """Write ``rows`` as JSON lines to ``path`` atomically (a temporary file renamed into place); returns ``path``."""
    import os

    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def _get(d: dict | None, key: str, default: Any = None) -> Any:
    v = (d or {}).get(key)
    return default if v is None else v


def _training(training_config: dict, notes: list[str]) -> dict:
    """TrainingConfig -> the spec's training section (and model.dtype, returned under the key "_dtype")."""
    out: dict[str, Any] = {}
    epochs = training_config.get("n_epochs")
    if not isinstance(epochs, int) or epochs < 1:
        raise MappingError(f"training_config.n_epochs: {epochs!r} is not a positive integer")
    out["epochs"] = epochs
    per_epoch = training_config.get("max_steps_per_epoch")
    if per_epoch is not None:
        if not isinstance(per_epoch, int) or per_epoch < 1:
            raise MappingError(f"training_config.max_steps_per_epoch: {per_epoch!r} is not a positive integer")
        out["max_steps"] = epochs * per_epoch  # torchtune stops each epoch after this many optimizer steps
    if training_config.get("gradient_accumulation_steps") is not None:
        out["gradient_accumulation_steps"] = int(training_config["gradient_accumulation_steps"])
    data = training_config.get("data_config") or {}
    if data.get("batch_size") is not None:
        out["batch_size"] = int(data["batch_size"])
    if data.get("packed"):
        out["packing"] = True
    if data.get("shuffle") is False:
        notes.append("data_config.shuffle=false: kubetune always shuffles the training rows (seeded by training.seed)")
    opt = training_config.get("optimizer_config") or {}
    if opt:
        kind = str(_get(opt, "optimizer_type", "adamw")).lower()
        if kind not in _OPTIMIZERS:
            raise MappingError(f"training_config.optimizer_config.optimizer_type: {kind!r} is not one of {', '.join(_OPTIMIZERS)}")
        out["optimizer"] = _OPTIMIZERS[kind]
        for src, dst in (("lr", "learning_rate"), ("weight_decay", "weight_decay"), ("num_warmup_steps", "warmup_steps")):
            if opt.get(src) is not None:
                out[dst] = opt[src]
    eff = training_config.get("efficiency_config") or {}
    if eff.get("enable_activation_checkpointing"):
        out["gradient_checkpointing"] = True
    for key in ("enable_activation_offloading", "memory_efficient_fsdp_wrap", "fsdp_cpu_offload"):
        if eff.get(key):
            notes.append(f"efficiency_config.{key}: not applied (kubetune's FSDP settings are training.strategy and resources; "
                         "docs/distributed.md)")
    dtype = training_config.get("dtype")
    if dtype is not None:
        if str(dtype).lower() not in _DTYPES:
            raise MappingError(f"training_config.dtype: {dtype!r} is not one of {', '.join(sorted(_DTYPES))}")
        out["_dtype"] = _DTYPES[str(dtype).lower()]
    return out


def _method(algorithm_config: dict | None) -> dict:
    """LoraFinetuningConfig -> the spec's method section; none -> a full fine-tune."""
    if not algorithm_config:
        return {"type": "full"}
    kind = algorithm_config.get("type", "LoRA")
    if kind != "LoRA":
        raise MappingError(f"algorithm_config.type: {kind!r} is not supported: kubetune trains full, LoRA, DoRA and QLoRA "
                           "(type LoRA with use_dora / quantize_base); quantization-aware training (QAT) is not one of them")
    modules: list[str] = []
    for name in algorithm_config.get("lora_attn_modules") or []:
        modules.append(_ATTN_MODULES.get(name, name))
    if algorithm_config.get("apply_lora_to_mlp"):
        modules += _MLP_MODULES
    if algorithm_config.get("apply_lora_to_output"):
        modules.append(_OUTPUT_MODULE)
    if not modules:
        raise MappingError("algorithm_config.lora_attn_modules: empty, and apply_lora_to_mlp / apply_lora_to_output are off: "
                           "name at least one module (q_proj, k_proj, v_proj, output_proj)")
    dora, qlora = bool(algorithm_config.get("use_dora")), bool(algorithm_config.get("quantize_base"))
    if dora and qlora:
        raise MappingError("algorithm_config: use_dora and quantize_base together are not supported; choose one")
    lora = {"target_modules": list(dict.fromkeys(modules))}
    if algorithm_config.get("rank") is not None:
        lora["r"] = int(algorithm_config["rank"])
    if algorithm_config.get("alpha") is not None:
        lora["alpha"] = float(algorithm_config["alpha"])
    return {"type": "dora" if dora else "qlora" if qlora else "lora", "lora": lora}


def _spec(*, name: str, model_source: str, training: dict, method: dict, train_file: str, eval_file: str | None,
          train_on_input: bool, defaults: dict | None) -> dict:
    dtype = training.pop("_dtype", None)
    spec: dict[str, Any] = {
        "name": name,
        "model": {"source": model_source, **({"dtype": dtype} if dtype else {})},
        "dataset": {"source": train_file, "format": "auto", **({"eval_source": eval_file} if eval_file else {}),
                    **({"train_on_inputs": True} if train_on_input else {})},
        "method": method,
        "training": training,
    }
    return merge_specs(defaults or {}, spec)


def sft_spec(*, job_uuid: str, model_source: str, training_config: dict, algorithm_config: dict | None,
             train_file: str, eval_file: str | None = None, defaults: dict | None = None,
             hyperparam_search_config: dict | None = None, logger_config: dict | None = None) -> tuple[dict, list[str]]:
    """A kubetune spec for ``supervised_fine_tune``, and notes on what the request asked that kubetune does not do.

    Args:
        job_uuid: the request's job id (the spec's name is derived from it).
        model_source: the model's URI (the caller resolved the request's model name).
        training_config / algorithm_config: the request's objects as JSON dicts.
        train_file / eval_file: the training and validation rows, already written as JSONL.
        defaults: a base spec (the provider's or server's defaults); the request's values win.

    Raises:
        MappingError: a field kubetune cannot honour, named.
    """
    notes: list[str] = []
    training = _training(training_config, notes)
    data = training_config.get("data_config") or {}
    spec = _spec(name=job_name(job_uuid), model_source=model_source, training=training, method=_method(algorithm_config),
                 train_file=train_file, eval_file=eval_file, train_on_input=bool(data.get("train_on_input")), defaults=defaults)
    _ignored(notes, hyperparam_search_config, logger_config)
    return spec, notes


def dpo_spec(*, job_uuid: str, model_source: str, training_config: dict, algorithm_config: dict | None,
             train_file: str, eval_file: str | None = None, defaults: dict | None = None,
             hyperparam_search_config: dict | None = None, logger_config: dict | None = None) -> tuple[dict, list[str]]:
    """A kubetune DPO spec (``method.objective: dpo``, LoRA) for ``preference_optimize``, and notes.

    llama-stack 0.2's ``DPOAlignmentConfig`` (reward_scale, reward_clip, epsilon, gamma) has no counterpart in TRL's
    DPO loss; newer llama-stack sends ``beta`` and ``loss_type``, which map to ``method.dpo``.
    """
    notes: list[str] = []
    training = _training(training_config, notes)
    dpo: dict[str, Any] = {}
    algo = algorithm_config or {}
    if algo.get("beta") is not None:
        dpo["beta"] = float(algo["beta"])
    if algo.get("loss_type") is not None:
        dpo["loss_type"] = str(algo["loss_type"])
    for key in ("reward_scale", "reward_clip", "epsilon", "gamma"):
        if algo.get(key) is not None:
            notes.append(f"algorithm_config.{key}: TRL's DPO loss has no such setting; not applied (method.dpo.beta is the KL weight)")
    method = {"type": "lora", "objective": "dpo", **({"dpo": dpo} if dpo else {})}
    spec = _spec(name=job_name(job_uuid), model_source=model_source, training=training, method=method,
                 train_file=train_file, eval_file=eval_file, train_on_input=False, defaults=defaults)
    _ignored(notes, hyperparam_search_config, logger_config)
    return spec, notes


def _ignored(notes: list[str], hyperparam_search_config: dict | None, logger_config: dict | None) -> None:
    if hyperparam_search_config:
        notes.append("hyperparam_search_config: not applied (kubetune sweeps are `kubetune sweep`, docs/sweeps.md)")
    if logger_config:
        notes.append("logger_config: not applied (set training.report_to in the provider's defaults)")


# -- rows ----------------------------------------------------------------------------------------------------------

def _json_field(row: dict, key: str, index: int) -> Any:
    value = row[key]
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise MappingError(f"dataset row {index}: column {key!r} is a string that is not JSON ({e.msg})") from None
    return value


def _text(content: Any) -> Any:
    """llama-stack's content items ({"type": "text", "text": ...}, or a list of them) -> a string; other content as it is."""
    if isinstance(content, dict) and content.get("type") == "text":
        return content.get("text", "")
    if isinstance(content, list) and content and all(isinstance(c, dict) and c.get("type") == "text" for c in content):
        return "".join(c.get("text", "") for c in content)
    return content


def _messages(value: Any, key: str, index: int) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m for m in value):
        raise MappingError(f"dataset row {index}: column {key!r} is not a list of messages with a role")
    return [{**{k: v for k, v in m.items() if k not in ("content", "context", "stop_reason")}, "content": _text(m.get("content", ""))}
            for m in value]


def plain(obj: Any) -> Any:
    """``json.dumps``'s ``default``: numpy scalars and arrays (pandas gives them in datasetio rows) as Python values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    return str(obj)


def _clean(value: Any) -> Any:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def normalize_rows(rows: Iterable[dict], data_format: str | None = None) -> list[dict]:
    """Rows as llama-stack's datasetio gives them -> rows kubetune's format detection reads.

    ``instruct`` rows (``chat_completion_input`` + ``expected_answer``, or ``input_query`` + ``expected_answer``)
    become chat ``messages`` whose answer is the assistant turn; ``dialog`` rows become ``messages``; JSON-encoded
    columns are decoded; the NaN cells pandas adds for missing columns are dropped. Other rows pass unchanged.

    Raises:
        MappingError: a row that is not an object, or a llama-stack column that does not hold messages.
    """
    out: list[dict] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise MappingError(f"dataset row {i}: not an object")
        row = json.loads(json.dumps({k: v for k, v in row.items() if _clean(v)}, default=plain))
        if "chat_completion_input" in row and "expected_answer" in row:
            msgs = _messages(_json_field(row, "chat_completion_input", i), "chat_completion_input", i)
            out.append({"messages": [*msgs, {"role": "assistant", "content": str(row["expected_answer"])}]})
        elif "input_query" in row and "expected_answer" in row:
            out.append({"messages": [{"role": "user", "content": str(row["input_query"])},
                                     {"role": "assistant", "content": str(row["expected_answer"])}]})
        elif "dialog" in row:
            out.append({"messages": _messages(_json_field(row, "dialog", i), "dialog", i)})
        elif isinstance(row.get("messages"), str):
            out.append({**row, "messages": _messages(_json_field(row, "messages", i), "messages", i)})
        elif isinstance(row.get("messages"), list):
            out.append({**row, "messages": _messages(row["messages"], "messages", i)})
        else:
            out.append(row)
    if not out:
        raise MappingError("the dataset has no rows")
    return out


# -- status --------------------------------------------------------------------------------------------------------

def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat() if ts else None


def job_status(job_uuid: str, state: str, *, created_at: float | None, started_at: float | None, finished_at: float | None,
               resources: dict | None, checkpoint_list: list[dict]) -> dict:
    """llama-stack's ``PostTrainingJobStatusResponse`` as JSON."""
    return {"job_uuid": job_uuid, "status": LLAMA_STATUS.get(state, "in_progress"), "scheduled_at": _iso(created_at),
            "started_at": _iso(started_at), "completed_at": _iso(finished_at), "resources_allocated": resources or None,
            "checkpoints": checkpoint_list}


def _metrics(epoch: int, train_loss: float | None, eval_loss: float | None) -> dict | None:
    # llama-stack's PostTrainingMetric needs all four numbers; without an eval loss there is none to give
    if train_loss is None or eval_loss is None:
        return None
    return {"epoch": epoch, "train_loss": float(train_loss), "validation_loss": float(eval_loss),
            "perplexity": float(math.exp(min(eval_loss, 50.0)))}


def checkpoints(job_uuid: str, events: list[dict], *, result: dict | None = None, final_path: str | None = None,
                finished_at: float | None = None) -> list[dict]:
    """llama-stack ``Checkpoint`` objects (JSON) for a job's checkpoint events, and its final model when it has one.

    Args:
        events: the job's events, oldest first (kubetune's events.jsonl records).
        result: result.json of a finished job; with ``final_path``, the final adapter or model is the last checkpoint.
    """
    out: list[dict] = []
    loss = epoch = None
    for ev in events:
        data = ev.get("data") or {}
        if ev.get("type") == "metrics":
            loss = data.get("loss", loss)
            epoch = data.get("epoch", epoch)
        elif ev.get("type") == "checkpoint" and data.get("step") is not None and not data.get("removed") and not data.get("resume"):
            ep = int(math.ceil(epoch)) if isinstance(epoch, (int, float)) else 0
            step = int(data["step"])
            out.append({"identifier": f"{job_uuid}/checkpoint-{step}", "created_at": _iso(ev.get("time") or finished_at or time.time()),
                        "epoch": ep, "post_training_job_id": job_uuid, "path": str(data.get("path", "")),
                        "training_metrics": _metrics(ep, loss, data.get("eval_loss"))})
    if result and final_path:
        ep = int(math.ceil(epoch)) if isinstance(epoch, (int, float)) else 0
        out.append({"identifier": f"{job_uuid}/final", "created_at": _iso(finished_at or time.time()),
                    "epoch": ep, "post_training_job_id": job_uuid, "path": final_path,
                    "training_metrics": _metrics(ep, result.get("train_loss"), result.get("eval_loss"))})
    return out
