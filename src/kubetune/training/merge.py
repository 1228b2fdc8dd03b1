"""Merge a trained adapter into its base model: a plain model directory any transformers user can load.

The merge happens in float32 whatever the training precision (QLoRA included: its adapter is merged into
the full-precision base, not into the 4-bit copy it was trained against), and the result is stored in
the base model's own dtype. A tied input/output embedding that the adapter trained stays tied; one the
adapter untied is saved untied (PEFT sets ``tie_word_embeddings: false``), so the merged model computes
exactly what base + adapter computes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .. import constants as C
from ..errors import TrainError

__all__ = ["merge_run", "merge_adapter"]


def merge_run(run_dir: str | os.PathLike, *, base_model: str | os.PathLike | None = None, trust_remote_code: bool | None = None) -> Path:
    """Write ``merged/`` (safetensors, tokenizer with chat template, generation config) for a LoRA/QLoRA/DoRA run.

    Args:
        run_dir: a run directory holding ``adapter/`` and ``spec.yaml``.
        base_model: local base model directory (default: the spec's model.source, fetched or generated).
        trust_remote_code: default: the spec's model.trust_remote_code.

    Returns:
        The merged model directory.

    Raises:
        TrainError: the run has no adapter (a full fine-tune, or not finished).
    """
    run_dir = Path(run_dir)
    adapter = run_dir / C.ADAPTER_DIR
    if not (adapter / "adapter_config.json").is_file():
        hint = "merge works on lora, qlora and dora runs"
        if (run_dir / C.MODEL_DIR / "config.json").is_file():
            hint = "this is a full fine-tune: model/ already is a complete model"
        raise TrainError(f"{run_dir}: no adapter to merge (adapter/adapter_config.json is missing)", hint=hint)
    if base_model is None or trust_remote_code is None:
        from ..spec import load_spec
        from ..storage import fetch

        job = load_spec(run_dir / C.SPEC_FILE)
        base_model = base_model or fetch(job.model.pinned_source)
        trust_remote_code = job.model.trust_remote_code if trust_remote_code is None else trust_remote_code
    return merge_adapter(base_model, adapter, run_dir / C.MERGED_DIR, trust_remote_code=bool(trust_remote_code))


def merge_adapter(base_model: str | os.PathLike, adapter: str | os.PathLike, target: str | os.PathLike, *, trust_remote_code: bool = False) -> Path:
    """Merge the PEFT adapter at ``adapter`` into ``base_model`` and write the result to ``target`` atomically."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    target = Path(target)
    stored = getattr(AutoConfig.from_pretrained(base_model, trust_remote_code=trust_remote_code), "dtype", None)
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32, trust_remote_code=trust_remote_code)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    if isinstance(stored, torch.dtype) and stored != torch.float32:
        merged = merged.to(stored)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(adapter, trust_remote_code=trust_remote_code).save_pretrained(tmp)  # with the chat template
    try:
        GenerationConfig.from_pretrained(base_model).save_pretrained(tmp)
    except OSError:
        pass  # the base model has no generation config
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target
