"""The backend with the real ``kubernetes`` client against the API server double (apiserver_double.py).

create -> status from conditions and the worker's log -> logs -> cancel, then the error cases and the
failure diagnoses a user would otherwise dig out of ``kubectl describe``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetune import Client
from kubetune import constants as C
from kubetune.backends import get_backend
from kubetune.errors import BackendError, JobNotFound
from kubetune.events import event_line, make_event
from kubetune.spec import load_spec

from . import specs
from .apiserver_double import CORE, ApiServerDouble, make_pod

JOBS = ("batch/v1", "jobs")
PTJ = ("kubeflow.org/v1", "pytorchjobs")
TJ = ("trainer.kubeflow.org/v1alpha1", "trainjobs")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def double():
    d = ApiServerDouble().start()
    yield d
    d.stop()


@pytest.fixture
def kubeconfig(double, tmp_path):
    return str(double.kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def backend(kubeconfig):
    return get_backend("kubernetes", kubeconfig=kubeconfig, cache_seconds=0)


def _job(variant: str = "cpu", *overrides: str):
    return load_spec(specs.spec(variant), list(overrides))


def _worker_log(*events: dict, noise: str = "loading model...\n") -> str:
    return noise + "".join(event_line(ev) + "\n" for ev in events)


def _running_pod(double, workload: dict, *, logs: str, flavor: str = "job", index: str = "0", **kw) -> dict:
    labels = {C.LABEL_JOB: workload["metadata"]["name"], C.LABEL_FLAVOR: flavor, C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE}
    name = f"{workload['metadata']['name']}-{index}-abcde"
    pod = make_pod(
        name, labels, main=C.K8S_MAIN_CONTAINER[flavor], init=[("fetch-data", {"terminated": {"exitCode": 0, "reason": "Completed"}})],
        annotations={C.ANNOTATION_COMPLETION_INDEX: index}, owner=workload, **kw,
    )
    return double.add_pod(workload["metadata"]["namespace"], pod, logs={"fetch-data": "fetched 1 file\n", C.K8S_MAIN_CONTAINER[flavor]: logs})


# --- the happy path ---------------------------------------------------------------------------
def test_create_status_logs_cancel(double, backend):
    ref = backend.submit(_job("cpu"))
    assert (ref.id, ref.backend, ref.extra["namespace"], ref.extra["flavor"]) == ("tune-demo", "kubernetes", "default", "job")
    job = double.get(*JOBS, "default", "tune-demo")
    cm = double.get(CORE, "configmaps", "default", "tune-demo-spec")
    assert job["metadata"]["labels"][C.LABEL_RUN_ID] == ref.extra["run_id"]
    # the ConfigMap is owned by the Job, so the Job's TTL and deletion clean it up
    assert cm["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert load_spec(yaml.safe_load(cm["data"][C.K8S_SPEC_KEY])).name == "tune-demo"

    st = backend.status(ref)
    assert st.state == C.STATE_PENDING and st.job_id == "tune-demo"

    log = _worker_log(
        make_event("state", "running", state="running"),
        make_event("stage", "training", stage="train"),
        make_event("metrics", "step 3/5", step=3, total_steps=5, loss=1.25, eta_seconds=4.0),
    )
    _running_pod(double, job, logs=log)
    double.set_status(*JOBS, "default", "tune-demo", {"active": 1, "ready": 1})
    st = backend.status(ref)
    assert (st.state, st.stage, st.step, st.total_steps, st.loss) == ("running", "train", 3, 5, 1.25)
    assert [e["type"] for e in backend.events(ref)] == ["state", "stage", "metrics"]

    lines = list(backend.logs(ref))
    assert lines[0] == "[fetch-data] fetched 1 file"
    assert lines[1] == "loading model..." and lines[-1].startswith(C.EVENT_LINE_PREFIX)
    assert list(backend.logs(ref, follow=True)) == log.splitlines()  # streamed from the pod's log

    double.set_status(*JOBS, "default", "tune-demo", {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
    assert Client("kubernetes", kubeconfig=backend._kubeconfig, cache_seconds=0).status("tune-demo").state == C.STATE_SUCCEEDED

    backend.cancel(ref)
    assert double.get(*JOBS, "default", "tune-demo") is None
    assert double.get(CORE, "configmaps", "default", "tune-demo-spec") is None
    assert double.names(CORE, "pods", "default") == []  # owned by the Job: collected with it
    assert any(m == "PATCH" for m, _ in double.requests)  # marked cancelled before the delete
    assert backend.status(ref).state == C.STATE_CANCELLED
    with pytest.raises(JobNotFound, match="no kubetune job 'tune-demo' in namespace 'default'"):
        get_backend("kubernetes", kubeconfig=backend._kubeconfig).status("tune-demo")


def test_pvc_is_kept_and_reused(double, backend):
    job = _job("gpu-pvc", "kubernetes.namespace=team-a")
    ref = backend.submit(job)
    assert double.get(CORE, "persistentvolumeclaims", "team-a", "tune-demo-workspace")["metadata"].get("ownerReferences") is None
    backend.cancel(ref)
    assert double.get(CORE, "persistentvolumeclaims", "team-a", "tune-demo-workspace") is not None  # results and checkpoints stay
    backend.submit(job)  # the same name again: the PVC is reused (resume from its checkpoints)
    assert double.get(*JOBS, "team-a", "tune-demo") is not None


@pytest.mark.parametrize("flavor, gvp", [("pytorchjob", PTJ), ("trainjob", TJ)])
def test_operator_flavours(double, kubeconfig, flavor, gvp):
    backend = get_backend("kubernetes", kubeconfig=kubeconfig, flavor=flavor)
    ref = backend.submit(_job("cpu"))
    obj = double.get(*gvp, "default", "tune-demo")
    assert obj["kind"] == {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}[flavor]
    done = "Succeeded" if flavor == "pytorchjob" else "Complete"
    double.set_status(*gvp, "default", "tune-demo", {"conditions": [{"type": "Running", "status": "False"}, {"type": done, "status": "True"}]})
    assert backend.status(ref).state == C.STATE_SUCCEEDED
    refs = backend.list()
    assert [(r.id, r.extra["flavor"]) for r in refs] == [("tune-demo", flavor)]


def test_trainjob_progress_from_trainer_status(double, kubeconfig):
    backend = get_backend("kubernetes", kubeconfig=kubeconfig, flavor="trainjob")
    ref = backend.submit(_job("cpu"))
    double.set_status(*TJ, "default", "tune-demo", {
        "jobsStatus": [{"name": "node", "active": 1, "ready": 1, "failed": 0, "succeeded": 0, "suspended": 0}],
        "trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 90, "metrics": [{"name": "loss", "value": "0.75"}]},
    })
    st = backend.status(ref)
    assert (st.state, st.loss, st.eta_seconds, st.extra["progress_percentage"]) == ("running", 0.75, 90, 40)


def test_list_newest_first_and_resolve(double, backend, kubeconfig):
    backend.submit(_job("cpu", "name=older"))
    get_backend("kubernetes", kubeconfig=kubeconfig, flavor="pytorchjob").submit(_job("cpu", "name=newer"))
    double.crds.discard("trainer.kubeflow.org/v1alpha1")  # a cluster without Kubeflow Trainer is fine for list
    assert [r.id for r in backend.list()] == ["newer", "older"]
    assert backend.resolve("newer").extra["flavor"] == "pytorchjob"
    with pytest.raises(JobNotFound):
        backend.resolve("missing")


# --- errors ------------------------------------------------------------------------------------
def test_missing_operator_says_what_to_install(kubeconfig, double):
    double.crds.clear()
    for flavor, what in (("pytorchjob", "Kubeflow training operator"), ("trainjob", "Kubeflow Trainer v2")):
        with pytest.raises(BackendError) as e:
            get_backend("kubernetes", kubeconfig=kubeconfig, flavor=flavor).submit(_job("cpu"))
        text = str(e.value)
        assert "no matches for kind" in text and what in text and "--flavor job" in text
    assert double.names(CORE, "configmaps", "default") == []  # nothing left behind


def test_forbidden_names_verb_and_resource(double, backend):
    double.forbidden.add(("create", "jobs"))
    with pytest.raises(BackendError) as e:
        backend.submit(_job("cpu"))
    assert "you may not create jobs in namespace 'default' (RBAC)" in str(e.value)
    assert "deploy/rbac.yaml" in str(e.value)


def test_already_exists(backend):
    backend.submit(_job("cpu"))
    with pytest.raises(BackendError) as e:
        backend.submit(_job("cpu"))
    assert "Job 'tune-demo' already exists in namespace 'default'" in str(e.value)
    assert "kubetune cancel tune-demo" in str(e.value)


def test_unauthorized(double, tmp_path):
    cfg = double.kubeconfig(tmp_path / "bad", token="wrong")
    with pytest.raises(BackendError, match=r"rejected the credentials \(401"):
        get_backend("kubernetes", kubeconfig=str(cfg)).list()


def test_missing_namespace(kubeconfig):
    with pytest.raises(BackendError, match="namespace 'nope' does not exist"):
        get_backend("kubernetes", kubeconfig=kubeconfig, namespace="nope").submit(_job("cpu"))


def test_unreachable_api_server(double, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = double.kubeconfig(tmp_path / "dead")
    cfg.write_text(cfg.read_text().replace(double.url, f"http://127.0.0.1:{port}"))
    with pytest.raises(BackendError) as e:
        get_backend("kubernetes", kubeconfig=str(cfg)).list()
    assert f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}" in str(e.value)


def test_no_configuration(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(BackendError, match="no Kubernetes configuration found"):
        get_backend("kubernetes").list()


def test_spec_errors_come_before_any_call(double, backend, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    with pytest.raises(Exception, match="kubernetes.staging_uri"):
        backend.submit(load_spec(specs.spec("cpu", dataset={"source": str(data)})))
    assert double.requests == []


# --- diagnosis ---------------------------------------------------------------------------------
def _failed(double, ns="default"):
    double.set_status(*JOBS, ns, "tune-demo", {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]})


def test_oom_killed(double, backend):
    ref = backend.submit(_job("cpu"))
    job = double.get(*JOBS, "default", "tune-demo")
    _running_pod(double, job, logs="", phase="Failed", limits={"memory": "4Gi"}, main_state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    _failed(double)
    st = backend.status(ref)
    assert st.state == C.STATE_FAILED
    assert "OOMKilled, limit 4Gi" in st.reason and "resources.memory" in st.reason and "training.batch_size" in st.reason
    assert st.extra["exit_code"] == 137


def test_image_pull_back_off(double, backend):
    ref = backend.submit(_job("cpu"))
    job = double.get(*JOBS, "default", "tune-demo")
    pod = make_pod("tune-demo-0-x", {C.LABEL_JOB: "tune-demo", C.LABEL_FLAVOR: "job"}, main="worker", phase="Pending",
                   main_state={"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/kubetune/kubetune:0.1.0"'}}, owner=job)
    double.add_pod("default", pod)
    st = backend.status(ref)
    assert st.state == C.STATE_PENDING
    assert "cannot pull image" in st.reason and "kubernetes.image_pull_secrets" in st.reason


def test_unschedulable_names_the_resource_and_queue(double, backend):
    ref = backend.submit(_job("amd-2x4", "kubernetes.queue=gpu-queue"))
    job = double.get(*JOBS, "default", "tune-demo")
    cond = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient amd.com/gpu."}]
    double.add_pod("default", make_pod("tune-demo-0-x", {C.LABEL_JOB: "tune-demo", C.LABEL_FLAVOR: "job"}, main="worker", phase="Pending", conditions=cond, main_state={"waiting": {"reason": "PodInitializing"}}, owner=job))
    double.set_status(*JOBS, "default", "tune-demo", {"active": 1})  # the Job controller counts waiting pods as active
    st = backend.status(ref)
    assert st.state == C.STATE_PENDING
    assert "no node has enough free amd.com/gpu" in st.reason and "resources.accelerator_type" in st.reason
    assert "Kueue queue 'gpu-queue'" in st.reason


def test_waiting_for_kueue(double, backend):
    ref = backend.submit(_job("cpu", "kubernetes.queue=team-queue"))
    double.set_status(*JOBS, "default", "tune-demo", {"conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended"}]})
    st = backend.status(ref)
    assert (st.state, st.reason) == ("pending", "waiting for Kueue to admit it from queue 'team-queue'")


def test_missing_secret(double, backend):
    ref = backend.submit(_job("gpu-pvc", "kubernetes.namespace=default"))
    job = double.get(*JOBS, "default", "tune-demo")
    waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}
    double.add_pod("default", make_pod("tune-demo-0-x", {C.LABEL_JOB: "tune-demo", C.LABEL_FLAVOR: "job"}, main="worker", phase="Pending",
                                       init=[("fetch-model", waiting)], main_state={"waiting": {"reason": "PodInitializing"}}, owner=job))
    assert "kubectl create secret generic hf-token" in backend.status(ref).reason


def test_failed_fetch_quotes_its_log(double, backend):
    ref = backend.submit(_job("cpu"))
    job = double.get(*JOBS, "default", "tune-demo")
    pod = make_pod("tune-demo-0-x", {C.LABEL_JOB: "tune-demo", C.LABEL_FLAVOR: "job"}, main="worker", phase="Failed",
                   init=[("fetch-data", {"terminated": {"exitCode": 2, "reason": "Error"}})], main_state={"waiting": {"reason": "PodInitializing"}}, owner=job)
    double.add_pod("default", pod, logs={"fetch-data": "error: s3://datasets/capitals/capitals.jsonl: access denied (403)\n"})
    _failed(double)
    st = backend.status(ref)
    assert "fetching the data failed in init container fetch-data" in st.reason
    assert "access denied (403)" in st.reason


def test_crash_quotes_the_last_lines_and_worker_reason_wins(double, backend):
    ref = backend.submit(_job("cpu"))
    job = double.get(*JOBS, "default", "tune-demo")
    crash = "Traceback (most recent call last):\n  File \"x.py\"\nRuntimeError: boom\n"
    _running_pod(double, job, logs=crash, phase="Failed", main_state={"terminated": {"exitCode": 1, "reason": "Error"}})
    _failed(double)
    st = backend.status(ref)
    assert "the worker in pod tune-demo-0-abcde exited with code 1" in st.reason and "RuntimeError: boom" in st.reason
    # when the worker recorded its own error, that is the reason
    double.logs[("default", "tune-demo-0-abcde", "worker")] = _worker_log(
        make_event("error", "dataset.source: row 3 is not valid JSON"),
        make_event("state", "failed", state="failed", reason="dataset.source: row 3 is not valid JSON"),
    )
    assert backend.status(ref).reason == "dataset.source: row 3 is not valid JSON"


def test_an_evicted_worker_that_saved_its_checkpoint_is_preempted_not_failed(double, backend):
    """The kubelet's SIGTERM: the worker checkpoints, records `preempted` and exits 143; the Job then fails."""
    ref = backend.submit(_job("cpu"))
    job = double.get(*JOBS, "default", "tune-demo")
    reason = "preempted (SIGTERM): saved checkpoint-37 at step 37; rerun the same spec to resume"
    logs = _worker_log(
        make_event("checkpoint", "saved checkpoint-37", path="/workspace/output/checkpoints/checkpoint-37", step=37),
        make_event("state", "preempted", state=C.STATE_PREEMPTED, reason=reason, exit_code=143),
    )
    _running_pod(double, job, logs=logs, phase="Failed", main_state={"terminated": {"exitCode": 143, "reason": "Error"}})
    _failed(double)
    st = backend.status(ref)
    assert st.state == C.STATE_PREEMPTED and st.terminal
    assert st.reason == reason


