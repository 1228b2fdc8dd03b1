"""The ``kaito`` flavour: a Kaito tuning Workspace (kaito.sh/v1beta1) and the ConfigMap of its training config.

Kaito runs its own training script (``fine_tuning.py``: peft + TRL's SFTTrainer) on its own preset models; it
reads hyperparameters from a ConfigMap whose ``training_config.yaml`` has six sections (ModelConfig,
QuantizationConfig, LoraConfig, TrainingArguments, DataCollator, DatasetConfig), each parsed by transformers'
``HfArgumentParser`` from the flattened keys. That parser rejects keys it does not know and takes lists for
``target_modules``, so only plain scalars and lists of module names are written here.

The values come from the resolved spec (the method's preset plus the user's fields), i.e. the same values
kubetune's own engine trains with (``training/model.py``, ``training/sft.py``). What Kaito cannot do is an
error that names the field and the way out (usually ``--flavor job``), never a silently different job.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

import yaml

from ... import constants as C
from ...errors import SpecError
from ...spec import KubernetesSpec, TuneJob

__all__ = ["render_kaito", "check", "preset_name", "target_modules", "training_config", "kaito_names"]

_CLAIM_RE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # a PersistentVolumeClaim's name (a DNS subdomain)

_JOB_HINT = "use --flavor job (or pytorchjob/trainjob), which runs kubetune's own worker"
# Kaito preset name prefixes -> the architecture (config.model_type) whose module names target_modules.yaml
# lists. Kaito's peft takes module names only ("all-linear" is not a list entry it understands).
_PRESET_ARCH = (
    ("deepseek-r1-distill-llama", "llama"),
    ("deepseek-r1-distill-qwen", "qwen2"),
    ("phi-3", "phi3"),
    ("phi-4", "phi3"),
    ("falcon", "falcon"),
    ("mistral", "mistral"),
    ("llama", "llama"),
    ("qwen2.5", "qwen2"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
)
# kubernetes.* fields Kaito applies (or that belong to another flavour and are ignored there too).
_K8S_FIELDS_USED = {"flavor", "namespace", "image_pull_secrets", "node_selector", "labels", "annotations", "staging_uri", "trainjob", "kaito"}


def kaito_names(job: TuneJob) -> dict[str, str]:
    """Object names: the Workspace is the job (Kaito names its Job after it), the ConfigMap gets a suffix."""
    return {"workspace": job.name, "config": f"{job.name}-{C.K8S_KAITO_CONFIG_SUFFIX}"}


# --- what fits -----------------------------------------------------------------------------------
def check(job: TuneJob) -> None:
    """Refuse what a Kaito tuning Workspace cannot run, before any other render step.

    Raises:
        SpecError: the first problem, naming the field and the fix.
    """
    m, d, r, k = job.method, job.dataset, job.resources, job.kubernetes
    if job.entrypoint is not None:
        raise SpecError("entrypoint: Kaito runs its own tuning code, not a custom training function", hint=_JOB_HINT)
    if m.type not in ("lora", "qlora"):
        raise SpecError(f"method.type {m.type}: kaito tunes with lora or qlora; use --flavor job")
    if m.objective != "sft":
        raise SpecError(f"method.objective {m.objective}: Kaito's tuning Workspace does supervised fine-tuning only", hint=_JOB_HINT)
    preset_name(job)  # model.source errors next: they say the most about whether Kaito fits at all
    if d.mix:
        raise SpecError("dataset.mix: Kaito trains on one dataset", hint="merge the files into dataset.source, or " + _JOB_HINT)
    if d.preprocess is not None:
        raise SpecError("dataset.preprocess: Kaito's trainer reads the dataset itself and runs no kubetune code",
                        hint="preprocess the rows first and point dataset.source at the result, or " + _JOB_HINT)
    if d.eval_source:
        raise SpecError(
            "dataset.eval_source: Kaito holds out evaluation rows from the training data only",
            hint="use dataset.eval_split (Kaito's DatasetConfig.train_test_split), or " + _JOB_HINT,
        )
    _data_input(job)
    _output_image(job)
    if r.nodes > 1:
        raise SpecError(
            f"resources.nodes {r.nodes}: Kaito tunes on one node only (its webhook refuses resource.count > 1)", hint=_JOB_HINT
        )
    if r.processes_per_node > 1:
        raise SpecError(
            f"resources.processes_per_node {r.processes_per_node}: Kaito starts one process per GPU of the node itself, "
            "and kubetune cannot set that count",
            hint="remove resources.processes_per_node (pick the GPUs with kubernetes.kaito.instance_type), or " + _JOB_HINT,
        )
    if r.accelerators and r.accelerator_type != "nvidia.com/gpu":
        raise SpecError(
            f"resources.accelerator_type {r.accelerator_type}: Kaito tunes on whole NVIDIA GPUs (nvidia.com/gpu); "
            "it has no other accelerators and no GPU partitions (MIG) for tuning",
            hint=_JOB_HINT,
        )
    bad = _unsupported_fields(job)
    if bad:
        raise SpecError(
            f"the kaito flavour cannot apply {', '.join(bad)}: Kaito builds the training pod itself",
            hint="remove them for this flavour, or " + _JOB_HINT,
        )
    if not k.kaito.instance_type and not k.node_selector:
        raise SpecError(
            "kubernetes.kaito.instance_type: Kaito needs a GPU node SKU to provision, or the labels of your own GPU nodes",
            hint="set kubernetes.kaito.instance_type (e.g. Standard_NC24ads_A100_v4), or kubernetes.node_selector when "
            "Kaito's node auto-provisioning is off",
        )
    target_modules(job)


def _unsupported_fields(job: TuneJob) -> list[str]:
    """Fields the spec sets (to a non-default value) that Kaito's Workspace has no place for."""
    bad: list[str] = []
    k = job.kubernetes
    for name in KubernetesSpec.model_fields:
        if name in _K8S_FIELDS_USED or name not in k.model_fields_set:
            continue
        default = KubernetesSpec.model_fields[name].get_default(call_default_factory=True)
        value = getattr(k, name)
        dump = (lambda v: v.model_dump() if hasattr(v, "model_dump") else v)
        if dump(value) != dump(default):
            bad.append(f"kubernetes.{name}")
    r, t, d = job.resources, job.training, job.dataset
    bad += [f"resources.{f}" for f in ("cpu", "memory") if getattr(r, f) is not None]
    if job.model.attn_implementation != "auto":
        bad.append("model.attn_implementation")
    if job.output.merge:
        bad.append("output.merge (Kaito publishes the adapter only)")
    if t.resume not in ("auto", "never"):
        bad.append("training.resume (Kaito cannot start from a checkpoint)")
    if t.strategy != "ddp":
        bad.append("training.strategy")
    if t.global_batch_size is not None:
        bad.append("training.global_batch_size (Kaito's process count is the instance type's GPU count: set gradient_accumulation_steps)")
    if t.packing:
        bad.append("training.packing")
    if d.format in ("alpaca", "sharegpt"):
        bad.append(f"dataset.format {d.format} (Kaito reads messages, prompt/completion or text rows as they are)")
    if d.columns:
        bad.append("dataset.columns")
    if d.chat_template:
        bad.append("dataset.chat_template")
    if d.max_rows is not None:
        bad.append("dataset.max_rows")
    return bad


