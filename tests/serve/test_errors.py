"""Every error the server answers has OpenAI's body {"error": {"message", "type", "param", "code"}} and the
status the openai client maps to its exception classes."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY

CHAT = [{"role": "user", "content": "hi"}]


def _body(e: openai.APIStatusError) -> dict:
    body = e.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_unknown_model_is_404_naming_the_models(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=CHAT)
    err = _body(e.value)
    assert err["code"] == "model_not_found" and err["param"] == "model" and err["type"] == "invalid_request_error"
    assert "gpt-4" in err["message"] and "capitals-bot" in err["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "beta"}, "messages"),
        ({"messages": CHAT}, "model"),
        ({"model": "beta", "messages": []}, "messages"),
        ({"model": "beta", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "beta", "messages": CHAT, "temperature": 3}, "temperature"),
        ({"model": "beta", "messages": CHAT, "top_p": 0}, "top_p"),
        ({"model": "beta", "messages": CHAT, "max_tokens": 0}, "max_tokens"),
        ({"model": "beta", "messages": CHAT, "max_tokens": "many"}, "max_tokens"),
        ({"model": "beta", "messages": CHAT, "stop": ""}, "stop"),
        ({"model": "beta", "messages": CHAT, "n": 100}, "n"),
        ({"model": "beta", "messages": CHAT, "seed": "x"}, "seed"),
        ({"model": "beta", "messages": CHAT, "logprobs": True}, "logprobs"),
        ({"model": "beta", "messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"model": "beta", "messages": [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                                         {"role": "tool", "tool_call_id": "c", "content": "1"}]}, "messages[1].tool_calls"),
    ],
)
def test_invalid_chat_body_is_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert param in err["message"] or param.split("[")[0] in err["message"] or "supported" in err["message"]


def test_invalid_completion_body_is_400(server):
    for body, param in [
        ({"model": "beta"}, "prompt"),
        ({"model": "beta", "prompt": {"text": "x"}}, "prompt"),
        ({"model": "beta", "prompt": [10**9]}, "prompt"),
        ({"model": "beta", "prompt": ""}, "prompt"),
    ]:
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, r.text


def test_malformed_json_is_400(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


def test_openai_client_raises_bad_request_with_param(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="beta", messages=[{"role": "robot", "content": "x"}])
    assert e.value.param == "messages[0].role"


def test_prompt_too_long_is_400_context_length_exceeded(server):
    client = server.client()  # the server runs with max_model_len=512
    long = "capital " * 600
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="beta", messages=[{"role": "user", "content": long}])
    err = _body(e.value)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "512" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="beta", prompt=long)
    assert _body(e.value)["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as e:  # a short prompt, but the completion cannot fit
        client.chat.completions.create(model="beta", messages=CHAT, max_tokens=1000)
    assert _body(e.value)["code"] == "context_length_exceeded" and _body(e.value)["param"] == "max_tokens"


def test_unknown_route_and_method_use_the_error_body(server):
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(f"{server.url}/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_api_key_missing_or_wrong_is_401(keyed_server):
    with pytest.raises(openai.AuthenticationError) as e:
        keyed_server.client(api_key="wrong").models.list()
    assert _body(e.value)["code"] == "invalid_api_key"
    r = httpx.post(f"{keyed_server.url}/v1/chat/completions", json={"model": "tiny-chat", "messages": CHAT})
    assert r.status_code == 401 and "Missing API key" in r.json()["error"]["message"]
    r = httpx.get(f"{keyed_server.url}/v1/models", headers={"Authorization": "Basic " + API_KEY})
    assert r.status_code == 401
    ok = keyed_server.client(api_key=API_KEY)
    assert [m.id for m in ok.models.list().data] == ["tiny-chat"]
    assert ok.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=2).choices[0].finish_reason == "length"
    # health and metrics stay open for probes and scrapers
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200
    assert "kubetune_serve_requests_total" in httpx.get(f"{keyed_server.url}/metrics").text


def test_values_the_engine_cannot_take_are_400_not_a_failed_batch(server):
    """A seed beyond 64 bits used to raise inside the engine (failing every request admitted with it); stop strings
    are bounded in length (each is searched at every token)."""
    for path, body in [
        ("chat/completions", {"model": "beta", "messages": CHAT, "temperature": 1, "seed": 2**64}),
        ("completions", {"model": "beta", "prompt": "x", "temperature": 1, "seed": -(2**63) - 1}),
    ]:
        r = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "beta", "messages": CHAT, "stop": ["x" * 100_000]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    ok = server.client().chat.completions.create(model="beta", messages=CHAT, max_tokens=2, temperature=1, seed=2**63 - 1, stop=["y" * 256])
    assert ok.choices[0].finish_reason == "length"
