"""kubetune's own API on the jobs service: a full spec submitted with ``kubetune.Client(URL)`` (the Kubeflow
SDK's method names), followed, its events as Server-Sent Events, its log, its files downloaded, deleted; and
the CLI's ``--server`` sending run/list/status/logs/cancel there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from kubetune import Client
from kubetune.errors import BackendError, JobNotFound

from .conftest import CAPITALS

pytestmark = pytest.mark.slow


def _spec(name: str, steps: int = 3) -> dict:
    return {"name": name, "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(CAPITALS)},
            "method": {"type": "lora", "lora": {"r": 8, "alpha": 16, "target_modules": "all-linear"}},
            "training": {"max_steps": steps, "max_seq_length": 128, "batch_size": 4}, "output": {"dir": "runs/ignored-by-the-server"}}


def test_client_drives_a_server(make_server, tmp_path):
    server = make_server().start()
    key = server.key("alpha")
    client = Client(server.url.removesuffix("/v1"), api_key=key)

    ref = client.train(_spec("native-one"))
    assert ref.id.startswith("job-") and ref.name == "native-one"
    st = client.wait_for_job_status(ref, "succeeded", timeout=180)
    assert st.state == "succeeded" and st.step == 3 and st.loss > 0
    assert [s.job_id for s in client.list_jobs()] == [ref.id]
    assert client.get_job("native-one").job_id == ref.id  # by name too
    log = list(client.get_job_logs(ref))
    assert any("step 3/3" in line for line in log)
    kinds = [e["type"] for e in client.events(ref)]
    assert kinds[0] == "server" and {"metrics", "checkpoint", "done"} <= set(kinds)

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("GET", f"{server.url}/jobs/{ref.id}/events", params={"stream": "true"}, headers=headers, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    data = [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
    assert data[-1] == {"status": "succeeded"} and any(d.get("type") == "metrics" for d in data[:-1])

    files = {f["path"]: f["bytes"] for f in httpx.get(f"{server.url}/jobs/{ref.id}/artifacts", headers=headers).json()["data"]}
    assert "adapter/adapter_config.json" in files and "status.json" in files
    got = httpx.get(f"{server.url}/jobs/{ref.id}/artifacts/adapter/adapter_config.json", headers=headers)
    assert got.status_code == 200 and json.loads(got.content)["r"] == 8
    # a succeeded native job is a model of the project: chat with it (the dashboard's chat panel does this)
    native = httpx.get(f"{server.url}/jobs/{ref.id}", headers=headers).json()
    assert native["fine_tuned_model"] == f"ft:builtin://tiny-chat:native-one:{ref.id}"
    assert native["fine_tuned_model"] in [m["id"] for m in httpx.get(f"{server.url}/models", headers=headers).json()["data"]]
    reply = httpx.post(f"{server.url}/chat/completions", headers=headers, timeout=120,
                       json={"model": native["fine_tuned_model"], "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 4})
    assert reply.status_code == 200 and reply.json()["model"] == native["fine_tuned_model"] and reply.json()["usage"]["completion_tokens"] > 0
    escape = httpx.get(f"{server.url}/jobs/{ref.id}/artifacts/..%2F..%2Fserver.yaml", headers=headers)
    assert escape.status_code == 404 and escape.json()["error"]["code"] == "artifact_not_found"

    other = Client(server.url, api_key=server.key("beta"))
    with pytest.raises(JobNotFound):
        other.get_job(ref.id)
    bad = httpx.post(f"{server.url}/jobs", content=b"name: x\nmodel: {source: builtin://tiny-chat}\nbogus: 1\n",
                     headers={**headers, "Content-Type": "application/yaml"})
    assert bad.status_code == 400 and "bogus" in bad.json()["error"]["message"] and bad.json()["error"]["code"] == "invalid_spec"
    # a custom training function would run a client's code with the server's privileges: refused, nothing queued
    custom = httpx.post(f"{server.url}/jobs", json={"name": "mine", "entrypoint": {"source": "def main():\n    pass\n"}}, headers=headers)
    assert custom.status_code == 400 and custom.json()["error"]["message"].startswith("invalid spec: entrypoint: the jobs server runs")
    prep = httpx.post(f"{server.url}/jobs", headers=headers, json={
        "name": "prep", "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": "https://example.com/rows.jsonl", "preprocess": {"file": "prep.py"}}})
    assert prep.status_code == 400 and "dataset.preprocess: the jobs server runs no client code" in prep.json()["error"]["message"]
    assert [s.job_id for s in client.list_jobs()] == [ref.id]

    client.delete_job(ref)
    with pytest.raises(JobNotFound):
        client.get_job(ref.id)
    assert not (server.data / "runs" / ref.id).exists()
    with pytest.raises(BackendError):
        Client(server.url, api_key="kt-wrong").list_jobs()


def test_cli_server_option(make_server, tmp_path):
    server = make_server().start()
    env = {**os.environ, "KUBETUNE_API_KEY": server.key("alpha"), "KUBETUNE_SERVER": server.url.removesuffix("/v1")}
    spec = tmp_path / "job.yaml"
    import yaml

    spec.write_text(yaml.safe_dump(_spec("cli-job")), encoding="utf-8")

    def kt(*args):
        return subprocess.run([sys.executable, "-m", "kubetune.cli", *args], capture_output=True, text=True, env=env, timeout=240)

    run = kt("run", str(spec))
    assert run.returncode == 0, run.stderr + run.stdout
    assert "succeeded" in run.stdout
    listed = kt("list")
    assert "cli-job" not in listed.stdout and "succeeded" in listed.stdout and "job-" in listed.stdout
    st = kt("status", "cli-job", "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["state"] == "succeeded"
    assert "step 3/3" in kt("logs", "cli-job").stdout
    wrong = subprocess.run([sys.executable, "-m", "kubetune.cli", "list", "--server", server.url], capture_output=True, text=True,
                           env={**env, "KUBETUNE_API_KEY": "kt-nope"}, timeout=60)
    assert wrong.returncode == 2 and "Incorrect API key" in wrong.stderr and "Traceback" not in wrong.stderr


def test_a_sweep_run_on_the_server_from_the_cli(make_server, tmp_path):
    """``kubetune sweep SPEC --server URL`` submits to ``POST /v1/sweeps``, follows the trials to the end and prints
    them ranked; ``sweep status/list/cancel --server`` read the same sweep; each trial is a job of the project."""
    import yaml

    server = make_server(max_running_jobs=2).start()
    key = server.key("alpha")
    headers = {"Authorization": f"Bearer {key}"}
    spec_file = tmp_path / "sweepy.yaml"
    spec_file.write_text(yaml.safe_dump(_spec("sweepy")), encoding="utf-8")
    env = {**os.environ, "KUBETUNE_API_KEY": key, "KUBETUNE_SERVER": server.url, "COLUMNS": "200"}

    def kt(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kubetune.cli", *args], capture_output=True, text=True, env=env, timeout=300)

    ran = kt("sweep", str(spec_file), "--grid", "method.lora.r=4,8", "--objective", "train_loss")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 trials) submitted to" in ran.stdout
    assert ran.stdout.count(" succeeded train_loss=") == 2, ran.stdout  # one line per trial as it ends
    sweep_id = ran.stdout.split("sweep ", 1)[1].split()[0]
    assert sweep_id.startswith("sweep-") and "best: " in ran.stdout and "r=4" in ran.stdout and "r=8" in ran.stdout

    sweep = httpx.get(f"{server.url}/sweeps/{sweep_id}", headers=headers).json()
    assert sweep["objective"] == "train_loss" and [t["values"] for t in sweep["trials"]] == [{"method.lora.r": 4}, {"method.lora.r": 8}]
    assert sweep["status"] == "succeeded" and sweep["counts"] == {"succeeded": 2}, sweep
    best = min(sweep["trials"], key=lambda t: t["objective"])
    assert sweep["best"]["id"] == best["id"] and sweep["best"]["objective"] > 0
    assert f"job {best['id']}" in ran.stdout  # the printed best is the server's best
    trial = Client(server.url, api_key=key).get_job(best["id"])  # each trial is a job of the project
    assert trial.state == "succeeded" and trial.step == 3

    st = kt("sweep", "status", sweep_id, "-o", "json")
    assert st.returncode == 0 and json.loads(st.stdout)["best"]["id"] == best["id"]
    rows = kt("sweep", "status", sweep_id, "-o", "csv").stdout.splitlines()
    assert rows[0] == "rank,id,name,method.lora.r,status,train_loss" and rows[1].startswith(f"1,{best['id']},")
    listed = kt("sweep", "list")
    assert listed.returncode == 0 and sweep_id in listed.stdout and "2/2" in listed.stdout
    plot = kt("sweep", "status", sweep_id, "--plot", str(tmp_path / "p.png"))
    assert plot.returncode == 2 and "--plot: not available for a sweep on a server" in plot.stderr

    other = {"Authorization": f"Bearer {server.key('beta')}"}
    assert httpx.get(f"{server.url}/sweeps/{sweep_id}", headers=other).status_code == 404
    missing = subprocess.run([sys.executable, "-m", "kubetune.cli", "sweep", "status", sweep_id], capture_output=True, text=True, timeout=60,
                             env={**env, "KUBETUNE_API_KEY": other["Authorization"].split()[1]})
    assert missing.returncode == 2 and "No such sweep" in missing.stderr and "Traceback" not in missing.stderr
    bad = httpx.post(f"{server.url}/sweeps", json={"spec": _spec("nosweep")}, headers=headers)
    assert bad.status_code == 400 and "no sweep" in bad.json()["error"]["message"]
    no_grid = kt("sweep", str(spec_file))
    assert no_grid.returncode == 2 and "sweep" in no_grid.stderr and "Traceback" not in no_grid.stderr


def test_the_server_refuses_tpe_and_optuna_pruners(make_server):
    """A server plans a sweep's trials up front: TPE and Optuna's pruners run with kubetune sweep on the client."""
    server = make_server().start()
    headers = {"Authorization": f"Bearer {server.key('alpha')}"}
    for sweep in ({"sampler": "tpe", "trials": 2, "grid": {"method.lora.r": [4, 8]}, "objective": "train_loss"},
                  {"grid": {"method.lora.r": [4, 8]}, "objective": "train_loss", "early_stopping": {"rule": "hyperband"}}):
        r = httpx.post(f"{server.url}/sweeps", json={"spec": {**_spec("opt"), "sweep": sweep}}, headers=headers)
        assert r.status_code == 400 and "not Optuna's TPE or pruners" in r.json()["error"]["message"], r.text


def test_a_sweep_on_the_server_is_cancelled_from_the_cli(make_server, tmp_path):
    import yaml

    server = make_server(max_running_jobs=1).start()
    key = server.key("alpha")
    spec_file = tmp_path / "long.yaml"
    spec_file.write_text(yaml.safe_dump(_spec("long", steps=400)), encoding="utf-8")
    env = {**os.environ, "KUBETUNE_API_KEY": key, "KUBETUNE_SERVER": server.url}

    def kt(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kubetune.cli", *args], capture_output=True, text=True, env=env, timeout=120)

    started = kt("sweep", str(spec_file), "--grid", "method.lora.r=4,8", "--objective", "train_loss", "--detach")
    assert started.returncode == 0, started.stderr
    sweep_id = started.stdout.strip()
    assert sweep_id.startswith("sweep-") and f"kubetune sweep status {sweep_id}" in started.stderr
    cancelled = kt("sweep", "cancel", sweep_id)
    assert cancelled.returncode == 0 and cancelled.stdout.count("cancelled") >= 2, cancelled.stdout
    sweep = Client(server.url, api_key=key).backend.sweep(sweep_id)
    assert {t["status"] for t in sweep["trials"]} == {"cancelled"} and sweep["status"] == "failed"
