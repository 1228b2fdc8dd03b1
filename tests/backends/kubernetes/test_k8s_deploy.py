"""deploy/: the RBAC Role grants what the backend really calls, sample objects validate, the images agree
with what the render runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C
from kubetune.backends import get_backend
from kubetune.backends.kubernetes import render
from kubetune.backends.kubernetes.cluster import RBAC_RULES
from kubetune.spec import load_spec

from . import specs
from .apiserver_double import ApiServerDouble, make_pod
from .k8s_validate import K8S_VERSIONS, validate_all

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")) if d]


@pytest.mark.parametrize("name", ["rbac.yaml", "secrets.example.yaml"])
def test_sample_objects_validate(name):
    import kubernetes_validate

    for doc in _docs(name):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_rbac_grants_every_call_the_backend_makes(tmp_path):
    double = ApiServerDouble().start()
    try:
        cfg = str(double.kubeconfig(tmp_path / "kubeconfig"))
        for flavor in ("job", "pytorchjob", "trainjob"):
            backend = get_backend("kubernetes", kubeconfig=cfg, flavor=flavor, cache_seconds=0)
            ref = backend.submit(load_spec(specs.spec("gpu-pvc", kubernetes={"namespace": "default"}, name=f"rbac-{flavor}")))
            workload = double.get(*{"job": ("batch/v1", "jobs"), "pytorchjob": ("kubeflow.org/v1", "pytorchjobs"), "trainjob": ("trainer.kubeflow.org/v1alpha1", "trainjobs")}[flavor], "default", ref.id)
            labels = {C.LABEL_JOB: ref.id, C.LABEL_FLAVOR: flavor}
            double.add_pod("default", make_pod(f"{ref.id}-0", labels, main=C.K8S_MAIN_CONTAINER[flavor], owner=workload), logs={C.K8S_MAIN_CONTAINER[flavor]: "hello\n"})
            backend.status(ref)
            list(backend.logs(ref))
            list(backend.logs(ref, follow=True))
            backend.list()
            backend.cancel(ref)
        used = double.calls
    finally:
        double.stop()
    granted = set()
    for rule in RBAC_RULES:  # what `kubetune cluster init` grants; deploy/rbac.yaml holds the same (next test)
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((verb, group, res))
    missing = sorted(used - granted)
    assert not missing, f"RBAC_RULES (and deploy/rbac.yaml) lack {missing}"


def test_rbac_yaml_is_the_rules_cluster_init_grants():
    role = next(d for d in _docs("rbac.yaml") if d["kind"] == "Role")
    assert role["rules"] == RBAC_RULES, "deploy/rbac.yaml and kubetune.backends.kubernetes.cluster.RBAC_RULES differ: change both"


def test_sample_job_spec_renders_for_every_flavour():
    job = load_spec(DEPLOY / "job-gpu.yaml")
    assert job.dataset.source == str((REPO / "examples" / "data" / "capitals.jsonl").resolve())
    for flavor in ("job", "pytorchjob", "trainjob"):
        validate_all(render(job, flavor))


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda", "Dockerfile.rocm", "Dockerfile.gaudi"])
def test_images_install_kubetune_and_run_its_cli(dockerfile):
    text = (DEPLOY / dockerfile).read_text(encoding="utf-8")
    for src in re.findall(r"^COPY\s+(.+?)\s+\S+$", text, flags=re.M):
        for path in src.split():
            assert (REPO / path).exists(), f"{dockerfile} copies {path}, which is not in the repository"
    assert 'ENTRYPOINT ["kubetune"]' in text
    assert f'CMD ["worker", "--spec", "{C.K8S_SPEC_PATH}"]' in text
    assert "USER 1000" in text
    ignore = (DEPLOY / f"{dockerfile}.dockerignore").read_text(encoding="utf-8")
    assert "!src/" in ignore and "!pyproject.toml" in ignore
    from kubetune import __version__

    flavour = dockerfile.partition(".")[2]
    tag = f"{__version__}-{flavour}" if flavour else __version__
    assert f"{C.K8S_IMAGE_REPO}:{tag}" in text  # the build line names the image the render defaults to
