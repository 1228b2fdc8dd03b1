"""The batching engine on its own: stop strings and partial characters in streams, failures, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from kubetune.serve.engine import EngineRequest, SamplingParams
from kubetune.serve.loading import load_engine
from kubetune.serve.options import ServeOptions
from kubetune.serve.sampling import _find_stop, _holdback
from kubetune.serve.sources import resolve_sources


def test_holdback_keeps_partial_characters_and_stop_prefixes():
    assert _holdback("hello", ()) == 0
    assert _holdback("caf\ufffd", ()) == 1  # half of a UTF-8 character: wait for the rest
    assert _holdback("hello wor", ("world",)) == 3
    assert _holdback("hello w", ("world", "xyz")) == 1
    assert _holdback("hello", ("world",)) == 0
    assert _find_stop("abc STOP def", ("STOP", "c S"), 0) == 2
    assert _find_stop("abc", ("x",), 0) is None


@pytest.fixture(scope="module")
def engine(artifacts):
    loaded = load_engine(resolve_sources("builtin://tiny-chat", {"a": str(artifacts.alpha)}), ServeOptions())
    loaded.engine.start()
    yield loaded
    loaded.engine.shutdown()


def _run(engine, reqs: list[EngineRequest]) -> list[list]:
    outs: list[list] = [[] for _ in reqs]
    done = threading.Semaphore(0)
    for i, r in enumerate(reqs):
        def sink(o, i=i):
            outs[i].append(o)
            if o.finish_reason:
                done.release()

        r.on_output = sink
        engine.submit(r)
    for _ in reqs:
        assert done.acquire(timeout=120)
    return outs


def _ids(loaded, text: str) -> list[int]:
    return loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True)["input_ids"]


def test_greedy_output_equals_transformers_generate(engine):
    """The engine's own decode loop (KV cache, batching, streaming deltas) gives generate()'s tokens."""
    import torch

    ids = _ids(engine, "What is the capital of France?")
    (out,) = _run(engine.engine, [EngineRequest(ids, SamplingParams(max_tokens=16), None, adapter="a")])
    assert out[-1].finish_reason == "length" and out[-1].completion_tokens == 16
    with torch.inference_mode():
        ref = engine.engine.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=16, do_sample=False, adapter_names=["a"])
    assert "".join(o.text for o in out) == engine.tokenizer.decode(ref[0, len(ids) :], skip_special_tokens=True)


def test_the_kv_cache_goes_under_the_name_the_model_takes(engine):
    """transformers 5 renamed the forward's past_key_values to cache, and warns at every call that uses the old name
    (a FutureWarning per call site, a log line): the engine uses the name the loaded model declares."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (out,) = _run(engine.engine, [EngineRequest(_ids(engine, "Hi"), SamplingParams(max_tokens=6), None, adapter="a")])
    assert out[-1].finish_reason == "length"
    assert [str(w.message) for w in seen if "past_key_values" in str(w.message)] == []


def test_a_failing_batch_fails_its_requests_and_the_engine_keeps_serving(engine):
    bad = EngineRequest([10**7], SamplingParams(max_tokens=3), None)  # no such token: the forward pass raises
    (out,) = _run(engine.engine, [bad])
    assert out[-1].finish_reason == "error" and out[-1].error
    (ok,) = _run(engine.engine, [EngineRequest(_ids(engine, "Hi"), SamplingParams(max_tokens=3), None)])
    assert ok[-1].finish_reason == "length"
    assert engine.engine.alive


def test_cancelled_before_it_starts(engine):
    req = EngineRequest(_ids(engine, "Hi"), SamplingParams(max_tokens=3), None)
    req.cancel()
    (out,) = _run(engine.engine, [req])
    assert [o.finish_reason for o in out] == ["cancelled"]


def test_shutdown_answers_everyone(artifacts):
    loaded = load_engine(resolve_sources("builtin://tiny-chat"), ServeOptions())
    loaded.engine.shutdown()
    outs = []
    loaded.engine.submit(EngineRequest([1, 2, 3], SamplingParams(max_tokens=3), outs.append))
    assert outs[0].finish_reason == "error" and "shutting down" in outs[0].error


# --- sharing the batch between requests (issue 14: one client must not starve the others) ---------------
@pytest.fixture(scope="module")
def small_engine(tiny_model):
    """The base model with room for two rows: preemption is easy to provoke."""
    loaded = load_engine(resolve_sources("builtin://tiny-chat"), ServeOptions(max_batch_size=2))
    loaded.engine.start()
    yield loaded
    loaded.engine.shutdown()


def _collect(engine, reqs: list[EngineRequest], finished: list | None = None) -> tuple[list[list], threading.Semaphore]:
    """Submit ``reqs``; their outputs are gathered; the semaphore is released once per finished request."""
    outs: list[list] = [[] for _ in reqs]
    done = threading.Semaphore(0)
    for i, r in enumerate(reqs):
        def sink(o, i=i):
            outs[i].append(o)
            if o.finish_reason:
                if finished is not None:
                    finished.append(reqs[i])
                done.release()

        r.on_output = sink
        engine.submit(r)
    return outs, done


def _text(out: list) -> str:
    return "".join(o.text for o in out)


