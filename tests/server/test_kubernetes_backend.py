"""The jobs service on the kubernetes backend: an OpenAI fine-tuning job goes to a cluster and back.

The cluster is the one stand-in we accept: the HTTP double of the Kubernetes API (tests/backends/kubernetes), with
the submitted Job run for real by the pod executor (its init container fetches the staged dataset from the loopback
S3 server, its worker trains and publishes to ``output.uri``). Everything else is real: ``kubetune server`` in its
own process with ``backend: kubernetes``, the official ``openai`` client, S3 (moto's server).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from kubetune import constants as C

from _support.fixtures_servers import s3, s3_server  # noqa: F401  (pytest fixtures)
from _support.pod_executor import PodExecutor
from backends.kubernetes.apiserver_double import CORE, ApiServerDouble, make_pod

from .conftest import CAPITALS, FAST, Server

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
SECRET = "s3-credentials"


def _wait(what, predicate, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cluster(tmp_path):
    double = ApiServerDouble().start()
    yield double
    double.stop()


def test_an_openai_job_runs_on_the_cluster_and_its_model_is_served(cluster, s3, tmp_path):
    cluster_section = {
        "staging_uri": s3.uri("staging"),  # the uploaded training file reaches the pods through S3
        "env": {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_DEFAULT_REGION": "us-east-1"},
        "secrets": {"s3": {"secret": SECRET}},
    }
    defaults = {**FAST, "kubernetes": cluster_section, "output": {"uri": s3.uri("finetunes")}}
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    server = Server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}", backend="kubernetes", backend_options={"kubeconfig": str(kubeconfig)},
                    method_defaults={"supervised": defaults}).start()
    try:
        client = server.openai(server.key("alpha"))
        upload = client.files.create(file=CAPITALS.open("rb"), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="tiny-chat", training_file=upload.id, suffix="cluster")

        # the server's runner submits it: the upload is staged to S3, the Job and its spec ConfigMap are created
        workload = _wait("the Job on the cluster", lambda: cluster.get("batch/v1", "jobs", "default", job.id))
        spec_cm = cluster.get(CORE, "configmaps", "default", f"{job.id}-spec")
        staged = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"staging/{job.id}/data/")["Contents"]
        assert len(staged) == 1
        assert s3.client.get_object(Bucket=s3.bucket, Key=staged[0]["Key"])["Body"].read() == CAPITALS.read_bytes()
        assert s3.secret not in str(workload) + str(spec_cm) and str(server.data) not in str(workload)  # referenced, not inlined
        assert _wait("running", lambda: client.fine_tuning.jobs.retrieve(job.id).status == "running")

        # the cluster runs it (the pod executor plays the kubelet), then reports it as a kubelet and the Job controller would
        (pod,) = PodExecutor([spec_cm, workload], workdir=tmp_path / "cluster", bin_dirs=[BIN], extra_env=OFFLINE, timeout=500,
                             secrets={SECRET: {"AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": s3.secret}}).run()
        assert pod.ok, pod.describe()
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        cluster.add_pod("default", make_pod(f"{job.id}-x7k2p", workload["spec"]["template"]["metadata"]["labels"], main=C.K8S_MAIN_CONTAINER["job"],
                                            phase="Succeeded", init=[("fetch-data", done)], main_state=done, owner=workload),
                        logs={"fetch-data": pod.output("fetch-data"), C.K8S_MAIN_CONTAINER["job"]: pod.output(C.K8S_MAIN_CONTAINER["job"])})
        cluster.set_status("batch/v1", "jobs", "default", job.id, {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})

        finished = _wait("succeeded", lambda: (j := client.fine_tuning.jobs.retrieve(job.id)).status == "succeeded" and j)
        assert finished.fine_tuned_model.startswith("ft:tiny-chat:cluster:") and finished.error is None
        events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
        assert any(e.type == "metrics" and (e.data or {}).get("train_loss") for e in events)  # progress from the pod's log
        steps = sorted(c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data)
        assert steps == [2, 4]
        published = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"finetunes/{job.id}/")["Contents"]
        assert any(o["Key"].endswith("adapter_config.json") for o in published)  # its own prefix under output.uri

        # the fine-tuned model is served by the same server, loaded from where the pod published it
        reply = client.chat.completions.create(model=finished.fine_tuned_model, messages=[{"role": "user", "content": "Capital of France?"}],
                                               max_tokens=8, temperature=0)
        assert reply.model == finished.fine_tuned_model and reply.choices[0].message.content

        # a second job is cancelled: its workload is deleted from the cluster
        second = client.fine_tuning.jobs.create(model="tiny-chat", training_file=upload.id)
        _wait("the second Job", lambda: cluster.get("batch/v1", "jobs", "default", second.id))
        assert client.fine_tuning.jobs.cancel(second.id).status == "cancelled"
        assert cluster.get("batch/v1", "jobs", "default", second.id) is None
        assert client.fine_tuning.jobs.retrieve(second.id).status == "cancelled"
    finally:
        server.stop()


def test_unknown_backend_options_stop_the_server_at_start(tmp_path):
    from .conftest import cli

    config = tmp_path / "server.yaml"
    config.write_text("backend: kubernetes\nbackend_options: {nmespace: team-a}\n", encoding="utf-8")
    proc = cli("server", "--config", str(config), "--port", "0", "--db", f"sqlite:///{tmp_path / 'db.sqlite'}", check=False)
    assert proc.returncode == 2 and "backend_options.nmespace: not an option of the kubernetes backend" in proc.stderr
    assert "namespace" in proc.stderr and "Traceback" not in proc.stderr
