"""Remote mode against the KFP API double (kfp_api_double.py) and a real S3 server (moto): upload, submit,
follow, cancel, logs, and the errors a user meets (unreachable host, refused credentials, failed run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kubetune import Client
from kubetune import constants as C
from kubetune.errors import BackendError
from kubetune.events import RunDir
from kubetune.spec import load_spec

TOKEN = "kfp-test-token"


def _remote(tiny_job, kfp_api, **kfp) -> dict:
    return tiny_job(kfp={"mode": "remote", "host": kfp_api.url, **kfp})


def _client() -> Client:
    return Client("kfp", poll_seconds=0)


def _stages(run_dir: str) -> list[str]:
    return [e.get("message", "") for e in RunDir(run_dir).read_events() if e["type"] == "stage"]


def test_submit_uploads_local_inputs_and_follows_the_run_to_success(tiny_job, tiny_model, kfp_api, s3, monkeypatch):
    kfp_api.token = TOKEN
    monkeypatch.setenv(C.ENV_KFP_TOKEN, TOKEN)
    monkeypatch.setenv(C.ENV_KFP_S3_BUCKET, s3.bucket)
    spec = _remote(tiny_job, kfp_api, experiment="team-a", pipeline_root="s3://artifacts/pipelines")
    spec["model"] = {"source": str(tiny_model)}  # a local model folder: travels as one tarball (seed 000's flow)
    spec["kubernetes"] = {"service_account": "pipeline-runner"}
    client = _client()

    ref = client.submit(spec)

    # Local files are in the bucket, under the job's id.
    keys = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket)["Contents"])
    prefix = f"{C.KFP_STAGING_PREFIX}/tiny/{ref.id}"
    assert keys == [f"{prefix}/dataset/capitals.jsonl", f"{prefix}/model/{tiny_model.name}.tar.gz"]
    # The run was created with the compiled pipeline and parameters that name the uploads.
    (create,) = kfp_api.calls("POST", "/apis/v2beta1/runs")
    body = create.body
    assert body["display_name"] == ref.id
    assert body["service_account"] == "pipeline-runner"
    assert body["runtime_config"]["pipeline_root"] == "s3://artifacts/pipelines"
    params = body["runtime_config"]["parameters"]
    assert params["model_uri"] == f"s3://{s3.bucket}/{prefix}/model/{tiny_model.name}.tar.gz"
    assert params["dataset_uri"] == f"s3://{s3.bucket}/{prefix}/dataset/capitals.jsonl"
    assert params["run_dir"] == ""
    assert json.loads(params["spec"])["model"]["source"] == params["model_uri"]
    ir = body["pipeline_spec"].get("pipeline_spec", body["pipeline_spec"])
    assert ir["pipelineInfo"]["name"] == "kubetune-tiny"
    assert {"comp-fetch", "comp-train", "comp-publish"} <= set(ir["components"])
    assert [e["display_name"] for e in kfp_api.experiments.values()] == ["team-a"]
    assert body["experiment_id"] == next(iter(kfp_api.experiments))
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in kfp_api.requests)
    run_id = ref.extra["run_id"]
    assert ref.extra["run_url"] == f"{kfp_api.url}/#/runs/details/{run_id}"

    st = client.wait(ref, timeout=60, poll=0.05)

    assert st.state == C.STATE_SUCCEEDED
    run = RunDir(ref.run_dir)
    assert run.is_done()
    assert yaml.safe_load(run.spec_file.read_text())["model"]["source"] == params["model_uri"]
    stages = _stages(ref.run_dir)
    assert any(m.startswith(f"uploaded model.source {tiny_model}") for m in stages)
    assert f"submitted KFP run {run_id}: {ref.extra['run_url']}" in stages
    for task in ("fetch", "train", "merge", "publish"):
        assert f"task {task}: succeeded" in stages
    assert st.extra["kfp_run_id"] == run_id
    # The job is known by its id, its KFP run id, its name and its run directory.
    for key in (ref.id, run_id, "tiny", ref.run_dir):
        assert client.backend.resolve(key).run_dir == ref.run_dir
    assert ref.id in [r.id for r in client.list()]
    assert client.status(run_id).state == C.STATE_SUCCEEDED


def test_remote_inputs_need_a_bucket(tiny_job, kfp_api):
    with pytest.raises(BackendError) as err:
        _client().submit(_remote(tiny_job, kfp_api))
    assert "dataset.source" in str(err.value) and "kfp.bucket" in str(err.value) and "KFP_S3_BUCKET" in str(err.value)
    assert not kfp_api.calls("POST", "/apis/v2beta1/runs")


def test_unreachable_host_fails_at_once_with_a_clear_message(tiny_job, tmp_path):
    from _support.fixtures_servers import free_port

    spec = tiny_job(dataset={"source": "hf://datasets/org/data"}, kfp={"mode": "remote", "host": f"http://127.0.0.1:{free_port()}"})
    started = time.monotonic()
    with pytest.raises(BackendError) as err:
        _client().submit(spec)
    assert time.monotonic() - started < 20
    assert "cannot reach the KFP API at http://127.0.0.1:" in str(err.value)
    assert "port-forward" in str(err.value)


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_refused_credentials_say_what_to_set(tiny_job, kfp_api, monkeypatch, token):
    kfp_api.token = TOKEN
    if token:
        monkeypatch.setenv(C.ENV_KFP_TOKEN, token)
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    with pytest.raises(BackendError) as err:
        _client().submit(spec)
    text = str(err.value)
    assert f"the KFP API at {kfp_api.url} refused {'the token' if token else 'no credentials'} (HTTP 401" in text
    assert C.ENV_KFP_TOKEN in text and "oc whoami -t" in text


def test_a_failed_run_reports_the_reason_and_the_run_url(tiny_job, kfp_api):
    kfp_api.states = ["RUNNING", "FAILED"]
    kfp_api.failure = {"task_message": "train: exit code 2 (DataError: capitals.jsonl:7: no messages)"}
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    client = _client()
    ref = client.submit(spec)

    st = client.wait(ref, timeout=60, poll=0.05)

    assert st.state == C.STATE_FAILED
    run_id = ref.extra["run_id"]
    assert st.reason == (f"KFP run {run_id} failed: task train failed: train: exit code 2 (DataError: capitals.jsonl:7: no messages); "
                         f"see {kfp_api.url}/#/runs/details/{run_id}")
    assert st.extra["exit_code"] == 1
    assert not RunDir(ref.run_dir).is_done()
    errors = [e["message"] for e in RunDir(ref.run_dir).read_events() if e["type"] == "error"]
    assert errors == [st.reason]


def test_run_level_error_message_wins(tiny_job, kfp_api):
    kfp_api.states = ["FAILED"]
    kfp_api.failure = {"message": "pod fetch-xyz: ImagePullBackOff for ghcr.io/kubetune/kubetune:0.1.0"}
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    client = _client()
    st = client.wait(client.submit(spec), timeout=60, poll=0.05)
    assert st.state == C.STATE_FAILED
    assert "failed: pod fetch-xyz: ImagePullBackOff" in st.reason and "/#/runs/details/" in st.reason


def test_server_refusing_the_run_is_recorded_and_raised(tiny_job, kfp_api):
    kfp_api.create_run_error = (400, "Failed to create a new run: invalid pipeline spec")
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    with pytest.raises(BackendError) as err:
        _client().submit(spec)
    assert f"the KFP API at {kfp_api.url} answered HTTP 400: Failed to create a new run: invalid pipeline spec" in str(err.value)
    st = RunDir(load_spec(spec).output_dir).read_status()
    assert st.state == C.STATE_FAILED and "HTTP 400" in st.reason


def test_cancel_terminates_the_server_run(tiny_job, kfp_api):
    kfp_api.states = ["RUNNING"]
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    client = _client()
    ref = client.submit(spec)
    assert client.status(ref).state == C.STATE_RUNNING

    client.cancel(ref)

    (terminate,) = kfp_api.calls("POST", f"/apis/v2beta1/runs/{ref.extra['run_id']}:terminate")
    assert terminate.method == "POST"
    assert client.status(ref).state == C.STATE_CANCELLED


def test_unknown_run_on_the_server_is_job_not_found(tiny_job, kfp_api):
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    client = _client()
    ref = client.submit(spec)
    kfp_api.runs.clear()  # e.g. deleted in the UI
    with pytest.raises(BackendError) as err:
        client.status(ref)
    assert f"has no run {ref.extra['run_id']}" in str(err.value)


def test_logs_come_from_the_task_pods(tiny_job, kfp_api, pod_logs, tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": pod_logs.url}}],
        "users": [{"name": "me", "user": {"token": "kube-token"}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "me", "namespace": "team-a"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    kfp_api.states = ["RUNNING"]
    spec = _remote(tiny_job, kfp_api)
    spec["dataset"] = {"source": "s3://data/capitals.jsonl"}
    client = _client()
    ref = client.submit(spec)
    client.status(ref)
    short = ref.extra["run_id"][:6]
    pod_logs.logs = {
        f"fetch-pod-{short}": "[kubetune] fetching model and data\n",
        f"train-pod-{short}": '[kubetune] training\nKUBETUNE_EVENT {"time":1,"type":"metrics","data":{"step":1}}\n',
    }

    lines = list(client.logs(ref))

    assert lines == [
        f"== fetch (fetch-pod-{short}) ==", "[kubetune] fetching model and data",
        f"== train (train-pod-{short}) ==", "[kubetune] training", 'KUBETUNE_EVENT {"time":1,"type":"metrics","data":{"step":1}}',
    ]
    paths = [r.path for r in pod_logs.requests]
    assert paths == [f"/api/v1/namespaces/team-a/pods/fetch-pod-{short}/log", f"/api/v1/namespaces/team-a/pods/train-pod-{short}/log"]
    assert all(r.query["container"] == [C.KFP_MAIN_CONTAINER] for r in pod_logs.requests)

    pod_logs.logs.clear()
    with pytest.raises(BackendError) as err:
        list(client.logs(ref))
    assert f"cannot read the log of pod fetch-pod-{short}: HTTP 404" in str(err.value)


def test_run_cli_remote_mode_follows_to_success(tiny_job, kfp_api, s3, tmp_path, kubetune_cli):
    spec = tiny_job()
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
    env = {**os.environ, C.ENV_KFP_ENDPOINT: kfp_api.url, C.ENV_KFP_S3_BUCKET: s3.bucket, "COLUMNS": "400"}
    out = subprocess.run([*kubetune_cli, "run", str(spec_file), "--backend", "kfp", "--mode", "remote"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "succeeded" in out.stdout
    assert re.search(r"submitted KFP run [0-9a-f-]{36}: http://127\.0\.0\.1:\d+/#/runs/details/", out.stdout)

    bad = subprocess.run([*kubetune_cli, "run", str(spec_file), "--mode", "remote"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--mode applies to --backend kfp" in bad.stdout + bad.stderr
