"""The job and its sections: model, dataset, method, training, output, resources."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from .. import constants as C
from ..data.formats import FORMATS
from ..data.preference_formats import PREFERENCE_FORMATS
from .reader import Located
from .base import _NAME_RE, _SCHEME_RE, _Section, check_uri, register_root
from .cluster import KfpSpec, KubernetesSpec, check_quantity
from .entrypoint import EntrypointSpec, check_built_in_input, check_custom_job, dump_without_unused
from .sweep import SweepSpec
from .validate import validate_job


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

    @property
    def pinned_source(self) -> str:
        """``source`` with ``revision`` joined in: the one URI that names exactly what is fetched.

        ``revision`` wins over an ``@REV`` in an ``hf://`` source (``hf://org/m@v1`` with revision ``v2`` is
        ``hf://org/m@v2``); other schemes have no revisions and are returned as they are. Everything that fetches
        the model or hands its URI on (the worker, merge, serve, init containers) goes through this.
        """
        if not self.revision or not self.source.startswith("hf://"):
            return self.source
        segments = self.source[len("hf://"):].split("/")
        name = 1 + (segments[0] in ("datasets", "models", "spaces"))  # the NAME segment after ORG
        if len(segments) <= name:
            return self.source
        segments[name] = f"{segments[name].partition('@')[0]}@{self.revision}"
        return "hf://" + "/".join(segments)


# --- dataset ---------------------------------------------------------------------------------
# The format names come from the data package's registry (a plain table importing nothing of the spec), so a
# format added there is accepted here and listed in the JSON schema without a second list to keep in step.
# Preference formats (prompt/chosen/rejected rows) are for method.objective dpo and orpo.
DatasetFormat = Literal[("auto", *FORMATS, *PREFERENCE_FORMATS)]  # type: ignore[valid-type]


def _check_columns(v: dict[str, str]) -> dict[str, str]:
    from ..data.formats import COLUMN_NAMES

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


class PreprocessSpec(_Section):
    """A Python function applied to the fetched rows before they are prepared (docs/datasets.md#preprocessing-rows-with-your-own-code)."""

    file: str = Field(
        description="The Python file that defines the function: a local path (relative to the spec file; staged with the job "
        "on a cluster) or a URI kubetune reads (s3://, https://, ...). Its content is part of the cache key."
    )
    function: str = Field(
        "preprocess",
        description="The function's name in the file: it takes an iterator of row dicts (as read from the dataset, before "
        "dataset.columns) and returns or yields row dicts.",
    )

    @field_validator("file")
    @classmethod
    def _check_file(cls, v: str) -> str:
        check_uri(v)
        if not v.split("?", 1)[0].endswith(".py"):
            raise ValueError(f"'{v}' is not a Python file: name a .py file that defines the function")
        return v

    @field_validator("function")
    @classmethod
    def _check_function(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"'{v}' is not a Python function name (a name defined in the file, no dots)")
        return v


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
    preprocess: PreprocessSpec | None = Field(
        None, description="A Python function applied to the rows of source and eval_source before they are prepared (cached)."
    )
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
        from ..data.templates import CHAT_TEMPLATES

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


# TRL DPOConfig.loss_type values that train from (prompt, chosen, rejected) pairs alone.
DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "apo_zero", "apo_down",
    "discopop", "sigmoid_norm",
)  # fmt: skip


class DpoSpec(_Section):
    """DPO settings (method.objective dpo), passed to TRL's DPOConfig."""

    beta: float = Field(0.1, gt=0, le=C.SPEC_MAX_WEIGHT, description="How far the policy may move from the reference: higher stays closer (preset).")
    loss_type: Literal[DPO_LOSS_TYPES] = Field(  # type: ignore[valid-type]
        "sigmoid", description="TRL's DPO loss: sigmoid (the paper's), ipo, hinge, robust, ... (preset)."
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5, description="Assumed share of flipped labels (robust, exo_pair) (preset).")
    reference: str | None = Field(
        None,
        description="The frozen reference model's URI for method.type full (default: a frozen copy of model.source). "
        "Adapters always use their own base with the adapter switched off, so they take none.",
    )

    @field_validator("reference")
    @classmethod
    def _check_reference(cls, v: str | None) -> str | None:
        return None if v is None else check_uri(v)


class OrpoSpec(_Section):
    """ORPO settings (method.objective orpo), passed to TRL's ORPOConfig. ORPO has no reference model."""

    beta: float = Field(0.1, gt=0, le=C.SPEC_MAX_WEIGHT, description="Weight of the odds-ratio term against the SFT term (the paper's lambda) (preset).")


