"""llama-stack's post-training requests -> kubetune specs, rows and statuses (docs/llama-stack.md's table).

Every spec built here is loaded by kubetune's own spec loader: a mapping that produced a spec kubetune refuses
would fail the user at submit time."""

from __future__ import annotations

import json
import math

import pytest

from kubetune.integrations.llama_stack.mapping import MappingError, checkpoints, dpo_spec, job_name, job_status, normalize_rows, sft_spec
from kubetune.spec import load_spec

TC = {"n_epochs": 2, "max_steps_per_epoch": 5, "gradient_accumulation_steps": 2, "dtype": "bf16",
      "data_config": {"dataset_id": "d", "batch_size": 4, "shuffle": True, "data_format": "instruct", "packed": True, "train_on_input": True},
      "optimizer_config": {"optimizer_type": "adamw", "lr": 1e-4, "weight_decay": 0.01, "num_warmup_steps": 3},
      "efficiency_config": {"enable_activation_checkpointing": True}}
LORA = {"type": "LoRA", "lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True, "apply_lora_to_output": False,
        "rank": 8, "alpha": 16}


def _load(spec: dict):
    return load_spec(json.loads(json.dumps(spec)))


def test_sft_request_maps_every_field_to_the_spec(tmp_path):
    spec, notes = sft_spec(job_uuid="Job_1", model_source="builtin://tiny-chat", training_config=TC, algorithm_config=LORA,
                           train_file=str(tmp_path / "t.jsonl"), eval_file=str(tmp_path / "v.jsonl"),
                           defaults={"training": {"max_seq_length": 128, "learning_rate": 9.0}, "output": {"dir": str(tmp_path / "out")}})
    job = _load(spec)
    assert job.name == job_name("Job_1") and job.name.startswith("ls-job-1-")
    t = job.training
    assert (t.epochs, t.max_steps, t.gradient_accumulation_steps, t.batch_size) == (2, 10, 2, 4)  # 2 epochs x 5 steps
    assert (t.learning_rate, t.weight_decay, t.warmup_steps, t.optimizer) == (1e-4, 0.01, 3, "adamw_torch")  # request wins over defaults
    assert t.packing and t.gradient_checkpointing and t.max_seq_length == 128
    assert job.model.dtype == "auto"  # bf16: bf16 where the device has it, fp32 on a CPU
    assert job.dataset.train_on_inputs and job.dataset.eval_source == str(tmp_path / "v.jsonl")
    assert job.method.type == "lora" and job.method.lora.r == 8 and job.method.lora.alpha == 16
    assert job.method.lora.target_modules == ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert notes == []


