"""The job spec: one declarative description of a fine-tune, loaded from YAML or built in Python.

Every section is a pydantic model with ``extra="forbid"``; defaults live here and nowhere else.
``load_spec`` turns YAML (plus ``--set`` overrides) into a validated :class:`TuneJob`, and turns
pydantic's errors into one :class:`~kubetune.errors.SpecError` whose lines name the file:line (or the
override), the field path and, for unknown keys, the closest valid key. The YAML is read within bounds
(:mod:`kubetune.spec_yaml`), and every number has a sane range.

A job remembers which fields its spec set; method presets fill the rest. A job derived from another
(a sweep trial, ``Client.submit(job, overrides)``) is made by :meth:`TuneJob.with_overrides`, never by
dumping the resolved spec and loading it back, which would count every preset value as set by the user.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import types as types_
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from . import constants as C
from .errors import SpecError
from .redact import MASK, has_credentials, redact_data
from .spec_yaml import Located, check_shape, parse_value, read_spec_file, where_written

__all__ = [
    "TuneJob",
    "ModelSpec",
    "DatasetSpec",
    "DatasetSourceSpec",
    "LoraSpec",
    "MethodSpec",
    "TrainingSpec",
    "OutputSpec",
    "ResourcesSpec",
    "load_spec",
    "apply_overrides",
    "spec_to_dict",
    "dump_spec",
    "redacted_spec_dict",
    "spec_warnings",
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


# A number as text: YAML 1.1 (PyYAML) reads exponents without a dot, like 1e-4, as strings.
_NUMBER_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class _Section(BaseModel):
    # allow_inf_nan: no NaN or infinity in any number of a spec
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """Numbers are numbers: true/false is not one; '1e9' (a string to YAML 1.1) counts as 1e9 for an integer field,
        which then must be whole and in range."""
        kind = _number_kind(cls, info.field_name)
        if kind is None:
            return v
        if isinstance(v, bool):
            raise ValueError(f"expected a number, got {str(v).lower()}")
        if kind is int and isinstance(v, str) and _NUMBER_RE.match(v.strip()) and not v.strip().lstrip("+-").isdigit():
            v = float(v)
        if kind is int and isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)  # 1e38 too: the field's bounds then name the limit
        return v


_NUMBER_KINDS: dict[type, dict[str, type]] = {}


def _number_kind(cls: type[BaseModel], name: str | None) -> type | None:
    """int or float when field ``name`` of ``cls`` holds a number (possibly optional), else None."""
    kinds = _NUMBER_KINDS.get(cls)
    if kinds is None:
        kinds = {}
        for field_name, field in cls.model_fields.items():
            ann = field.annotation
            types = set(get_args(ann)) - {type(None)} if get_origin(ann) in (Union, types_.UnionType) else {ann}
            if types in ({int}, {float}):
                kinds[field_name] = next(iter(types))
        _NUMBER_KINDS[cls] = kinds
    return kinds.get(name or "")


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


def _check_columns(v: dict[str, str]) -> dict[str, str]:
    from .data.formats import COLUMN_NAMES

    unknown = [k for k in v if k not in COLUMN_NAMES]
    if unknown:
        raise ValueError(
            f"unknown column name(s) {', '.join(unknown)}: keys are kubetune's names ({', '.join(COLUMN_NAMES)}), "
            "values are your dataset's, e.g. {prompt: question, completion: answer}"
        )
    return v


class DatasetSourceSpec(_Section):
    """One more dataset, trained together with ``dataset.source`` (an entry of ``dataset.mix``)."""

    source: str = Field(description="Dataset URI or local file/directory (JSONL, JSON, CSV, Parquet, save_to_disk folder).")
    weight: float | None = Field(
        None, gt=0, le=C.SPEC_MAX_WEIGHT, description="Share of the training rows (relative to the other sources' weights); unset: all rows, once."
    )
    format: DatasetFormat = Field("auto", description="Row format; auto detects it from the rows.")
    columns: dict[str, str] = Field(default_factory=dict, description="Map kubetune's column names to this dataset's.")
    split: str = Field("train", description="Split to read from a Hub dataset, a saved DatasetDict or split-named files.")

    _check_source = field_validator("source")(lambda cls, v: check_uri(v))
    _check_columns = field_validator("columns")(lambda cls, v: _check_columns(v))


class DatasetSpec(_Section):
    """Training data: where it is, its format, and how it is turned into trained tokens."""

    source: str = Field(description="Dataset URI or local file/directory (JSONL, JSON, CSV, Parquet, save_to_disk folder).")
    format: DatasetFormat = Field("auto", description="Row format; auto detects it from the rows.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Map kubetune's column names to yours, e.g. {prompt: question, completion: answer}.",
    )
    split: str = Field("train", description="Split to read from a Hub dataset, a saved DatasetDict or split-named files.")
    weight: float | None = Field(
        None, gt=0, le=C.SPEC_MAX_WEIGHT, description="Share of the training rows when mixing with dataset.mix (relative to their weights)."
    )
    mix: list[DatasetSourceSpec] = Field(
        default_factory=list,
        max_length=C.SPEC_MAX_MIX,
        description="More datasets trained together with source: concatenated, or sampled by weight when weights are set.",
    )
    eval_source: str | None = Field(None, description="A separate evaluation dataset (same formats).")
    eval_split: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of rows held out for evaluation (seeded).")
    chat_template: str | None = Field(
        None,
        description="Named chat template (chatml, llama3, mistral, gemma, phi3) when the tokenizer has none or to override "
        "it; unset: the tokenizer's own.",
    )
    train_on_inputs: bool = Field(False, description="Train on prompt tokens too (default: answers only).")
    on_bad_rows: Literal["error", "skip"] = Field("error", description="A malformed row stops the job, or is skipped and counted.")
    length_handling: Literal["truncate", "drop"] = Field(
        "truncate", description="Rows longer than training.max_seq_length are cut or dropped (both are reported)."
    )
    max_rows: int | None = Field(None, ge=1, le=C.SPEC_MAX_ROWS, description="Use at most this many rows (after shuffling with the seed).")
    cache: bool = Field(True, description="Reuse prepared (tokenized) data from the kubetune cache when data, tokenizer and settings match.")
    num_proc: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_PROCS, description="Processes that tokenize; unset: all CPUs for large datasets, one for small ones."
    )

    _check_source = field_validator("source")(lambda cls, v: check_uri(v))
    _check_columns = field_validator("columns")(lambda cls, v: _check_columns(v))

    @field_validator("eval_source")
    @classmethod
    def _check_eval_source(cls, v: str | None) -> str | None:
        return None if v is None else check_uri(v)

    @field_validator("chat_template")
    @classmethod
    def _check_chat_template(cls, v: str | None) -> str | None:
        from .data.templates import CHAT_TEMPLATES

        if v is not None and v not in CHAT_TEMPLATES:
            raise ValueError(f"unknown chat template '{v}'; choose one of {', '.join(CHAT_TEMPLATES)} (or leave it unset)")
        return v

    @model_validator(mode="after")
    def _one_eval(self) -> "DatasetSpec":
        if self.eval_source and self.eval_split:
            raise ValueError("set either eval_source or eval_split, not both")
        weighted = [w is not None for w in [self.weight] + [m.weight for m in self.mix]]
        if any(weighted) and not all(weighted):
            raise ValueError("give dataset.weight and every dataset.mix[].weight, or none of them (none: concatenate)")
        if self.weight is not None and not self.mix:
            raise ValueError("dataset.weight only applies when mixing with dataset.mix")
        return self


# --- method ----------------------------------------------------------------------------------
# Fields marked "(preset)" start from the method's preset (src/kubetune/presets/<method.type>.yaml), not
# from the schema default shown here; whatever the spec sets wins, field by field.
class LoraSpec(_Section):
    """LoRA adapter settings (used by lora, qlora and dora)."""

    r: int = Field(16, ge=1, le=4096, description="Adapter rank (preset).")
    alpha: float = Field(32, gt=0, le=C.SPEC_MAX_LORA_ALPHA, description="Scaling numerator: scale = alpha / r, or alpha / sqrt(r) with use_rslora (preset).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input (preset).")
    target_modules: Union[Literal["all-linear", "attention", "mlp"], list[str]] = Field(
        "all-linear",
        description="Modules that get adapters: all-linear (every linear layer but the output head), attention or mlp "
        "(per-architecture presets), or a list of module names (preset).",
    )
    use_rslora: bool = Field(False, description="Rank-stabilised LoRA: scale alpha / sqrt(r), steadier at high ranks (preset).")
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained fully and saved inside the adapter, e.g. [embed_tokens] for new tokens. "
        "Makes the adapter much bigger and not loadable as a LoRA adapter by vLLM (serve merged/ instead).",
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="Which biases are trained.")

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or not all(isinstance(m, str) and m.strip() for m in v)):
            raise ValueError("give all-linear, attention, mlp or a non-empty list of module names")
        return v


class MethodSpec(_Section):
    """How the model is adapted."""

    type: Literal["full", "lora", "qlora", "dora"] = Field(
        "lora",
        description="full fine-tune, LoRA, QLoRA (4-bit NF4 base via bitsandbytes) or DoRA; picks the preset that "
        "fills the fields marked (preset).",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Adapter settings (ignored for full).")


# --- training --------------------------------------------------------------------------------
# Integrations transformers' Trainer knows by name (training.report_to); each needs its own package.
REPORT_TO = ("tensorboard", "mlflow", "wandb", "comet_ml", "clearml", "dvclive", "neptune", "aim", "swanlab", "trackio", "codecarbon", "azure_ml", "dagshub", "flyte")


class TrainingSpec(_Section):
    """Hyperparameters and the training loop."""

    epochs: float = Field(3.0, gt=0, le=C.SPEC_MAX_EPOCHS, description="Passes over the training data (max_steps wins when set).")
    max_steps: int | None = Field(None, ge=1, le=C.SPEC_MAX_STEPS, description="Optimizer steps; overrides epochs.")
    batch_size: int = Field(8, ge=1, le=C.SPEC_MAX_BATCH, description="Sequences per device per micro-step.")
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_BATCH, description="Micro-steps per optimizer step (derived from global_batch_size when that is set; default 1)."
    )
    global_batch_size: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_GLOBAL_BATCH, description="Sequences per optimizer step over all processes; accumulation is derived from it."
    )
    learning_rate: float = Field(2e-4, gt=0, le=1.0, description="Peak learning rate (preset).")
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial"] = Field(
        "cosine", description="Learning-rate schedule (preset)."
    )
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of steps spent warming up (preset).")
    warmup_steps: int = Field(0, ge=0, le=C.SPEC_MAX_STEPS, description="Warm-up steps (wins over warmup_ratio when > 0).")
    weight_decay: float = Field(0.0, ge=0.0, le=C.SPEC_MAX_WEIGHT_DECAY, description="AdamW weight decay (preset).")
    max_grad_norm: float = Field(1.0, ge=0.0, le=C.SPEC_MAX_GRAD_NORM, description="Gradient clipping (0 disables) (preset).")
    optimizer: str = Field(
        "adamw_torch", description="Optimizer name as transformers knows it: adamw_torch, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, ... (preset)."
    )
    seed: int = Field(42, ge=0, le=C.SPEC_MAX_SEED, description="Seed for data order, splits and initialisation.")
    max_seq_length: int = Field(
        1024, ge=8, le=C.SPEC_MAX_SEQ_LENGTH,
        description="Longest sequence in tokens; at most the model's max_position_embeddings (checked where the model's config is at hand).",
    )
    packing: bool = Field(False, description="Pack several rows per sequence (no attention across rows).")
    logging_steps: int = Field(1, ge=1, le=C.SPEC_MAX_STEPS, description="Emit metrics every N optimizer steps.")
    eval_steps: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_STEPS, description="Evaluate every N steps (default: whenever a checkpoint is saved); always at the end too."
    )
    save_steps: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_STEPS, description="Checkpoint every N steps (default: once per epoch); the last step is always saved."
    )
    save_total_limit: int | None = Field(
        2, ge=1, le=C.SPEC_MAX_KEEP, description="Keep the newest K complete checkpoints (plus the best one by eval loss); null keeps all."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: less memory, about 30% slower (preset).")
    resume: str = Field(
        "auto",
        description="auto: continue from the newest complete checkpoint in output.dir (restoring optimizer, scheduler, "
        "RNG and data position); never: start over; or the path of a checkpoint directory.",
    )
    report_to: list[Literal[REPORT_TO]] = Field(  # type: ignore[valid-type]
        default_factory=list,
        description="Trainer integrations to log to, e.g. [tensorboard] (files under logs/tensorboard) or [mlflow]; "
        "install them with pip install 'kubetune[tracking]'.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How several processes share the work: ddp (each holds the whole model; gradients are averaged) or "
        "fsdp (full shard: parameters, gradients and optimizer state split over the processes; GPUs only, not with qlora).",
    )

    @field_validator("resume")
    @classmethod
    def _resume(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must be auto, never or the path of a checkpoint directory")
        return v

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

    @field_validator("dir")
    @classmethod
    def _check_dir(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a directory path, e.g. runs/{name} (an empty one would be the current directory)")
        return v

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

    nodes: int = Field(1, ge=1, le=C.SPEC_MAX_NODES, description="Machines (pods) taking part.")
    processes_per_node: int = Field(1, ge=1, le=C.SPEC_MAX_PROCESSES, description="Worker processes per node (one per accelerator, usually).")
    accelerators: int = Field(0, ge=0, le=C.SPEC_MAX_PROCESSES, description="Accelerators per node (0: CPU only).")
    accelerator_type: str = Field(
        "nvidia.com/gpu", description="Extended resource name: nvidia.com/gpu, amd.com/gpu, habana.ai/gaudi, nvidia.com/mig-1g.10gb, ..."
    )
    cpu: str | None = Field(None, description="CPU request per node, e.g. '8'.")
    memory: str | None = Field(None, description="Memory request per node, e.g. '32Gi'.")
    collective_timeout_seconds: int = Field(
        1800, ge=10, le=C.SPEC_MAX_TIMEOUT_S, description="How long a process waits for the others in one collective (gradient all-reduce, barrier, "
        "checkpoint) before the job fails: a hung rank ends the job after this, never later."
    )
    rendezvous_timeout_seconds: int = Field(
        600, ge=10, le=C.SPEC_MAX_TIMEOUT_S, description="How long the nodes of a multi-node job wait for each other at start-up (python -m kubetune.distributed)."
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node


# --- kubernetes ------------------------------------------------------------------------------
# Rules the API server would enforce; checked here so a bad value fails at load, naming its field.
_K8S_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label (namespace)
_K8S_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_K8S_QUALIFIED_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")  # label key name, label value
_K8S_QUANTITY_RE = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")
_K8S_ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_K8S_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
# Plain env values land in the rendered objects; these names must come from a Secret instead.
_K8S_SECRET_NAME_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_KEY|PRIVATE_KEY", re.I)
# Names that often hold a credential but also name harmless things (CACHE_KEY, NUM_PASS): warned about, not
# refused (spec_warnings), and their values are masked wherever the spec is shown or saved.
_K8S_SECRETISH_WORDS = frozenset({"PASS", "PASSWD", "PWD", "PW", "PAT", "KEY", "KEYS", "AUTH", "CRED", "CREDS", "SIG",
                                  "SIGNATURE", "SESSION", "COOKIE", "DSN", "PASSPHRASE", "SALT"})
# Values shaped like well-known credentials: GitHub/GitLab/Hugging Face/OpenAI/Slack/Google tokens, AWS key
# ids, JWTs, PEM private keys.
_SECRET_VALUE_RE = re.compile(
    r"^(gh[pousr]_|github_pat_|glpat-|hf_[A-Za-z0-9]{20}|sk-[A-Za-z0-9_-]{16}|xox[abposr]-|(AKIA|ASIA)[A-Z0-9]{16}$|AIza[0-9A-Za-z_-]{30}|"
    r"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.)|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)


def _secretish_env_name(name: str) -> bool:
    """Whether an environment variable named ``name`` probably holds a credential (refused or warned names)."""
    if _K8S_SECRET_NAME_RE.search(name):
        return True
    words = [w for w in re.split(r"[_.\-]+", name.upper()) if w]
    return any(w in _K8S_SECRETISH_WORDS or w.endswith(("PASS", "PWD", "KEY", "TOKEN")) for w in words)


def _k8s_name(value: str, what: str = "name") -> str:
    if len(value) > 253 or not _K8S_SUBDOMAIN_RE.match(value):
        raise ValueError(f"'{value}' is not a valid Kubernetes {what}: lowercase letters, digits, '-' and '.'")
    return value


def _k8s_quantity(value: str | None) -> str | None:
    if value is not None and not _K8S_QUANTITY_RE.match(str(value)):
        raise ValueError(f"'{value}' is not a Kubernetes quantity (e.g. 500m, 8, 32Gi, 1.5G)")
    return value


def _k8s_labels(values: dict[str, str], *, labels: bool) -> dict[str, str]:
    for key, val in values.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _K8S_SUBDOMAIN_RE.match(prefix))) or len(name) > 63 or not _K8S_QUALIFIED_RE.match(name):
            raise ValueError(f"'{key}' is not a valid label/annotation key ([prefix/]name, name at most 63 characters)")
        if prefix == "kubetune.io" or prefix.endswith(".kubetune.io"):
            raise ValueError(f"'{key}': the kubetune.io/ prefix is reserved for labels kubetune sets itself")
        if labels and val and (len(val) > 63 or not _K8S_QUALIFIED_RE.match(val)):
            raise ValueError(f"label '{key}': value '{val}' must be at most 63 letters, digits, '-', '_' or '.'")
    return values


class K8sTolerationSpec(_Section):
    """A toleration, as in a pod spec (snake_case keys)."""

    key: str | None = Field(None, description="Taint key; empty with operator Exists tolerates every taint.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: match value; Exists: any value.")
    value: str | None = Field(None, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="Taint effect; empty matches all.")
    toleration_seconds: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="How long a NoExecute taint is tolerated.")

    @model_validator(mode="after")
    def _consistent(self) -> "K8sTolerationSpec":
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key (or use operator Exists)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds only applies to effect NoExecute")
        return self


class K8sSecurityContextSpec(_Section):
    """Who the containers run as (pod securityContext) and what they may do (container securityContext)."""

    run_as_non_root: bool | None = Field(None, description="Refuse to start a container whose user is root.")
    run_as_user: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="UID of every container process.")
    run_as_group: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="GID of every container process.")
    fs_group: int | None = Field(None, ge=0, le=C.SPEC_MAX_INT32, description="Group that owns mounted volumes (so a non-root user can write the PVC).")
    allow_privilege_escalation: bool | None = Field(None, description="Container may gain more privileges than its parent.")
    capabilities_add: list[str] = Field(default_factory=list, description="Linux capabilities to add, e.g. [SYS_NICE] (Gaudi).")
    capabilities_drop: list[str] = Field(default_factory=list, description="Linux capabilities to drop, e.g. [ALL].")

    @model_validator(mode="after")
    def _not_root(self) -> "K8sSecurityContextSpec":
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("run_as_non_root is true but run_as_user is 0 (root); pick another uid")
        return self


class K8sWorkspaceSpec(_Section):
    """The volume at /workspace holding fetched inputs, caches and the run directory."""

    volume: Literal["emptyDir", "pvc"] = Field("emptyDir", description="emptyDir (lives with the pod) or pvc (outlives it).")
    size: str | None = Field(None, description="emptyDir size limit, or the PVC's requested storage, e.g. 100Gi.")
    storage_class: str | None = Field(None, description="PVC storage class (default: the cluster's default class).")
    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadWriteOnce"], description="PVC access modes; several nodes need ReadWriteMany."
    )
    claim_name: str | None = Field(None, description="Use this existing PVC instead of creating '<name>-workspace'.")

    _check_size = field_validator("size")(lambda cls, v: _k8s_quantity(v))

    @field_validator("storage_class", "claim_name")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _k8s_name(v)

    @model_validator(mode="after")
    def _consistent(self) -> "K8sWorkspaceSpec":
        if self.volume == "emptyDir" and (self.claim_name or self.storage_class):
            raise ValueError("claim_name and storage_class need volume: pvc")
        if self.volume == "pvc" and not self.claim_name and not self.size:
            raise ValueError("a new PVC needs a size (e.g. size: 100Gi), or name an existing one with claim_name")
        if not self.access_modes:
            raise ValueError("access_modes must not be empty")
        return self


class K8sHugePagesSpec(_Section):
    """Hugepages per node (Gaudi needs them): requested as hugepages-<page_size>, mounted at /hugepages."""

    page_size: Literal["2Mi", "1Gi"] = Field("2Mi", description="Page size the nodes provide.")
    amount: str = Field(description="Hugepage memory per node, e.g. 9800Mi.")

    _check_amount = field_validator("amount")(lambda cls, v: _k8s_quantity(v))


class K8sSecretKeySpec(_Section):
    """One key of a Secret."""

    secret: str = Field(description="Secret name (in the job's namespace).")
    key: str = Field("token", description="Key inside the Secret.")

    _check_secret = field_validator("secret")(lambda cls, v: _k8s_name(v, "Secret name"))


class K8sS3SecretSpec(_Section):
    """A Secret holding S3 credentials; its keys become AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""

    secret: str = Field(description="Secret name (in the job's namespace).")
    access_key_id_key: str = Field("AWS_ACCESS_KEY_ID", description="Key holding the access key id.")
    secret_access_key_key: str = Field("AWS_SECRET_ACCESS_KEY", description="Key holding the secret access key.")

    _check_secret = field_validator("secret")(lambda cls, v: _k8s_name(v, "Secret name"))


