"""kubetune as llama-stack's post-training provider, end to end: a real ``llama stack run`` serving the config that
``kubetune llama-stack config`` writes, driven by the official ``llama-stack-client`` as a llama-stack user would
(register a dataset from a local JSONL, fine-tune, poll, read the checkpoints, cancel), once on the local backend and
once as a KFP local pipeline (the seed's own flow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from llama_stack_client import BadRequestError, LlamaStackClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ folder: shared helpers
from _support.llama_stack import LlamaStack, capitals, wait_status  # noqa: E402

pytestmark = pytest.mark.slow

LORA = {"type": "LoRA", "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
        "apply_lora_to_output": False, "rank": 8, "alpha": 16}


def _training(steps: int, *, validation: str | None = "caps-valid") -> dict:
    return {"n_epochs": 1, "max_steps_per_epoch": steps, "max_validation_steps": 2, "dtype": "bf16",
            "data_config": {"dataset_id": "caps", "batch_size": 8, "shuffle": True, "data_format": "dialog",
                            **({"validation_dataset_id": validation} if validation else {})},
            "optimizer_config": {"optimizer_type": "adamw", "lr": 3e-3, "weight_decay": 0.0, "num_warmup_steps": 0}}


@pytest.fixture(params=["local", "kfp"])
def stack(request, tmp_path):
    args = ["--backend", "kfp", "--mode", "local"] if request.param == "kfp" else []
    server = LlamaStack(tmp_path, *args).start(env={"KUBECONFIG": str(tmp_path / "no-kubeconfig")})
    yield request.param, server
    server.stop()


def test_fine_tune_poll_artifacts_and_cancel_through_llama_stack(stack):
    backend, server = stack
    client = LlamaStackClient(base_url=server.url)
    client.datasets.register(purpose="post-training/messages", source={"type": "rows", "rows": capitals(96)}, dataset_id="caps")
    client.datasets.register(purpose="post-training/messages", source={"type": "rows", "rows": capitals(32, skip=200)}, dataset_id="caps-valid")

    job = client.post_training.supervised_fine_tune(job_uuid="ft-1", model="tiny-chat", training_config=_training(4), algorithm_config=LORA,
                                                    hyperparam_search_config={}, logger_config={})
    assert job.job_uuid == "ft-1"
    st = wait_status(client, "ft-1", {"completed"})
    assert st.started_at and st.completed_at and st.completed_at >= st.started_at
    assert st.resources_allocated["backend"] == backend and st.resources_allocated["step"] == 4

    arts = client.post_training.job.artifacts(job_uuid="ft-1")
    names = [c["identifier"] for c in arts.checkpoints]
    assert names[-1] == "ft-1/final" and "ft-1/checkpoint-4" in names
    final = arts.checkpoints[-1]
    assert Path(final["path"]).is_dir() and (Path(final["path"]) / "adapter_config.json").is_file()
    metrics = next(c for c in arts.checkpoints if c["identifier"] == "ft-1/checkpoint-4")["training_metrics"]
    assert metrics["epoch"] == 1 and metrics["validation_loss"] > 0 and metrics["train_loss"] > 0  # 16 validation rows: 2 steps x 8

    # a long job, cancelled while it trains
    client.post_training.supervised_fine_tune(job_uuid="ft-2", model="tiny-chat", training_config=_training(5000, validation=None),
                                              algorithm_config=LORA, hyperparam_search_config={}, logger_config={})
    wait_status(client, "ft-2", {"in_progress"})
    client.post_training.job.cancel(job_uuid="ft-2")
    assert wait_status(client, "ft-2", {"cancelled"}, timeout=120).status == "cancelled"
    assert [j.job_uuid for j in client.post_training.job.list()] == ["ft-1", "ft-2"]

    # what kubetune cannot do is refused with a message naming the field
    with pytest.raises(BadRequestError, match="QAT"):
        client.post_training.supervised_fine_tune(job_uuid="ft-3", model="tiny-chat", training_config=_training(2),
                                                  algorithm_config={"type": "QAT", "quantizer_name": "int8", "group_size": 32},
                                                  hyperparam_search_config={}, logger_config={})
    with pytest.raises(BadRequestError, match="ft-1.*exists already"):
        client.post_training.supervised_fine_tune(job_uuid="ft-1", model="tiny-chat", training_config=_training(2), algorithm_config=LORA,
                                                  hyperparam_search_config={}, logger_config={})
