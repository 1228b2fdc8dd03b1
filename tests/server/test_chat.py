"""Chat completions with fine-tuned models on the jobs service: LoRA fine-tunes of one base are answered by one
engine holding all their adapters (batched together, as ``kubetune serve BASE --adapter ...`` does), each
answering with its own weights; the base model shares that engine."""

from __future__ import annotations

import time

import pytest

from kubetune.server.config import ServerConfig
from kubetune.server.store import Store

pytestmark = pytest.mark.slow


def _run(tmp_path, tiny_model, name: str, seed: int):
    from serve.conftest import make_adapter, make_run  # tests/ is on sys.path (rootdir conftest import)

    adapter = make_adapter(tiny_model, tmp_path / f"adapter-{name}", seed=seed)
    return make_run(tmp_path / "runs" / name, adapter, name=name)


def test_fine_tunes_of_one_base_share_its_engine(tmp_path, tiny_model):
    from fastapi.testclient import TestClient

    from kubetune.server.app import create_app

    store = Store(f"sqlite:///{tmp_path / 'server.db'}")
    key, _ = store.create_key("alpha")
    project = store.authenticate(key)
    names = {}
    for name, seed in (("one", 1), ("two", 2)):
        run = _run(tmp_path, tiny_model, name, seed)
        names[name] = f"ft:tiny-chat:{name}:{seed}"
        store.add_job(id=f"ftjob-{name}", project_id=project["id"], kind="openai", model="tiny-chat", hyperparameters={}, method={}, spec={},
                      status="succeeded", backend="local", fine_tuned_model=names[name], run_dir=str(run), finished_at=time.time())
    app = create_app(ServerConfig(data_dir=tmp_path / "data"), store)
    headers = {"Authorization": f"Bearer {key}"}
    ask = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12, "temperature": 0}
    with TestClient(app) as http:
        replies = {}
        for model in (names["one"], names["two"], "tiny-chat", names["one"]):
            r = http.post("/v1/chat/completions", json={**ask, "model": model}, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
            replies.setdefault(model, []).append(r.json()["choices"][0]["message"]["content"])
        chat = app.state.chat
        assert len(chat._groups) == 1  # one engine: the base, with both adapters
        plan = next(iter(chat._groups.values()))["server"].plan
        assert {a.name for a in plan.adapters} == {names["one"], names["two"]} and plan.model_name == "tiny-chat"
        assert replies[names["one"]][0] == replies[names["one"]][1]  # the same weights after the engine was rebuilt
        assert len({replies[names["one"]][0], replies[names["two"]][0], replies["tiny-chat"][0]}) == 3  # each its own
        missing = http.post("/v1/chat/completions", json={**ask, "model": "ft:tiny-chat:nope:1"}, headers=headers)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    store.close()

