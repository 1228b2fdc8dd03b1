"""Merge a trained adapter into its base model: a plain model directory any transformers user can load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .. import constants as C
from ..errors import TrainError

__all__ = ["merge_run"]


def merge_run(run_dir: str | os.PathLike, *, base_model: str | os.PathLike | None = None, trust_remote_code: bool = False) -> Path:
    """Write ``merged/`` (safetensors, tokenizer, chat template, generation config) for a LoRA/DoRA run.

    Args:
        run_dir: a run directory holding ``adapter/``.
        base_model: local base model directory (default: the one recorded in the adapter config).

    Returns:
        The merged model directory.

    Raises:
        TrainError: the run has no adapter.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    run_dir = Path(run_dir)
    adapter = run_dir / C.ADAPTER_DIR
    if not (adapter / "adapter_config.json").is_file():
        raise TrainError(f"{run_dir}: no adapter to merge (adapter/adapter_config.json is missing)", hint="merge works on lora, qlora and dora runs")
    if base_model is None:
        from ..spec import load_spec
        from ..worker import materialize

        base_model = materialize(load_spec(run_dir / C.SPEC_FILE).model.source)
    # Merge in full precision: merging into a 4-bit (QLoRA) base would lose the adapter's precision.
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32, trust_remote_code=trust_remote_code)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    target = run_dir / C.MERGED_DIR
    tmp = run_dir / f".{C.MERGED_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(adapter).save_pretrained(tmp)
    try:
        GenerationConfig.from_pretrained(base_model).save_pretrained(tmp)
    except OSError:
        pass  # the base model has no generation config
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target
