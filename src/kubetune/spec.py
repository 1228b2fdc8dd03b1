"""The job spec: one declarative description of a fine-tune, loaded from YAML or built in Python.

Every section is a pydantic model with ``extra="forbid"``; defaults live here and nowhere else.
``load_spec`` turns YAML (plus ``--set`` overrides) into a validated :class:`TuneJob`, and turns
pydantic's errors into one :class:`~kubetune.errors.SpecError` whose lines name the field path and,
for unknown keys, the closest valid key.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SpecError

__all__ = [
    "TuneJob",
    "ModelSpec",
    "DatasetSpec",
    "LoraSpec",
    "MethodSpec",
    "TrainingSpec",
    "OutputSpec",
    "ResourcesSpec",
    "load_spec",
    "apply_overrides",
    "spec_to_dict",
    "dump_spec",
    "URI_SCHEMES",
    "check_uri",
]

# Schemes a model, dataset or output may name. A plain path (no scheme) is a local path.
URI_SCHEMES = ("file", "hf", "s3", "http", "https", "oci", "builtin")
_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check_uri(value: str) -> str:
    """Return ``value`` if it is a local path or a URI with a supported scheme, else raise ValueError."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty path or URI")
    m = _SCHEME_RE.match(value)
    if m and m.group(1).lower() not in URI_SCHEMES:
        raise ValueError(
            f"unknown URI scheme '{m.group(1)}://' in '{value}'; supported: "
            + ", ".join(f"{s}://" for s in URI_SCHEMES)
            + " or a local path"
        )
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


# --- model -----------------------------------------------------------------------------------
class ModelSpec(_Section):
    """The base model to fine-tune."""

    source: str = Field(
        description="Model URI: builtin://tiny-chat, hf://org/name[@revision], s3://bucket/prefix, "
        "http(s)://..., oci://registry/repo:tag, or a local directory / tarball."
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit); overrides an @revision in source.")
    trust_remote_code: bool = Field(False, description="Run Python code shipped with the model. Off unless you trust it.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights/compute dtype. auto: bf16 where the device supports it, fp32 on CPU."
    )
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = Field(
        "auto", description="Attention kernel. auto: sdpa when available."
    )

    _check_source = field_validator("source")(lambda cls, v: check_uri(v))


# --- dataset ---------------------------------------------------------------------------------
DatasetFormat = Literal["auto", "messages", "sharegpt", "prompt_completion", "alpaca", "text"]


class DatasetSpec(_Section):
    """Training data: where it is, its format, and how it is turned into trained tokens."""

    source: str = Field(description="Dataset URI or local file/directory (JSONL, JSON, CSV, Parquet).")
    format: DatasetFormat = Field("auto", description="Row format; auto detects it from the rows.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Map kubetune's column names to yours, e.g. {prompt: question, completion: answer}.",
    )
    eval_source: str | None = Field(None, description="A separate evaluation dataset (same formats).")
    eval_split: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of rows held out for evaluation (seeded).")
    chat_template: str | None = Field(
        None, description="Named chat template (chatml, llama3, mistral, ...) when the tokenizer has none or to override it."
    )
    train_on_inputs: bool = Field(False, description="Train on prompt tokens too (default: answers only).")
    on_bad_rows: Literal["error", "skip"] = Field("error", description="A malformed row stops the job, or is skipped and counted.")
    length_handling: Literal["truncate", "drop"] = Field(
        "truncate", description="Rows longer than training.max_seq_length are cut or dropped (both are reported)."
    )
    max_rows: int | None = Field(None, ge=1, description="Use at most this many rows (after shuffling with the seed).")

    _check_source = field_validator("source")(lambda cls, v: check_uri(v))

    @field_validator("eval_source")
    @classmethod
    def _check_eval_source(cls, v: str | None) -> str | None:
        return None if v is None else check_uri(v)

    @model_validator(mode="after")
    def _one_eval(self) -> "DatasetSpec":
        if self.eval_source and self.eval_split:
            raise ValueError("set either eval_source or eval_split, not both")
        return self