class K8sSecretEnvSpec(_Section):
    """An environment variable whose value comes from a Secret key."""

    var: str = Field(description="Environment variable name, e.g. WANDB_API_KEY.")
    secret: str = Field(description="Secret name.")
    key: str = Field(description="Key inside the Secret.")
    optional: bool = Field(False, description="Start even when the Secret or key is missing.")

    _check_secret = field_validator("secret")(lambda cls, v: _k8s_name(v, "Secret name"))

    @field_validator("var")
    @classmethod
    def _var(cls, v: str) -> str:
        if not _K8S_ENV_NAME_RE.match(v):
            raise ValueError(f"'{v}' is not a valid environment variable name")
        return v


class K8sSecretsSpec(_Section):
    """Secrets the containers read, by reference only: no secret value is ever part of a spec or a render."""

    hf_token: K8sSecretKeySpec | None = Field(None, description="Secret key holding a Hugging Face token (env HF_TOKEN).")
    s3: K8sS3SecretSpec | None = Field(None, description="Secret holding S3 credentials (env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY).")
    env: list[K8sSecretEnvSpec] = Field(default_factory=list, description="More variables from Secret keys.")
    env_from: list[str] = Field(default_factory=list, description="Secrets whose every key becomes a variable (not for trainjob).")

    @field_validator("env_from")
    @classmethod
    def _env_from(cls, v: list[str]) -> list[str]:
        return [_k8s_name(s, "Secret name") for s in v]

    @field_validator("hf_token", "s3", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"secret": v} if isinstance(v, str) else v  # `hf_token: my-secret` names the Secret


