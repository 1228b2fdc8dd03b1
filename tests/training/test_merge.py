"""Merge and export: merged logits equal base+adapter logits; adapters load in PEFT and are LoRA-only."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from kubetune import constants as C

from .conftest import small

PROMPTS = ["What is the capital of France?", "Which city is the capital of Japan?"]


def _logits(model, tokenizer):
    enc = tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        return model(**enc).logits


@pytest.mark.parametrize(
    "method,lora",
    [
        ("lora", {"modules_to_save": ["embed_tokens"]}),  # the quickstart's shape: tied embeddings trained
        ("dora", {}),
    ],
)
def test_merged_model_equals_base_plus_adapter(tiny_job, tiny_model, run_inprocess, method, lora):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rc, run_dir, result = run_inprocess(small(tiny_job, method={"type": method, "lora": lora}, output={"merge": True}))
    assert rc == 0
    merged_dir = run_dir / C.MERGED_DIR
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (merged_dir / name).is_file(), name
    tok = AutoTokenizer.from_pretrained(merged_dir)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template

    # Plain transformers, nothing of PEFT.
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, run_dir / C.ADAPTER_DIR).eval()
    a, b = _logits(merged, tok), _logits(with_adapter, tok)
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    # ...and the adapter changed something (the comparison is not vacuous).
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert (_logits(plain, tok) - a).abs().max() > 1e-2


def test_adapter_is_plain_peft_lora_and_merge_command(tiny_job, tiny_model, run_inprocess):
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from kubetune.cli import app

    rc, run_dir, _ = run_inprocess(small(tiny_job))
    assert rc == 0 and not (run_dir / C.MERGED_DIR).exists()
    adapter = run_dir / C.ADAPTER_DIR
    cfg = PeftConfig.from_pretrained(adapter)
    assert cfg.peft_type == "LORA" and cfg.r == 8
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), adapter)
    assert model.active_adapter == "default"
    # What vLLM reads: adapter_config.json (r, lora_alpha, target_modules) + LoRA A/B tensors only.
    raw = json.loads((adapter / "adapter_config.json").read_text())
    assert {"r", "lora_alpha", "target_modules", "peft_type"} <= set(raw)
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert all(k.startswith("base_model.model.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in keys)

    out = CliRunner().invoke(app, ["merge", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert (run_dir / C.MERGED_DIR / "model.safetensors").is_file()
    assert AutoModelForCausalLM.from_pretrained(run_dir / C.MERGED_DIR).config.model_type == "llama"


def test_merge_of_a_full_run_explains(tmp_path):
    from kubetune.errors import TrainError
    from kubetune.training.merge import merge_run

    (tmp_path / C.MODEL_DIR).mkdir()
    (tmp_path / C.MODEL_DIR / "config.json").write_text("{}")
    with pytest.raises(TrainError, match="no adapter to merge") as e:
        merge_run(tmp_path)
    assert "full fine-tune" in str(e.value)
