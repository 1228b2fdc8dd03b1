"""The batching engine on its own: stop strings and partial characters in streams, failures, shutdown."""

from __future__ import annotations

import threading

import pytest

from kubetune.serve.engine import EngineRequest, SamplingParams, _find_stop, _holdback, load_engine
from kubetune.serve.options import ServeOptions
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
