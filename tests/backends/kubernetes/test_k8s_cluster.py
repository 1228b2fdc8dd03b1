"""`kubetune cluster init`: the rendered objects validate, secret values are never printed, applying against
the API double creates each object once and leaves existing ones alone, and a 403 is one clear error."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kubetune.backends.kubernetes.cluster import KUEUE_API_VERSION, RBAC_RULES

from .apiserver_double import ApiServerDouble
from .cli_process import run_kubetune
from .k8s_validate import validate_all

REPO = Path(__file__).resolve().parents[3]
HF_VALUE = "hf_TopSecretTokenValue0123456789"
AWS_ID = "AKIATOPSECRETID9876"
AWS_KEY = "wJalrTopSecretKeyValue/K7MDENG+bPxRfiCY"


def _kubetune(*args: str, env: dict | None = None, probe: bool = False) -> subprocess.CompletedProcess:
    return run_kubetune(*args, env={"HF_TOKEN": HF_VALUE, "MY_AWS_ID": AWS_ID, "MY_AWS_KEY": AWS_KEY, **(env or {})}, probe=probe)


SECRETS = ("--secret", "hf-token=HF_TOKEN", "--secret", "s3-credentials=AWS_ACCESS_KEY_ID:MY_AWS_ID,AWS_SECRET_ACCESS_KEY:MY_AWS_KEY")


def test_render_prints_valid_objects_and_the_spec_hint_without_heavy_imports():
    r = _kubetune("cluster", "init", "--namespace", "ml-team", "--queue", "gpu-cluster-queue", *SECRETS, "--render", probe=True)
    assert r.returncode == 0, r.stderr
    objects = list(yaml.safe_load_all(r.stdout))
    assert [o["kind"] for o in objects] == ["Namespace", "ServiceAccount", "Role", "RoleBinding", "LocalQueue"]
    validate_all(objects)  # core kinds strictly with kubernetes-validate, the LocalQueue against Kueue v0.19.2's CRD
    ns, sa, role, binding, queue = objects
    assert ns["metadata"]["name"] == "ml-team"
    assert {o["metadata"]["namespace"] for o in objects[1:]} == {"ml-team"}
    assert sa["metadata"]["name"] == "kubetune"
    assert role["rules"] == RBAC_RULES
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kubetune", "namespace": "ml-team"}]
    assert queue["apiVersion"] == KUEUE_API_VERSION and queue["spec"] == {"clusterQueue": "gpu-cluster-queue"}
    # what specs then set, on stderr (stdout stays ready for kubectl apply -f -)
    assert "queue: kubetune" in r.stderr and "service_account: kubetune" in r.stderr
    assert "hf_token: {secret: hf-token, key: HF_TOKEN}" in r.stderr and "s3: {secret: s3-credentials}" in r.stderr
    assert "HEAVY []" in r.stderr, r.stderr  # neither torch nor the kubernetes client


def test_render_never_prints_a_secret_value():
    for fmt in ("yaml", "json"):
        r = _kubetune("cluster", "init", "-n", "ml-team", *SECRETS, "--render", "-o", fmt)
        assert r.returncode == 0, r.stderr
        for value in (HF_VALUE, AWS_ID, AWS_KEY):
            assert value not in r.stdout and value not in r.stderr
        kinds = [o["kind"] for o in (json.loads(r.stdout)["items"] if fmt == "json" else yaml.safe_load_all(r.stdout))]
        assert "Secret" not in kinds  # no Secret with placeholder values that an apply could write over real ones
        # instead, the command that creates each from the same variables, for the admin to run
        assert 'kubectl create secret generic hf-token -n ml-team --from-literal=HF_TOKEN="$HF_TOKEN"' in r.stderr
        assert '--from-literal=AWS_ACCESS_KEY_ID="$MY_AWS_ID" --from-literal=AWS_SECRET_ACCESS_KEY="$MY_AWS_KEY"' in r.stderr


def test_render_rejects_a_bad_option_with_one_message():
    r = _kubetune("cluster", "init", "-n", "ml-team", "--secret", "hf-token", "--render")
    assert r.returncode == 2 and "is not NAME=ENVVAR" in r.stderr and "Traceback" not in r.stderr
    r = _kubetune("cluster", "init", "-n", "ML_Team", "--render")
    assert r.returncode == 2 and "not a valid namespace" in r.stderr
    r = _kubetune("cluster", "init", "-n", "ml-team", "-o", "json")
    assert r.returncode == 2 and "applies to --render" in r.stderr


@pytest.fixture
def double():
    d = ApiServerDouble(namespaces=("default",)).start()
    yield d
    d.stop()


def _lines(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if "/" in line.split(" ", 1)[0])


def test_apply_creates_each_object_once_then_reports_them_unchanged(double, tmp_path):
    cfg = str(double.kubeconfig(tmp_path / "kubeconfig"))
    token_file = tmp_path / "token"
    token_file.write_text("file-secret-value-42", encoding="utf-8")
    args = ("cluster", "init", "--namespace", "ml-team", "--queue", "gpu-cq", *SECRETS, "--secret-file", f"extra=registry-token:{token_file}")
    first = _kubetune(*args, env={"KUBECONFIG": cfg})
    assert first.returncode == 0, first.stderr
    expected = ["namespace/ml-team", "serviceaccount/kubetune", "role/kubetune", "rolebinding/kubetune-kubetune",
                "localqueue/kubetune", "secret/hf-token", "secret/s3-credentials", "secret/extra"]
    assert _lines(first.stdout) == {what: "created" for what in expected}
    assert "queue: kubetune" in first.stdout
    for value in (HF_VALUE, AWS_ID, AWS_KEY, "file-secret-value-42"):
        assert value not in first.stdout and value not in first.stderr
    # the objects are there, once, with the values read from the environment and the file
    assert "ml-team" in double.namespaces
    assert double.names("v1", "serviceaccounts", "ml-team") == ["kubetune"]
    assert double.get("rbac.authorization.k8s.io/v1", "roles", "ml-team", "kubetune")["rules"] == RBAC_RULES
    assert double.get("kueue.x-k8s.io/v1beta1", "localqueues", "ml-team", "kubetune")["spec"] == {"clusterQueue": "gpu-cq"}
    s3 = double.get("v1", "secrets", "ml-team", "s3-credentials")["data"]
    assert {k: base64.b64decode(v).decode() for k, v in s3.items()} == {"AWS_ACCESS_KEY_ID": AWS_ID, "AWS_SECRET_ACCESS_KEY": AWS_KEY}
    extra = double.get("v1", "secrets", "ml-team", "extra")["data"]
    assert base64.b64decode(extra["registry-token"]).decode() == "file-secret-value-42"
    creates = [p for m, p in double.requests if m == "POST"]
    assert len(creates) == len(expected)

    # a second run changes nothing, even with other values: an existing object is never overwritten
    second = _kubetune(*args, env={"KUBECONFIG": cfg, "HF_TOKEN": "another-value"})
    assert second.returncode == 0, second.stderr
    assert _lines(second.stdout) == {what: "unchanged" for what in expected}
    assert [p for m, p in double.requests if m == "POST"] == creates
    hf = double.get("v1", "secrets", "ml-team", "hf-token")["data"]
    assert base64.b64decode(hf["HF_TOKEN"]).decode() == HF_VALUE


def test_apply_missing_variable_creates_nothing(double, tmp_path):
    cfg = str(double.kubeconfig(tmp_path / "kubeconfig"))
    r = _kubetune("cluster", "init", "-n", "ml-team", "--secret", "hf-token=NOT_SET_ANYWHERE", env={"KUBECONFIG": cfg})
    assert r.returncode == 2 and "NOT_SET_ANYWHERE is not set" in r.stderr
    assert not [m for m, _ in double.requests if m == "POST"]


def test_apply_forbidden_is_one_clear_error(double, tmp_path):
    cfg = str(double.kubeconfig(tmp_path / "kubeconfig"))
    double.forbidden.add(("create", "roles"))
    r = _kubetune("cluster", "init", "-n", "default", env={"KUBECONFIG": cfg})
    assert r.returncode == 2
    assert "forbidden: you may not create roles in namespace 'default'" in r.stderr
    assert "--render" in r.stderr  # the way out: hand the objects to the namespace's admin
    assert "Traceback" not in r.stderr
    assert _lines(r.stdout) == {"namespace/default": "unchanged", "serviceaccount/kubetune": "created"}


def test_apply_without_kueue_says_so(tmp_path):
    d = ApiServerDouble(crds=()).start()
    try:
        r = _kubetune("cluster", "init", "-n", "team-a", "--queue", "gpu-cq", env={"KUBECONFIG": str(d.kubeconfig(tmp_path / "kc"))})
    finally:
        d.stop()
    assert r.returncode == 2 and "Kueue is not installed" in r.stderr and "Traceback" not in r.stderr


def test_apply_bad_credentials_and_unreachable_server_exit_2(double, tmp_path):
    r = _kubetune("cluster", "init", "-n", "default", env={"KUBECONFIG": str(double.kubeconfig(tmp_path / "kc", token="wrong"))})
    assert r.returncode == 2 and "401 Unauthorized" in r.stderr and "Traceback" not in r.stderr
    cfg = double.kubeconfig(tmp_path / "kc2")
    double.stop()
    r = _kubetune("cluster", "init", "-n", "default", env={"KUBECONFIG": str(cfg)})
    assert r.returncode == 2 and "cannot reach the Kubernetes API server" in r.stderr and "Traceback" not in r.stderr


def test_apply_as_a_namespace_admin_who_may_not_read_namespaces(double, tmp_path):
    cfg = str(double.kubeconfig(tmp_path / "kubeconfig"))
    double.forbidden.add(("get", "namespaces"))
    r = _kubetune("cluster", "init", "-n", "default", env={"KUBECONFIG": cfg})
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stdout)
    assert lines["namespace/default"].startswith("not checked")
    assert lines["serviceaccount/kubetune"] == lines["role/kubetune"] == lines["rolebinding/kubetune-kubetune"] == "created"


def test_docs_render_excerpt_is_what_the_command_prints():
    text = (REPO / "docs" / "cluster-setup.md").read_text(encoding="utf-8")
    section = text[text.index("## The render"):]
    shown = list(yaml.safe_load_all(section[section.index("```yaml\n") + 8 : section.index("```", section.index("```yaml\n") + 8)]))
    r = _kubetune("cluster", "init", "--namespace", "ml-team", "--queue", "gpu-cluster-queue", "--render")
    assert r.returncode == 0, r.stderr
    printed = {o["kind"]: o for o in yaml.safe_load_all(r.stdout)}
    assert shown and all(printed[o["kind"]] == o for o in shown)
    hints = text[text.index("# Secrets are not rendered"):].split("```")[0]
    r = _kubetune("cluster", "init", "--namespace", "ml-team", "--secret", "hf-token=HF_TOKEN",
                  "--secret", "s3-credentials=AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY", "--render")
    assert hints.strip() in r.stderr
