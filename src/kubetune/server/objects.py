"""OpenAI's object shapes (files, fine-tuning jobs, events, checkpoints) from the database's records, and a
fine-tuning request turned into a kubetune job spec."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SpecError
from ..spec.validate import merge_specs
from ..serve.protocol import APIError
from .config import AUTO_HYPERPARAMETERS, ServerConfig

__all__ = ["FineTuneRequest", "build_spec", "file_object", "job_object", "event_object", "checkpoint_object", "fine_tuned_name"]

Auto = Literal["auto"]


class Hyperparameters(BaseModel):
    """OpenAI's hyperparameters: each a value or ``"auto"``."""

    model_config = ConfigDict(extra="forbid")
    n_epochs: Union[Auto, int] = Field("auto")
    batch_size: Union[Auto, int] = Field("auto")
    learning_rate_multiplier: Union[Auto, float] = Field("auto")


class _Supervised(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hyperparameters: Hyperparameters | None = None


class Method(BaseModel):
    """``method``: only ``supervised`` here (dpo is preference tuning, not served yet)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["supervised"] = "supervised"
    supervised: _Supervised | None = None


class FineTuneRequest(BaseModel):
    """The body of ``POST /v1/fine_tuning/jobs``."""

    model_config = ConfigDict(extra="forbid")
    model: str
    training_file: str
    validation_file: str | None = None
    hyperparameters: Hyperparameters | None = None
    method: Method | None = None
    suffix: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_-]*$")
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: dict[str, str] | None = None
    integrations: list[Any] | None = None


def resolve_hyperparameters(req: FineTuneRequest) -> dict[str, Any]:
    """The request's hyperparameters with every ``auto`` resolved (method's win over the top-level ones).

    Raises:
        APIError: a value out of range (400, naming the field).
    """
    given = (req.method.supervised.hyperparameters if req.method and req.method.supervised else None) or req.hyperparameters or Hyperparameters()
    out: dict[str, Any] = {}
    for name, auto in AUTO_HYPERPARAMETERS.items():
        value = getattr(given, name)
        out[name] = auto if value == "auto" else value
    limits = {"n_epochs": (1, 50), "batch_size": (1, 256), "learning_rate_multiplier": (1e-6, 100.0)}
    for name, (lo, hi) in limits.items():
        if not lo <= out[name] <= hi:
            raise APIError(400, f"hyperparameters.{name}: {out[name]} is outside [{lo}, {hi}]", param=f"hyperparameters.{name}")
    return out


def fine_tuned_name(model: str, suffix: str | None, job_id: str) -> str:
    """``ft:<base>:<suffix>:<id>`` (the suffix empty when none was given)."""
    return f"ft:{model}:{suffix or ''}:{job_id.removeprefix('ftjob-')}"


def build_spec(config: ServerConfig, job_id: str, source: str, hp: dict, *, train_path: Path, valid_path: Path | None, seed: int | None) -> dict:
    """The kubetune spec of an OpenAI fine-tuning job: the method's defaults, then the request.

    Raises:
        APIError: the spec kubetune makes of it is invalid (400, with kubetune's message).
    """
    from ..spec import load_spec

    defaults = config.method_defaults.get("supervised", {})
    base_lr = float((defaults.get("training") or {}).get("learning_rate", 2e-4))
    request: dict[str, Any] = {
        "name": job_id,
        "model": {"source": source},
        "dataset": {"source": str(train_path), "format": "auto", **({"eval_source": str(valid_path)} if valid_path else {})},
        "training": {"epochs": hp["n_epochs"], "batch_size": hp["batch_size"], "learning_rate": base_lr * hp["learning_rate_multiplier"]},
        "output": {"dir": str(config.data_path() / "runs" / job_id)},
    }
    if seed is not None:
        request["training"]["seed"] = seed
    spec = merge_specs(defaults, request)
    prefix = (defaults.get("output") or {}).get("uri")
    if prefix:  # a prefix shared by every job of the method: each publishes under its own id
        spec["output"]["uri"] = f"{str(prefix).rstrip('/')}/{job_id}"
    try:
        load_spec(copy.deepcopy(spec))
    except SpecError as e:
        raise APIError(400, f"the job cannot run: {e.message}", code="invalid_job") from None
    return spec


# -- objects ----------------------------------------------------------------------------------------
def file_object(f: dict) -> dict:
    """OpenAI's ``file`` object."""
    return {"id": f["id"], "object": "file", "bytes": f["bytes"], "created_at": int(f["created_at"]), "filename": f["filename"],
            "purpose": f["purpose"], "status": "processed", "status_details": None, "expires_at": None}


def job_object(j: dict) -> dict:
    """OpenAI's ``fine_tuning.job`` object."""
    hp = dict(j.get("hyperparameters") or {})
    return {
        "object": "fine_tuning.job",
        "id": j["id"],
        "created_at": int(j["created_at"]),
        "finished_at": int(j["finished_at"]) if j.get("finished_at") else None,
        "model": j["model"],
        "fine_tuned_model": j["fine_tuned_model"] if j["status"] == "succeeded" else None,
        "organization_id": j["project_id"],
        "status": j["status"],
        "training_file": j.get("training_file"),
        "validation_file": j.get("validation_file"),
        "hyperparameters": hp,
        "method": {"type": "supervised", "supervised": {"hyperparameters": hp}},
        "result_files": [],
        "trained_tokens": j.get("trained_tokens"),
        "error": j.get("error"),
        "seed": j.get("seed"),
        "suffix": j.get("suffix"),
        "metadata": j.get("extra_metadata"),
        "integrations": [],
        "estimated_finish": None,
        "user_provided_suffix": j.get("suffix"),
    }


def event_object(e: dict) -> dict:
    """OpenAI's ``fine_tuning.job.event`` object (id ``ftevent-<seq>``: the list's cursor)."""
    return {"object": "fine_tuning.job.event", "id": f"ftevent-{e['seq']}", "created_at": int(e["created_at"]), "level": e["level"],
            "message": e["message"], "type": e["type"], "data": e.get("data")}


def checkpoint_object(c: dict, job: dict) -> dict:
    """OpenAI's ``fine_tuning.job.checkpoint`` object."""
    step = int(c["step"])
    base = job["fine_tuned_model"] or fine_tuned_name(job["model"], job.get("suffix"), job["id"])
    return {"object": "fine_tuning.job.checkpoint", "id": f"ftckpt-{c['seq']}", "created_at": int(c["created_at"]),
            "fine_tuned_model_checkpoint": f"{base}:ckpt-step-{step}", "fine_tuning_job_id": job["id"], "step_number": step,
            "metrics": c.get("metrics") or {"step": step}}
