"""`kubetune deliver SRC DEST --backend kubernetes`: the rendered Job validates and holds no credential; against
the API double, the CLI creates it and follows its pod's log to the end while the pod executor runs the rendered
container for real (http:// source, the loopback S3 server as destination, S3 keys only through the Secret)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import yaml

from kubetune import constants as C

from _support.pod_executor import PodExecutor

from .apiserver_double import ApiServerDouble, make_pod
from .cli_process import run_kubetune
from .k8s_validate import validate_all

BIN = Path(sys.executable).parent
SECRET = "s3-credentials"


def test_render_is_a_valid_job_with_secret_references_only():
    r = run_kubetune("deliver", "hf://org/model", "s3://models/org-model", "--backend", "kubernetes", "--render", "-n", "ml-team",
                     "--name", "deliver-model", "--secret", SECRET, "--secret-env", "HF_TOKEN=hf-token:token",
                     "--env", "AWS_ENDPOINT_URL=http://minio.minio:9000", "--retries", "5", "--disk", "100Gi", probe=True,
                     env={"HF_TOKEN": "hf_NeverPrintedValue123", "AWS_SECRET_ACCESS_KEY": "never-printed-either"})
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stderr  # no cluster, no kubernetes client, no torch
    assert "hf_NeverPrintedValue123" not in r.stdout and "never-printed-either" not in r.stdout
    (job,) = list(yaml.safe_load_all(r.stdout))
    validate_all([job])
    assert job["metadata"]["namespace"] == "ml-team" and job["spec"]["backoffLimit"] == 5
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["kubetune", "deliver", "hf://org/model", "s3://models/org-model"]
    assert c["envFrom"] == [{"secretRef": {"name": SECRET}}]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.minio:9000"
    assert pod["volumes"] == [{"name": "workspace", "emptyDir": {"sizeLimit": "100Gi"}}] and pod["restartPolicy"] == "Never"
    # without -n the Job names no namespace: kubectl apply puts it in the current one
    r = run_kubetune("deliver", "hf://org/model", "s3://models/org-model", "--backend", "kubernetes", "--render", "-o", "json")
    (job,) = json.loads(r.stdout)["items"]
    assert "namespace" not in job["metadata"] and job["metadata"]["name"].startswith("deliver-")
    validate_all([job])


def test_render_refuses_what_would_leak_or_cannot_work():
    base = ("deliver", "https://example.com/d.jsonl", "s3://b/p", "--backend", "kubernetes", "--render")
    r = run_kubetune(*base, "--env", "AWS_SECRET_ACCESS_KEY=abc")
    assert r.returncode == 2 and "a credential would be written into the Job" in r.stderr and "abc" not in r.stderr
    r = run_kubetune("deliver", "https://user:pw@example.com/d.jsonl", "s3://b/p", "--backend", "kubernetes", "--render")
    assert r.returncode == 2 and "SRC carries credentials" in r.stderr and "pw@" not in r.stderr
    r = run_kubetune("deliver", "./local-model", "s3://b/p", "--backend", "kubernetes", "--render")
    assert r.returncode == 2 and "a pod in the cluster cannot read" in r.stderr and "Traceback" not in r.stderr


def _controller(double: ApiServerDouble, workdir: Path, secrets: dict, result: dict, before: list) -> None:
    """Plays the Job controller and the kubelet: once the Job exists, its pod runs for real (PodExecutor), then the
    pod, its log and the Job's end are reported through the API as a cluster would. ``before``: one callable per
    attempt, run before it (a failed attempt is followed by the next one, as backoffLimit allows)."""
    deadline = time.time() + 120
    while time.time() < deadline and not double.names("batch/v1", "jobs", "default"):
        time.sleep(0.1)
    (name,) = double.names("batch/v1", "jobs", "default")
    job = double.get("batch/v1", "jobs", "default", name)
    result["pods"] = []
    for attempt, prepare in enumerate(before or [lambda: None], start=1):
        prepare()
        (pod,) = PodExecutor([job], workdir=workdir / f"attempt-{attempt}", secrets=secrets, bin_dirs=[BIN], timeout=240).run()
        result["pods"].append(pod)
        state = {"terminated": {"exitCode": 0 if pod.ok else 1, "reason": "Completed" if pod.ok else "Error"}}
        double.add_pod("default", make_pod(f"{name}-{attempt}", job["spec"]["template"]["metadata"]["labels"], main=C.K8S_DELIVER_CONTAINER,
                                           phase="Succeeded" if pod.ok else "Failed", main_state=state, owner=job),
                       logs={C.K8S_DELIVER_CONTAINER: pod.output(C.K8S_DELIVER_CONTAINER)})
        time.sleep(1.0)  # the CLI sees the pod's end before the Job's (or the next pod), as it may on a cluster
        if pod.ok:
            break
    cond = {"type": "Complete", "status": "True"} if pod.ok else {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                                  "message": "Job has reached the specified backoff limit"}
    double.set_status("batch/v1", "jobs", "default", name, {"succeeded" if pod.ok else "failed": 1, "conditions": [cond]})


def _deliver_in_cluster(tmp_path, s3, src: str, dest: str, before: list | None = None):
    double = ApiServerDouble().start()
    result: dict = {}
    secrets = {SECRET: {"AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": s3.secret}}
    thread = threading.Thread(target=_controller, args=(double, tmp_path / "cluster", secrets, result, before or []), daemon=True)
    thread.start()
    try:
        env = {"KUBECONFIG": str(double.kubeconfig(tmp_path / "kubeconfig"))}
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the CLI's machine has none: only the pod gets them
            env[var] = ""
        r = run_kubetune("deliver", src, dest, "--backend", "kubernetes", "--secret", SECRET,
                         "--env", f"AWS_ENDPOINT_URL={s3.endpoint}", "--env", "AWS_DEFAULT_REGION=us-east-1", env=env)
        thread.join(timeout=60)
        created = double.get("batch/v1", "jobs", "default", double.names("batch/v1", "jobs", "default")[0])
    finally:
        double.stop()
    return r, created, result["pods"]


def test_the_job_runs_the_copy_and_the_cli_follows_it_to_the_end(s3, http_server, tmp_path):
    body = b"".join(b'{"text": "row %d"}\n' % i for i in range(5000))
    (http_server.root / "corpus.jsonl").write_bytes(body)
    r, job, (pod,) = _deliver_in_cluster(tmp_path, s3, f"{http_server.url}/corpus.jsonl", s3.uri("datasets/corpus"))
    assert pod.ok, pod.describe()
    assert r.returncode == 0, r.stderr
    assert s3.secret not in json.dumps(job)  # the key reached the pod through the Secret only
    # what the pod printed, followed by the CLI until the Job ended
    assert f"job/{job['metadata']['name']} created in namespace default" in r.stdout
    for line in (f"deliver: fetching {http_server.url}/corpus.jsonl", "deliver: verified 1 file(s)", "deliver: complete: "):
        assert line in r.stdout
    assert r.stdout.count("deliver: complete: ") == 1  # each log line once, though the log was read repeatedly
    mib = f"{len(body) / 2**20:.1f} MiB"
    assert f"fetch {http_server.url}/corpus.jsonl: {mib} of {mib}" in r.stdout  # byte progress as log lines, not a bar
    assert s3.client.get_object(Bucket=s3.bucket, Key="datasets/corpus/corpus.jsonl")["Body"].read() == body
    marker = json.loads(s3.client.get_object(Bucket=s3.bucket, Key=f"datasets/corpus/{C.DELIVER_MARKER}")["Body"].read())
    assert marker["files"]["corpus.jsonl"]["size"] == len(body)


def test_a_failed_job_is_one_error_after_its_log(s3, http_server, tmp_path):
    r, job, (pod,) = _deliver_in_cluster(tmp_path, s3, f"{http_server.url}/missing.jsonl", s3.uri("datasets/none"))
    assert not pod.ok
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"job/{job['metadata']['name']} failed in namespace default: BackoffLimitExceeded" in r.stderr
    assert "404" in r.stdout  # the pod's own error line, from its log
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix="datasets/none/").get("Contents", [])
    assert not listed  # nothing was written, and no marker claims otherwise


def test_a_failed_attempt_is_followed_by_the_next_pod(s3, http_server, tmp_path):
    """The first pod finds no file yet and fails; the Job starts another (backoffLimit), which delivers it."""
    late = http_server.root / "late.jsonl"
    r, job, pods = _deliver_in_cluster(tmp_path, s3, f"{http_server.url}/late.jsonl", s3.uri("datasets/late"),
                                       before=[lambda: None, lambda: late.write_bytes(b'{"text": "here now"}\n')])
    assert [p.ok for p in pods] == [False, True]
    assert r.returncode == 0, r.stderr
    name = job["metadata"]["name"]
    first, second = r.stdout.index("404"), r.stdout.index(f"attempt 2: pod {name}-2")
    assert first < second < r.stdout.index("deliver: complete: ")
    assert r.stdout.count(f"deliver: fetching {http_server.url}/late.jsonl") == 2  # once per attempt, never repeated
    assert s3.client.get_object(Bucket=s3.bucket, Key="datasets/late/late.jsonl")["Body"].read() == b'{"text": "here now"}\n'


def test_a_pod_that_cannot_start_is_reported_while_the_job_waits(tmp_path):
    """An image that cannot be pulled keeps the Job pending (it never fails by itself): the CLI says why, once."""
    double = ApiServerDouble().start()

    def kubelet() -> None:
        while not double.names("batch/v1", "jobs", "default"):
            time.sleep(0.05)
        (name,) = double.names("batch/v1", "jobs", "default")
        job = double.get("batch/v1", "jobs", "default", name)
        waiting = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/kubetune:nope"'}}
        double.add_pod("default", make_pod(f"{name}-1", job["spec"]["template"]["metadata"]["labels"], main=C.K8S_DELIVER_CONTAINER,
                                           phase="Pending", main_state=waiting, owner=job))
        time.sleep(3)  # the CLI polls a few times meanwhile
        double.set_status("batch/v1", "jobs", "default", name, {"failed": 1, "conditions": [
            {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline"}]})

    thread = threading.Thread(target=kubelet, daemon=True)
    thread.start()
    try:
        r = run_kubetune("deliver", "hf://org/model", "s3://models/m", "--backend", "kubernetes", "--image", "registry.example/kubetune:nope",
                         env={"KUBECONFIG": str(double.kubeconfig(tmp_path / "kubeconfig"))})
    finally:
        double.stop()
    assert r.returncode == 2 and "DeadlineExceeded" in r.stderr
    said = [line for line in r.stdout.splitlines() if "is waiting" in line]
    assert len(said) == 1 and said[0].endswith('is waiting: ImagePullBackOff: Back-off pulling image "registry.example/kubetune:nope"')
