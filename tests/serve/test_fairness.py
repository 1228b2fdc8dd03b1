"""One client cannot starve the others: the engine shares its batch fairly between requests (issue 14).

Big requests (many choices, long completions) used to fill the batch and the queue in arrival order, so a
short request sent after them waited for all their sequences: minutes. Now every request gets its share
of the batch (round-robin across requests, rows of over-served requests preempted and resumed later), so
a short request is answered in about the time it takes alone, while the big ones keep running.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from .conftest import start_server

HI = [{"role": "user", "content": "Hi"}]  # the tiny model never ends this reply early: every choice runs to max_tokens
SHORT_BOUND_S = 20.0  # the short request's latency bound; the old FIFO engine needed well over 60 s here


@pytest.fixture(scope="module")
def small_batch_server(tiny_model):
    """The base model with a 4-row batch: a few big requests saturate it."""
    s = start_server("builtin://tiny-chat", max_batch_size=4)
    yield s
    s.close()


async def _wait_saturated(engine, waiting: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (engine.running == engine.max_batch_size and engine.waiting >= waiting):
        assert time.monotonic() < deadline, f"the big requests never filled the batch (running {engine.running}, waiting {engine.waiting})"
        await asyncio.sleep(0.05)


async def _short_request_under_load(server, *, big: int, n: int, endpoint: str, stream: bool) -> tuple[float, str | None, int]:
    """Start ``big`` requests of ``n`` x 1900 tokens, then time one 8-token request; the big ones are abandoned after."""
    engine = server.app.state.server.loaded.engine
    aclient = server.async_client()
    hogs = [
        asyncio.create_task(aclient.chat.completions.create(model="tiny-chat", messages=HI, n=n, max_tokens=1900, temperature=0))
        for _ in range(big)
    ]
    try:
        await _wait_saturated(engine, waiting=big * n - engine.max_batch_size)
        started = time.monotonic()
        if endpoint == "chat":
            call = aclient.chat.completions.create(model="tiny-chat", messages=HI, max_tokens=8, temperature=0, stream=stream)
        else:
            call = aclient.completions.create(model="tiny-chat", prompt="The capital of France is", max_tokens=8, temperature=0, stream=stream)

        async def run() -> tuple[str | None, int]:
            if not stream:
                r = await call
                return r.choices[0].finish_reason, r.usage.completion_tokens
            reason, pieces = None, 0
            async for chunk in await call:
                for c in chunk.choices:
                    pieces += bool(getattr(c, "delta", None) and c.delta.content) or bool(getattr(c, "text", None))
                    reason = c.finish_reason or reason
            return reason, pieces

        try:
            reason, tokens = await asyncio.wait_for(run(), timeout=SHORT_BOUND_S)
        except asyncio.TimeoutError:
            pytest.fail(f"an 8-token request sent after {big} requests of n={n} x 1900 tokens got no answer in {SHORT_BOUND_S:.0f} s: starved")
        return time.monotonic() - started, reason, tokens
    finally:
        for t in hogs:
            t.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
        await aclient.close()
        deadline = time.monotonic() + 30
        while engine.running or engine.waiting:  # the abandoned big requests are cancelled, not generated to the end
            assert time.monotonic() < deadline, "the abandoned requests still hold the engine"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "big, n, endpoint, stream",
    [
        (4, 4, "chat", False),  # as many big requests as batch rows: each holds one row, the short one gets a time slice
        (2, 8, "chat", True),  # fewer big requests than rows: each holds two, one of theirs makes room at once
        (3, 16, "completions", False),
        (3, 16, "completions", True),
    ],
)
def test_a_short_request_is_answered_while_big_requests_fill_the_batch(small_batch_server, big, n, endpoint, stream):
    latency, reason, tokens = asyncio.run(_short_request_under_load(small_batch_server, big=big, n=n, endpoint=endpoint, stream=stream))
    assert reason == "length" and tokens >= 1, "the short request got its whole answer"
    assert latency < SHORT_BOUND_S