# --- method ----------------------------------------------------------------------------------
class LoraSpec(_Section):
    """LoRA adapter settings (used by lora, qlora and dora)."""

    r: int = Field(16, ge=1, le=4096, description="Adapter rank.")
    alpha: float = Field(32, gt=0, description="Scaling numerator (scale = alpha / r, or alpha / sqrt(r) with rslora).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: Union[Literal["all-linear"], list[str]] = Field(
        "all-linear", description="Modules that get adapters: all-linear, or a list of module names."
    )
    use_rslora: bool = Field(False, description="Rank-stabilised LoRA scaling.")
    modules_to_save: list[str] = Field(default_factory=list, description="Modules trained fully and saved with the adapter.")
    bias: Literal["none", "all", "lora_only"] = Field("none", description="Which biases are trained.")


class MethodSpec(_Section):
    """How the model is adapted."""

    type: Literal["full", "lora", "qlora", "dora"] = Field("lora", description="full fine-tune, LoRA, QLoRA (4-bit base) or DoRA.")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Adapter settings (ignored for full).")

    @model_validator(mode="after")
    def _full_has_no_lora(self) -> "MethodSpec":
        if self.type == "full" and "lora" in self.model_fields_set:
            raise ValueError("method.lora is set but method.type is 'full'; remove method.lora or use lora/qlora/dora")
        return self


# --- training --------------------------------------------------------------------------------
class TrainingSpec(_Section):
    """Hyperparameters and the training loop."""

    epochs: float = Field(3.0, gt=0, description="Passes over the training data (max_steps wins when set).")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps; overrides epochs.")
    batch_size: int = Field(8, ge=1, description="Sequences per device per micro-step.")
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, description="Micro-steps per optimizer step (derived from global_batch_size when that is set; default 1)."
    )
    global_batch_size: int | None = Field(
        None, ge=1, description="Sequences per optimizer step over all processes; accumulation is derived from it."
    )
    learning_rate: float = Field(2e-4, gt=0, le=1.0, description="Peak learning rate.")
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial"] = Field(
        "cosine", description="Learning-rate schedule."
    )
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of steps spent warming up.")
    warmup_steps: int = Field(0, ge=0, description="Warm-up steps (wins over warmup_ratio when > 0).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0.0, description="Gradient clipping (0 disables).")
    optimizer: str = Field("adamw_torch", description="Optimizer name as transformers knows it (adamw_torch, adamw_8bit, ...).")
    seed: int = Field(42, ge=0, description="Seed for data order, splits and initialisation.")
    max_seq_length: int = Field(1024, ge=8, description="Longest sequence in tokens.")
    packing: bool = Field(False, description="Pack several rows per sequence (no attention across rows).")
    logging_steps: int = Field(1, ge=1, description="Emit metrics every N optimizer steps.")
    eval_steps: int | None = Field(None, ge=1, description="Evaluate every N steps (default: at the end of each epoch).")
    save_steps: int | None = Field(None, ge=1, description="Checkpoint every N steps (default: at the end of each epoch).")
    save_total_limit: int | None = Field(2, ge=1, description="Keep the newest K checkpoints.")
    gradient_checkpointing: bool = Field(False, description="Trade compute for memory.")
    resume: str = Field("auto", description="auto: continue from the newest complete checkpoint; never; or a checkpoint path.")
    report_to: list[str] = Field(default_factory=list, description="Trainer integrations: tensorboard, mlflow, ...")

    @model_validator(mode="after")
    def _accumulation(self) -> "TrainingSpec":
        if self.global_batch_size is not None and self.gradient_accumulation_steps is not None:
            raise ValueError("set either global_batch_size or gradient_accumulation_steps, not both")
        return self


# --- output ----------------------------------------------------------------------------------
class OutputSpec(_Section):
    """Where results go."""

    dir: str = Field("runs/{name}", description="The local run directory ({name} is replaced by the job name).")
    uri: str | None = Field(None, description="Also publish results to s3://... or oci://... (checkpoints are synced there).")
    merge: bool = Field(False, description="Also write base+adapter merged into merged/.")

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, v: str | None) -> str | None:
        if v is None:
            return v
        check_uri(v)
        m = _SCHEME_RE.match(v)
        if not m or m.group(1).lower() not in ("s3", "oci", "file"):
            raise ValueError(f"output.uri must be s3://..., oci://... or file://..., got '{v}'")
        return v