class K8sTrainJobSpec(_Section):
    """Options of the trainjob flavour (Kubeflow Trainer v2)."""

    runtime: str = Field("torch-distributed", description="The (Cluster)TrainingRuntime the TrainJob references.")
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = Field(
        "ClusterTrainingRuntime", description="Kind of the runtime (a TrainingRuntime lives in the job's namespace)."
    )
    initializers: bool = Field(
        False,
        description="The runtime has Kubeflow's dataset/model initializers: hf:// and s3:// inputs go to "
        "spec.initializer.*.storageUri instead of being fetched by the trainer container.",
    )

    _check_runtime = field_validator("runtime")(lambda cls, v: _k8s_name(v, "runtime name"))


class K8sKaitoSpec(_Section):
    """Options of the kaito flavour (a Kaito tuning Workspace, kaito.sh/v1beta1)."""

    instance_type: str | None = Field(
        None,
        description="GPU node SKU Kaito provisions (resource.instanceType), e.g. Standard_NC24ads_A100_v4; unset when Kaito's "
        "node auto-provisioning is off (then kubernetes.node_selector selects your GPU nodes).",
    )
    preset: str | None = Field(
        None,
        description="Kaito model preset to tune (tuning.preset.name); default: the hf:// model's name lowercased, "
        "e.g. hf://microsoft/Phi-3-mini-4k-instruct -> phi-3-mini-4k-instruct (a guess: set it when Kaito names the model otherwise).",
    )
    push_secret: str | None = Field(
        None, description="Secret with registry credentials Kaito pushes the adapter image (output.uri) with (tuning.output.imagePushSecret)."
    )

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]*", v):
            raise ValueError(f"'{v}' is not an instance type (a cloud SKU name such as Standard_NC24ads_A100_v4)")
        return v

    @field_validator("preset", "push_secret")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _k8s_name(v)