# --- the CLI through the main app (KUBECONFIG points at the double) ------------------------------
def test_cli_run_status_cancel(double, kubeconfig, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(specs.spec("cpu")), encoding="utf-8")
    env = {**os.environ, "KUBECONFIG": kubeconfig}

    def kt(*args):
        return subprocess.run([sys.executable, "-m", "kubetune.cli", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)

    r = kt("run", str(spec), "--backend", "kubernetes", "--detach")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tune-demo"
    r = kt("status", "tune-demo", "--backend", "kubernetes", "--json")
    assert r.returncode == 0, r.stderr
    assert '"state": "pending"' in r.stdout
    r = kt("download", "tune-demo", str(tmp_path / "out"))
    assert r.returncode == 2 and "emptyDir workspace, which is gone with its pod" in r.stderr
    r = kt("cancel", "tune-demo", "--backend", "kubernetes")
    assert r.returncode == 0, r.stderr
    assert double.get(*JOBS, "default", "tune-demo") is None
    r = kt("status", "tune-demo", "--backend", "kubernetes")
    assert r.returncode == 2 and "no kubetune job 'tune-demo'" in r.stderr


def test_cli_namespace_and_context_reach_every_verb(double, tmp_path):
    """kubectl's -n/--namespace and --context on run, list, status, logs and cancel."""
    cfg = yaml.safe_load(double.kubeconfig(tmp_path / "kubeconfig").read_text())
    cfg["users"].append({"name": "stranger", "user": {"token": "not-the-token"}})
    cfg["contexts"].append({"name": "elsewhere", "context": {"cluster": "double", "user": "stranger"}})
    cfg["current-context"] = "elsewhere"  # the current context is refused (401): only --context double works
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(specs.spec("cpu")), encoding="utf-8")
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "kubeconfig")}

    def kt(*args):
        return subprocess.run([sys.executable, "-m", "kubetune.cli", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)

    cluster = ("--backend", "kubernetes", "--context", "double", "-n", "team-a")
    r = kt("run", str(spec), *cluster, "--detach")
    assert r.returncode == 0, r.stderr
    assert double.get(*JOBS, "team-a", "tune-demo") is not None and double.get(*JOBS, "default", "tune-demo") is None
    workload = double.get(*JOBS, "team-a", "tune-demo")
    _running_pod(double, workload, logs=_worker_log(make_event("state", "running", state="running"), make_event("stage", "training", stage="train")), phase="Running",
                 main_state={"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    double.set_status(*JOBS, "team-a", "tune-demo", {"active": 1, "ready": 1})
    r = kt("list", *cluster, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [j["job_id"] for j in yaml.safe_load(r.stdout)] == ["tune-demo"]
    assert kt("list", "--backend", "kubernetes", "--context", "double", "-o", "json").stdout.strip() == "[]"  # the context's namespace
    r = kt("status", "tune-demo", *cluster, "-o", "json")
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["state"] == "running", r.stderr
    r = kt("logs", "tune-demo", *cluster)
    assert r.returncode == 0 and "loading model" in r.stdout
    refused = kt("status", "tune-demo", "--backend", "kubernetes", "-n", "team-a")  # the current context's user
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    r = kt("cancel", "tune-demo", *cluster)
    assert r.returncode == 0 and double.get(*JOBS, "team-a", "tune-demo") is None, r.stderr
    local = kt("list", "-n", "team-a")
    assert local.returncode == 2 and "-n/--namespace applies to --backend kubernetes" in local.stderr


def test_a_job_seen_ending_reports_its_last_events_despite_the_cache(double, kubeconfig):
    """A follower polls status then events; when it sees the end it stops. Events cached while the job ran must not
    be what it gets then, or the worker's last lines (final metrics, the end) are lost for good."""
    backend = get_backend("kubernetes", kubeconfig=kubeconfig, cache_seconds=300)
    ref = backend.submit(_job("cpu"))
    job = double.get(*JOBS, "default", "tune-demo")
    assert backend.status(ref).state == C.STATE_PENDING and backend.events(ref) == []  # cached: no pod yet
    log = _worker_log(make_event("state", "running", state="running"), make_event("metrics", "done", step=5, total_steps=5, train_loss=0.5),
                      make_event("state", "succeeded", state="succeeded"))
    _running_pod(double, job, logs=log, phase="Succeeded", main_state={"terminated": {"exitCode": 0, "reason": "Completed"}})
    double.set_status(*JOBS, "default", "tune-demo", {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
    st = backend.status(ref)
    assert st.state == C.STATE_SUCCEEDED and st.step == 5
    assert [e["type"] for e in backend.events(ref)] == ["state", "metrics", "state"]


# --- results back --------------------------------------------------------------------------------
def _pvc_outputs(tmp_path) -> tuple[Path, bytes]:
    """What the finished job left in /workspace/output on its PVC, as the copy pod's tar | base64 prints it."""
    import base64
    import io
    import tarfile

    out = tmp_path / "pvc-output"
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    (out / C.DONE_FILE).write_text("1\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:  # what `ls -A | tar czf - -T -` packs
        for child in sorted(out.iterdir()):
            tar.add(child, arcname=child.name)
    return out, base64.b64encode(buf.getvalue()) + b"\n"


def test_download_from_the_pvc_through_a_copy_pod(double, backend, tmp_path):
    from kubetune.backends.kubernetes.download import data_access_pod

    from .k8s_validate import validate

    job = _job("gpu-pvc", "kubernetes.namespace=default", "output.uri=null")
    backend.submit(job)
    _, payload = _pvc_outputs(tmp_path)
    seen = []

    def exec_handler(ns, pod, argv):
        seen.append((pod, argv))
        return payload, b"", 0

    double.exec_handler, double.start_pods = exec_handler, True
    dest = backend.download("tune-demo", tmp_path / "results")
    assert (dest / "adapter" / "adapter_config.json").read_text() == '{"r": 8}'
    assert (dest / C.DONE_FILE).is_file()
    pod, argv = seen[0]
    assert pod == "tune-demo-download" and argv[:2] == ["sh", "-c"] and C.K8S_OUTPUT_DIR in argv[2]
    assert double.get(CORE, "pods", "default", "tune-demo-download") is None  # the copy pod is gone again
    validate(data_access_pod(job, claim="tune-demo-workspace", namespace="default"))


def test_download_failures_are_explained(double, backend, tmp_path):
    backend.submit(_job("gpu-pvc", "kubernetes.namespace=default", "output.uri=null"))
    double.start_pods = True
    double.exec_handler = lambda ns, pod, argv: (b"", b"no /workspace/output on the PVC\n", 3)
    with pytest.raises(BackendError, match=r"failed \(exit 3\): no /workspace/output on the PVC"):
        backend.download("tune-demo", tmp_path / "results")
    assert double.get(CORE, "pods", "default", "tune-demo-download") is None
    backend.cancel("tune-demo")
    backend.submit(_job("cpu"))  # emptyDir workspace, no output.uri
    with pytest.raises(BackendError, match="emptyDir workspace, which is gone with its pod"):
        backend.download("tune-demo", tmp_path / "results")


def test_download_from_the_output_uri(double, backend, s3, tmp_path):
    s3.client.put_object(Bucket=s3.bucket, Key="results/tune-demo/adapter/adapter_config.json", Body=b'{"r": 16}')
    backend.submit(_job("cpu", f"output.uri={s3.uri('results/tune-demo')}"))
    dest = backend.download("tune-demo", tmp_path / "results")
    assert (Path(dest) / "adapter" / "adapter_config.json").read_bytes() == b'{"r": 16}'
