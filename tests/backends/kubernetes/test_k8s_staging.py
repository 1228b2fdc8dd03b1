"""Local inputs reach the cluster: staged to S3 under a predictable key, fetched back by the pod's command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