def test_dora_qlora_full_and_what_is_not_supported(tmp_path):
    base = dict(job_uuid="u", model_source="builtin://tiny-chat", training_config={"n_epochs": 1}, train_file="t.jsonl")
    assert sft_spec(**base, algorithm_config={**LORA, "use_dora": True})[0]["method"]["type"] == "dora"
    assert sft_spec(**base, algorithm_config={**LORA, "quantize_base": True, "apply_lora_to_output": True})[0]["method"] == {
        "type": "qlora", "lora": {"target_modules": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"], "r": 8, "alpha": 16.0}}
    assert sft_spec(**base, algorithm_config=None)[0]["method"] == {"type": "full"}
    with pytest.raises(MappingError, match=r"algorithm_config.type: 'QAT' is not supported.*quantization-aware"):
        sft_spec(**base, algorithm_config={"type": "QAT", "quantizer_name": "x", "group_size": 32})
    with pytest.raises(MappingError, match="lora_attn_modules"):
        sft_spec(**base, algorithm_config={**LORA, "lora_attn_modules": [], "apply_lora_to_mlp": False})
    with pytest.raises(MappingError, match="training_config.n_epochs"):
        sft_spec(**{**base, "training_config": {"n_epochs": 0}}, algorithm_config=None)
    with pytest.raises(MappingError, match="optimizer_type: 'lion'"):
        sft_spec(**{**base, "training_config": {"n_epochs": 1, "optimizer_config": {"optimizer_type": "lion", "lr": 1, "weight_decay": 0, "num_warmup_steps": 0}}},
                 algorithm_config=None)
    _, notes = sft_spec(**{**base, "training_config": {"n_epochs": 1, "data_config": {"shuffle": False},
                                                       "efficiency_config": {"fsdp_cpu_offload": True}}},
                        algorithm_config=None, hyperparam_search_config={"x": 1}, logger_config={"y": 2})
    assert [n.split(":")[0] for n in notes] == ["data_config.shuffle=false", "efficiency_config.fsdp_cpu_offload", "hyperparam_search_config", "logger_config"]


def test_preference_request_is_a_dpo_job(tmp_path):
    spec, notes = dpo_spec(job_uuid="p", model_source="builtin://tiny-chat", training_config={"n_epochs": 1, "max_steps_per_epoch": 2},
                           algorithm_config={"reward_scale": 1.0, "reward_clip": 5.0, "epsilon": 0.1, "gamma": 0.99, "beta": 0.2},
                           train_file=str(tmp_path / "p.jsonl"), defaults={"output": {"dir": str(tmp_path / "o")}})
    job = _load(spec)
    assert job.method.objective == "dpo" and job.method.dpo.beta == 0.2 and job.training.max_steps == 2
    assert len(notes) == 4 and all("TRL's DPO loss has no such setting" in n for n in notes)


def test_llama_stack_row_shapes_become_chat_messages():
    rows = normalize_rows([
        {"chat_completion_input": json.dumps([{"role": "user", "content": "Capital of France?"}]), "expected_answer": "Paris."},
        {"input_query": "2+2?", "expected_answer": "4", "dialog": math.nan},  # pandas fills a missing column with NaN
        {"dialog": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": {"type": "text", "text": "Hello"}}]},
        {"messages": json.dumps([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])},
        {"prompt": "p", "completion": "c"},  # any other shape is kubetune's format detection's
    ])
    assert rows[0] == {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]}
    assert rows[1] == {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    assert rows[2] == {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    assert rows[3]["messages"][1] == {"role": "assistant", "content": "b"}
    assert rows[4] == {"prompt": "p", "completion": "c"}
    with pytest.raises(MappingError, match=r"dataset row 0: column 'dialog' is a string that is not JSON"):
        normalize_rows([{"dialog": "{not json"}])
    with pytest.raises(MappingError, match=r"dataset row 1: column 'dialog' is not a list of messages"):
        normalize_rows([{"text": "ok"}, {"dialog": [{"content": "no role"}]}])
    with pytest.raises(MappingError, match="no rows"):
        normalize_rows([])


def test_status_and_checkpoints_in_llama_stack_shape():
    events = [{"time": 100.0, "type": "metrics", "data": {"step": 1, "loss": 2.0, "epoch": 0.5}},
              {"time": 101.0, "type": "checkpoint", "data": {"step": 2, "path": "/r/checkpoints/checkpoint-2", "eval_loss": 1.0}},
              {"time": 102.0, "type": "checkpoint", "data": {"step": 2, "removed": True}},
              {"time": 103.0, "type": "checkpoint", "data": {"step": 4, "path": "/r/checkpoints/checkpoint-4"}}]
    ck = checkpoints("j", events, result={"train_loss": 1.5, "eval_loss": 0.5}, final_path="/r/adapter", finished_at=110.0)
    assert [c["identifier"] for c in ck] == ["j/checkpoint-2", "j/checkpoint-4", "j/final"]
    assert ck[0]["training_metrics"] == {"epoch": 1, "train_loss": 2.0, "validation_loss": 1.0, "perplexity": math.exp(1.0)}
    assert ck[1]["training_metrics"] is None  # no validation loss: llama-stack's metric object needs one
    assert ck[2]["path"] == "/r/adapter" and ck[2]["created_at"].startswith("1970-01-01T00:01:50")
    st = job_status("j", "running", created_at=100.0, started_at=101.0, finished_at=None, resources={"backend": "local"}, checkpoint_list=ck)
    assert st["status"] == "in_progress" and st["completed_at"] is None and st["scheduled_at"].startswith("1970-01-01T00:01:40")
    assert [job_status("j", s, created_at=None, started_at=None, finished_at=None, resources=None, checkpoint_list=[])["status"]
            for s in ("pending", "succeeded", "failed", "cancelled")] == ["scheduled", "completed", "failed", "cancelled"]