class KubernetesSpec(_Section):
    """How the job runs on Kubernetes (used by the kubernetes backend and `kubetune render`)."""

    flavor: Literal["job", "pytorchjob", "trainjob", "kaito"] = Field(
        "job",
        description="job: batch/v1 Job (no operator); pytorchjob: Kubeflow training operator; trainjob: Kubeflow Trainer v2; "
        "kaito: a Kaito tuning Workspace (lora/qlora on Kaito's preset models; render only).",
    )
    namespace: str | None = Field(None, description="Namespace (default: the kubeconfig context's, else 'default').")
    image: str | None = Field(
        None, description="Worker image (default: the kubetune image for this version; its -cuda tag for nvidia.com resources)."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(None, description="Image pull policy.")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets with registry credentials.")
    service_account: str | None = Field(None, description="Service account the pods run as.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods require.")
    tolerations: list[K8sTolerationSpec] = Field(default_factory=list, description="Taints the pods tolerate.")
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="Pod affinity exactly as Kubernetes writes it (nodeAffinity, podAffinity, podAntiAffinity)."
    )
    priority_class: str | None = Field(None, description="PriorityClass of the pods.")
    queue: str | None = Field(None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every object and pod.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations on every object and pod.")
    security_context: K8sSecurityContextSpec = Field(default_factory=K8sSecurityContextSpec, description="User, group and privileges.")
    workspace: K8sWorkspaceSpec = Field(default_factory=K8sWorkspaceSpec, description="The /workspace volume.")
    shm_size: str | None = Field(None, description="Size limit of /dev/shm (memory-backed), e.g. 16Gi.")
    hugepages: K8sHugePagesSpec | None = Field(None, description="Hugepages per node (needs resources.memory).")
    env: dict[str, str] = Field(default_factory=dict, description="Plain environment variables (no secrets: use secrets.env).")
    secrets: K8sSecretsSpec = Field(default_factory=K8sSecretsSpec, description="Secrets by reference.")
    ttl_seconds_after_finished: int | None = Field(
        604800, ge=0, le=C.SPEC_MAX_INT32, description="Delete the finished job (and its pods' logs) after this many seconds; null keeps it."
    )
    backoff_limit: int = Field(0, ge=0, le=C.SPEC_MAX_INT32, description="Retries of failed pods (use with training.resume: auto).")
    active_deadline_seconds: int | None = Field(None, ge=1, le=C.SPEC_MAX_INT32, description="Stop the job after this many seconds.")
    staging_uri: str | None = Field(None, description="s3:// prefix where `kubetune run` uploads local model/dataset files.")
    trainjob: K8sTrainJobSpec = Field(default_factory=K8sTrainJobSpec, description="Options of the trainjob flavour.")
    kaito: K8sKaitoSpec = Field(default_factory=K8sKaitoSpec, description="Options of the kaito flavour.")

    _check_shm = field_validator("shm_size")(lambda cls, v: _k8s_quantity(v))

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 63 or not _K8S_LABEL_RE.match(v)):
            raise ValueError(f"'{v}' is not a valid namespace: lowercase letters, digits and '-', at most 63 characters")
        return v

    @field_validator("service_account", "priority_class", "queue")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else _k8s_name(v)

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull_secrets(cls, v: list[str]) -> list[str]:
        return [_k8s_name(s, "Secret name") for s in v]

    _check_labels = field_validator("labels", "node_selector")(lambda cls, v: _k8s_labels(v, labels=True))
    _check_annotations = field_validator("annotations")(lambda cls, v: _k8s_labels(v, labels=False))

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = set(v) - {"nodeAffinity", "podAffinity", "podAntiAffinity"}
        if unknown:
            raise ValueError(f"unknown affinity keys {sorted(unknown)}; use nodeAffinity, podAffinity, podAntiAffinity")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _K8S_ENV_NAME_RE.match(name):
                raise ValueError(f"'{name}' is not a valid environment variable name")
            if _K8S_SECRET_NAME_RE.search(name):
                raise ValueError(
                    f"'{name}' looks like a secret: its value would be visible in the rendered objects; "
                    f"put it in a Secret and list it under kubernetes.secrets.env ({{var: {name}, secret: NAME, key: KEY}})"
                )
        return {k: str(val) for k, val in v.items()}

    @field_validator("staging_uri")
    @classmethod
    def _staging(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("s3://"):
            raise ValueError(f"staging_uri must be an s3:// prefix, got '{v}'")
        return v.rstrip("/") if v else v


# --- sweep -----------------------------------------------------------------------------------
# Fields a sweep sets on every trial itself, so no grid or distribution may vary them.
_SWEEP_RESERVED = ("name", "output.dir", "output.uri", "sweep")


def _sweep_number(value: Any) -> Any:
    """'1e-4' -> 0.0001: YAML 1.1 reads exponents without a dot as strings; sweeps want numbers."""
    if isinstance(value, str) and _NUMBER_RE.match(value.strip()):
        text = value.strip()
        return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)
    return value


