"""Concurrent requests are batched together, and each still gets exactly its own answer."""

from __future__ import annotations

import asyncio
import re
import time

import httpx

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