def preset_name(job: TuneJob) -> str:
    """The Kaito preset: ``kubernetes.kaito.preset``, else the hf:// model's name lowercased (a guess).

    Raises:
        SpecError: a builtin:// model, or a model Kaito cannot be told about without a preset name.
    """
    src = job.model.source
    if src.startswith(f"{C.BUILTIN_SCHEME}://"):
        raise SpecError(
            f"model.source {src}: kubetune's built-in test model has no Kaito preset; Kaito tunes only its preset models",
            hint="set model.source to hf://ORG/NAME of a model Kaito has a preset for (or kubernetes.kaito.preset), or " + _JOB_HINT,
        )
    if job.kubernetes.kaito.preset:
        return job.kubernetes.kaito.preset
    if src.startswith("hf://"):
        name = src[len("hf://"):].split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
        if name and all(c.isalnum() or c in "-." for c in name):
            return name
    raise SpecError(
        f"model.source {src}: Kaito loads its preset models, not weights from this URI, and no preset name can be derived from it",
        hint="set kubernetes.kaito.preset to Kaito's name for the model (kubectl get configmap supported-models -n kaito-workspace -o yaml), "
        "or " + _JOB_HINT,
    )


def _data_input(job: TuneJob) -> dict:
    """tuning.input: http(s) URLs, or an image whose /data holds the files."""
    src = job.dataset.source
    scheme = src.split("://", 1)[0].lower() if "://" in src else ""
    if scheme in ("http", "https"):
        host = (urlsplit(src).hostname or "").lower()
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if host == "localhost" or host.endswith(".localhost") or (ip is not None and (ip.is_loopback or ip.is_private or ip.is_link_local)):
            raise SpecError(
                f"dataset.source {src}: Kaito refuses data URLs on localhost, private or link-local addresses",
                hint="publish the file at a public https:// URL, or in an image (see below)",
            )
        return {"name": job.name, "urls": [src]}
    if scheme == C.PVC_SCHEME:
        return {"name": job.name, "volumeSource": _claim_volume(src, "dataset.source", read_only=True)}
    if scheme == "oci":
        out: dict[str, Any] = {"name": job.name, "image": src[len("oci://"):]}
        if job.kubernetes.image_pull_secrets:
            out["imagePullSecrets"] = list(job.kubernetes.image_pull_secrets)
        return out
    if (not scheme or scheme == "file") and (job.kubernetes.staging_uri or "").startswith("s3://"):
        # kubetune run uploads it to the staging prefix and puts a presigned https URL of it here
        # (backend.py, _presign_kaito_input); a render shows the staged s3:// URI in its place.
        from .staging import local_path, staged_uri

        if local_path(src).is_dir():
            raise SpecError(f"dataset.source {src} is a folder: Kaito's data-downloader fetches files by URL, one URL per file",
                            hint="point dataset.source at one file (JSONL, JSON, CSV or Parquet)")
        return {"name": job.name, "urls": [staged_uri(job, "data", src)]}
    what = "a local path" if not scheme or scheme == "file" else f"an {scheme}:// URI" if scheme[0] in "aeiou" else f"a {scheme}:// URI"
    raise SpecError(
        f"dataset.source {src} is {what}: Kaito's data-downloader fetches http(s) URLs, an image or a volume (pvc://CLAIM)",
        hint="publish the file at an https:// URL, put it on a PersistentVolumeClaim and set dataset.source: pvc://CLAIM, set kubernetes.staging_uri: s3://BUCKET/PREFIX for a local file (kubetune run "
        "uploads it and gives Kaito a presigned URL), or build an image with it under /data (FROM scratch + COPY data.jsonl /data/, "
        "docker push) and set dataset.source: oci://REGISTRY/REPO:TAG",
    )


