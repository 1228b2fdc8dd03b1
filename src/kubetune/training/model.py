"""Model setup for a run: the device and dtype, 4-bit quantization (QLoRA), and the PEFT adapter.

:func:`load_model` is the one entry: it returns a model ready for the trainer, with the method of
``job.method`` attached. Precision follows ``model.dtype``:

=========  ================================  ======================================
dtype      weights loaded as                 trainer precision
=========  ================================  ======================================
auto       bf16 on accelerators that         bf16 autocast; fp16 autocast on older
           support it (recent NVIDIA/AMD     GPUs; plain fp32 on CPU (and on MPS
           GPUs, Gaudi, XPU, MPS on macOS    before macOS 14)
           14), fp16 on older GPUs (fp32
           for full fine-tuning), else fp32
bfloat16   bf16                              bf16 autocast
float16    fp16 (fp32 for full)              fp16 autocast with loss scaling (CUDA,
                                             ROCm, Gaudi, XPU; not CPU or MPS)
float32    fp32                              fp32
=========  ================================  ======================================

The device comes from :func:`kubetune.training.devices.device_info`.

LoRA/DoRA adapter weights are kept in fp32 whatever the base dtype (PEFT's autocast_adapter_dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import ranks
from ..errors import TrainError
from ..preflight import check_model_config
from ..spec import TuneJob
from .devices import device_info, is_accelerator

__all__ = ["Precision", "device_info", "precision", "load_tokenizer", "load_model", "resolve_target_modules", "count_parameters"]


@dataclass(frozen=True)
class Precision:
    """The dtype weights are loaded in and the trainer's mixed-precision mode."""

    weights: str  # torch dtype name: float32, bfloat16, float16
    amp: str | None  # "bf16", "fp16" or None
    compute_4bit: str  # compute dtype of 4-bit layers (QLoRA)


def precision(job: TuneJob, device: dict) -> Precision:
    """The precision a job trains in on ``device`` (see the module docstring).

    Raises:
        TrainError: float16 asked for on a device without fp16 training (the CPU, Apple MPS).
    """
    full = job.method.type == "full"
    accel = is_accelerator(device)
    dtype = job.model.dtype
    if dtype == "auto":
        if accel and device["bf16"]:
            dtype = "bfloat16"
        elif accel and device.get("fp16"):
            dtype = "float16"
        else:
            dtype = "float32"
    if dtype == "float16" and not device.get("fp16"):
        where = "CPUs train" if not accel else f"{device['name']} ({device['type']}) trains"
        raise TrainError(f"model.dtype float16 needs a GPU with fp16 training: {where} in float32 or bfloat16", hint="set model.dtype: auto")
    compute_4bit = "float16" if accel and not device["bf16"] else "bfloat16"
    if dtype == "float32":
        return Precision("float32", None, compute_4bit)
    if dtype == "bfloat16":
        return Precision("bfloat16", "bf16", "bfloat16")
    # fp16 weights cannot take optimizer steps under loss scaling: a full fine-tune keeps fp32 master weights.
    return Precision("float32" if full else "float16", "fp16", "float16")


def load_tokenizer(job: TuneJob, model_path: Path):
    """The model's tokenizer, with a pad token (EOS when it has none).

    The worker's first use of the fetched model, so the spec is checked against the model's config here,
    before any data is prepared.

    Raises:
        SpecError: training.max_seq_length is beyond the model's max_position_embeddings.
    """
    from transformers import AutoTokenizer

    check_model_config(job, model_path)

    tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=job.model.trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(job: TuneJob, model_path: Path, device: dict):
    """Load the base model in the job's precision and attach its method (LoRA, QLoRA, DoRA or none).

    Raises:
        TrainError: qlora without bitsandbytes, or target modules that match nothing in this model.
        SpecError: training.max_seq_length is beyond the model's max_position_embeddings.
    """
    import torch
    from transformers import AutoModelForCausalLM

    check_model_config(job, model_path)

    prec = precision(job, device)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, prec.weights), "trust_remote_code": job.model.trust_remote_code}
    if job.model.attn_implementation != "auto":
        kwargs["attn_implementation"] = job.model.attn_implementation
    if job.method.type == "qlora":
        kwargs["quantization_config"] = _bnb_config(prec)
        if is_accelerator(device):  # quantize straight onto this process's device
            kwargs["device_map"] = {"": ranks.local_rank() if device["type"] == "cuda" else f"{device['type']}:{ranks.local_rank()}"}
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    if job.training.gradient_checkpointing:
        model.config.use_cache = False  # the cache is useless in training and conflicts with checkpointing
    if job.method.type == "full":
        return model
    return _attach_adapter(job, model, device)


