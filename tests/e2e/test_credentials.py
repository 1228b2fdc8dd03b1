"""Credentials in URIs, end to end: a real job reads its dataset from a loopback HTTP server that demands Basic
auth and a token in the query, then every place a user or another machine can see is searched for them.

Places searched: every file of the run directory and of the copy published to output.uri, the kubetune home
(job registry, cache), the output of validate, run, status, logs, list, render (kubernetes and kfp), and of a
`kubetune serve` process: its /v1/models, /metrics and log. The job must still succeed: the real credentials
were used, in memory only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ folder: shared real servers
from _support.fixtures_servers import free_port, http_server  # noqa: E402,F401

from kubetune import constants as C  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CAPITALS = REPO / "examples" / "data" / "capitals.jsonl"

USER = "kt-user-q7"
PASSWORD = "kt-pass-Zx91"
TOKEN = "kt-qtok-55aa"
SIGNATURE = "KTSIG0099"
ENV_SECRET = "kt-envpass-3e"
SECRETS = (USER, PASSWORD, TOKEN, SIGNATURE, ENV_SECRET)


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _tree_text(root: Path) -> dict[str, str]:
    """Every file under ``root`` (its path and bytes as text) and every name."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[f"name:{p}"] = str(p.relative_to(root))
        if p.is_file() and not p.is_symlink():
            out[str(p)] = p.read_bytes().decode("utf-8", errors="replace")
    return out


def _assert_clean(where: str, texts: dict[str, str]) -> None:
    bad = {name: _leaks(text) for name, text in texts.items() if _leaks(text)}
    assert not bad, f"credentials leaked in {where}: {bad}"


