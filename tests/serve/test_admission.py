"""Admission control (issue 14): what one request may ask for is bounded (400 naming the field and the limit),
and a saturated server says so (429 with Retry-After) instead of queueing without end. Every admitted request
gives its tokens back however it ends: answered, or its client gone (streaming or not, even before a stream
started)."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import httpx
import openai
import pytest

from .conftest import start_server

HI = [{"role": "user", "content": "Hi"}]  # 13 prompt tokens with the builtin template
PROMPT = "The capital of France is"  # 5 tokens
BUDGET = 4000  # --max-queued-tokens of the limited server: its last 500 (1/8) are kept for requests of at most 62 (1/64)
PER_REQUEST = 3000  # --max-request-tokens


@pytest.fixture(scope="module")
def limited(tiny_model):
    s = start_server(
        "builtin://tiny-chat",
        max_batch_size=4,
        max_n=4,
        max_prompts=3,
        max_request_tokens=PER_REQUEST,
        max_queued_tokens=BUDGET,
        max_request_bytes=64 * 1024,
    )
    yield s
    s.close()


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def _used(server) -> int:
    return server.app.state.server.admission.used


def _wait_used(server, want: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while _used(server) != want:
        assert time.monotonic() < deadline, f"admitted tokens stay at {_used(server)}, expected {want}"
        time.sleep(0.02)


def _wait_idle(server, timeout: float = 30.0) -> None:
    engine = server.app.state.server.loaded.engine
    deadline = time.monotonic() + timeout
    while _used(server) or engine.running or engine.waiting:
        assert time.monotonic() < deadline, f"still busy: {_used(server)} tokens admitted, {engine.running} running, {engine.waiting} waiting"
        time.sleep(0.02)


class Hog:
    """A streaming chat request holding ``n`` x (13 + max_tokens) admitted tokens until :meth:`close`."""

    def __init__(self, server, *, n: int, max_tokens: int) -> None:
        self.client = httpx.Client(timeout=120)
        body = {"model": "tiny-chat", "messages": HI, "n": n, "max_tokens": max_tokens, "stream": True}
        self.cm = self.client.stream("POST", f"{server.url}/v1/chat/completions", json=body)
        self.response = self.cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self.lines = self.response.iter_lines()
        next(self.lines)  # the stream has started: it is admitted
        self.tokens = n * (13 + max_tokens)

    def close(self) -> None:
        self.cm.__exit__(None, None, None)
        self.client.close()


# --- requests that can never be admitted: 400 ---------------------------------------------------------------
def test_more_choices_than_allowed_is_400_naming_n(limited, server):
    r = httpx.post(f"{limited.url}/v1/chat/completions", json={"model": "tiny-chat", "messages": HI, "n": 5}, timeout=60)
    err = _error(r, 400)
    assert err["param"] == "n" and "4" in err["message"] and "--max-n" in err["message"]
    r = httpx.post(f"{limited.url}/v1/completions", json={"model": "tiny-chat", "prompt": PROMPT, "n": 5, "stream": True}, timeout=60)
    assert _error(r, 400)["param"] == "n"
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "beta", "messages": HI, "n": 10**9}, timeout=60)  # the default: 16
    assert _error(r, 400)["param"] == "n" and "16" in r.json()["error"]["message"]


def test_more_prompts_than_allowed_is_400_naming_prompt(limited, server):
    with pytest.raises(openai.BadRequestError) as e:
        limited.client().completions.create(model="tiny-chat", prompt=[PROMPT] * 4, max_tokens=2)
    assert e.value.body["param"] == "prompt" and "--max-prompts" in e.value.body["message"] and "3" in e.value.body["message"]
    assert limited.client().completions.create(model="tiny-chat", prompt=[PROMPT] * 3, max_tokens=2).usage.completion_tokens == 6
    # the review's example: 1000 prompts in one request were all queued; the default limit is 64
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "beta", "prompt": [[5, 6, 7]] * 1000, "max_tokens": 1}, timeout=60)
    err = _error(r, 400)
    assert err["param"] == "prompt" and "1000 prompts" in err["message"] and "64" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_occupying_more_tokens_than_allowed_is_400_naming_the_field(limited, stream):
    client = limited.client()
    # n x (prompt + max_tokens) = 4 x 1013: n=1 would fit, so n is the field to reduce
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-chat", messages=HI, n=4, max_tokens=1000, stream=stream)
    err = e.value.body
    assert err["param"] == "n" and err["code"] == "request_too_large"
    assert "4052" in err["message"] and str(PER_REQUEST) in err["message"] and "--max-request-tokens" in err["message"]
    # 3 prompts x (5 + 1000): one prompt would fit
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-chat", prompt=[PROMPT] * 3, max_tokens=1000, stream=stream)
    assert e.value.body["param"] == "prompt" and e.value.body["code"] == "request_too_large"
    # prompt + max_tokens beyond the context stays context_length_exceeded
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=2048, stream=stream)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "max_tokens"
    assert _used(limited) == 0, "refused requests hold nothing"


def test_text_far_beyond_the_context_and_too_many_messages_are_400_before_tokenizing(server):
    huge = "a" * 200_000  # the server's context is 512 tokens; no token of its vocabulary is longer than 13 characters
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "beta", "prompt": huge}, timeout=60)
    err = _error(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt" and "200000 characters" in err["message"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "beta", "messages": [{"role": "user", "content": huge}]}, timeout=60)
    assert _error(r, 400)["param"] == "messages"
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "beta", "messages": [{"role": "user", "content": ""}] * 600}, timeout=60)
    assert _error(r, 400)["code"] == "context_length_exceeded"
    tool = {"type": "function", "function": {"name": "get_weather", "description": huge}}  # tools are rendered into the prompt too
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "beta", "messages": HI, "tools": [tool]}, timeout=60)
    assert _error(r, 400)["code"] == "context_length_exceeded"


def test_a_body_larger_than_allowed_is_413_also_without_a_length(limited):
    big = {"model": "tiny-chat", "messages": [{"role": "user", "content": "x" * 100_000}]}
    r = httpx.post(f"{limited.url}/v1/chat/completions", json=big, timeout=60)
    err = _error(r, 413)
    assert err["code"] == "request_too_large" and "--max-request-bytes" in err["message"]
    payload = httpx.Request("POST", "/", json=big).content

    def chunks():  # no Content-Length: the server counts what it reads
        for i in range(0, len(payload), 8192):
            yield payload[i : i + 8192]

    r = httpx.post(f"{limited.url}/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
    assert _error(r, 413)["code"] == "request_too_large"
    assert limited.client().chat.completions.create(model="tiny-chat", messages=HI, max_tokens=2).choices[0].finish_reason == "length"


# --- a saturated server: 429 with Retry-After ---------------------------------------------------------------
@pytest.mark.parametrize("endpoint, stream", [("chat", False), ("chat", True), ("completions", False), ("completions", True)])
def test_a_saturated_server_answers_429_with_retry_after_and_admits_again_once_freed(limited, endpoint, stream):
    _wait_idle(limited)
    hog = Hog(limited, n=2, max_tokens=1400)  # 2826 of the 3500 tokens big requests may fill
    try:
        assert _used(limited) == hog.tokens
        if endpoint == "chat":
            body = {"model": "tiny-chat", "messages": HI, "max_tokens": 1000, "stream": stream}  # 1013 more: does not fit
        else:
            body = {"model": "tiny-chat", "prompt": [PROMPT, PROMPT], "max_tokens": 500, "stream": stream}  # 1010 more
        r = httpx.post(f"{limited.url}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}", json=body, timeout=60)
        err = _error(r, 429)
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error" and str(BUDGET) in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 60
        client = limited.client()  # max_retries=0: the openai client raises at once
        call = client.chat.completions.create if endpoint == "chat" else client.completions.create
        with pytest.raises(openai.RateLimitError) as e:
            call(**body)
        assert e.value.response.headers["retry-after"].isdigit()
        assert _used(limited) == hog.tokens, "a refused request holds nothing"
    finally:
        hog.close()
    _wait_used(limited, 0)
    path = "chat/completions" if endpoint == "chat" else "completions"
    with httpx.stream("POST", f"{limited.url}/v1/{path}", json={**body, "stream": True}, timeout=60) as r:  # the same size now fits
        assert r.status_code == 200 and next(r.iter_lines()).startswith("data: ")
    _wait_used(limited, 0)


def test_small_requests_are_still_admitted_while_big_ones_fill_the_budget(limited):
    """The last eighth of the budget is kept for small requests: a short request is answered, not refused, while
    big requests hold all they may."""
    _wait_idle(limited)
    hog = Hog(limited, n=2, max_tokens=1400)
    other = Hog(limited, n=1, max_tokens=600)  # 2826 + 613 = 3439 of the 3500 big requests may fill
    try:
        r = httpx.post(f"{limited.url}/v1/chat/completions", json={"model": "tiny-chat", "messages": HI, "max_tokens": 200}, timeout=60)
        assert _error(r, 429)
        started = time.monotonic()
        r = limited.client().chat.completions.create(model="tiny-chat", messages=HI, max_tokens=8)  # 21 tokens: small
        assert r.choices[0].finish_reason == "length" and time.monotonic() - started < 30
    finally:
        hog.close()
        other.close()
    _wait_used(limited, 0)


def test_the_openai_client_retries_a_429_after_retry_after_and_succeeds(limited):
    _wait_idle(limited)
    metrics_url = f"{limited.url}/metrics"

    def refused() -> float:
        m = re.search(r'^kubetune_serve_requests_total\{endpoint="chat",model="tiny-chat",status="429"\} (\S+)$', httpx.get(metrics_url).text, re.M)
        return float(m.group(1)) if m else 0.0

    before = refused()
    hog = Hog(limited, n=2, max_tokens=1400)
    result: dict = {}

    def ask() -> None:
        client = openai.OpenAI(base_url=f"{limited.url}/v1", api_key="unused", max_retries=5, timeout=120)
        try:
            result["reply"] = client.chat.completions.create(model="tiny-chat", messages=HI, max_tokens=700)  # 713: does not fit beside the hog
        except Exception as e:  # reported below
            result["error"] = e

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while refused() == before:
            assert time.monotonic() < deadline, "the client's first try was not refused"
            time.sleep(0.05)
    finally:
        hog.close()
    thread.join(240)
    assert "error" not in result, result.get("error")
    assert result["reply"].choices[0].finish_reason == "length"
    _wait_used(limited, 0)


# --- every way a request ends gives its tokens back ---------------------------------------------------------
def test_a_stream_closed_early_gives_its_tokens_back(limited):
    _wait_idle(limited)
    hog = Hog(limited, n=2, max_tokens=1400)
    assert _used(limited) == hog.tokens
    hog.close()
    _wait_idle(limited)


def test_a_plain_request_whose_client_gives_up_gives_its_tokens_back(limited):
    _wait_idle(limited)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{limited.url}/v1/completions", json={"model": "tiny-chat", "prompt": PROMPT, "max_tokens": 1500}, timeout=httpx.Timeout(60, read=0.5))
    _wait_idle(limited)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_right_after_sending_gives_its_tokens_back(limited, stream):
    """The connection closes before any byte of the answer (for a stream: possibly before its generator ever runs)."""
    _wait_idle(limited)
    body = ('{"model": "tiny-chat", "prompt": "%s", "max_tokens": 500, "stream": %s}' % (PROMPT, "true" if stream else "false")).encode()
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", limited.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    _wait_idle(limited)
    assert limited.client().completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=2).choices[0].finish_reason == "length"


def test_a_waiting_request_whose_client_goes_away_gives_its_tokens_back(limited):
    """Requests queued behind a full batch (not yet generating) that are abandoned leave the queue and the budget."""
    _wait_idle(limited)
    engine = limited.app.state.server.loaded.engine

    async def crowd() -> None:
        aclient = limited.async_client()
        tasks = [asyncio.create_task(aclient.completions.create(model="tiny-chat", prompt=PROMPT, n=4, max_tokens=300)) for _ in range(2)]
        deadline = time.monotonic() + 30
        while not (_used(limited) == 2 * 4 * 305 and engine.running == 4 and engine.waiting == 4):  # both admitted, 4 rows wait
            assert time.monotonic() < deadline, f"never saturated: {_used(limited)} tokens, {engine.running} running, {engine.waiting} waiting"
            await asyncio.sleep(0.02)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await aclient.close()

    asyncio.run(crowd())
    _wait_idle(limited)


def test_metrics_show_the_admitted_tokens_and_preemptions(limited):
    _wait_idle(limited)
    hog = Hog(limited, n=2, max_tokens=1400)
    try:
        text = httpx.get(f"{limited.url}/metrics").text
        assert re.search(rf"^kubetune_serve_admitted_tokens {hog.tokens}(\.0)?$", text, re.M), text
        assert re.search(r"^kubetune_serve_preemptions_total \S+$", text, re.M)
    finally:
        hog.close()
    _wait_used(limited, 0)


def test_limits_that_could_never_admit_a_request_are_refused_at_start():
    from kubetune.errors import SpecError
    from kubetune.serve.options import make_options

    with pytest.raises(SpecError, match=r"--max-request-tokens \(5000\) is more than --max-queued-tokens \(4000\)"):
        make_options(max_request_tokens=5000, max_queued_tokens=4000)
    with pytest.raises(SpecError, match=r"--max-n"):
        make_options(max_n=0)


def test_a_stream_whose_client_is_gone_before_it_starts_gives_its_tokens_back(limited):
    """The ASGI server reports the disconnect while the response starts: Starlette then never iterates the stream
    (its generator never starts, so no `finally` in it runs). The request still gives its tokens back."""
    _wait_idle(limited)
    body = b'{"model": "tiny-chat", "prompt": "%s", "max_tokens": 500, "stream": true}' % PROMPT.encode()
    sent: list[dict] = []

    async def call() -> None:
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await asyncio.sleep(0.05)  # a slow socket: the disconnect is seen while the response's first bytes go out
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "", "query_string": b"",
            "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", limited.port), "state": {},
        }
        await limited.app(scope, receive, send)

    asyncio.run(call())
    assert not any(m["type"] == "http.response.body" and m.get("body") for m in sent), "nothing was streamed"
    _wait_idle(limited)


def test_kubetune_serve_takes_the_limits_as_options(kubetune_cli):
    import os
    import subprocess

    r = subprocess.run([*kubetune_cli, "serve", "--help"], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0
    for option in ("--max-n", "--max-prompts", "--max-request-tokens", "--max-queued-tokens", "--max-request-bytes"):
        assert option in r.stdout, option
    r = subprocess.run(
        [*kubetune_cli, "serve", "builtin://tiny-chat", "--port", "0", "--max-request-tokens", "5000", "--max-queued-tokens", "4000"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2 and "--max-request-tokens (5000) is more than --max-queued-tokens (4000)" in r.stderr and "Traceback" not in r.stderr


def test_the_400_names_the_field_to_reduce():
    from kubetune.serve.admission import Admission, Limits
    from kubetune.serve.options import ServeOptions
    from kubetune.serve.protocol import APIError

    adm = Admission(Limits(ServeOptions(max_request_tokens=100, max_queued_tokens=1000), context_length=2048))
    cases = [
        (([10, 10, 10], [50, 50, 50], 1, True), "prompt"),  # 3 prompts x 60: one prompt fits
        (([10] * 4, [40] * 4, 4, True), "n"),  # n=4 x 50: n=1 fits
        (([10], [200], 1, True), "max_tokens"),  # a shorter completion fits
        (([10], [200], 1, False), "messages"),  # max_tokens was not set: the server's default did not fit
        (([150], [10], 1, True), "messages"),  # the prompt alone is too long
    ]
    for (lengths, limits, n, given), param in cases:
        with pytest.raises(APIError) as e:
            adm.check_cost(lengths, limits, n=n, prompt_field="messages", max_tokens_given=given)
        assert e.value.status == 400 and e.value.param == param, (lengths, limits, n, e.value.message)
        assert "100 tokens" in e.value.message and "--max-request-tokens" in e.value.message
    assert adm.check_cost([10, 10], [40, 40], n=2, prompt_field="prompt", max_tokens_given=True) == 100
