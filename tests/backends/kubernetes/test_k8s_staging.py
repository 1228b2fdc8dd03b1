"""Local inputs reach the cluster: staged to S3 under a predictable key, fetched back by the pod's command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetune.backends.kubernetes import render, stage_inputs, staged_uri
from kubetune.errors import SpecError
from kubetune.spec import load_spec

BIN = Path(sys.executable).parent


def _spec(s3, **sections) -> dict:
    spec = {"name": "stage-me", "model": {"source": "builtin://tiny-chat"}, "kubernetes": {"staging_uri": s3.uri("staging/")}}
    spec.update(sections)
    return spec


def _fetch(uri: str, dest: Path) -> None:
    """What the rendered init container runs (with the S3 env of the s3 fixture)."""
    r = subprocess.run([str(BIN / "kubetune"), "fetch", uri, str(dest)], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_data_folder_and_a_model_folder_arrive_as_folders(s3, tmp_path):
    data = tmp_path / "my-data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (data / "b.jsonl").write_text('{"prompt": "c", "completion": "d"}\n')
    model = tmp_path / "my-model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w.bin").write_bytes(b"\0" * 10)
    job = load_spec(_spec(s3, dataset={"source": str(data)}, model={"source": str(model)}))
    uploads = stage_inputs(job)
    assert uploads == [(str(model), s3.uri("staging/stage-me/model/my-model")), (str(data), s3.uri("staging/stage-me/data/my-data"))]
    init = {c["name"]: c["command"] for c in render(job, "job")[-1]["spec"]["template"]["spec"]["initContainers"]}
    assert init["fetch-data"][2] == staged_uri(job, "data", str(data)) == uploads[1][1]
    _fetch(init["fetch-model"][2], tmp_path / "pod" / "model")
    _fetch(init["fetch-data"][2], tmp_path / "pod" / "data")
    assert sorted(p.name for p in (tmp_path / "pod" / "data").iterdir()) == ["a.jsonl", "b.jsonl"]
    assert (tmp_path / "pod" / "model" / "sub" / "w.bin").read_bytes() == b"\0" * 10


def test_missing_local_input_names_the_field(s3, tmp_path):
    job = load_spec(_spec(s3, dataset={"source": str(tmp_path / "gone.jsonl")}))
    with pytest.raises(SpecError, match="dataset.source: local path .*gone.jsonl does not exist"):
        stage_inputs(job)


def test_remote_inputs_are_not_uploaded(s3):
    calls = []
    job = load_spec(_spec(s3, dataset={"source": "hf://datasets/org/data"}))
    assert stage_inputs(job, push=lambda *a, **k: calls.append(a)) == [] and calls == []


@pytest.mark.parametrize("cluster", ["no kubeconfig", "unreachable API server"])
def test_no_cluster_is_said_before_anything_is_uploaded(s3, tmp_path, kubetune_cli, cluster):
    """`kubetune run --backend kubernetes` with local data: a missing kubeconfig or an API server that does not answer
    ends the command (exit 2, one message) before the data goes to the staging bucket, not after."""
    import socket

    import yaml

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_spec(s3, dataset={"source": str(data)})))
    kubeconfig = tmp_path / "nowhere" / "config"
    expected = f"no Kubernetes cluster configured: KUBECONFIG names {kubeconfig}, which does not exist"
    if cluster == "unreachable API server":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "dead",
            "clusters": [{"name": "dead", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "me", "user": {"token": "t"}}],
            "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "me"}}],
        }))
        expected = f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}"
    r = subprocess.run([*kubetune_cli, "run", str(spec), "--backend", "kubernetes"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert expected in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert s3.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount", 0) == 0, "nothing may be uploaded"


def test_the_preprocess_code_is_staged_and_the_worker_fetches_it(s3, tmp_path):
    """dataset.preprocess.file travels like a local dataset: uploaded to the staging URI, named there in the spec the
    pod reads; no init container fetches it, the worker does (with the pod's S3 credentials)."""
    from kubetune import constants as C
    from kubetune.data.preprocess import preprocess_inputs

    from .k8s_validate import validate_all

    data = tmp_path / "rows.jsonl"
    data.write_text('{"q": "a", "a": "b"}\n{"q": "c", "a": "d"}\n')
    code = tmp_path / "prep.py"
    code.write_text("def transform(rows):\n    return ({'prompt': r['q'] + '!', 'completion': r['a']} for r in rows)\n")
    job = load_spec(_spec(s3, dataset={"source": str(data), "preprocess": {"file": str(code), "function": "transform"}}))
    uploads = stage_inputs(job)
    assert (str(code), s3.uri("staging/stage-me/preprocess/prep.py")) in uploads
    objects = render(job, "job")
    validate_all(objects)
    assert "fetch-preprocess" not in [c["name"] for c in objects[-1]["spec"]["template"]["spec"]["initContainers"]]
    in_pod = next(o for o in objects if o["kind"] == "ConfigMap")["data"][C.K8S_SPEC_KEY]
    assert str(code) not in in_pod
    pod_job = load_spec(yaml.safe_load(in_pod))
    assert pod_job.dataset.preprocess.file == uploads[-1][1]
    out = preprocess_inputs(pod_job, {"dataset": data})["dataset"]  # what the worker's prepare stage runs in the pod
    assert [json.loads(line)["prompt"] for line in out.read_text().splitlines()] == ["a!", "c!"]
    # a local file without a staging URI is refused, naming the field
    bare = _spec(s3, dataset={"source": "s3://bucket/rows.jsonl", "preprocess": {"file": str(code)}})
    bare["kubernetes"] = {}
    with pytest.raises(SpecError, match="dataset.preprocess.file is a local path"):
        render(load_spec(bare), "job")