def _sweep_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be swept (unknown or reserved field), or None."""
    parts = key.split(".")
    if not all(parts) or any(key == r or key.startswith(r + ".") for r in _SWEEP_RESERVED):
        return f"'{key}' cannot be swept" + ("" if all(parts) else " (empty path component)") + (
            "; the sweep sets name, output.dir and output.uri of each trial itself" if all(parts) else ""
        )
    model: Any = TuneJob
    for i, part in enumerate(parts):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None  # inside a free-form mapping (kubernetes.env, dataset.columns): any key goes
        if part not in model.model_fields:
            close = difflib.get_close_matches(part, list(model.model_fields), n=1, cutoff=0.6)
            where = ".".join(parts[:i] + [close[0]]) if close else None
            return f"'{key}' is not a spec field" + (f"; did you mean {where}?" if where else f"; valid keys here: {', '.join(model.model_fields)}")
        model = _unwrap(model.model_fields[part].annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return f"'{key}' is a section; sweep one of its fields, e.g. {key}.{next(iter(model.model_fields))}"
    return None


class SweepParamSpec(_Section):
    """A distribution that random search draws one hyperparameter from."""

    type: Literal["choice", "uniform", "log_uniform"] = Field(
        description="choice: one of values; uniform: evenly in [low, high]; log_uniform (or log-uniform): evenly in log space "
        "(learning rates)."
    )
    values: list[Any] | None = Field(None, description="The candidates (choice).")
    low: float | None = Field(None, description="Lower bound (uniform, log_uniform).")
    high: float | None = Field(None, description="Upper bound (uniform, log_uniform).")
    integer: bool = Field(False, description="Round samples to whole numbers (e.g. method.lora.r).")

    @field_validator("type", mode="before")
    @classmethod
    def _dash(cls, v: Any) -> Any:
        return v.replace("-", "_") if isinstance(v, str) else v

    @field_validator("values")
    @classmethod
    def _numbers(cls, v: list[Any] | None) -> list[Any] | None:
        return None if v is None else [_sweep_number(x) for x in v]

    @model_validator(mode="after")
    def _consistent(self) -> "SweepParamSpec":
        if self.type == "choice":
            if not self.values:
                raise ValueError("a choice distribution needs values: [...]")
            if self.low is not None or self.high is not None:
                raise ValueError("a choice distribution takes values, not low/high")
            return self
        if self.values is not None:
            raise ValueError(f"a {self.type} distribution takes low and high, not values")
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"a {self.type} distribution needs low < high (got low={self.low}, high={self.high})")
        if self.type == "log_uniform" and self.low <= 0:
            raise ValueError(f"a log_uniform distribution needs low > 0 (got {self.low})")
        return self


class EarlyStoppingSpec(_Section):
    """Stop clearly bad trials before they finish (median stopping rule)."""

    rule: Literal["median"] = Field(
        "median",
        description="median: stop a trial whose best objective so far is worse than the median of the other trials' "
        "running averages at the same step. Needs the objective during training (eval_loss: set training.eval_steps).",
    )
    min_trials: int = Field(3, ge=1, le=C.SPEC_MAX_TRIALS, description="How many other trials must have reached the same step before any trial is stopped.")
    grace_steps: int = Field(0, ge=0, le=C.SPEC_MAX_STEPS, description="Never stop a trial before this optimizer step.")


class SweepSpec(_Section):
    """A hyperparameter sweep over this job (used by `kubetune sweep`; `kubetune run` ignores it)."""

    objective: str = Field("eval_loss", description="The metric that ranks trials, as result.json records it: eval_loss, train_loss, perplexity, ...")
    direction: Literal["minimize", "maximize"] = Field("minimize", description="Whether a lower or a higher objective is better.")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Field path -> values, e.g. {method.lora.r: [4, 8, 16]}. Grid search runs every combination; "
        "random search draws from these values.",
    )
    random: dict[str, SweepParamSpec] = Field(
        default_factory=dict, description="Field path -> distribution, e.g. {training.learning_rate: {type: log_uniform, low: 1e-5, high: 1e-3}}."
    )
    trials: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_TRIALS, description="Random search: how many trials to draw (grid values count as choices). Unset: grid search, every combination."
    )
    seed: int = Field(0, ge=0, le=C.SPEC_MAX_SEED, description="Seed of random search: the same seed draws the same trials.")
    parallel: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_PARALLEL, description="Trials running at once. Default: local, one per 4 CPU cores or per free set of accelerators; clusters, 4."
    )
    early_stopping: EarlyStoppingSpec | None = Field(None, description="Stop clearly bad trials early; off when unset.")
    dir: str = Field("runs/sweeps/{id}", description="The sweep directory: sweep.json, reports and trials/<trial>/ ({id}: the sweep id).")

    @field_validator("grid")
    @classmethod
    def _grid_values(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"grid '{key}' has no values")
        return {key: [_sweep_number(x) for x in values] for key, values in v.items()}

    @model_validator(mode="after")
    def _keys(self) -> "SweepSpec":
        problems = [p for p in (_sweep_key_problem(k) for k in [*self.grid, *self.random]) if p]
        both = sorted(set(self.grid) & set(self.random))
        if both:
            problems.append(f"{', '.join(both)}: given both as grid and as random distribution; keep one")
        if self.random and self.trials is None:
            problems.append("random distributions need trials: N (how many trials to draw)")
        combinations = math.prod(len(v) for v in self.grid.values())
        if self.trials is None and combinations > C.SPEC_MAX_TRIALS:
            problems.append(
                f"the grid has {_shown(combinations)} combinations, more than the {C.SPEC_MAX_TRIALS:,} trials a sweep may run; "
                "fewer values, or random search (trials: N draws from the grid)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


# --- kubeflow pipelines ----------------------------------------------------------------------
class KfpSpec(_Section):
    """How the job runs as a Kubeflow Pipelines run (kfp backend and `kubetune render --backend kfp`).

    The pods of a remote run also take kubernetes.env, kubernetes.secrets (hf_token, s3, env), node_selector,
    tolerations, image_pull_secrets, image_pull_policy, labels, annotations, shm_size and
    active_deadline_seconds from the kubernetes section.
    """

    mode: Literal["local", "remote"] = Field(
        "local", description="local: the KFP local runner runs the pipeline on this machine; remote: a run on a KFP server. "
        "`kubetune run --mode` overrides it."
    )
    host: str | None = Field(
        None, description="KFP API endpoint, e.g. https://ds-pipeline-dspa-team.apps.example.com or http://localhost:8888 "
        "(default: $KF_PIPELINES_ENDPOINT, else the kubeconfig's cluster through the ml-pipeline service proxy)."
    )
    ui_host: str | None = Field(None, description="Base URL of the KFP UI for run links (default: host).")
    namespace: str | None = Field(None, description="Profile namespace of a multi-user KFP (default: the client's context).")
    experiment: str = Field("kubetune", description="Experiment the runs are filed under (created when missing).")
    token_from_kubeconfig: bool = Field(
        False, description="Send the kubeconfig's bearer token (e.g. after `oc login`) when $KUBETUNE_KFP_TOKEN is not set."
    )
    kube_context: str | None = Field(None, description="kubeconfig context for kube credentials and pod logs (default: current).")
    verify_ssl: bool = Field(True, description="Verify the KFP API's TLS certificate.")
    base_image: str | None = Field(
        None, description="Image of every component (default: kubernetes.image, else the kubetune image of this version; "
        "its -cuda tag for nvidia.com accelerators)."
    )
    package: str | None = Field(
        None, description="pip requirement installed when each component starts, e.g. kubetune==0.1.0 or "
        "'kubetune @ git+https://github.com/ORG/kubetune@main'; '' installs nothing (default: nothing with the kubetune "
        "image, kubetune==<this version> with any other image)."
    )
    pip_index_urls: list[str] = Field(default_factory=list, description="Package indexes for kfp.package (default: pip's).")
    bucket: str | None = Field(
        None, description="s3://BUCKET[/PREFIX] where remote runs put local model/dataset files (default: s3://$KFP_S3_BUCKET)."
    )
    pipeline_root: str | None = Field(None, description="Where the KFP server keeps the run's artifacts (default: the server's).")
    cpu_limit: str | None = Field(None, description="CPU limit of the train task (requests come from resources.cpu).")
    memory_limit: str | None = Field(None, description="Memory limit of the train task (requests come from resources.memory).")
    caching: bool = Field(False, description="Let KFP reuse cached task results (off: every run trains again).")

    _check_limits = field_validator("cpu_limit", "memory_limit")(lambda cls, v: _k8s_quantity(v))

    @field_validator("host", "ui_host")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"'{v}' must be an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v if v.startswith("s3://") else f"s3://{v}"
        if not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", v):
            raise ValueError(f"'{v}' is not an s3://BUCKET[/PREFIX]")
        return v.rstrip("/")


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
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec, description="Kubernetes placement, volumes and secrets (kubernetes backend).")
    kfp: KfpSpec = Field(default_factory=KfpSpec, description="Kubeflow Pipelines: local runner or server, component image, bucket (kfp backend).")
    sweep: SweepSpec | None = Field(None, description="A hyperparameter sweep over this job (kubetune sweep); kubetune run ignores it.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if len(v) > 40 or not _NAME_RE.match(v):
            raise ValueError(
                f"'{v}' is not a valid job name: use lowercase letters, digits and '-', start with a letter, at most 40 characters"
            )
        return v

    @model_validator(mode="after")
    def _apply_method_preset(self) -> "TuneJob":
        """Fill every method.lora / training field that the spec leaves unset from the method's preset."""
        from .presets import preset_values

        for path, value in preset_values(self.method.type).items():
            section_path, _, name = path.rpartition(".")
            section: Any = self
            for part in section_path.split("."):
                section = getattr(section, part)
            if name in section.model_fields_set:
                continue  # the spec said so: it wins
            setattr(section, name, value)
            # Still unset by the spec, so that changing method.type later applies the new preset.
            section.model_fields_set.discard(name)
        return self

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

    @model_validator(mode="after")
    def _strategy(self) -> "TuneJob":
        if self.training.strategy == "fsdp" and self.method.type == "qlora":
            raise ValueError("training.strategy fsdp does not support method.type qlora (4-bit weights); use ddp, or method lora")
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

    def steps_per_epoch(self, samples: int) -> int:
        """Optimizer steps in one pass over ``samples`` training sequences: ceil(samples / global batch)."""
        return max(1, math.ceil(samples / self.global_batch))

    def planned_steps(self, samples: int) -> int:
        """Optimizer steps the run takes: training.max_steps, else ceil(epochs x ceil(samples / global batch))."""
        if self.training.max_steps:
            return self.training.max_steps
        return max(1, math.ceil(self.training.epochs * self.steps_per_epoch(samples)))

    def field_sources(self) -> dict[str, str]:
        """Where each effective value came from, by dotted path: ``spec``, ``preset NAME`` or ``default``."""
        from .presets import preset_values

        out: dict[str, str] = {}
        preset, preset_paths = f"preset {self.method.type}", preset_values(self.method.type)

        def walk(model: BaseModel, prefix: str) -> None:
            for name in type(model).model_fields:
                value, path = getattr(model, name), prefix + name
                if isinstance(value, BaseModel):
                    walk(value, path + ".")
                elif name in model.model_fields_set:
                    out[path] = "spec"
                elif path in preset_paths:
                    out[path] = preset
                else:
                    out[path] = "default"

        walk(self, "")
        return out

    @property
    def output_dir(self) -> Path:
        """The local run directory, absolute."""
        return Path(self.output.dir.replace("{name}", self.name)).expanduser().absolute()

    def with_overrides(self, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> "TuneJob":
        """This job with ``overrides`` applied and validated again; method presets fill what the spec never set.

        Every way of deriving a job from another (sweep trials, ``Client.submit(job, overrides)``, the CLI's
        ``--set`` on a sweep) goes through here. The job remembers which fields its spec set (pydantic's
        ``model_fields_set``; preset values are not counted): only those are kept, the overrides go on top,
        and the preset of the resulting ``method.type`` and the defaults fill the rest. So
        ``method.type=full`` brings the full preset's learning rate, warm-up and weight decay unless the
        spec set them itself, and applying the same overrides twice gives the same job.

        Args:
            overrides: ``"path.to.field=value"`` strings (values parsed as YAML, like ``--set``), or a mapping
                of dotted paths to values taken as they are. A number in a path indexes a list
                (``dataset.mix.0.source``). A null value unsets the field: back to its preset or default, or
                None where the field takes None.

        Returns:
            A new TuneJob; this one is unchanged.

        Raises:
            SpecError: an override is malformed, or the result is not a valid job (all problems listed).
        """
        data = self.model_dump(mode="python", exclude_unset=True)
        return _validate(data, overrides, located=Located())  # errors in overridden fields name their override


# --- loading, overrides, errors --------------------------------------------------------------
def _override_items(overrides: Mapping[str, Any] | Iterable[str] | None) -> Iterable[tuple[str, Any, str]]:
    """(key, value, how to name it in errors) for each override: ``KEY=VALUE`` strings or a mapping."""
    if overrides is None:
        return
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            if not isinstance(key, str):
                raise SpecError(f"override {key!r}: keys are dotted field paths, e.g. training.learning_rate")
            yield key, value, f"override '{key}'"
        return
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Iterable):
        what = f"the single string {overrides!r}" if isinstance(overrides, (str, bytes)) else type(overrides).__name__
        raise SpecError(f"overrides: expected a list of KEY=VALUE strings or a mapping, got {what}")
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. training.learning_rate=1e-4")
        key, _, raw = item.partition("=")
        yield key, parse_value(raw), f"--set '{item}'"