# --- resources -------------------------------------------------------------------------------
class ResourcesSpec(_Section):
    """Compute for the job: topology and per-node resources."""

    nodes: int = Field(1, ge=1, description="Machines (pods) taking part.")
    processes_per_node: int = Field(1, ge=1, description="Worker processes per node (one per accelerator, usually).")
    accelerators: int = Field(0, ge=0, description="Accelerators per node (0: CPU only).")
    accelerator_type: str = Field(
        "nvidia.com/gpu", description="Extended resource name: nvidia.com/gpu, amd.com/gpu, habana.ai/gaudi, nvidia.com/mig-1g.10gb, ..."
    )
    cpu: str | None = Field(None, description="CPU request per node, e.g. '8'.")
    memory: str | None = Field(None, description="Memory request per node, e.g. '32Gi'.")

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node


# --- the job ---------------------------------------------------------------------------------
class TuneJob(_Section):
    """A fine-tuning job: model, data, method, hyperparameters, resources and outputs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, title="kubetune job spec")

    name: str = Field("kubetune-job", description="Job name: lowercase letters, digits and '-', at most 40 characters.")
    model: ModelSpec
    dataset: DatasetSpec
    method: MethodSpec = Field(default_factory=MethodSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if len(v) > 40 or not _NAME_RE.match(v):
            raise ValueError(
                f"'{v}' is not a valid job name: use lowercase letters, digits and '-', start with a letter, at most 40 characters"
            )
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> "TuneJob":
        t, r = self.training, self.resources
        if t.global_batch_size is not None:
            per_step = t.batch_size * r.world_size
            if t.global_batch_size % per_step:
                raise ValueError(
                    f"training.global_batch_size ({t.global_batch_size}) must be a multiple of training.batch_size x "
                    f"processes ({t.batch_size} x {r.world_size} = {per_step})"
                )
        if r.accelerators and r.processes_per_node > r.accelerators:
            raise ValueError(
                f"resources.processes_per_node ({r.processes_per_node}) exceeds resources.accelerators ({r.accelerators}); "
                "use one process per accelerator"
            )
        return self

    # -- derived values ---------------------------------------------------------------------
    @property
    def accumulation_steps(self) -> int:
        """Micro-steps per optimizer step, derived from global_batch_size when that is set."""
        t = self.training
        if t.global_batch_size is not None:
            return t.global_batch_size // (t.batch_size * self.resources.world_size)
        return t.gradient_accumulation_steps or 1

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over all processes."""
        return self.training.batch_size * self.resources.world_size * self.accumulation_steps

    @property
    def output_dir(self) -> Path:
        """The local run directory, absolute."""
        return Path(self.output.dir.replace("{name}", self.name)).expanduser().absolute()


