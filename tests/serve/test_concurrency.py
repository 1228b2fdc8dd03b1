"""Concurrent requests are batched together, and each still gets exactly its own answer."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

PROMPTS = [
    "What is the capital of France?",
    "Hi",
    "Tell me about the capital of Japan and its people, please.",
    "Name a country in Africa.",
    "Which city is the capital of Peru?",
    "Say something nice.",
    "What is the capital of Canada?",
    "Where is Addis Ababa?",
]
MODELS = ["capitals-bot", "beta", "tiny-chat"]


def _requests() -> list[dict]:
    """16 different requests: several prompts, three models (two adapters and the base), several lengths."""
    out = []
    for i in range(16):
        out.append(
            {
                "model": MODELS[i % 3],
                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + (" Thanks!" if i >= 8 else "")}],
                "max_tokens": 10 + (i % 4) * 5,
                "temperature": 0,
            }
        )
    return out


def test_16_simultaneous_requests_are_batched_and_independent(server):
    engine = server.app.state.server.loaded.engine
    reqs = _requests()
    client = server.client()
    alone = []
    for body in reqs:  # one at a time: the reference answers
        r = client.chat.completions.create(**body)
        alone.append((r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason))
    assert len({a[0] for a in alone}) >= 8, "the requests are different enough to catch mixed-up answers"

    async def all_at_once():
        aclient = server.async_client()
        try:
            return await asyncio.gather(*[aclient.chat.completions.create(**body) for body in reqs])
        finally:
            await aclient.close()

    together = asyncio.run(all_at_once())
    for body, want, got in zip(reqs, alone, together):
        assert got.model == body["model"]
        assert (got.choices[0].message.content, got.usage.completion_tokens, got.choices[0].finish_reason) == want, body
    assert engine.max_rows_seen >= 8, f"concurrent requests share forward passes (largest batch: {engine.max_rows_seen})"
    metrics = httpx.get(f"{server.url}/metrics").text
    count = float(re.search(r"^kubetune_serve_batch_size_count (\S+)$", metrics, re.M).group(1))
    total = float(re.search(r"^kubetune_serve_batch_size_sum (\S+)$", metrics, re.M).group(1))
    assert total / count > 1.0, "forward passes carried several requests on average"


def test_16_simultaneous_streams_get_their_own_tokens(server):
    reqs = _requests()
    client = server.client()
    alone = [client.chat.completions.create(**b).choices[0].message.content for b in reqs]

    async def stream(aclient, body):
        text = ""
        async for chunk in await aclient.chat.completions.create(stream=True, **body):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        return text

    async def all_at_once():
        aclient = server.async_client()
        try:
            return await asyncio.gather(*[stream(aclient, b) for b in reqs])
        finally:
            await aclient.close()

    assert asyncio.run(all_at_once()) == alone


def test_a_client_that_goes_away_frees_its_place(server):
    """Closing a stream early cancels its generation; the server keeps answering others."""
    engine = server.app.state.server.loaded.engine
    cancelled = engine.cancelled_count
    body = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break
    for _ in range(400):
        if engine.cancelled_count > cancelled and engine.running == 0:
            break
        time.sleep(0.05)
    assert engine.cancelled_count == cancelled + 1, "the abandoned request was cancelled, not generated to the end"
    assert engine.running == 0
    r = server.client().chat.completions.create(model="beta", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.choices[0].finish_reason == "length"


def test_a_plain_request_whose_client_gives_up_is_cancelled(server):
    """A non-streaming client that times out (the openai client then retries) stops its generation too."""
    engine = server.app.state.server.loaded.engine
    cancelled = engine.cancelled_count
    body = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 480}  # seconds of work
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=0.2))
    for _ in range(200):
        if engine.cancelled_count > cancelled and engine.running == 0:
            break
        time.sleep(0.05)
    assert engine.cancelled_count == cancelled + 1, "the abandoned request was cancelled, not generated to the end"
    assert engine.running == 0 and time.monotonic() - started < 8
    r = server.client().chat.completions.create(model="beta", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.choices[0].finish_reason == "length"


def test_adapters_with_and_without_saved_modules_share_a_batch(artifacts, tmp_path):
    """An adapter trained with modules_to_save (the quickstart saves embed_tokens), a plain LoRA adapter and the
    base model are decoded in the same forward passes, each row with its own weights: the replies equal
    transformers generate with that adapter alone. (PEFT's mixed-adapter forward alone fails with KeyError.)"""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .conftest import make_adapter, start_server

    saved = make_adapter(artifacts.base, tmp_path / "saved", seed=3, modules_to_save=["embed_tokens"])
    models = {"saved": saved, "beta": artifacts.beta, "tiny-chat": None}
    reqs = [{"model": m, "messages": [{"role": "user", "content": p}], "max_tokens": 12, "temperature": 0} for m in models for p in PROMPTS[:3]]
    tok = AutoTokenizer.from_pretrained(artifacts.base)
    want = []
    for body in reqs:
        model = AutoModelForCausalLM.from_pretrained(artifacts.base, dtype=torch.float32)
        if models[body["model"]] is not None:
            model = PeftModel.from_pretrained(model, models[body["model"]])
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.inference_mode():
            out = model.eval().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        want.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    assert len(set(want)) >= 6, "the three models answer differently"

    s = start_server("builtin://tiny-chat", {"saved": str(saved), "beta": str(artifacts.beta)})
    try:

        async def all_at_once():
            aclient = s.async_client()
            try:
                return await asyncio.gather(*[aclient.chat.completions.create(**body) for body in reqs])
            finally:
                await aclient.close()

        got = [r.choices[0].message.content for r in asyncio.run(all_at_once())]
        assert got == want
        assert s.app.state.server.loaded.engine.max_rows_seen >= 3, "the models shared forward passes"
    finally:
        s.close()
