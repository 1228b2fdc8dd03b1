"""The commands as a user runs them: `kubetune serve` in its own process, `kubetune chat URL|RUN`."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx

from .conftest import API_KEY, free_port


def test_kubetune_serve_process_answers_the_openai_client(artifacts, server, kubetune_cli, tmp_path):
    """`kubetune serve RUN --adapter beta=DIR --api-key k` in its own process serves the same models, with the same
    replies, as the in-process server built from the same run and adapter."""
    from openai import OpenAI

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [*kubetune_cli, "serve", str(artifacts.run), "--adapter", f"beta={artifacts.beta}", "--port", str(port), "--api-key", "k"],
        stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not come up"
            time.sleep(0.3)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["capitals-bot", "tiny-chat", "beta"]
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        for model in ("capitals-bot", "beta", "tiny-chat"):
            r = client.chat.completions.create(model=model, messages=ask, max_tokens=12)  # no temperature: the model's default (greedy)
            want = server.client().chat.completions.create(model=model, messages=ask, max_tokens=12)
            assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length", (model, r)
            assert (r.choices[0].message.content, r.usage.prompt_tokens) == (want.choices[0].message.content, want.usage.prompt_tokens), model
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        log.close()
    out = (tmp_path / "serve.log").read_text()
    assert f"serving capitals-bot, tiny-chat, beta at http://127.0.0.1:{port}/v1 (API key required)" in out


def test_a_busy_port_is_refused_before_the_model_loads(kubetune_cli):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([*kubetune_cli, "serve", "builtin://tiny-chat", "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr and "Traceback" not in r.stderr
    assert "serving" not in r.stdout, "nothing claims to serve on a port it does not have"


def test_chat_against_a_server_url(server, kubetune_cli):
    ask = [{"role": "user", "content": "What is the capital of Peru?"}]
    want = server.client().chat.completions.create(model="beta", messages=ask, max_tokens=20, temperature=0).choices[0].message.content
    r = subprocess.run(
        [*kubetune_cli, "chat", server.url, "--model", "beta", "--prompt", ask[0]["content"], "--max-new-tokens", "20"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"> {ask[0]['content']}\n{want}\n"


def test_interactive_chat_keeps_history(server, kubetune_cli):
    client = server.client()
    first = client.chat.completions.create(model="capitals-bot", messages=[{"role": "user", "content": "Hello"}], max_tokens=10, temperature=0).choices[0].message.content
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": first}, {"role": "user", "content": "And Kenya?"}]
    second = client.chat.completions.create(model="capitals-bot", messages=history, max_tokens=10, temperature=0).choices[0].message.content
    r = subprocess.run(
        [*kubetune_cli, "chat", server.url + "/v1", "--max-new-tokens", "10"],
        input="Hello\nAnd Kenya?\n\n", capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert f"Chatting with capitals-bot at {server.url}/v1" in r.stdout, "the first model the server lists is the default"
    assert f"> {first}\n> {second}\n> " in r.stdout


def test_chat_takes_the_openai_client_s_environment(keyed_server, kubetune_cli):
    """OPENAI_BASE_URL and OPENAI_API_KEY, as the openai client reads them, when no SOURCE or --api-key is given."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBETUNE_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env.update(OPENAI_BASE_URL=keyed_server.url + "/v1", OPENAI_API_KEY=API_KEY)
    r = subprocess.run([*kubetune_cli, "chat", "-p", "hi", "--max-new-tokens", "3"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("> hi\n") and len(r.stdout.splitlines()) == 2, r.stdout
    env["OPENAI_API_KEY"] = "wrong"
    r = subprocess.run([*kubetune_cli, "chat", "-p", "hi"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "HTTP 401" in r.stderr, "the key from OPENAI_API_KEY is the one sent"
    env["KUBETUNE_API_KEY"] = API_KEY  # kubetune's own variable wins
    r = subprocess.run([*kubetune_cli, "chat", "-p", "hi", "--max-new-tokens", "3"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr


def test_chat_errors_name_the_problem(keyed_server, kubetune_cli):
    r = subprocess.run([*kubetune_cli, "chat", keyed_server.url, "-p", "hi"], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k not in ("KUBETUNE_API_KEY", "OPENAI_API_KEY")})
    assert r.returncode == 2 and "HTTP 401" in r.stderr and "--api-key" in r.stderr
    r = subprocess.run([*kubetune_cli, "chat", keyed_server.url, "-p", "hi", "--max-new-tokens", "3"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KUBETUNE_API_KEY": API_KEY})
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*kubetune_cli, "chat", keyed_server.url, "-p", "hi", "--model", "nope", "--api-key", API_KEY], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "HTTP 404" in r.stderr and "--model" in r.stderr
    r = subprocess.run([*kubetune_cli, "chat", f"http://127.0.0.1:{free_port()}", "-p", "hi"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot reach" in r.stderr and "kubetune serve" in r.stderr


def test_chat_with_a_run_directory_in_process_agrees_with_the_server(artifacts, server, kubetune_cli):
    want = server.client().chat.completions.create(model="capitals-bot", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)
    r = subprocess.run([*kubetune_cli, "chat", str(artifacts.run), "-p", "Hi", "--max-new-tokens", "8"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"> Hi\n{want.choices[0].message.content}\n"


def test_chat_ends_quietly_when_its_reader_goes_away(artifacts, kubetune_cli):
    """`kubetune chat RUN -p ... | head -1`: the reader closes the pipe while the model is still generating in its
    thread; the generation stops with it and the command ends with 141 (what a shell reports for SIGPIPE), not
    with a C++ "terminate called without an active exception" abort (134) or a traceback."""
    proc = subprocess.Popen([*kubetune_cli, "chat", str(artifacts.run), "-p", "Hi", "--max-new-tokens", "400"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "> Hi\n"
        proc.stdout.close()  # what `head -1` does once it has its line
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 141, err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "terminate called" not in err and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_blank_answer_is_shown_as_such(kubetune_cli):
    """The quickstart's "before" question to the untrained builtin model: its reply is whitespace only, which used
    to print as a dozen blank lines; it is named instead."""
    r = subprocess.run([*kubetune_cli, "chat", "builtin://tiny-chat", "-p", "What is the capital of France?", "--max-new-tokens", "12"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    first, answer, rest = r.stdout.split("\n", 2)
    assert first == "> What is the capital of France?" and rest == "", r.stdout
    assert answer.startswith(("(blank answer: ", "(empty answer)")), r.stdout


def test_blank_replies_are_named():
    from kubetune.cli.main import _blank_reply

    assert _blank_reply("") == "(empty answer)"
    assert _blank_reply("\n\n ") == "(blank answer: 3 whitespace character(s), '\\n\\n ')"
    assert _blank_reply("\n" * 100) == "(blank answer: 100 whitespace character(s), '" + "\\n" * 40 + "...')"
