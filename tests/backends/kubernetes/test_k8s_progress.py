"""Progress reported to Kubeflow Trainer's TrainJob status endpoint (KEP-2779), when the cluster offers it."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest

from kubetune import constants as C
from kubetune.backends.kubernetes.progress import TrainerStatusReporter, trainer_status_payload
from kubetune.events import JobStatus

from .k8s_validate import crd_schema


def _trainer_status_schema() -> dict:
    return crd_schema("trainer.kubeflow.org/v1alpha1", "TrainJob")["properties"]["status"]["properties"]["trainerStatus"]


def test_payload_is_what_the_trainjob_status_accepts():
    st = JobStatus(state="running", step=30, total_steps=120, loss=1.23456789, eval_loss=1.5, learning_rate=2e-4, eta_seconds=95.4, tokens_per_second=812.0)
    body = trainer_status_payload(st, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    jsonschema.validate(body["trainerStatus"], _trainer_status_schema())
    ts = body["trainerStatus"]
    assert (ts["progressPercentage"], ts["estimatedRemainingSeconds"], ts["lastUpdatedTime"]) == (25, 95, "2026-01-02T03:04:05Z")
    metrics = {m["name"]: m["value"] for m in ts["metrics"]}
    assert metrics["loss"] == "1.23457" and metrics["currentStep"] == "30" and metrics["totalSteps"] == "120"
    done = trainer_status_payload(JobStatus(state="succeeded"))["trainerStatus"]
    jsonschema.validate(done, _trainer_status_schema())
    assert done["progressPercentage"] == 100


@pytest.fixture
def endpoint():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers.get("Authorization"), json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/tune/status", received
    server.shutdown()
    server.server_close()


def test_reporter_posts_with_the_token_and_rate_limits(endpoint, tmp_path, monkeypatch):
    url, received = endpoint
    token = tmp_path / "token"
    token.write_text("projected-sa-token\n")
    monkeypatch.setenv(C.ENV_KUBEFLOW_STATUS_URL, url)
    monkeypatch.setenv(C.ENV_KUBEFLOW_STATUS_TOKEN, str(token))
    reporter = TrainerStatusReporter.from_env()
    assert reporter.report(JobStatus(state="running", step=1, total_steps=10))
    assert not reporter.report(JobStatus(state="running", step=2, total_steps=10))  # too soon: skipped
    assert reporter.report(JobStatus(state="succeeded", step=10, total_steps=10))  # the end always goes out
    assert [r[1] for r in received] == ["Bearer projected-sa-token"] * 2
    assert received[0][0].endswith("/trainjobs/tune/status")
    assert received[-1][2]["trainerStatus"]["progressPercentage"] == 100


def test_reporter_is_off_without_the_endpoint_and_never_raises(monkeypatch):
    monkeypatch.delenv(C.ENV_KUBEFLOW_STATUS_URL, raising=False)
    assert TrainerStatusReporter.from_env() is None
    dead = TrainerStatusReporter("http://127.0.0.1:9/status", min_interval=0)
    assert dead.report(JobStatus(state="running")) is False