def apply_overrides(data: dict, overrides: Mapping[str, Any] | Iterable[str] | None, located: Located | None = None) -> dict:
    """Apply overrides to a spec dict (in place) and return it.

    Args:
        data: the spec as plain data.
        overrides: ``path.to.key=value`` strings (values parsed as YAML) or a mapping of dotted paths to
            values. A number in a path indexes an existing list item. A null value is kept: validation
            then unsets that field (see :func:`load_spec`).
        located: where each value was written; overridden paths are recorded as coming from the override.

    Raises:
        SpecError: an override is not of the form KEY=VALUE, or walks through a value that is not a section.
    """
    for key, value, item in _override_items(overrides):
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise SpecError(f"{item}: empty key")
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            here = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    has = f"items 0 to {len(node) - 1}" if node else "no items"
                    raise SpecError(f"{item}: '{here}': '{'.'.join(parts[:i])}' is a list with {has}; give an index")
                part = int(part)  # type: ignore[assignment]
            elif not isinstance(node, dict):
                raise SpecError(f"{item}: '{'.'.join(parts[:i])}' is not a section")
            if last:
                node[part] = value
            else:
                nxt = node[part] if isinstance(node, list) else node.get(part)
                if nxt is None:
                    nxt = node[part] = {}
                node = nxt
        if located is not None:
            path = tuple(parts)
            for known in [k for k in located if k[: len(path)] == path]:
                del located[known]
            located[path] = item
    return data