# --- loading, overrides, errors --------------------------------------------------------------
def _parse_scalar(text: str) -> Any:
    """Parse an override value like helm --set: YAML scalars and flow collections."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str] | None) -> dict:
    """Apply ``path.to.key=value`` overrides to a spec dict (in place) and return it.

    Raises:
        SpecError: an override is not of the form KEY=VALUE, or walks through a non-mapping.
    """
    for item in overrides or []:
        if "=" not in item:
            raise SpecError(f"--set '{item}': expected KEY=VALUE, e.g. training.learning_rate=1e-4")
        key, _, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise SpecError(f"--set '{item}': empty key")
        node = data
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise SpecError(f"--set '{item}': '{'.'.join(parts[: i + 1])}' is not a section")
            node = nxt
        node[parts[-1]] = _parse_scalar(raw)
    return data


def _model_at(path: tuple, root: type[BaseModel] = None) -> type[BaseModel] | None:  # type: ignore[assignment]
    """The pydantic model class found by walking ``path`` from TuneJob (for key suggestions)."""
    model: Any = root or TuneJob
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    args = getattr(annotation, "__args__", None)
    if args:
        for a in args:
            if isinstance(a, type) and issubclass(a, BaseModel):
                return a
    return annotation


def _format_errors(err: ValidationError, source: str) -> SpecError:
    problems = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        path = ".".join(loc) or "(spec)"
        if e["type"] == "extra_forbidden":
            parent = _model_at(tuple(e["loc"][:-1]))
            hint = ""
            if parent is not None:
                close = difflib.get_close_matches(loc[-1], list(parent.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f"; did you mean {'.'.join(loc[:-1] + (close[0],))}?"
                else:
                    hint = f"; valid keys here: {', '.join(parent.model_fields)}"
            problems.append(f"{path}: unknown key{hint}")
        elif e["type"] == "missing":
            problems.append(f"{path}: required field is missing")
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            val = e.get("input")
            shown = "" if isinstance(val, (dict, list)) or val is None else f" (got {val!r})"
            problems.append(f"{path}: {msg}{shown}")
    head = f"invalid job spec {source}" if source else "invalid job spec"
    return SpecError(head + ":\n  " + "\n  ".join(problems), problems=problems)


def _resolve_local_paths(data: dict, base: Path | None) -> None:
    """Make relative local dataset/model paths absolute: the current directory first, then the spec's."""

    def fix(section: dict | None, key: str) -> None:
        if not isinstance(section, dict):
            return
        v = section.get(key)
        if not isinstance(v, str) or _SCHEME_RE.match(v) or os.path.isabs(v):
            return
        p = Path(v).expanduser()
        for candidate in (Path.cwd() / p, (base / p) if base else None):
            if candidate is not None and candidate.exists():
                section[key] = str(candidate.resolve())
                return

    fix(data.get("model"), "source")
    fix(data.get("dataset"), "source")
    fix(data.get("dataset"), "eval_source")


def load_spec(source: str | os.PathLike | dict, overrides: list[str] | None = None) -> TuneJob:
    """Load, override and validate a job spec.

    Args:
        source: a YAML file path, or a dict with the spec's fields.
        overrides: ``path=value`` strings applied before validation (like ``helm --set``).

    Returns:
        The validated :class:`TuneJob`.

    Raises:
        SpecError: the file is missing or not YAML, or the spec is invalid (all problems listed).
    """
    base: Path | None = None
    label = ""
    if isinstance(source, dict):
        data = _deep_copy(source)
    else:
        path = Path(source)
        label = str(path)
        if not path.is_file():
            raise SpecError(f"spec file not found: {path}", hint="pass the path of a YAML job spec, e.g. examples/quickstart.yaml")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise SpecError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise SpecError(f"{path}: a job spec must be a YAML mapping, got {type(data).__name__}")
        base = path.parent.resolve()
        data.setdefault("name", _name_from_file(path))
    apply_overrides(data, overrides)
    _resolve_local_paths(data, base)
    try:
        return TuneJob.model_validate(data)
    except ValidationError as e:
        raise _format_errors(e, label) from None


def _name_from_file(path: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", path.stem.lower()).strip("-")
    return (name if name and name[0].isalpha() else f"job-{name}")[:40].rstrip("-") or "kubetune-job"


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def spec_to_dict(job: TuneJob) -> dict:
    """The resolved spec as plain data (every default filled in)."""
    return job.model_dump(mode="json")


def dump_spec(job: TuneJob) -> str:
    """The resolved spec as YAML, in field order."""
    return yaml.safe_dump(spec_to_dict(job), sort_keys=False, allow_unicode=True)
