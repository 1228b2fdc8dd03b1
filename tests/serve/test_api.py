"""The OpenAI API as the official ``openai`` client sees it: models, chat (plain and streamed), completions,
adapter selection, sampling options, health and metrics."""

from __future__ import annotations

import httpx
import pytest

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_lists_the_run_adapter_first_then_base_and_extra_adapters(server):
    models = server.client().models.list().data
    assert [m.id for m in models] == ["capitals-bot", "tiny-chat", "beta"]
    assert all(m.object == "model" and m.owned_by == "kubetune" for m in models)
    one = server.client().models.retrieve("beta")
    assert one.id == "beta"


def test_chat_returns_assistant_message_with_usage(server):
    r = server.client().chat.completions.create(model="capitals-bot", messages=CHAT, max_tokens=12)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "capitals-bot"
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 5 and r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_streamed_chat_equals_the_plain_reply(server):
    client = server.client()
    plain = client.chat.completions.create(model="beta", messages=CHAT, max_tokens=16).choices[0].message.content
    chunks = list(client.chat.completions.create(model="beta", messages=CHAT, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1, "the reply arrives in several pieces"
    assert "".join(pieces) == plain
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_raw_sse_stream_ends_with_done(server):
    body = {"model": "beta", "messages": CHAT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_adapter_selection_changes_the_output(server):
    client = server.client()
    replies = {
        m: client.chat.completions.create(model=m, messages=CHAT, max_tokens=16, temperature=0).choices[0].message.content
        for m in ("capitals-bot", "beta", "tiny-chat")
    }
    assert len(set(replies.values())) == 3, replies
    again = client.chat.completions.create(model="capitals-bot", messages=CHAT, max_tokens=16, temperature=0).choices[0].message.content
    assert again == replies["capitals-bot"], "greedy decoding is deterministic"


def test_completions_plain_streamed_and_batched_prompts(server):
    client = server.client()
    r = client.completions.create(model="beta", prompt="The capital of France is", max_tokens=8)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="beta", prompt="The capital of France is", max_tokens=8, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    many = client.completions.create(model="beta", prompt=["The capital of France is", "Hello"], max_tokens=8)
    assert [c.index for c in many.choices] == [0, 1]
    assert many.choices[0].text == r.choices[0].text
    echo = client.completions.create(model="beta", prompt="The capital of France is", max_tokens=8, echo=True)
    assert echo.choices[0].text == "The capital of France is" + r.choices[0].text


def test_completions_accept_token_ids(server, artifacts):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(artifacts.base)("The capital of France is")["input_ids"]
    client = server.client()
    by_text = client.completions.create(model="beta", prompt="The capital of France is", max_tokens=6).choices[0].text
    by_ids = client.completions.create(model="beta", prompt=ids, max_tokens=6).choices[0].text
    assert by_ids == by_text


def test_stop_strings_cut_the_reply_before_the_stop(server):
    client = server.client()
    full = client.chat.completions.create(model="beta", messages=CHAT, max_tokens=24).choices[0].message.content
    stop = full[6:9]
    assert stop and stop in full
    cut = client.chat.completions.create(model="beta", messages=CHAT, max_tokens=24, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(stop)]
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(model="beta", messages=CHAT, max_tokens=24, stop=stop, stream=True) if c.choices
    )
    assert streamed == full[: full.index(stop)], "a stop string never leaks into the stream, not even its beginning"


def test_sampling_is_reproducible_with_a_seed_and_varies_without(server):
    client = server.client()

    def ask(**kw):
        return client.chat.completions.create(model="beta", messages=CHAT, max_tokens=16, temperature=1.5, **kw).choices[0].message.content

    assert ask(seed=7) == ask(seed=7)
    assert len({ask(seed=s) for s in range(4)}) > 1
    greedy = client.chat.completions.create(model="beta", messages=CHAT, max_tokens=16, temperature=0).choices[0].message.content
    tiny_p = client.chat.completions.create(model="beta", messages=CHAT, max_tokens=16, temperature=1.0, top_p=1e-6, seed=3).choices[0].message.content
    assert tiny_p == greedy, "top_p near 0 keeps only the most likely token"


def test_n_choices(server):
    r = server.client().chat.completions.create(model="beta", messages=CHAT, max_tokens=8, n=3, temperature=1.5, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 24


def test_reply_stops_at_end_of_turn(artifacts, tmp_path):
    """Generation ends at any EOS/end-of-turn token the model names; the token is not part of the text."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from .conftest import start_server

    tok = AutoTokenizer.from_pretrained(artifacts.base)
    newline = tok("\n", add_special_tokens=False)["input_ids"][0]  # what the untrained tiny model always says next
    model = tmp_path / "eot-model"
    shutil.copytree(artifacts.base, model)
    cfg = json.loads((model / "generation_config.json").read_text())
    cfg["eos_token_id"] = [tok.eos_token_id, newline]  # like Llama 3: end-of-text and end-of-turn
    (model / "generation_config.json").write_text(json.dumps(cfg))
    plain = start_server(str(artifacts.base))
    eot = start_server(str(model))
    try:
        before = plain.client().chat.completions.create(model=artifacts.base.name, messages=CHAT, max_tokens=5).choices[0]
        assert before.finish_reason == "length" and before.message.content == "\n" * 5
        after = eot.client().chat.completions.create(model="eot-model", messages=CHAT, max_tokens=5)
        assert after.choices[0].finish_reason == "stop"
        assert after.choices[0].message.content == ""
        assert after.usage.completion_tokens == 1
    finally:
        plain.close()
        eot.close()


def test_health_and_metrics(server):
    import re

    def metric(text: str, name: str) -> float:
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    ttft = 'kubetune_serve_time_to_first_token_seconds_count{endpoint="chat"}'
    latency = 'kubetune_serve_request_latency_seconds_count{endpoint="chat"}'
    before = httpx.get(f"{server.url}/metrics").text
    server.client().chat.completions.create(model="beta", messages=CHAT, max_tokens=3)
    list(server.client().chat.completions.create(model="beta", messages=CHAT, max_tokens=3, stream=True))
    text = httpx.get(f"{server.url}/metrics").text
    assert 'kubetune_serve_requests_total{endpoint="chat",model="beta",status="200"}' in text
    assert 'kubetune_serve_completion_tokens_total{model="beta"}' in text
    assert "kubetune_serve_request_latency_seconds_bucket" in text
    assert metric(text, latency) == metric(before, latency) + 2
    assert metric(text, ttft) == metric(before, ttft) + 1, "time to first token is measured on streams only"
    assert "kubetune_serve_requests_running" in text