def _attach_adapter(job: TuneJob, model, device: dict):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if job.method.type == "qlora":
        # Casts norms/embeddings to fp32 for stability; checkpointing is switched on by the trainer (non-reentrant).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        if device["type"] == "cpu":
            _disable_bnb_cpu_packing(model)
    lora = job.method.lora
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    # PEFT extends LoraConfig's lists in place (modules_to_save gains "model.embed_tokens" beside "embed_tokens"):
    # it gets copies, never the spec's own lists, or the spec (and the checkpoint fingerprint) changes under us.
    extra: dict[str, Any] = {}
    if "ensure_weight_tying" in LoraConfig.__dataclass_fields__:  # peft >= 0.18
        # A tied input/output embedding in modules_to_save stays tied (one trained copy serves both), so the
        # merged model keeps the base architecture.
        extra["ensure_weight_tying"] = bool(lora.modules_to_save) and tied
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=resolve_target_modules(job, model),
        use_rslora=lora.use_rslora,
        modules_to_save=list(lora.modules_to_save) or None,
        bias=lora.bias,
        use_dora=job.method.type == "dora",
        task_type="CAUSAL_LM",
        **extra,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as e:
        if "not found in the base model" in str(e) or "Target modules" in str(e):
            raise TrainError(
                f"method.lora.target_modules: {e}",
                hint="use all-linear, or module names printed by print(model) for this architecture",
            ) from None
        raise


def resolve_target_modules(job: TuneJob, model) -> str | list[str]:
    """``all-linear`` or a list of module names, expanding the ``attention``/``mlp`` presets for this architecture.

    A list is always a new one (the spec's own list never reaches a library that may change it).

    Raises:
        TrainError: ``attention``/``mlp`` for an architecture without a preset.
    """
    from ..presets import architectures, target_modules_for

    targets = job.method.lora.target_modules
    if isinstance(targets, list):
        return list(targets)
    if targets == "all-linear":
        return targets
    model_type = getattr(model.config, "model_type", "?")
    names = target_modules_for(model_type, targets)
    if names is None:
        raise TrainError(
            f"method.lora.target_modules: no '{targets}' preset for architecture '{model_type}' "
            f"(presets exist for {', '.join(architectures())})",
            hint="use all-linear, or list the module names, e.g. target_modules: [q_proj, v_proj]",
        )
    return names


def _bnb_config(prec: Precision):
    import torch
    from transformers import BitsAndBytesConfig

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise TrainError(
            "method.type qlora needs bitsandbytes, which is not installed",
            hint="pip install 'kubetune[qlora]' (or pip install bitsandbytes), or set method.type: lora",
        ) from None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=getattr(torch, prec.compute_4bit),
    )


def _disable_bnb_cpu_packing(model) -> None:
    # bitsandbytes repacks 4-bit weights for AVX512-BF16 CPUs the first time a layer runs without grad (our
    # evaluation); the repacking assumes in_features divisible by the 64-value quantization block and
    # fails otherwise (the builtin model's 352-wide MLP). The generic CPU kernel has no such limit.
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # pragma: no cover - checked in _bnb_config
        return
    for module in model.modules():
        if isinstance(module, Linear4bit) and getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts; 4-bit weights count as their unpacked size."""
    trainable = total = 0
    for p in model.parameters():
        n = p.numel()
        if p.__class__.__name__ == "Params4bit":
            n *= 2  # two 4-bit values per stored byte
        total += n
        if p.requires_grad:
            trainable += n
    return trainable, total