def _unset_nulls(data: Any, model: type[BaseModel]) -> None:
    """null means unset: drop null values of fields that take no None, so their preset or default applies."""
    if not isinstance(data, dict):
        return
    for key in list(data):
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        value, annotation = data[key], field.annotation
        if value is None:
            if not _takes_none(annotation):
                del data[key]
            continue
        inner = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) in (Union, types_.UnionType) else [annotation]
        for ann in inner:
            origin, args = get_origin(ann), get_args(ann)
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                _unset_nulls(value, ann)
            elif origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel) and isinstance(value, list):
                for entry in value:
                    _unset_nulls(entry, args[0])
            elif origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel) and isinstance(value, dict):
                for entry in value.values():
                    _unset_nulls(entry, args[1])


def _takes_none(annotation: Any) -> bool:
    return annotation is Any or (get_origin(annotation) in (Union, types_.UnionType) and type(None) in get_args(annotation))


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


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        try:
            return f"{value:.3g}"
        except OverflowError:  # beyond any float (and str() refuses past 4300 digits)
            return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _format_errors(err: ValidationError, source: str, located: Located | None = None) -> SpecError:
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
            problem = f"{path}: unknown key{hint}"
        elif e["type"] == "missing":
            problem = f"{path}: required field is missing"
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            val = e.get("input")
            shown = "" if isinstance(val, (dict, list)) or val is None or " got " in msg else f" (got {_shown(val)})"
            problem = f"{path}: {msg}{shown}"
        where = where_written(loc, located)
        problems.append(f"{where}: {problem}" if where else problem)
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
    mix = data.get("dataset", {}).get("mix") if isinstance(data.get("dataset"), dict) else None
    for entry in mix if isinstance(mix, list) else []:
        fix(entry, "source")


