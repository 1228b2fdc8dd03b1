"""Each training method on the builtin tiny model: lora, qlora (4-bit on CPU), dora, full; and their options."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from kubetune import constants as C
from kubetune.errors import TrainError
from kubetune.spec import load_spec

from .conftest import events, small, status


def _adapter_keys(run_dir):
    with safe_open(str(run_dir / C.ADAPTER_DIR / "adapter_model.safetensors"), "pt") as f:
        return list(f.keys())


def _check_common(rc, run_dir, result, steps=4):
    assert rc == 0, (run_dir / C.EVENTS_FILE).read_text()[-3000:]
    assert result["global_step"] == result["total_steps"] == steps
    assert [x["step"] for x in result["losses"]] == list(range(1, steps + 1))
    assert result["eval_loss"] is not None and result["perplexity"] > 1
    assert result["best_checkpoint"]["eval_loss"] == min(e["eval_loss"] for e in result["evals"])
    assert (run_dir / C.DONE_FILE).is_file()


def test_lora_trains_an_adapter(tiny_job, run_inprocess):
    rc, run_dir, result = run_inprocess(small(tiny_job))
    _check_common(rc, run_dir, result)
    cfg = json.loads((run_dir / C.ADAPTER_DIR / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16 and not cfg["use_dora"]
    keys = _adapter_keys(run_dir)
    # vLLM-compatible: LoRA weights only, nothing of the base model.
    assert keys and all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in keys)
    assert result["losses"][-1]["loss"] < result["losses"][0]["loss"]
    assert result["trainable_parameters"] < result["total_parameters"] / 5


def test_qlora_quantizes_the_base_to_4bit_nf4_on_cpu(tiny_job, tiny_model):
    from bitsandbytes.nn import Linear4bit

    from kubetune.training.model import device_info, load_model

    job = load_spec(small(tiny_job, method={"type": "qlora"}))
    model = load_model(job, tiny_model, device_info())
    quantized = [m for m in model.modules() if isinstance(m, Linear4bit)]
    assert len(quantized) == 4 * 7  # every linear layer of the 4 blocks (q, k, v, o, gate, up, down)
    state = quantized[0].weight.quant_state
    assert state.quant_type == "nf4" and state.nested  # NF4 with double quantization
    assert quantized[0].compute_dtype.__repr__() == "torch.bfloat16"
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_qlora_trains_on_cpu(tiny_job, run_inprocess):
    rc, run_dir, result = run_inprocess(
        small(tiny_job, method={"type": "qlora"}, training={"max_steps": 2, "save_steps": 2, "batch_size": 2, "max_seq_length": 48})
    )
    _check_common(rc, run_dir, result, steps=2)
    cfg = json.loads((run_dir / C.ADAPTER_DIR / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA"
    assert all(k.endswith(("lora_A.weight", "lora_B.weight")) for k in _adapter_keys(run_dir))
    assert result["precision"]["compute_4bit"] == "bfloat16"
    saved = load_spec(run_dir / C.SPEC_FILE)  # the preset's choices are in the resolved spec
    assert saved.training.gradient_checkpointing is True and saved.training.max_grad_norm == 0.3


def test_dora_trains_magnitudes(tiny_job, run_inprocess):
    rc, run_dir, result = run_inprocess(small(tiny_job, method={"type": "dora"}))
    _check_common(rc, run_dir, result)
    cfg = json.loads((run_dir / C.ADAPTER_DIR / "adapter_config.json").read_text())
    assert cfg["use_dora"] is True
    assert any("lora_magnitude_vector" in k for k in _adapter_keys(run_dir))


def test_full_fine_tune_writes_a_model(tiny_job, run_inprocess):
    from transformers import AutoModelForCausalLM

    rc, run_dir, result = run_inprocess(small(tiny_job, method={"type": "full"}, training={"learning_rate": 1e-3}))
    _check_common(rc, run_dir, result)
    assert result["trainable_parameters"] == result["total_parameters"]
    model = AutoModelForCausalLM.from_pretrained(run_dir / C.MODEL_DIR)
    assert model.config.model_type == "llama"
    assert not (run_dir / C.ADAPTER_DIR).exists()


def test_rslora_modules_to_save_and_attention_targets(tiny_job, tiny_model):
    from kubetune.training.model import device_info, load_model

    job = load_spec(
        small(tiny_job, method={"lora": {"r": 4, "alpha": 8, "use_rslora": True, "target_modules": "attention", "modules_to_save": ["embed_tokens"]}})
    )
    model = load_model(job, tiny_model, device_info())
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(8 / 4**0.5)  # rsLoRA: alpha / sqrt(r)
    adapted = {n.split(".")[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"}  # the llama 'attention' preset
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("embed_tokens.modules_to_save" in n for n in trainable)
    # The tied output head follows the trained embedding (one trained copy, still tied).
    inner = model.base_model.model
    assert inner.lm_head.weight is inner.model.embed_tokens.modules_to_save["default"].weight


def test_unknown_architecture_preset_names_the_field(tiny_job, tiny_model):
    from kubetune.training.model import resolve_target_modules

    job = load_spec(small(tiny_job, method={"lora": {"target_modules": "mlp"}}))

    class Fake:
        class config:
            model_type = "mamba-ish"

    with pytest.raises(TrainError, match="method.lora.target_modules: no 'mlp' preset for architecture 'mamba-ish'"):
        resolve_target_modules(job, Fake)


def test_gradient_checkpointing_gives_the_same_losses(tiny_job, run_inprocess, tmp_path):
    spec = small(tiny_job, training={"max_steps": 3, "save_steps": 3}, dataset={"source": small(tiny_job)["dataset"]["source"], "eval_split": 0.0})
    _, _, plain = run_inprocess({**spec, "output": {"dir": str(tmp_path / "plain")}})
    ckpt_spec = {**spec, "training": {**spec["training"], "gradient_checkpointing": True}, "output": {"dir": str(tmp_path / "ckpt")}}
    rc, _, checkpointed = run_inprocess(ckpt_spec)
    assert rc == 0
    for a, b in zip(plain["losses"], checkpointed["losses"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.parametrize(
    "device,dtype,method,expected",
    [
        ({"type": "cpu", "bf16": False, "fp16": False}, "auto", "lora", ("float32", None)),
        ({"type": "cuda", "bf16": True, "fp16": True}, "auto", "lora", ("bfloat16", "bf16")),
        ({"type": "cuda", "bf16": False, "fp16": True}, "auto", "lora", ("float16", "fp16")),
        ({"type": "cuda", "bf16": False, "fp16": True}, "auto", "full", ("float32", "fp16")),  # fp32 master weights
        ({"type": "cpu", "bf16": False, "fp16": False}, "bfloat16", "lora", ("bfloat16", "bf16")),
        ({"type": "cuda", "bf16": True, "fp16": True}, "float32", "full", ("float32", None)),
    ],
)
def test_dtype_auto_and_explicit(tiny_job, device, dtype, method, expected):
    from kubetune.training.model import precision

    job = load_spec(small(tiny_job, model={"source": "builtin://tiny-chat", "dtype": dtype}, method={"type": method}))
    p = precision(job, {**device, "name": "x"})
    assert (p.weights, p.amp) == expected


def test_float16_on_cpu_is_refused(tiny_job):
    from kubetune.training.model import precision

    job = load_spec(small(tiny_job, model={"source": "builtin://tiny-chat", "dtype": "float16"}))
    with pytest.raises(TrainError, match="model.dtype float16 needs a GPU"):
        precision(job, {"type": "cpu", "bf16": False, "name": "cpu"})


def test_progress_events_and_plan(tiny_job, run_inprocess):
    rc, run_dir, result = run_inprocess(small(tiny_job, training={"max_steps": None, "epochs": 0.1, "batch_size": 8, "gradient_accumulation_steps": 2}))
    assert rc == 0
    evs = events(run_dir)
    plan = next(e for e in evs if e["type"] == "metrics" and e["message"].startswith("plan:"))
    # 270 training rows, global batch 16: ceil(0.1 x ceil(270 / 16)) = ceil(1.7) = 2 steps, known before step 1.
    assert plan["data"]["total_steps"] == 2 and plan["data"]["steps_per_epoch"] == 17
    first_step = next(i for i, e in enumerate(evs) if e["type"] == "metrics" and (e.get("data") or {}).get("loss") is not None)
    assert evs.index(plan) < first_step
    steps = [e["data"] for e in evs if e["type"] == "metrics" and "loss" in (e.get("data") or {})]
    for key in ("step", "total_steps", "loss", "learning_rate", "grad_norm", "tokens_per_second", "eta_seconds", "peak_memory_mb"):
        assert all(key in s for s in steps), key
    assert steps[-1]["step"] == steps[-1]["total_steps"] == 2 and steps[-1]["tokens_per_second"] > 0
    evals = [e["data"] for e in evs if e["type"] == "metrics" and "eval_loss" in (e.get("data") or {})]
    assert evals and all(e["perplexity"] > 1 for e in evals)
    assert result["global_step"] == 2
    # status.json (what `kubetune status` and the live view read) carries the latest progress.
    st = status(run_dir)
    assert st["step"] == st["total_steps"] == 2 and st["loss"] == steps[-1]["loss"]
    assert st["eval_loss"] == evals[-1]["eval_loss"]
    for key in ("learning_rate", "grad_norm", "tokens_per_second", "eta_seconds", "peak_memory_mb"):
        assert st[key] is not None, key
