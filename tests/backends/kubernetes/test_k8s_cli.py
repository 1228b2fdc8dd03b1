"""`kubetune render`: prints the objects, fails with one message, and stays instant (no torch, no client)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from kubetune import constants as C

from . import specs
from .cli_process import run_kubetune

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "examples" / "quickstart.yaml"


def _kubetune(*args: str, probe: bool = False) -> subprocess.CompletedProcess:
    return run_kubetune(*args, probe=probe)


def _write_spec(tmp_path: Path, variant: str = "gpu-pvc") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(specs.spec(variant)), encoding="utf-8")
    return path


def test_render_prints_yaml_without_heavy_imports(tmp_path):
    r = _kubetune("render", str(_write_spec(tmp_path)), "--flavor", "pytorchjob", probe=True)
    assert r.returncode == 0, r.stderr
    objects = list(yaml.safe_load_all(r.stdout))
    assert [o["kind"] for o in objects] == ["ConfigMap", "PersistentVolumeClaim", "PyTorchJob"]
    assert "HEAVY []" in r.stderr, r.stderr  # neither torch nor the kubernetes client was imported


def test_render_json_namespace_and_set(tmp_path):
    r = _kubetune("render", str(_write_spec(tmp_path, "cpu")), "-o", "json", "-n", "ml", "--set", "resources.nodes=2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "List"
    assert {o["metadata"]["namespace"] for o in doc["items"]} == {"ml"}
    assert [o["kind"] for o in doc["items"]] == ["ConfigMap", "Service", "Job"]  # --set reached the spec: 2 nodes


def test_render_local_dataset_is_one_clear_error():
    r = _kubetune("render", str(QUICKSTART))
    assert r.returncode == 2
    assert "dataset.source is a local path" in r.stderr and "kubernetes.staging_uri" in r.stderr
    assert "Traceback" not in r.stderr
    ok = _kubetune("render", str(QUICKSTART), "--set", "kubernetes.staging_uri=s3://my-bucket/staging")
    assert ok.returncode == 0, ok.stderr
    assert "s3://my-bucket/staging/quickstart/data/capitals.jsonl" in ok.stdout


def test_render_rejects_other_backends_and_flavors(tmp_path):
    spec = str(_write_spec(tmp_path, "cpu"))
    r = _kubetune("render", spec, "--backend", "local")
    assert r.returncode == 2 and "render supports --backend kubernetes" in r.stderr
    r = _kubetune("render", spec, "--flavor", "mpijob")
    assert r.returncode == 2 and "unknown flavor 'mpijob'" in r.stderr


def test_render_matches_the_library(tmp_path):
    from kubetune.backends.kubernetes import render, render_text
    from kubetune.spec import load_spec

    path = _write_spec(tmp_path, "amd-2x4")
    r = _kubetune("render", str(path), "--flavor", "trainjob")
    assert r.returncode == 0, r.stderr
    assert r.stdout == render_text(render(load_spec(path), "trainjob"))
    assert C.K8S_SPEC_PATH in r.stdout
