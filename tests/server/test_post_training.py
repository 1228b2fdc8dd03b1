"""llama-stack's post-training routes on kubetune server, driven by the official ``llama-stack-client`` with no
llama-stack server in between; and ``remote::kubetune``: a real ``llama stack run`` forwarding to this server."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import httpx
import pytest
from llama_stack_client import AuthenticationError, BadRequestError, LlamaStackClient, NotFoundError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ folder: shared helpers
from _support.llama_stack import LlamaStack, capitals, wait_status  # noqa: E402

pytestmark = pytest.mark.slow

LORA = {"type": "LoRA", "lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": True, "apply_lora_to_output": False, "rank": 8, "alpha": 16}


@pytest.fixture
def db_url(tmp_path):
    """SQLite only: the routes use the store like every other route (the lifecycle tests cover PostgreSQL)."""
    return f"sqlite:///{tmp_path / 'server.db'}"


def _training(steps: int, dataset: str = "caps", validation: str | None = None) -> dict:
    return {"n_epochs": 1, "max_steps_per_epoch": steps, "max_validation_steps": 2,
            "data_config": {"dataset_id": dataset, "batch_size": 8, "shuffle": True, "data_format": "dialog",
                            **({"validation_dataset_id": validation} if validation else {})},
            "optimizer_config": {"optimizer_type": "adamw", "lr": 3e-3, "weight_decay": 0.0, "num_warmup_steps": 0}}


def test_llama_stack_client_drives_kubetune_server(make_server):
    server = make_server().start()
    key, other = server.key("team-a"), server.key("team-b")
    base = server.url.removesuffix("/v1")
    client = LlamaStackClient(base_url=base, api_key=key)

    client.datasets.register(purpose="post-training/messages", source={"type": "rows", "rows": capitals(96)}, dataset_id="caps")
    jsonl = "".join(json.dumps(r) + "\n" for r in capitals(32, skip=200)).encode()
    client.datasets.register(purpose="post-training/messages", dataset_id="caps-valid",
                             source={"type": "uri", "uri": "data:application/jsonl;base64," + base64.b64encode(jsonl).decode()})
    assert {d.identifier for d in client.datasets.list()} == {"caps", "caps-valid"}
    page = client.datasets.iterrows(dataset_id="caps-valid", start_index=30, limit=5)
    assert len(page.data) == 2 and page.has_more is False

    client.post_training.supervised_fine_tune(job_uuid="ft-1", model="tiny-chat", training_config=_training(4, validation="caps-valid"),
                                              algorithm_config=LORA, hyperparam_search_config={}, logger_config={})
    st = wait_status(client, "ft-1", {"completed"})
    assert st.started_at and st.completed_at and st.resources_allocated["backend"] == "local"
    arts = client.post_training.job.artifacts(job_uuid="ft-1")
    assert [c["identifier"] for c in arts.checkpoints][-1] == "ft-1/final"
    assert (Path(arts.checkpoints[-1]["path"]) / "adapter_config.json").is_file()
    assert arts.checkpoints[-1]["training_metrics"]["validation_loss"] > 0
    # the same job through llama-stack 0.3-0.6's paths, and as a native job
    alpha = httpx.get(f"{base}/v1alpha/post-training/job/status", params={"job_uuid": "ft-1"}, headers={"Authorization": f"Bearer {key}"})
    assert alpha.status_code == 200 and alpha.json()["status"] == "completed"
    native = httpx.get(f"{server.url}/jobs/ft-1", headers={"Authorization": f"Bearer {key}"}).json()
    assert native["kind"] == "llama_stack" and native["status"] == "succeeded"

    client.post_training.supervised_fine_tune(job_uuid="ft-2", model="tiny-chat", training_config=_training(5000), algorithm_config=LORA,
                                              hyperparam_search_config={}, logger_config={})
    wait_status(client, "ft-2", {"in_progress"})
    client.post_training.job.cancel(job_uuid="ft-2")
    assert wait_status(client, "ft-2", {"cancelled"}, timeout=60).status == "cancelled"
    assert [j.job_uuid for j in client.post_training.job.list()] == ["ft-1", "ft-2"]

    with pytest.raises(BadRequestError, match="'gpt-9' is not a model of this server; available: tiny-chat"):
        client.post_training.supervised_fine_tune(job_uuid="ft-3", model="gpt-9", training_config=_training(2), hyperparam_search_config={}, logger_config={})
    with pytest.raises(BadRequestError, match="QAT"):
        client.post_training.supervised_fine_tune(job_uuid="ft-3", model="tiny-chat", training_config=_training(2),
                                                  algorithm_config={"type": "QAT", "quantizer_name": "x", "group_size": 8},
                                                  hyperparam_search_config={}, logger_config={})
    with pytest.raises(BadRequestError, match="dataset_id: No such dataset: 'nope'"):
        client.post_training.supervised_fine_tune(job_uuid="ft-3", model="tiny-chat", training_config=_training(2, dataset="nope"),
                                                  hyperparam_search_config={}, logger_config={})
    with pytest.raises(BadRequestError, match="fetches no URI for a client"):
        client.datasets.register(purpose="post-training/messages", source={"type": "uri", "uri": "http://169.254.169.254/x.jsonl"})
    with pytest.raises(AuthenticationError):
        LlamaStackClient(base_url=base, api_key="kt-wrong").post_training.job.list()
    with pytest.raises(NotFoundError):  # another project's job is not there
        LlamaStackClient(base_url=base, api_key=other).post_training.job.status(job_uuid="ft-1")


def test_remote_provider_forwards_a_llama_stack_server_to_kubetune_server(make_server, tmp_path):
    server = make_server().start()
    key = server.key("team-a")
    stack = LlamaStack(tmp_path / "ls", "--provider", "remote", "--url", server.url.removesuffix("/v1"))
    assert key not in stack.config.read_text()  # the key is referenced from the environment, never written
    stack.start(env={"KUBETUNE_API_KEY": key})
    try:
        client = LlamaStackClient(base_url=stack.url)  # llama-stack's own datasets: rows kept by its localfs provider
        client.datasets.register(purpose="post-training/messages", source={"type": "rows", "rows": capitals(64)}, dataset_id="caps")
        client.post_training.supervised_fine_tune(job_uuid="rt-1", model="tiny-chat", training_config=_training(3), algorithm_config=LORA,
                                                  hyperparam_search_config={}, logger_config={})
        assert wait_status(client, "rt-1", {"completed"}).resources_allocated["backend"] == "local"
        assert [c["identifier"] for c in client.post_training.job.artifacts(job_uuid="rt-1").checkpoints][-1] == "rt-1/final"
        client.post_training.supervised_fine_tune(job_uuid="rt-2", model="tiny-chat", training_config=_training(5000), algorithm_config=LORA,
                                                  hyperparam_search_config={}, logger_config={})
        wait_status(client, "rt-2", {"in_progress"})
        client.post_training.job.cancel(job_uuid="rt-2")
        assert wait_status(client, "rt-2", {"cancelled"}, timeout=60).status == "cancelled"
        # the job is the server's: its own client sees it, with the rows the provider uploaded
        direct = LlamaStackClient(base_url=server.url.removesuffix("/v1"), api_key=key)
        assert [j.job_uuid for j in direct.post_training.job.list()] == ["rt-1", "rt-2"]
        assert len(direct.datasets.iterrows(dataset_id="rt-1-train").data) == 64
    finally:
        stack.stop()


def test_preference_optimize_is_a_dpo_job(make_server):
    server = make_server().start()
    key = server.key("team-a")
    client = LlamaStackClient(base_url=server.url.removesuffix("/v1"), api_key=key)
    rows = [{"prompt": f"What is the capital of {r['messages'][0]['content'].split()[-1].rstrip('?')}?",
             "chosen": r["messages"][1]["content"], "rejected": "I do not know."} for r in capitals(48)]
    client.datasets.register(purpose="post-training/messages", source={"type": "rows", "rows": rows}, dataset_id="prefs")
    client.post_training.preference_optimize(job_uuid="po-1", finetuned_model="tiny-chat", training_config=_training(2, dataset="prefs"),
                                             algorithm_config={"reward_scale": 1.0, "reward_clip": 5.0, "epsilon": 0.1, "gamma": 0.99},
                                             hyperparam_search_config={}, logger_config={})
    assert wait_status(client, "po-1", {"completed"}).status == "completed"
    native = httpx.get(f"{server.url}/jobs/po-1", headers={"Authorization": f"Bearer {key}"}).json()
    assert native["kind"] == "llama_stack"
    events = httpx.get(f"{server.url}/jobs/po-1/events", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    assert any("reward_scale: TRL's DPO loss has no such setting" in e["message"] for e in events)  # said, not silently dropped
    result = json.loads((Path(server.data) / "runs" / "po-1" / "result.json").read_text())
    assert result["objective"] == "dpo"
