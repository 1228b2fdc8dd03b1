"""Rendered Jobs run as local processes (tests/_support/pod_executor.py).

The tiny job goes the whole way a cluster would take it: its local dataset is staged to the loopback S3
server, the rendered init container fetches it with ``kubetune fetch`` using credentials that reach it only
through the rendered ``secretKeyRef``, and the worker trains and writes its run directory in the workspace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubetune import constants as C
from kubetune.backends import get_backend
from kubetune.backends.kubernetes import render, stage_inputs
from kubetune.spec import load_spec

from _support.pod_executor import PodExecutor

from . import specs
from .apiserver_double import CORE, ApiServerDouble, make_pod

BIN = Path(sys.executable).parent
# What the test machine needs and a real image has baked in: no network for the hub, one thread per process.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
SECRET = "s3-credentials"


def _fake_commands(objects: list[dict], init: list[str], main: list[str]) -> list[dict]:
    pod = objects[-1]["spec"]["template"]["spec"]
    for c in pod["initContainers"]:
        c["command"] = init
    pod["containers"][0]["command"], pod["containers"][0]["args"] = main, []
    return objects


# --- the executor itself -----------------------------------------------------------------------
def test_mounts_env_and_secrets_are_resolved(tmp_path):
    job = load_spec(specs.spec("gpu-pvc", kubernetes={"namespace": "default"}))
    probe = "import json, os, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True); open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"
    objects = _fake_commands(
        render(job, "job"),
        init=[sys.executable, "-c", probe, "/workspace/model/env.json"],
        main=[sys.executable, "-c", probe + "; print(open('/etc/kubetune/spec.yaml').read()[:4])", "/workspace/output/env.json"],
    )
    secrets = {"hf-token": {"token": "hf_xyz"}, SECRET: {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}}
    (pod,) = PodExecutor(objects, workdir=tmp_path, secrets=secrets, bin_dirs=[BIN]).run()
    assert pod.ok, pod.describe()
    env = json.loads(pod.host_path("/workspace/output/env.json").read_text())
    assert env["HF_TOKEN"] == "hf_xyz" and env["AWS_SECRET_ACCESS_KEY"] == "key"
    assert "WANDB_API_KEY" not in env  # optional and absent: left unset, as the kubelet does
    assert env[C.ENV_EVENT_STDOUT] == "1"
    assert env[C.ENV_HOME] == str(pod.host_path(C.K8S_HOME_DIR))  # pod paths in env point into the volume
    init_env = json.loads(pod.host_path("/workspace/model/env.json").read_text())
    assert C.ENV_EVENT_STDOUT not in init_env
    assert pod.output("worker").strip() == "name"  # the spec ConfigMap is mounted where --spec points
    # the PVC outlives the pod: it is shared by claim name
    assert str(pod.host_path("/workspace")).startswith(str(tmp_path / "pvc" / "tune-demo-workspace"))


def test_missing_secret_fails_like_the_kubelet(tmp_path):
    objects = render(load_spec(specs.spec("gpu-pvc", kubernetes={"namespace": "default"})), "job")
    (pod,) = PodExecutor(objects, workdir=tmp_path, secrets={}, bin_dirs=[BIN]).run()
    assert not pod.ok
    assert pod.error == 'CreateContainerConfigError: secret "hf-token" not found'


def test_indexed_pods_get_ranks_and_reach_each_other(tmp_path):
    job = load_spec(specs.spec("cpu", resources={"nodes": 2}))
    show = "import os; print(os.environ['NODE_RANK'], os.environ['JOB_COMPLETION_INDEX'], os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])"
    objects = _fake_commands(render(job, "job"), init=["true"], main=[sys.executable, "-c", show])
    pods = PodExecutor(objects, workdir=tmp_path, bin_dirs=[BIN]).run()
    assert [p.ok for p in pods] == [True, True], [p.describe() for p in pods]
    lines = [p.output("worker").split() for p in pods]
    assert [(r, i) for r, i, _, _ in lines] == [("0", "0"), ("1", "1")]
    assert {a for _, _, a, _ in lines} == {"127.0.0.1"}  # tune-demo-0.tune-demo -> this machine
    port = lines[0][3]
    assert port != str(C.K8S_RDZV_PORT) and lines[1][3] == port  # a free local port, the same for both


def test_one_failed_pod_stops_the_others(tmp_path):
    job = load_spec(specs.spec("cpu", resources={"nodes": 2}))
    crash_rank_1 = "import os, sys, time; sys.exit(3) if os.environ['NODE_RANK'] == '1' else time.sleep(60)"
    objects = _fake_commands(render(job, "job"), init=["true"], main=[sys.executable, "-c", crash_rank_1])
    pods = PodExecutor(objects, workdir=tmp_path, bin_dirs=[BIN], timeout=50).run()
    assert pods[1].error == "container worker exited with 3"
    assert not pods[0].ok and pods[0].containers[-1].returncode != 0  # killed, not left hanging for 60 s


# --- the tiny job, end to end -------------------------------------------------------------------
def _fetch_available() -> bool:
    r = subprocess.run([str(BIN / "kubetune"), "fetch", "--help"], capture_output=True, text=True)
    return r.returncode == 0


def _tiny_spec(s3, capitals, **resources) -> dict:
    return {
        "name": "tiny-k8s",
        "model": {"source": "builtin://tiny-chat"},
        "dataset": {"source": str(capitals), "eval_split": 0.1},
        "method": {"type": "lora", "lora": {"r": 8, "alpha": 16}},
        "training": {"max_steps": 4, "batch_size": 4, "learning_rate": 3e-3, "max_seq_length": 96, "save_steps": 2, "logging_steps": 1},
        "resources": {"cpu": "1", "memory": "2Gi", **resources},
        "kubernetes": {
            "staging_uri": s3.uri("staging"),
            "env": {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_DEFAULT_REGION": "us-east-1"},
            "secrets": {"s3": {"secret": SECRET}},
        },
    }


def _secrets(s3) -> dict:
    return {SECRET: {"AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": s3.secret}}


@pytest.mark.slow
def test_tiny_job_submitted_staged_fetched_trained_and_followed(s3, capitals, tmp_path):
    """submit (stages the local dataset to S3) -> the submitted Job runs -> status and logs from its pod."""
    if not _fetch_available():
        pytest.skip("`kubetune fetch` (the storage CLI) is not available yet: the init containers cannot run")
    double = ApiServerDouble().start()
    try:
        backend = get_backend("kubernetes", kubeconfig=str(double.kubeconfig(tmp_path / "kubeconfig")), cache_seconds=0)
        ref = backend.submit(load_spec(_tiny_spec(s3, capitals)))
        staged = s3.client.get_object(Bucket=s3.bucket, Key="staging/tiny-k8s/data/capitals.jsonl")["Body"].read()
        assert staged == capitals.read_bytes()
        submitted = [double.get(CORE, "configmaps", "default", "tiny-k8s-spec"), double.get("batch/v1", "jobs", "default", "tiny-k8s")]
        assert s3.secret not in json.dumps(submitted) and str(capitals) not in json.dumps(submitted)

        (pod,) = PodExecutor(submitted, workdir=tmp_path / "cluster", secrets=_secrets(s3), bin_dirs=[BIN], extra_env=OFFLINE, timeout=500).run()
        assert pod.ok, pod.describe()
        assert (pod.host_path(C.K8S_DATA_DIR) / "capitals.jsonl").read_bytes() == capitals.read_bytes()
        run = pod.host_path(C.K8S_OUTPUT_DIR)
        assert (run / C.DONE_FILE).is_file() and (run / C.ADAPTER_DIR).is_dir()
        assert json.loads((run / C.STATUS_FILE).read_text())["state"] == C.STATE_SUCCEEDED

        # what the kubelet and the Job controller would report, from what really ran
        job = double.get("batch/v1", "jobs", "default", "tiny-k8s")
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        kubelet_pod = make_pod("tiny-k8s-x7k2p", job["spec"]["template"]["metadata"]["labels"], main="worker", phase="Succeeded",
                               init=[("fetch-data", done)], main_state=done, owner=job)
        double.add_pod("default", kubelet_pod, logs={"fetch-data": pod.output("fetch-data"), "worker": pod.output("worker")})
        double.set_status("batch/v1", "jobs", "default", "tiny-k8s", {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
        st = backend.status(ref)
        assert (st.state, st.step, st.total_steps) == (C.STATE_SUCCEEDED, 4, 4)
        assert st.loss is not None
        assert any(line.startswith("[fetch-data] ") for line in backend.logs(ref))
    finally:
        double.stop()


@pytest.mark.slow
def test_two_node_job_trains_with_torchrun(s3, capitals, tmp_path):
    """Issue 7: the job flavour's Indexed Job + headless Service rendezvous, two pods of one process each."""
    if not _fetch_available():
        pytest.skip("`kubetune fetch` (the storage CLI) is not available yet: the init containers cannot run")
    job = load_spec(_tiny_spec(s3, capitals, nodes=2))
    stage_inputs(job)
    objects = render(job, "job")
    main = objects[-1]["spec"]["template"]["spec"]["containers"][0]
    assert main["command"] == ["python", "-m", "kubetune.launch"] and "--node-rank=$(NODE_RANK)" in main["args"]
    pods = PodExecutor(objects, workdir=tmp_path / "cluster", secrets=_secrets(s3), bin_dirs=[BIN], extra_env=OFFLINE, timeout=500).run()
    assert all(p.ok for p in pods), "\n\n".join(p.describe() for p in pods)
    run = pods[0].host_path(C.K8S_OUTPUT_DIR)  # rank 0 writes the run directory
    assert (run / C.DONE_FILE).is_file()
    status = json.loads((run / C.STATUS_FILE).read_text())
    assert status["state"] == C.STATE_SUCCEEDED
    # the two pods trained as one job of two ranks (not two jobs of one): rank 0 saw world size 2, planned the
    # global batch over both, and both pods' ranks took every step
    assert status["extra"]["world_size"] == 2 and status["step"] == status["total_steps"]
    assert "x 2 process(es)" in pods[0].output("worker")
    assert not (pods[1].host_path(C.K8S_OUTPUT_DIR) / C.DONE_FILE).exists()
    assert C.EVENT_LINE_PREFIX not in pods[1].output("worker")  # only rank 0 reports; its log is the record


