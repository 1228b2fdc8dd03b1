"""The Helm charts in deploy/helm, rendered and linted by Helm's own engine (helm-python-sdk binds Helm's Go SDK;
no helm binary), every object validated strictly, and the job chart's launcher run against the API double."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm  # the test extra installs helm-python-sdk (Helm's Go SDK; no helm binary)
import pytest
import yaml

from kubetune import __version__
from kubetune import constants as C
from kubetune.backends.kubernetes import render
from kubetune.backends.kubernetes.cluster import RBAC_RULES
from kubetune.spec import load_spec

from .apiserver_double import ApiServerDouble
from .cli_process import run_kubetune
from .k8s_validate import validate_all

REPO = Path(__file__).resolve().parents[3]
SERVER_CHART = REPO / "deploy" / "helm" / "kubetune"
JOB_CHART = REPO / "deploy" / "helm" / "kubetune-job"
EXAMPLES = sorted((JOB_CHART / "examples").glob("*.yaml"))
KEYS = {"apiKeys": {"existingSecret": "kubetune-api-keys"}}
CAPITALS = (REPO / "examples" / "data" / "capitals.jsonl").read_text(encoding="utf-8")


def _render(chart: Path, values: dict, *, namespace: str = "ml-team", name: str = "kt") -> list[dict]:
    with helm.Chart.load(str(chart)) as c:
        out = c.render(values, name=name, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [d for d in yaml.safe_load_all(text) if d]
    for o in objects:
        o["metadata"].setdefault("namespace", namespace)  # what helm install --namespace does
    return objects


def _kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _lint(chart: Path, values: dict) -> dict:
    report = helm.lint(str(chart), values, strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error (strict: warnings fail too)
    assert not errors and not report["errors"], report
    return report


# --- the server chart ---------------------------------------------------------------------------
def test_server_chart_lints_and_every_object_is_valid():
    _lint(SERVER_CHART, KEYS)
    objects = _render(SERVER_CHART, KEYS)
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Role", "RoleBinding", "Service", "ServiceAccount"]
    validate_all(objects)
    (dep,) = _kind(objects, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["image"] == f"{C.K8S_IMAGE_REPO}:{__version__}-server"
    assert server["command"][:4] == ["kubetune", "server", "--host", "0.0.0.0"] and "kubernetes" in server["command"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["KUBETUNE_SERVER_DB"] == "sqlite:////var/lib/kubetune/server.db" and env["KUBETUNE_HOME"] == "/var/lib/kubetune"
    # Non-root, read-only root filesystem, no privilege escalation: the state lives on the PVC, scratch on /tmp.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert server["securityContext"]["readOnlyRootFilesystem"] is True and server["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    assert mounts["/var/lib/kubetune"] == "state" and mounts["/tmp"] == "tmp"
    # The API keys Secret is imported before the server starts, never put in an env var or argument.
    (init,) = pod["initContainers"]
    assert init["command"][:5] == ["kubetune", "server", "keys", "import", "--dir"]
    assert {"name": "api-keys", "secret": {"secretName": "kubetune-api-keys", "defaultMode": 0o400}} in pod["volumes"]
    # The Role is exactly what the kubernetes backend calls (the same rules as deploy/rbac.yaml and cluster init).
    (role,) = _kind(objects, "Role")
    assert role["rules"] == RBAC_RULES
    (binding,) = _kind(objects, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kt-kubetune", "namespace": "ml-team"}]


def test_server_chart_postgresql_ingress_and_object_store():
    values = {
        **KEYS,
        "database": {"type": "postgresql", "postgresql": {"existingSecret": "pg", "key": "url"}},
        "persistence": {"enabled": False},
        "ingress": {"enabled": True, "className": "nginx", "host": "tune.example.com", "tls": [{"hosts": ["tune.example.com"], "secretName": "tls"}]},
        "objectStore": {"endpoint": "http://minio.minio.svc:9000", "existingSecret": "minio-credentials"},
        "config": {"models": {"llama-3.1-8b": "s3://models/llama-3.1-8b"}, "max_running_jobs": 4},
    }
    _lint(SERVER_CHART, values)
    objects = _render(SERVER_CHART, values)
    validate_all(objects)
    assert not _kind(objects, "PersistentVolumeClaim")
    (server,) = _kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    db = next(e for e in server["env"] if e["name"] == "KUBETUNE_SERVER_DB")
    assert db == {"name": "KUBETUNE_SERVER_DB", "valueFrom": {"secretKeyRef": {"name": "pg", "key": "url"}}}  # a reference, not the URL
    assert {"secretRef": {"name": "minio-credentials"}} in server["envFrom"]
    (ing,) = _kind(objects, "Ingress")
    assert ing["spec"]["rules"][0]["host"] == "tune.example.com"
    (cm,) = _kind(objects, "ConfigMap")
    assert yaml.safe_load(cm["data"]["server.yaml"]) == values["config"]


def test_the_server_reads_the_charts_config_and_imports_its_keys(tmp_path):
    """What the pod runs, run here: the init container's import, then the server's own config loading."""
    objects = _render(SERVER_CHART, {**KEYS, "config": {"max_running_jobs": 3, "models": {"tiny": "builtin://tiny-chat"}}})
    (cm,) = _kind(objects, "ConfigMap")
    (conf := tmp_path / "server.yaml").write_text(cm["data"]["server.yaml"])
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "research").write_text("k" * 40)
    (keys / "..data").write_text("a mounted Secret's link, not a key")
    env = {"KUBETUNE_SERVER_DB": f"sqlite:///{tmp_path / 'server.db'}", "KUBETUNE_HOME": str(tmp_path / "home")}
    r = run_kubetune("server", "keys", "import", "--dir", str(keys), "--config", str(conf), env=env)
    assert r.returncode == 0, r.stderr
    assert "k" * 12 not in r.stdout + r.stderr  # never echoed
    again = run_kubetune("server", "keys", "import", "--dir", str(keys), "--config", str(conf), env=env)
    assert "already known" in again.stdout
    listed = run_kubetune("server", "keys", "list", env=env)
    assert listed.stdout.count("research") == 1
    from kubetune.server.config import load_config
    from kubetune.server.store import Store

    assert Store(env["KUBETUNE_SERVER_DB"]).authenticate("k" * 40)["name"] == "research"
    assert load_config(conf).max_running_jobs == 3
    (keys / "research").write_text("short")
    bad = run_kubetune("server", "keys", "import", "--dir", str(keys), env=env)
    assert bad.returncode == 2 and "at least 32 characters" in bad.stderr and "Traceback" not in bad.stderr
    (keys / "research").write_bytes(b"\xff\xfe not text")
    unreadable = run_kubetune("server", "keys", "import", "--dir", str(keys), env=env)
    assert unreadable.returncode == 2 and "cannot read a key" in unreadable.stderr and "Traceback" not in unreadable.stderr


@pytest.mark.parametrize(
    "values,message",
    [
        ({**KEYS, "port": "8000"}, "/port"),
        ({**KEYS, "backend": "slurm"}, "/backend"),
        ({**KEYS, "replicas": 3}, "replicas"),  # unknown values are refused, not ignored
        ({**KEYS, "database": {"type": "mysql"}}, "/database/type"),
        ({**KEYS, "persistence": {"size": "ten gigs"}}, "/persistence/size"),
        ({**KEYS, "objectStore": {"endpoint": "minio:9000"}}, "/objectStore/endpoint"),
    ],
)
def test_server_values_that_break_the_schema_are_refused(values, message):
    with pytest.raises(helm.HelmValuesError, match=message):
        _render(SERVER_CHART, values)


def test_server_chart_requires_keys_and_a_postgresql_secret():
    with pytest.raises(helm.HelmRenderError, match="apiKeys.existingSecret"):
        _render(SERVER_CHART, {})
    with pytest.raises(helm.HelmRenderError, match="database.postgresql.existingSecret"):
        _render(SERVER_CHART, {**KEYS, "database": {"type": "postgresql"}})


# --- the job chart ------------------------------------------------------------------------------
def _example(path: Path) -> dict:
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    if path.name == "quickstart.yaml":
        values["files"] = {"data/capitals.jsonl": CAPITALS}  # what --set-file 'files.data/capitals\.jsonl=...' gives
    return values


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_job_chart_examples_lint_and_render_valid_objects(example, tmp_path):
    values = _example(example)
    _lint(JOB_CHART, values)
    objects = _render(JOB_CHART, values, name="my-tune")
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "Job", "Role", "RoleBinding", "ServiceAccount"]
    validate_all(objects)
    (launcher,) = _kind(objects, "Job")
    (c,) = launcher["spec"]["template"]["spec"]["containers"]
    flavor = values.get("flavor", "job")
    assert c["command"] == ["kubetune", "run", "/etc/kubetune-job/spec.yaml", "--backend", "kubernetes", "--set", f"kubernetes.flavor={flavor}", "--namespace", "ml-team"]
    assert launcher["spec"]["template"]["spec"]["serviceAccountName"] == "my-tune-launcher"
    (role,) = _kind(objects, "Role")
    assert role["rules"] == RBAC_RULES
    # The spec in the ConfigMap is the values' spec, and kubetune renders it into valid objects of the flavour.
    spec_cm = next(o for o in objects if o["metadata"]["name"] == "my-tune-spec")
    assert yaml.safe_load(spec_cm["data"]["spec.yaml"]) == values["spec"]
    mounted = _mount_spec(objects, tmp_path / "etc-kubetune-job")
    validate_all(render(load_spec(mounted / "spec.yaml", overrides=[f"kubernetes.flavor={flavor}"]), flavor))


def test_job_chart_with_the_quickstart_renders_what_kubetune_render_renders(tmp_path):
    """The pod's view of the chart (its ConfigMap mounted at /etc/kubetune-job) gives the same objects as
    `kubetune render examples/quickstart.yaml` with the same staging_uri."""
    values = _example(JOB_CHART / "examples" / "quickstart.yaml")
    objects = _render(JOB_CHART, values, name="quickstart")
    mounted = _mount_spec(objects, tmp_path / "etc-kubetune-job")
    staging = values["spec"]["kubernetes"]["staging_uri"]
    for flavor in ("job", "pytorchjob", "trainjob"):
        from_chart = render(load_spec(mounted / "spec.yaml"), flavor)
        from_cli = render(load_spec(REPO / "examples" / "quickstart.yaml", overrides=[f"kubernetes.staging_uri={staging}"]), flavor)
        assert from_chart == from_cli, flavor
        validate_all(from_chart)


def test_job_chart_launcher_submits_the_rendered_objects(tmp_path, s3):
    """The launcher's own command, run here against the API double (and S3 for staging the dataset): the
    cluster receives exactly the objects `kubetune render` gives for the spec."""
    values = _example(JOB_CHART / "examples" / "quickstart.yaml")
    values["spec"]["kubernetes"]["staging_uri"] = s3.uri("staging")
    values["follow"] = False
    objects = _render(JOB_CHART, values, name="quickstart", namespace="team-a")
    mounted = _mount_spec(objects, tmp_path / "etc-kubetune-job")
    (launcher,) = _kind(objects, "Job")
    (c,) = launcher["spec"]["template"]["spec"]["containers"]
    assert c["command"][-1] == "--detach"
    argv = [mounted / "spec.yaml" if a == "/etc/kubetune-job/spec.yaml" else a for a in c["command"][1:]]
    double = ApiServerDouble().start()
    try:
        kubeconfig = double.kubeconfig(tmp_path / "kubeconfig", namespace="default")
        env = {"KUBECONFIG": str(kubeconfig), "KUBETUNE_HOME": str(tmp_path / "home"), **{e["name"]: e["value"] for e in c["env"] if e["name"] != "KUBETUNE_HOME"}}
        env["HOME"] = str(tmp_path)
        env["AWS_ENDPOINT_URL"] = s3.endpoint  # the chart example names the in-cluster MinIO
        r = run_kubetune(*map(str, argv), env=env)
        assert r.returncode == 0, r.stderr
        expected = render(load_spec(mounted / "spec.yaml"), "job", run_id=_run_id(double))
        for obj in expected:
            gv, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
            got = double.get(gv, _plural(kind), "team-a", name)
            assert got is not None, f"{kind}/{name} was not created"
            assert got["spec" if "spec" in obj else "data"] == obj["spec" if "spec" in obj else "data"], kind
    finally:
        double.stop()
    # The dataset travelled: staged to S3 where the rendered spec points.
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])]
    assert any(k.endswith("data/capitals.jsonl") for k in keys), keys


def test_job_chart_refuses_bad_values():
    with pytest.raises(helm.HelmValuesError, match="spec"):
        _render(JOB_CHART, {})
    spec = _example(JOB_CHART / "examples" / "gaudi-1.yaml")
    with pytest.raises(helm.HelmValuesError, match="/flavor"):
        _render(JOB_CHART, {**spec, "flavor": "mpijob"})
    with pytest.raises(helm.HelmValuesError, match="/spec"):
        _render(JOB_CHART, {**spec, "spec": {"name": "x"}})  # no model or dataset
    with pytest.raises(helm.HelmRenderError, match="relative path inside the spec's folder"):
        _render(JOB_CHART, {**spec, "files": {"../etc/passwd": "x"}})


# --- helpers ------------------------------------------------------------------------------------
def _mount_spec(objects: list[dict], root: Path) -> Path:
    """Write the spec ConfigMap's items where the launcher pod sees them (the volume's key -> path items)."""
    (launcher,) = _kind(objects, "Job")
    volume = next(v for v in launcher["spec"]["template"]["spec"]["volumes"] if v["name"] == "spec")
    cm = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"])
    for item in volume["configMap"]["items"]:
        path = root / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cm["data"][item["key"]], encoding="utf-8")
    return root


def _plural(kind: str) -> str:
    return {"ConfigMap": "configmaps", "Job": "jobs", "Service": "services", "PyTorchJob": "pytorchjobs", "TrainJob": "trainjobs"}[kind]


def _run_id(double: ApiServerDouble) -> str:
    (name,) = double.names("batch/v1", "jobs", "team-a")
    return double.get("batch/v1", "jobs", "team-a", name)["metadata"]["labels"][C.LABEL_RUN_ID]