def test_a_preempted_request_goes_on_exactly_where_it_stopped(small_engine):
    """Two choices of one request fill the batch; another request takes one of their rows. The preempted row is
    resumed later (prompt and generated tokens prefilled again, sampler kept) and ends with the reply it gets
    alone: greedy and seeded sampling, streamed."""
    eng = small_engine.engine
    ids = _ids(small_engine, "What is the capital of France?")
    params = [SamplingParams(max_tokens=60), SamplingParams(max_tokens=60, temperature=0.9, seed=7)]

    def pair(group: object) -> list[EngineRequest]:
        return [EngineRequest(ids, p, None, group=group) for p in params]

    alone_outs, done = _collect(eng, pair(object()))
    for _ in range(2):
        assert done.acquire(timeout=120)
    alone = [_text(o) for o in alone_outs]
    assert all(o[-1].completion_tokens == 60 for o in alone_outs)

    before = eng.preempted_count
    big = object()
    outs, done = _collect(eng, pair(big))
    while not any(o for o in outs):  # both rows are decoding
        time.sleep(0.01)
    short, short_done = _collect(eng, [EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=5), None)])
    assert short_done.acquire(timeout=60) and short[0][-1].finish_reason == "length"
    for _ in range(2):
        assert done.acquire(timeout=120)
    assert eng.preempted_count == before + 1, "the newcomer took one row of the request holding both"
    assert [_text(o) for o in outs] == alone
    assert [o[-1].completion_tokens for o in outs] == [60, 60]


def test_rows_are_shared_between_requests_not_handed_out_in_arrival_order(small_engine):
    """A request with 6 long sequences arrives first; a request with 2 short ones after it is finished long before
    the first request's sequences (FIFO would have made it wait for all six)."""
    eng = small_engine.engine
    finished: list[EngineRequest] = []
    big = [EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=150), None, group="big") for _ in range(6)]
    _, big_done = _collect(eng, big, finished)
    deadline = time.monotonic() + 30
    while eng.running < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    small = [EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=4), None, group="small") for _ in range(2)]
    _, small_done = _collect(eng, small, finished)
    for _ in range(2):
        assert small_done.acquire(timeout=60)
    for _ in range(6):
        assert big_done.acquire(timeout=300)
    assert {id(r) for r in finished[:2]} == {id(r) for r in small}, "the short request finished first"


def test_a_waiting_request_whose_client_goes_away_is_answered_at_once(small_engine):
    """A request waiting for a place (the batch is full) that is cancelled leaves now, not when a row frees up."""
    eng = small_engine.engine
    hogs = [EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=1900), None, group="hog") for _ in range(2)]
    _, hogs_done = _collect(eng, hogs)
    deadline = time.monotonic() + 30
    while eng.running < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    req = EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=1900), None, group="hog")  # its group holds rows: it waits
    outs, done = _collect(eng, [req])
    time.sleep(0.3)
    assert eng.waiting == 1 and not outs[0]
    started = time.monotonic()
    req.cancel()
    assert done.acquire(timeout=10) and outs[0][-1].finish_reason == "cancelled"
    while eng.waiting:  # the engine counts it out right after answering it
        assert time.monotonic() - started < 10
        time.sleep(0.01)
    for r in hogs:
        r.cancel()
    for _ in hogs:
        assert hogs_done.acquire(timeout=30)


# --- one request cannot fail the others or stop the engine (issue 14) ---------------------------------------
def test_a_request_the_engine_cannot_even_set_up_fails_alone(small_engine):
    """A seed torch cannot take (the server refuses it with a 400; here it reaches the engine directly) fails that
    request only: the engine thread lives on and answers the next one."""
    eng = small_engine.engine
    bad = EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=3, temperature=1.0, seed=2**64), None)
    (out,) = _run(eng, [bad])
    assert out[-1].finish_reason == "error"
    (ok,) = _run(eng, [EngineRequest(_ids(small_engine, "Hi"), SamplingParams(max_tokens=3), None)])
    assert ok[-1].finish_reason == "length" and eng.alive


def test_a_tiny_temperature_does_not_fail_the_batch_it_shares(small_engine):
    """temperature 1e-300 turns logits / temperature into inf: sampling must not fail (it used to fail the whole
    decode step, and so every request in the batch)."""
    eng = small_engine.engine
    ids = _ids(small_engine, "What is the capital of France?")
    (alone,) = _run(eng, [EngineRequest(ids, SamplingParams(max_tokens=12), None)])
    outs = _run(eng, [EngineRequest(ids, SamplingParams(max_tokens=12), None), EngineRequest(ids, SamplingParams(max_tokens=12, temperature=1e-300, seed=1), None)])
    assert [o[-1].finish_reason for o in outs] == ["length", "length"]
    assert _text(outs[0]) == _text(alone) == _text(outs[1]), "a near-zero temperature samples the greedy token"


def test_a_request_whose_prefill_fails_does_not_take_its_fellow_newcomers_with_it(tiny_model):
    """Two requests join the batch in one prefill; one of them cannot be run (a token id outside the embedding).
    Only that one fails."""
    loaded = load_engine(resolve_sources("builtin://tiny-chat"), ServeOptions(max_batch_size=4))
    eng = loaded.engine
    good = EngineRequest(_ids(loaded, "Hi"), SamplingParams(max_tokens=4), None)
    bad = EngineRequest([10**7], SamplingParams(max_tokens=4), None)
    outs, done = _collect(eng, [good, bad])  # queued before the engine starts: they are prefilled together
    eng.start()
    try:
        for _ in range(2):
            assert done.acquire(timeout=60)
        assert outs[0][-1].finish_reason == "length" and outs[1][-1].finish_reason == "error"
        assert eng.alive
    finally:
        eng.shutdown()


def test_holdback_is_the_longest_stop_prefix_at_the_end():
    """The fast holdback agrees with the plain definition (longest suffix of the text that starts a stop string)."""
    import random

    def plain(text: str, stops: tuple[str, ...]) -> int:
        best = 0
        for s in stops:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    best = max(best, k)
                    break
        return best

    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("ab ") for _ in range(rng.randint(0, 12)))
        stops = tuple("".join(rng.choice("ab ") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3)))
        assert _holdback(text, stops) == plain(text, stops), (text, stops)