@pytest.mark.slow
def test_tiny_job_runs_its_staged_preprocess_code_in_the_pod(s3, capitals, tmp_path):
    """dataset.preprocess with a local file: staged beside the dataset, named by the spec in the ConfigMap, fetched
    and run by the worker in the pod (no init container), and the model trains on what it returned."""
    if not _fetch_available():
        pytest.skip("`kubetune fetch` (the storage CLI) is not available yet: the init containers cannot run")
    code = tmp_path / "prep.py"
    code.write_text("def keep_odd(rows):\n    return [row for i, row in enumerate(rows) if i % 2]\n")
    spec = _tiny_spec(s3, capitals)
    spec["dataset"] = {"source": str(capitals), "preprocess": {"file": str(code), "function": "keep_odd"}}
    job = load_spec(spec)
    stage_inputs(job)
    assert s3.client.get_object(Bucket=s3.bucket, Key="staging/tiny-k8s/preprocess/prep.py")["Body"].read() == code.read_bytes()
    objects = render(job, "job")
    (pod,) = PodExecutor(objects, workdir=tmp_path / "cluster", secrets=_secrets(s3), bin_dirs=[BIN], extra_env=OFFLINE, timeout=500).run()
    assert pod.ok, pod.describe()
    total = len(capitals.read_text().splitlines())
    # (the executor runs the pod's paths under its volume folders: /workspace/data is pod.host_path of it)
    assert f"preprocessed {pod.host_path(C.K8S_DATA_DIR)} with prep.py:keep_odd: {total} rows in, {total // 2} rows out" in pod.output("worker")
    result = json.loads((pod.host_path(C.K8S_OUTPUT_DIR) / C.RESULT_FILE).read_text())
    assert result["data"]["rows"] == total // 2