def _cli(kubetune_cli, *args: str, ok: bool | None = True, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([*kubetune_cli, *args], capture_output=True, text=True, timeout=timeout)
    if ok is True:
        assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
    elif ok is False:
        assert r.returncode != 0, (args, r.stdout[-3000:], r.stderr[-3000:])
    return r


@pytest.fixture
def secure_server(http_server):
    """The loopback file server, with Basic auth and a query token required on every request."""
    http_server.auth = (USER, PASSWORD)
    http_server.query = {"token": TOKEN}
    shutil.copy(CAPITALS, http_server.root / "d.jsonl")
    return http_server


def _uri(server, path: str, *, password: str = PASSWORD) -> str:
    host = server.url.split("//", 1)[1]
    return f"http://{USER}:{password}@{host}/{path}?token={TOKEN}&X-Amz-Signature={SIGNATURE}"


def _spec(tmp_path: Path, dataset: str, **extra) -> Path:
    spec = {
        "name": "cred-e2e",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": dataset, "eval_split": 0.1},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16}},
        "training": {"max_steps": 4, "batch_size": 8, "learning_rate": 3e-3, "max_seq_length": 128, "save_steps": 2},
        "output": {"dir": str(tmp_path / "run"), "uri": f"file://{tmp_path / 'published'}"},
        "kubernetes": {"env": {"DB_PASS": ENV_SECRET}},
        **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def test_a_run_with_credentials_in_its_uri_leaves_them_nowhere(secure_server, tmp_path, kubetune_cli, kubetune_home):
    spec = _spec(tmp_path, _uri(secure_server, "d.jsonl"))
    outputs: dict[str, str] = {}

    r = _cli(kubetune_cli, "validate", str(spec))
    outputs["validate"] = r.stdout + r.stderr
    assert "source: http://***@127.0.0.1:" in r.stdout and "token=***&X-Amz-Signature=***" in r.stdout
    assert "DB_PASS: '***'" in r.stdout or 'DB_PASS: "***"' in r.stdout or "DB_PASS: ***" in r.stdout
    assert "warning: kubernetes.env.DB_PASS: its name looks like a credential" in r.stderr
    r = _cli(kubetune_cli, "validate", str(spec), "-o", "json")
    outputs["validate json"] = r.stdout + r.stderr
    assert json.loads(r.stdout)["dataset"]["source"].startswith("http://***@")

    r = _cli(kubetune_cli, "run", str(spec))
    outputs["run"] = r.stdout + r.stderr
    run_dir = tmp_path / "run"
    status = json.loads((run_dir / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_SUCCEEDED, (status, (run_dir / "logs" / C.WORKER_LOG).read_text()[-3000:])
    assert "warning: kubernetes.env.DB_PASS" in r.stderr

    # The real credentials reached the server (in memory, through the worker's environment).
    fetched = [(path, h) for method, path, h in secure_server.requests if method == "GET" and path.startswith("/d.jsonl")]
    assert fetched and all(f"token={TOKEN}" in path and h.get("Authorization", "").startswith("Basic ") for path, h in fetched)
    # The leak the defect named is there, masked: httpx's request log line in logs/worker.log.
    worker_log = (run_dir / "logs" / C.WORKER_LOG).read_text()
    assert "HTTP Request: GET http://***@127.0.0.1:" in worker_log and "token=***" in worker_log, worker_log[-3000:]
    saved = yaml.safe_load((run_dir / C.SPEC_FILE).read_text())
    assert saved["dataset"]["source"].startswith("http://***@") and saved["kubernetes"]["env"]["DB_PASS"] == "***"

    for args in (["status", str(run_dir)], ["status", str(run_dir), "--json"], ["status", str(run_dir), "-o", "yaml"], ["logs", str(run_dir)],
                 ["list"], ["list", "-o", "json"], ["list", "-o", "wide"]):
        r = _cli(kubetune_cli, *args)
        outputs[" ".join(args)] = r.stdout + r.stderr
    assert "step 4/4" in outputs[f"logs {run_dir}"]

    # Rendering for a cluster refuses: the spec would be in a ConfigMap or a compiled pipeline.
    for backend in ("kubernetes", "kfp"):
        r = _cli(kubetune_cli, "render", str(spec), "--backend", backend, ok=False)
        outputs[f"render {backend}"] = r.stdout + r.stderr
        assert r.returncode == 2 and "dataset.source: credentials in the spec" in r.stderr, r.stderr
        assert "kubernetes.secrets" in r.stderr and r.stdout == ""

    _assert_clean("CLI output", outputs)
    _assert_clean("the run directory", _tree_text(run_dir))
    published = tmp_path / "published"
    assert (published / C.SPEC_FILE).is_file() and (published / "logs" / C.WORKER_LOG).is_file() and (published / C.DONE_FILE).is_file()
    _assert_clean("the copy published to output.uri", _tree_text(published))
    _assert_clean("the kubetune home (job registry, cache)", _tree_text(Path(kubetune_home)))


def test_a_failing_fetch_reports_the_uri_without_its_credentials(secure_server, tmp_path, kubetune_cli, kubetune_home):
    """Wrong password: the job fails at fetch; its reason names the URI, masked, in status, events, log and CLI."""
    spec = _spec(tmp_path, _uri(secure_server, "d.jsonl", password=PASSWORD + "-wrong"))
    r = _cli(kubetune_cli, "run", str(spec), ok=False)
    run_dir = tmp_path / "run"
    status = json.loads((run_dir / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_FAILED and "http://***@127.0.0.1:" in status["reason"], status
    assert "401" in status["reason"] or "denied" in status["reason"] or "refused" in status["reason"], status["reason"]
    outputs = {"run": r.stdout + r.stderr}
    for args in (["status", str(run_dir)], ["logs", str(run_dir)]):
        s = _cli(kubetune_cli, *args)
        outputs[" ".join(args)] = s.stdout + s.stderr
    # wrong-password: the secret parts are masked, so the wrong password is not shown either
    assert not [s for s in (PASSWORD + "-wrong",) if any(s in t for t in outputs.values())]
    _assert_clean("CLI output", outputs)
    _assert_clean("the run directory", _tree_text(run_dir))


def test_two_processes_get_the_real_spec_and_report_without_credentials(secure_server, tmp_path, kubetune_cli):
    """resources.processes_per_node: 2 goes through kubetune's torchrun launcher: both ranks get the spec from
    the environment (the server sees both fetches, with the given password), and the failure (a wrong
    password) is reported by rank, masked, in status, events, the launcher's output and the run's log."""
    spec = _spec(tmp_path, _uri(secure_server, "d.jsonl", password=PASSWORD + "-wrong"), resources={"processes_per_node": 2})
    r = _cli(kubetune_cli, "run", str(spec), ok=False)
    run_dir = tmp_path / "run"
    status = json.loads((run_dir / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_FAILED and "http://***@127.0.0.1:" in status["reason"], status
    tried = [h.get("Authorization", "") for m, p, h in secure_server.requests
             if m == "GET" and p.startswith("/d.jsonl") and f"token={TOKEN}" in p]
    assert len(tried) == 2 and all(t.startswith("Basic ") for t in tried), tried  # one GET per rank, with the spec's URI
    _assert_clean("CLI output", {"run": r.stdout + r.stderr})
    _assert_clean("the run directory", _tree_text(run_dir))


def test_fetch_and_data_inspect_show_the_uri_without_credentials(secure_server, tmp_path, kubetune_cli):
    """The commands that name a URI back to the user: fetch's summary, data inspect's report (text and JSON)."""
    uri = _uri(secure_server, "d.jsonl")
    outputs = {}
    r = _cli(kubetune_cli, "fetch", uri, str(tmp_path / "got"), "-q")
    outputs["fetch"] = r.stdout + r.stderr
    assert (tmp_path / "got" / "d.jsonl").read_bytes() == CAPITALS.read_bytes()  # fetched with the real credentials
    assert "fetched http://***@127.0.0.1:" in r.stderr
    for extra in ([], ["--json"]):
        r = _cli(kubetune_cli, "data", "inspect", uri, *extra)
        outputs[f"inspect {extra}"] = r.stdout + r.stderr
        assert "http://***@127.0.0.1:" in r.stdout, r.stdout[-2000:]
    _assert_clean("CLI output", outputs)


def _serve(kubetune_cli, args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([*kubetune_cli, "serve", *args, "--port", str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "the server did not come up: " + log.read_text()[-3000:]
        time.sleep(0.3)


def test_serve_from_uris_with_credentials_shows_none_of_them(secure_server, tiny_model, tmp_path, kubetune_cli):
    """`kubetune serve URI --adapter NAME=URI` with credentials in both: model ids, /v1/models (root) and the
    unauthenticated /metrics carry none of them, nor does the server's log."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with tarfile.open(secure_server.root / "model.tar.gz", "w:gz") as tar:
        tar.add(tiny_model, arcname="model")
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")).save_pretrained(tmp_path / "ad")
    with tarfile.open(secure_server.root / "adapter.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "ad", arcname="adapter")

    log = tmp_path / "serve.log"
    proc, url = _serve(kubetune_cli, [_uri(secure_server, "model.tar.gz"), "--adapter", f"mine={_uri(secure_server, 'adapter.tar.gz')}"], log)
    try:
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        for model in ("model", "mine"):
            r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "Paris is", "max_tokens": 2}, timeout=120)
            assert r.status_code == 200, r.text
        missing = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 1}, timeout=30).text
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    ids = [m["id"] for m in models["data"]]
    assert ids == ["model", "mine"], models
    roots = {m["id"]: m["root"] for m in models["data"]}
    assert roots["model"].startswith("http://***@127.0.0.1:") and roots["model"].endswith("/model.tar.gz?token=***&X-Amz-Signature=***")
    assert roots["mine"].startswith("http://***@127.0.0.1:") and roots["mine"].endswith("/adapter.tar.gz?token=***&X-Amz-Signature=***")
    assert 'model="mine"' in metrics
    fetched = [p for m, p, h in secure_server.requests if m == "GET" and f"token={TOKEN}" in p and h.get("Authorization")]
    assert any(p.startswith("/model.tar.gz") for p in fetched) and any(p.startswith("/adapter.tar.gz") for p in fetched)
    _assert_clean("kubetune serve", {"/v1/models": json.dumps(models), "/metrics": metrics, "404 body": missing,
                                     "log": log.read_text()})


def test_serving_a_run_whose_base_model_had_credentials_says_how(tmp_path, kubetune_cli, tiny_model):
    """spec.yaml keeps no credentials: serving such a run says how to give them, rather than failing with a 401."""
    run = tmp_path / "run"
    (run / C.ADAPTER_DIR).mkdir(parents=True)
    (run / C.ADAPTER_DIR / "adapter_config.json").write_text("{}")
    (run / C.SPEC_FILE).write_text(yaml.safe_dump({"name": "r", "model": {"source": "https://***@127.0.0.1:9/m.tar.gz?token=***"},
                                                   "dataset": {"source": str(CAPITALS)}}))
    r = _cli(kubetune_cli, "serve", str(run), "--port", str(free_port()), ok=False, timeout=120)
    assert r.returncode == 2 and "never saves in a run" in r.stderr and f"--adapter r={run}" in r.stderr, r.stderr


def test_worker_spec_travels_in_memory_only(tiny_job, tmp_path):
    """The local backend gives the worker its spec in the environment; spec.yaml is the masked copy."""
    from kubetune.backends._process import worker_env
    from kubetune.spec import load_spec

    job = load_spec(tiny_job(dataset={"source": f"https://{USER}:{PASSWORD}@h.example/d.jsonl?token={TOKEN}"}))
    env = worker_env(job, "jid")
    assert json.loads(env[C.ENV_WORKER_SPEC])["dataset"]["source"] == job.dataset.source  # the real one, for the worker
    assert C.ENV_WORKER_SPEC not in os.environ
    from kubetune.spec import dump_spec

    assert not _leaks(dump_spec(job))