def _claim_volume(uri: str, field: str, *, read_only: bool) -> dict:
    """A ``pvc://CLAIM`` URI as the v1 volume source Kaito mounts (the whole claim: Kaito takes no sub-path)."""
    from ...storage.schemes.pvc import claim_of

    claim, path = claim_of(uri)
    if len(claim) > 253 or not _CLAIM_RE.fullmatch(claim):
        raise SpecError(f"{field} {uri}: '{claim}' is not a PersistentVolumeClaim name (lowercase letters, digits, '-' and '.')",
                        hint="pvc://CLAIM names a PersistentVolumeClaim in the job's namespace")
    if path:
        raise SpecError(f"{field} {uri}: Kaito mounts a whole volume, not a folder in it", hint=f"use pvc://{claim} and keep only this job's files on it")
    return {"persistentVolumeClaim": {"claimName": claim, **({"readOnly": True} if read_only else {})}}


def _output_image(job: TuneJob) -> dict:
    """tuning.output: Kaito pushes the adapter as an image, with a push Secret, or writes it to a volume (pvc://CLAIM)."""
    uri = job.output.uri
    if uri and uri.startswith(f"{C.PVC_SCHEME}://"):
        return {"volumeSource": _claim_volume(uri, "output.uri", read_only=False)}
    if not uri or not uri.startswith("oci://"):
        raise SpecError(
            f"output.uri {uri or '(unset)'}: Kaito publishes the adapter as an image or onto a volume",
            hint="set output.uri: oci://REGISTRY/REPO:TAG (and kubernetes.kaito.push_secret), or pvc://CLAIM (a PersistentVolumeClaim Kaito writes to)",
        )
    secret = job.kubernetes.kaito.push_secret
    if not secret:
        raise SpecError(
            "kubernetes.kaito.push_secret: Kaito pushes the adapter image with a registry Secret, and it needs one",
            hint="kubectl create secret docker-registry NAME --docker-server=... and set kubernetes.kaito.push_secret: NAME",
        )
    return {"image": uri[len("oci://"):], "imagePushSecret": secret}


def target_modules(job: TuneJob) -> list[str]:
    """``method.lora.target_modules`` as module names (Kaito's peft takes a list, not ``all-linear``).

    Raises:
        SpecError: all-linear/attention/mlp for a preset whose architecture kubetune does not know.
    """
    from ...presets import target_modules_for

    targets = job.method.lora.target_modules
    if isinstance(targets, list):
        return list(targets)
    preset = preset_name(job)
    arch = next((a for prefix, a in _PRESET_ARCH if preset.startswith(prefix)), None)
    groups = ("attention", "mlp") if targets == "all-linear" else (targets,)
    names = [n for g in groups for n in (target_modules_for(arch, g) or [])] if arch else []
    if not names:
        raise SpecError(
            f"method.lora.target_modules {targets}: kubetune does not know the module names of Kaito preset '{preset}', "
            "and Kaito needs names",
            hint="list them, e.g. method.lora.target_modules: [q_proj, k_proj, v_proj, o_proj]",
        )
    return names