class MethodSpec(_Section):
    """How the model is adapted, and what it is trained to do."""

    type: Literal["full", "lora", "qlora", "dora"] = Field(
        "lora",
        description="full fine-tune, LoRA, QLoRA (4-bit NF4 base via bitsandbytes) or DoRA; picks the preset that "
        "fills the fields marked (preset).",
    )
    objective: Literal["sft", "dpo", "orpo"] = Field(
        "sft",
        description="sft: learn the answers (supervised); dpo or orpo: learn to prefer the chosen answer over the rejected "
        "one (preference data: prompt/chosen/rejected). dpo and orpo add their preset on top of method.type's.",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Adapter settings (ignored for full).")
    dpo: DpoSpec = Field(default_factory=DpoSpec, description="DPO settings (objective dpo).")
    orpo: OrpoSpec = Field(default_factory=OrpoSpec, description="ORPO settings (objective orpo).")

    @property
    def preference(self) -> bool:
        """True for the preference objectives (dpo, orpo)."""
        return self.objective != "sft"


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
    cpu_threads: int | None = Field(
        None, ge=1, le=C.SPEC_MAX_CPU_THREADS,
        description="CPU threads per process when training on the CPU (ignored on GPUs); unset: OMP_NUM_THREADS if set, else "
        "the cores that are free (cores minus those busy with other work, within the cgroup CPU quota, shared by the processes on a node).",
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
    uri: str | None = Field(None, description="Also publish results to s3://..., oci://..., hf://ORG/NAME or file://... (checkpoints are synced there).")
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
        if not m or m.group(1).lower() not in ("s3", "oci", "file", "hf", "pvc"):
            raise ValueError(f"output.uri must be s3://..., oci://..., hf://ORG/NAME, file://... or pvc://CLAIM (the kaito flavour's volume), got '{v}'")
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
    cpu: str | None = Field(None, description="CPU request per node, a Kubernetes quantity: e.g. '8' or '500m'.")
    memory: str | None = Field(None, description="Memory request (and limit) per node, a Kubernetes quantity: e.g. '32Gi'.")
    collective_timeout_seconds: int = Field(
        1800, ge=10, le=C.SPEC_MAX_TIMEOUT_S, description="How long a process waits for the others in one collective (gradient all-reduce, barrier, "
        "checkpoint) before the job fails: a hung rank ends the job after this, never later."
    )
    rendezvous_timeout_seconds: int = Field(
        600, ge=10, le=C.SPEC_MAX_TIMEOUT_S, description="How long the nodes of a multi-node job wait for each other at start-up (python -m kubetune.launch)."
    )

    _check_quantities = field_validator("cpu", "memory", mode="before")(lambda cls, v: check_quantity(v))

    @property
    def world_size(self) -> int:
        """Processes in the whole job: nodes x processes per node."""
        return self.nodes * self.processes_per_node


# --- the job ---------------------------------------------------------------------------------
class TuneJob(_Section):
    """A fine-tuning job: model, data, method, hyperparameters, resources and outputs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, title="kubetune job spec")

    name: str = Field("kubetune-job", description="Job name: lowercase letters, digits and '-', at most 40 characters.")
    entrypoint: EntrypointSpec | None = Field(None, description="Your own training function instead of the built-in fine-tune (docs/custom-training.md).")
    model: ModelSpec | None = Field(None, validate_default=True, description="The base model (required unless entrypoint is set).")
    dataset: DatasetSpec | None = Field(None, validate_default=True, description="Training data (required unless entrypoint is set).")
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

    _built_in_inputs = field_validator("model", "dataset")(lambda cls, v, info: check_built_in_input(v, info))  # spec/entrypoint.py
    _custom_function = model_validator(mode="after")(lambda self: check_custom_job(self))
    _dump = model_serializer(mode="wrap")(lambda self, handler: dump_without_unused(self, handler(self)))

    @model_validator(mode="after")
    def _apply_method_preset(self) -> "TuneJob":
        """Fill every method.lora / training field that the spec leaves unset from the method's preset."""
        for path, value in _preset_values(self.method.type, self.method.objective).items():
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
    def _objective(self) -> "TuneJob":
        m, ds = self.method, self.dataset
        if ds is None:  # an entrypoint job
            return self
        formats = [ds.format] + [x.format for x in ds.mix]
        if m.preference:
            if m.dpo.reference and m.objective != "dpo":
                raise ValueError("method.dpo.reference applies to method.objective dpo only: ORPO has no reference model (remove it)")
            if m.dpo.reference and m.type != "full":
                raise ValueError(
                    "method.dpo.reference applies to method.type full only: adapters (lora, qlora, dora) use their frozen base "
                    "model as the reference (remove method.dpo.reference)"
                )
            wrong = [f for f in formats if f != "auto" and f not in PREFERENCE_FORMATS]
            if wrong:
                raise ValueError(
                    f"dataset.format {wrong[0]} holds no preference pairs, and method.objective {m.objective} needs them: "
                    f"use {' or '.join(PREFERENCE_FORMATS)} (or auto), or method.objective sft"
                )
            if ds.mix:
                raise ValueError(f"dataset.mix is not supported with method.objective {m.objective} yet: combine the preference files into one dataset.source")
            if self.training.packing:
                raise ValueError(f"training.packing does not apply to method.objective {m.objective} (pairs are not packed); set it to false")
            if ds.train_on_inputs:
                raise ValueError(f"dataset.train_on_inputs does not apply to method.objective {m.objective}: prompts are never trained; set it to false")
        else:
            wrong = [f for f in formats if f in PREFERENCE_FORMATS]
            if wrong:
                raise ValueError(f"dataset.format {wrong[0]} is preference data: set method.objective to dpo or orpo, or pick an SFT format")
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
        from ..presets import objective_values, preset_values

        out: dict[str, str] = {}
        m = self.method
        type_paths, objective_paths = preset_values(m.type), objective_values(m.objective, m.type)

        def walk(model: BaseModel, prefix: str) -> None:
            for name in type(model).model_fields:
                value, path = getattr(model, name), prefix + name
                if isinstance(value, BaseModel):
                    walk(value, path + ".")
                elif name in model.model_fields_set:
                    out[path] = "spec"
                elif path in objective_paths:
                    out[path] = f"preset {m.objective}"
                elif path in type_paths:
                    out[path] = f"preset {m.type}"
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
        return validate_job(data, overrides, located=Located())  # errors in overridden fields name their override


def _preset_values(method_type: str, objective: str) -> dict[str, Any]:
    """The method type's preset with the objective's on top (dotted paths)."""
    from ..presets import objective_values, preset_values

    return {**preset_values(method_type), **objective_values(objective, method_type)}


register_root(TuneJob)
