"""End to end: a tiny job whose model comes from s3://, whose data comes from http://, whose results go to
s3:// and oci://; then a job killed after a checkpoint and relaunched on an empty disk resumes from the
remote checkpoint. Real worker processes (local backend), real servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from kubetune import Client
from kubetune import constants as C
from kubetune.storage import fetch, push

pytestmark = pytest.mark.slow


@pytest.fixture
def remote_job(tiny_job, s3, http_server, capitals, tmp_path):
    """tiny_job with the model pushed to s3:// and the dataset served over http://."""
    push(fetch("builtin://tiny-chat"), s3.uri("models/tiny-chat"))
    shutil.copy(capitals, http_server.root / "capitals.jsonl")

    def make(**sections):
        job = tiny_job(**sections)
        job["model"] = {"source": s3.uri("models/tiny-chat")}
        job["dataset"] = {**job["dataset"], "source": f"{http_server.url}/capitals.jsonl"}
        return job

    return make


def _run(job: dict, timeout: float = 600):
    client = Client("local")
    ref = client.submit(job)
    st = client.wait(ref, timeout=timeout)
    log = (Path(ref.run_dir) / C.LOGS_DIR / C.WORKER_LOG).read_text()[-4000:]
    assert st.state == C.STATE_SUCCEEDED, (st.reason, log)
    return ref


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / C.EVENTS_FILE).read_text().splitlines()]


def _remote_complete(s3, prefix: str) -> list[int]:
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])]
    return sorted(int(k.split("/")[-2].split("-")[1]) for k in keys if k.endswith("/" + C.CHECKPOINT_COMPLETE))


def test_output_to_oci_registry(remote_job, oci_registry, s3, tmp_path):
    job = remote_job(output={"dir": str(tmp_path / "run-oci"), "uri": f"oci://{oci_registry.host}/tuned/tiny:v1"})
    ref = _run(job)
    host = oci_registry.host
    m = httpx.get(f"http://{host}/v2/tuned/tiny/manifests/v1", headers={"Accept": C.OCI_MEDIA_MANIFEST}).json()
    media = {lay["annotations"][C.OCI_ANNOTATION_TITLE]: lay["mediaType"] for lay in m["layers"]}
    assert media == {"adapter_config.json": C.OCI_MEDIA_ADAPTER_CONFIG, "adapter_model.safetensors": C.OCI_MEDIA_ADAPTER_WEIGHTS}
    assert m["annotations"][C.OCI_ANNOTATION_BASE_MODEL] == s3.uri("models/tiny-chat")
    assert m["annotations"][C.OCI_ANNOTATION_METHOD] == "lora"
    tags = set(httpx.get(f"http://{host}/v2/tuned/tiny/tags/list").json()["tags"])
    assert {"v1", "v1-run", "v1-checkpoint-3", "v1-checkpoint-6"} <= tags
    # what was pushed is the adapter the run wrote, byte for byte
    pulled = fetch(f"oci://{host}/tuned/tiny:v1", tmp_path / "pulled")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (pulled / name).read_bytes() == (Path(ref.run_dir) / C.ADAPTER_DIR / name).read_bytes()


def test_killed_job_resumes_from_remote_checkpoint(remote_job, s3, tmp_path):
    out = s3.uri("runs/resume")
    steps = 30
    first = remote_job(training={"max_steps": steps, "save_steps": 3}, output={"dir": str(tmp_path / "pod-1"), "uri": out})
    client = Client("local")
    ref = client.submit(first)
    deadline = time.time() + 300
    while not _remote_complete(s3, "runs/resume/") and time.time() < deadline:
        assert client.status(ref).state in (C.STATE_PENDING, C.STATE_RUNNING), client.status(ref).reason
        time.sleep(0.1)
    os.kill(ref.extra["pid"], signal.SIGKILL)  # the pod dies: no publish, no DONE
    time.sleep(0.5)
    done_steps = _remote_complete(s3, "runs/resume/")
    assert done_steps and done_steps[-1] < steps, done_steps
    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="runs/resume/")["Contents"]}
    assert "runs/resume/DONE" not in keys

    # A relaunch on an empty disk (a new pod): same spec, new local directory.
    again = dict(first, output={"dir": str(tmp_path / "pod-2"), "uri": out})
    ref2 = _run(again)
    run2 = Path(ref2.run_dir)
    result = json.loads((run2 / C.RESULT_FILE).read_text())
    newest = done_steps[-1]
    assert result["resumed_at_step"] >= newest and result["global_step"] == steps
    pulled = [e for e in _events(run2) if e["type"] == "checkpoint" and "pulled" in e.get("message", "")]
    assert pulled and f"checkpoint-{result['resumed_at_step']}" in pulled[0]["message"] and out in pulled[0]["message"]

    keys = {o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="runs/resume/")["Contents"]}
    assert {"runs/resume/DONE", "runs/resume/result.json", "runs/resume/adapter/adapter_model.safetensors"} <= keys
    assert f"runs/resume/checkpoints/checkpoint-{steps}/{C.CHECKPOINT_COMPLETE}" in keys
    remote_adapter = s3.client.get_object(Bucket=s3.bucket, Key="runs/resume/adapter/adapter_model.safetensors")["Body"].read()
    assert remote_adapter == (run2 / C.ADAPTER_DIR / "adapter_model.safetensors").read_bytes()