# --- the objects ---------------------------------------------------------------------------------
def training_config(job: TuneJob) -> dict:
    """Kaito's ``training_config.yaml`` from the resolved spec (presets + overrides)."""
    t, lora, d = job.training, job.method.lora, job.dataset
    # model.dtype auto: Kaito runs on GPUs, where kubetune's engine picks bf16 (set float16 for GPUs without it).
    dtype = {"auto": "bfloat16"}.get(job.model.dtype, job.model.dtype)
    model: dict[str, Any] = {"torch_dtype": dtype, "local_files_only": True, "device_map": "auto"}
    if job.model.trust_remote_code:
        model["trust_remote_code"] = True
    if job.method.type == "qlora":
        quant: dict[str, Any] = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_compute_dtype": "float16" if dtype == "float16" else "bfloat16",
            "bnb_4bit_use_double_quant": True,
        }
    else:
        quant = {"load_in_4bit": False}
    lora_cfg: dict[str, Any] = {
        "r": lora.r,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_modules(job),
        "bias": lora.bias,
    }
    if lora.use_rslora:
        lora_cfg["use_rslora"] = True
    if lora.modules_to_save:
        lora_cfg["modules_to_save"] = list(lora.modules_to_save)
    args: dict[str, Any] = {"output_dir": C.K8S_KAITO_OUTPUT_DIR, "num_train_epochs": t.epochs}
    if t.max_steps:
        args["max_steps"] = t.max_steps
    args["per_device_train_batch_size"] = t.batch_size
    args["gradient_accumulation_steps"] = job.accumulation_steps
    args["learning_rate"] = t.learning_rate
    args["lr_scheduler_type"] = t.lr_scheduler
    if t.warmup_steps:
        args["warmup_steps"] = t.warmup_steps
    else:
        args["warmup_ratio"] = t.warmup_ratio
    args["weight_decay"] = t.weight_decay
    args["max_grad_norm"] = t.max_grad_norm
    args["optim"] = t.optimizer
    args["seed"] = t.seed
    args["data_seed"] = t.seed
    args["gradient_checkpointing"] = t.gradient_checkpointing
    args["logging_steps"] = t.logging_steps
    save = "steps" if t.save_steps else "epoch"  # kubetune's default: a checkpoint per epoch
    args["save_strategy"] = save
    if t.save_steps:
        args["save_steps"] = t.save_steps
    if t.save_total_limit is not None:
        args["save_total_limit"] = t.save_total_limit
    if d.eval_split:
        args["per_device_eval_batch_size"] = t.batch_size
        if t.eval_steps:
            args["eval_strategy"], args["eval_steps"] = "steps", t.eval_steps
        else:  # kubetune's default: evaluate whenever a checkpoint is saved
            args["eval_strategy"] = save
            if t.save_steps:
                args["eval_steps"] = t.save_steps
    args["bf16"] = dtype == "bfloat16"
    args["fp16"] = dtype == "float16"
    args["report_to"] = list(t.report_to) or ["none"]
    args["ddp_find_unused_parameters"] = False
    return {
        "training_config": {
            "ModelConfig": model,
            "QuantizationConfig": quant,
            "LoraConfig": lora_cfg,
            "TrainingArguments": args,
            "DataCollator": {"mlm": False},
            "DatasetConfig": {"shuffle_dataset": True, "shuffle_seed": t.seed, "train_test_split": round(1.0 - d.eval_split, 6)},
        }
    }


def render_kaito(ctx) -> list[dict]:
    """The ConfigMap of Kaito's training config, then the Workspace that names it.

    ``ctx`` is the :class:`~kubetune.backends.kubernetes.flavors.RenderContext` of the render.
    """
    job = ctx.job
    check(job)
    names = kaito_names(job)
    k = job.kubernetes
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": ctx.meta(names["config"]),
        "data": {C.K8S_KAITO_CONFIG_KEY: yaml.safe_dump(training_config(job), sort_keys=False)},
    }
    resource: dict[str, Any] = {}
    if k.kaito.instance_type:
        resource["instanceType"] = k.kaito.instance_type
    # Kaito labels the nodes it provisions with these (or selects your own GPU nodes by them).
    resource["labelSelector"] = {"matchLabels": dict(k.node_selector) or {C.LABEL_JOB: job.name}}
    tuning: dict[str, Any] = {
        "preset": {"name": preset_name(job)},
        "method": job.method.type,
        "config": names["config"],
        "input": _data_input(job),
        "output": _output_image(job),
    }
    workspace = {
        "apiVersion": C.K8S_KAITO_API_VERSION,
        "kind": "Workspace",
        "metadata": ctx.meta(names["workspace"], workload=True),
        "resource": resource,
        "tuning": tuning,
    }
    return [config, workspace]
