"""`kubetune cluster check` against the API double: what it finds installed, which flavours and features that
enables, what the caller may create (SelfSubjectAccessReviews), and one clear error for a bad login."""

from __future__ import annotations

import json

import pytest
import yaml

from .apiserver_double import ApiServerDouble
from .cli_process import run_kubetune

EVERYTHING = ("kubeflow.org/v1", "trainer.kubeflow.org/v1alpha1", "kueue.x-k8s.io/v1beta1", "kaito.sh/v1beta1")


def _double(crds, namespaces=("default", "team-a", "kubeflow")):
    return ApiServerDouble(crds=crds, namespaces=namespaces).start()


@pytest.fixture
def full():
    d = _double(EVERYTHING)
    d.add_object("v1", "services", "kubeflow", {"metadata": {"name": "ml-pipeline"}, "spec": {"ports": [{"port": 8888}]}})
    d.add_object("kueue.x-k8s.io/v1beta1", "localqueues", "team-a", {"metadata": {"name": "gpu"}, "spec": {"clusterQueue": "cq"}})
    d.add_object("trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes", "", {"metadata": {"name": "torch-distributed"}})
    yield d
    d.stop()


def _check(double, tmp_path, *args, namespace="team-a"):
    cfg = str(double.kubeconfig(tmp_path / "kubeconfig", namespace=namespace))
    return run_kubetune("cluster", "check", *args, env={"KUBECONFIG": cfg})


def _by(items, key):
    return {i[key]: i for i in items}


def test_a_full_cluster_enables_every_flavour_and_feature(full, tmp_path):
    r = _check(full, tmp_path, "-o", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["namespace"] == "team-a"  # the kubeconfig context's
    components = _by(report["components"], "name")
    assert {n: c["installed"] for n, c in components.items()} == {
        "Kubeflow Trainer": True, "Kubeflow training-operator": True, "Kaito": True, "Kueue": True, "Kubeflow Pipelines": True}
    assert components["Kubeflow Trainer"]["api"] == "trainer.kubeflow.org/v1alpha1"
    assert components["Kubeflow Trainer"]["runtimes"] == ["torch-distributed"]
    assert components["Kubeflow Pipelines"]["api"] == "service/ml-pipeline in kubeflow"
    flavours = _by(report["flavours"], "flavour")
    assert {f: (v["available"], v["allowed"]) for f, v in flavours.items()} == {
        "job": (True, True), "pytorchjob": (True, True), "trainjob": (True, True), "kaito": (True, True)}
    features = _by(report["features"], "feature")
    assert features["queues"]["available"] is True and features["queues"]["local_queues"] == ["gpu"]
    assert "kubernetes.queue: gpu" in features["queues"]["note"]
    assert features["kfp remote"]["available"] is True
    # the permissions were asked of the API server, for this namespace
    assert ("create", "batch", "jobs", "team-a") in full.reviews
    assert ("create", "trainer.kubeflow.org", "trainjobs", "team-a") in full.reviews
    assert ("get", "", "pods/log", "team-a") in full.reviews
    # it only reads: nothing was created
    assert not [p for m, p in full.requests if m in ("POST", "PATCH", "DELETE") and "selfsubjectaccessreviews" not in p]


def test_the_table_and_yaml_say_the_same(full, tmp_path):
    r = _check(full, tmp_path, "-n", "default")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("cluster http://127.0.0.1:") and lines[0].endswith("namespace default")
    row = next(line for line in lines if line.startswith("Kubeflow Trainer"))
    assert row.split()[2:4] == ["yes", "trainer.kubeflow.org/v1alpha1"]
    assert next(line for line in lines if line.startswith("trainjob")).split()[1:3] == ["yes", "yes"]
    queues = next(line for line in lines if line.startswith("queues"))
    assert "no LocalQueue in 'default'" in queues and "cluster init -n default --queue" in queues  # the gpu queue is team-a's
    r = _check(full, tmp_path, "-n", "default", "-o", "yaml")
    assert _by(yaml.safe_load(r.stdout)["features"], "feature")["queues"]["available"] is False


def test_a_bare_cluster_offers_the_job_flavour_only(tmp_path):
    d = _double(crds=(), namespaces=("default",))
    try:
        r = _check(d, tmp_path, "-o", "json", namespace="default")
    finally:
        d.stop()
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert not any(c["installed"] for c in report["components"])
    flavours = _by(report["flavours"], "flavour")
    assert flavours["job"]["available"] and flavours["job"]["allowed"]
    assert flavours["pytorchjob"] == {"flavour": "pytorchjob", "available": False, "allowed": None, "missing": [], "needs": "Kubeflow training-operator"}
    features = _by(report["features"], "feature")
    assert features["queues"]["available"] is False and "install Kueue" in features["queues"]["note"]
    assert features["kfp remote"]["available"] is False


def test_what_the_caller_may_not_create_is_named(full, tmp_path):
    full.forbidden |= {("create", "jobs"), ("get", "pods/log")}
    r = _check(full, tmp_path, "-o", "json")
    assert r.returncode == 0, r.stderr
    job = _by(json.loads(r.stdout)["flavours"], "flavour")["job"]
    assert job["allowed"] is False and job["missing"] == ["create jobs.batch", "get pods/log"]
    r = _check(full, tmp_path)
    assert "missing: create jobs.batch, get pods/log" in next(line for line in r.stdout.splitlines() if line.startswith("job "))


def test_what_cannot_be_read_is_unknown_not_missing(full, tmp_path):
    full.discovery_forbidden.add("kaito.sh/v1beta1")
    full.forbidden.add(("get", "services"))
    r = _check(full, tmp_path, "-o", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    components = _by(report["components"], "name")
    assert components["Kaito"]["installed"] is None and components["Kubeflow Pipelines"]["installed"] is None
    assert _by(report["flavours"], "flavour")["kaito"]["available"] is None


def test_bad_credentials_and_bad_options_exit_2_without_traceback(full, tmp_path):
    cfg = str(full.kubeconfig(tmp_path / "kc", token="wrong"))
    r = run_kubetune("cluster", "check", env={"KUBECONFIG": cfg})
    assert r.returncode == 2 and "401 Unauthorized" in r.stderr and "Traceback" not in r.stderr
    full.forbidden.add(("get", "discovery"))
    r = _check(full, tmp_path)
    assert r.returncode == 2 and "refused its list of API groups (/apis)" in r.stderr and "system:discovery" in r.stderr
    r = _check(full, tmp_path, "-o", "xml")
    assert r.returncode == 2 and "-o/--output" in r.stderr


def test_trainer_without_its_default_runtime_is_noted(tmp_path):
    d = _double(EVERYTHING)
    d.add_object("trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes", "", {"metadata": {"name": "my-torch"}})
    try:
        r = _check(d, tmp_path, "-o", "json")
        table = _check(d, tmp_path)
    finally:
        d.stop()
    trainjob = _by(json.loads(r.stdout)["flavours"], "flavour")["trainjob"]
    assert trainjob["available"] is True  # a spec may name its own runtime
    assert "no ClusterTrainingRuntime torch-distributed" in trainjob["note"] and "(my-torch)" in trainjob["note"]
    assert "no ClusterTrainingRuntime torch-distributed" in next(line for line in table.stdout.splitlines() if line.startswith("trainjob"))