def load_spec(source: str | os.PathLike | dict, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> TuneJob:
    """Load, override and validate a job spec.

    A spec file is read within bounds (size, aliases, nesting, one UTF-8 YAML document, no duplicate
    keys: see :mod:`kubetune.spec_yaml`); errors name the file and line. A null value unsets its field:
    the field's preset or default applies, or None where the field takes None.

    Args:
        source: a YAML file path, or a dict with the spec's fields.
        overrides: ``path=value`` strings (like ``helm --set``) or a mapping of dotted paths to values,
            applied before validation.

    Returns:
        The validated :class:`TuneJob`; it remembers which fields the spec (and overrides) set.

    Raises:
        SpecError: the file is missing, too big or not YAML, or the spec is invalid (all problems listed).
    """
    base: Path | None = None
    label = ""
    located = Located()
    if isinstance(source, dict):
        check_shape(source)  # before copying: bounded in size and depth, no cycles
        data = _deep_copy(source)
    else:
        path = Path(source)
        label = str(path)
        raw, located = read_spec_file(path)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise SpecError(f"{path}: a job spec must be a YAML mapping (model:, dataset:, ...), got a {_yaml_type(raw)}")
        data = _deep_copy(raw)  # aliased sections become separate: an override changes one place only
        base = path.parent.resolve()
        if data.get("name") is None:
            data["name"] = _name_from_file(path)
    return _validate(data, overrides, base=base, label=label, located=located)


def _validate(
    data: dict, overrides: Mapping[str, Any] | Iterable[str] | None, *, base: Path | None = None, label: str = "", located: Located | None = None
) -> TuneJob:
    """Overrides, bounds, null-means-unset and relative paths, then the models: the one way a TuneJob is made."""
    apply_overrides(data, overrides, located)
    check_shape(data, label, located)
    _unset_nulls(data, TuneJob)
    _resolve_local_paths(data, base)
    try:
        return TuneJob.model_validate(data)
    except ValidationError as e:
        raise _format_errors(e, label, located) from None


def _yaml_type(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), type(value).__name__)


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
    """The resolved spec as plain data (every default filled in), credentials included: for the job itself
    (the worker, rendering), never for showing or saving (:func:`redacted_spec_dict`)."""
    return job.model_dump(mode="json")


def redacted_spec_dict(job: TuneJob) -> dict:
    """The resolved spec as plain data with every credential masked (``***``): the user-info and credential
    parameters of each URI (:mod:`kubetune.redact`), and the values of ``kubernetes.env`` variables whose names
    look like credentials. What ``spec.yaml``, ``kubetune validate`` and sweep records show."""
    data = redact_data(spec_to_dict(job))
    env = (data.get("kubernetes") or {}).get("env") or {}
    for name in env:
        if _secretish_env_name(name) or _SECRET_VALUE_RE.search(str(env[name])):
            env[name] = MASK
    return data


def dump_spec(job: TuneJob) -> str:
    """The resolved spec as YAML, in field order, credentials masked (what ``spec.yaml`` holds)."""
    return yaml.safe_dump(redacted_spec_dict(job), sort_keys=False, allow_unicode=True)


def spec_warnings(job: TuneJob) -> list[str]:
    """Things in a valid spec that are probably a mistake, one message each (shown by validate, render, run).

    Today: ``kubernetes.env`` values that look like credentials (by the variable's name, or by the value's
    shape: a known token format, a URI with credentials), which would be visible in the rendered objects.
    """
    out = []
    for name, value in job.kubernetes.env.items():
        why = ("its name looks like a credential" if _secretish_env_name(name)
               else "its value looks like a credential" if _SECRET_VALUE_RE.search(value) or has_credentials(value) else None)
        if why:
            out.append(
                f"kubernetes.env.{name}: {why}, and a literal value is visible to anyone who can read the rendered objects "
                f"or the pod spec; put it in a Secret and reference it: kubernetes.secrets.env: [{{var: {name}, secret: NAME, key: KEY}}]"
            )
    return out
