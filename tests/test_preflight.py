"""Checks of a job against this machine (kubetune.preflight): local sources exist, output.dir can be written,
training.max_seq_length fits the model. `kubetune validate` and the local backend run them; render does not."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from kubetune import Client, SpecError, load_spec
from kubetune.preflight import check_local, check_model_config, model_max_positions


def job_dict(tmp_path, capitals, **sections):
    d = {"name": "job", "model": {"source": "builtin://tiny-chat"}, "dataset": {"source": str(capitals)},
         "output": {"dir": str(tmp_path / "runs" / "{name}")}}
    for key, value in sections.items():
        d[key] = {**d.get(key, {}), **value}
    return d


def problems(job) -> str:
    with pytest.raises(SpecError) as e:
        check_local(job)
    return str(e.value)


def test_a_good_job_passes_and_leaves_nothing_behind(tmp_path, capitals):
    check_local(load_spec(job_dict(tmp_path, capitals)))
    assert not (tmp_path / "runs").exists()  # nothing created
    assert list(tmp_path.iterdir()) == []  # and the write probe removed


def test_missing_local_sources_are_named(tmp_path, capitals):
    job = load_spec(job_dict(
        tmp_path, capitals, model={"source": str(tmp_path / "no-model")},
        dataset={"source": "nope.jsonl", "eval_source": f"file://{tmp_path}/no-eval.jsonl", "mix": [{"source": str(capitals)}, {"source": "gone.jsonl"}],
                 "preprocess": {"file": "missing-prep.py"}},
    ))
    text = problems(job)
    assert "dataset.preprocess.file: no such file or directory: missing-prep.py" in text
    assert f"model.source: no such file or directory: {tmp_path}/no-model" in text
    assert "dataset.source: no such file or directory: nope.jsonl" in text
    assert f"dataset.eval_source: no such file or directory: file://{tmp_path}/no-eval.jsonl" in text
    assert "dataset.mix[1].source: no such file or directory: gone.jsonl" in text and "mix[0]" not in text
    assert "relative paths resolve against the current directory, then the spec file's" in text


def test_remote_sources_are_not_checked_here(tmp_path, capitals):
    check_local(load_spec(job_dict(tmp_path, capitals, model={"source": "hf://org/model"}, dataset={"source": "s3://bucket/data.jsonl"})))


def test_a_volume_is_the_kaito_flavours_only(tmp_path, capitals):
    job = load_spec(job_dict(tmp_path, capitals, dataset={"source": "pvc://team-data"}, output={"uri": "pvc://team-out"}))
    text = problems(job)
    assert "dataset.source: pvc://team-data is a PersistentVolumeClaim, which only kubernetes.flavor kaito mounts" in text
    assert "output.uri: pvc://team-out is a PersistentVolumeClaim" in text
    assert "relative paths resolve" not in text  # no local path is at fault


def test_relative_sources_use_the_specs_rules(tmp_path, capitals, monkeypatch):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "train.jsonl").write_text(capitals.read_text())
    f = tmp_path / "specs" / "job.yaml"
    f.write_text(yaml.safe_dump({"model": {"source": "builtin://tiny-chat"}, "dataset": {"source": "train.jsonl"}, "output": {"dir": str(tmp_path / "out")}}))
    monkeypatch.chdir(tmp_path)
    check_local(load_spec(f))  # found next to the spec


@pytest.mark.parametrize("where", ["file", "under-file", "proc", "sys", "proc-link", "long-name", "device"])
def test_an_output_dir_that_cannot_be_written_is_named(tmp_path, capitals, where):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "link").symlink_to("/proc/self")
    out = {"file": tmp_path / "afile", "under-file": tmp_path / "afile" / "runs" / "x", "proc": "/proc/kubetune-run",
           "sys": "/sys/kernel/kubetune", "proc-link": tmp_path / "link" / "run", "long-name": tmp_path / ("x" * 300) / "run",
           "device": "/dev/null"}[where]
    text = problems(load_spec(job_dict(tmp_path, capitals, output={"dir": str(out)})))
    expected = {"file": "exists and is not a directory", "under-file": f"cannot be created: {tmp_path}/afile is a file",
                "proc": "is under /proc", "sys": "is under /sys", "proc-link": "is under /proc", "long-name": "is too long a path",
                "device": "exists and is not a directory"}[where]
    assert f"output.dir: {out}" in text and expected in text


def test_a_read_only_output_dir_is_named(tmp_path, capitals):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permission bits do not stop writes (the test below covers read-only mounts)")
        text = problems(load_spec(job_dict(tmp_path, capitals, output={"dir": str(ro / "run")})))
        assert f"output.dir: {ro}/run cannot be written (in {ro}, where it would be created): Permission denied" in text
    finally:
        ro.chmod(0o755)


def test_a_read_only_or_immutable_filesystem_is_named(tmp_path, capitals, monkeypatch):
    """Root passes every permission check, but not a read-only mount or an immutable directory: the write probe
    (a real file created and removed) is what finds those. Mounting needs privileges tests do not have, so the
    probe's failure is simulated where the kernel would report it."""
    import errno
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    text = problems(load_spec(job_dict(tmp_path, capitals)))
    assert f"output.dir: {tmp_path}/runs/job cannot be written (in {tmp_path}, where it would be created): Read-only file system" in text


def test_max_seq_length_beyond_the_builtin_models_positions(tmp_path, capitals):
    text = problems(load_spec(job_dict(tmp_path, capitals, training={"max_seq_length": 4096})))
    assert "training.max_seq_length: 4096 is more than the model builtin://tiny-chat can take (max_position_embeddings 2048)" in text
    check_local(load_spec(job_dict(tmp_path, capitals, training={"max_seq_length": 2048})))


def test_max_seq_length_beyond_a_local_models_positions(tmp_path, capitals):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 512}))
    job = load_spec(job_dict(tmp_path, capitals, model={"source": str(model)}, training={"max_seq_length": 1024}))
    assert "max_position_embeddings 512" in problems(job)
    # the worker's check, once a remote model is fetched to a directory
    with pytest.raises(SpecError, match=r"training.max_seq_length: 1024 is more than .* \(max_position_embeddings 512\)"):
        check_model_config(job, model)


def test_model_max_positions_reads_the_common_names():
    assert model_max_positions({"max_position_embeddings": 4096}) == 4096
    assert model_max_positions({"n_positions": 1024}) == 1024
    assert model_max_positions({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert model_max_positions({"max_position_embeddings": "lots"}) is None and model_max_positions({}) is None


def test_the_worker_refuses_a_too_long_max_seq_length_before_preparing_data(tmp_path, capitals, tiny_model):
    """The tokenizer load is the worker's first use of the fetched model: the check runs there."""
    from kubetune.training.model import load_tokenizer

    job = load_spec(job_dict(tmp_path, capitals, model={"source": "hf://org/remote-model"}, training={"max_seq_length": 4096}))
    with pytest.raises(SpecError, match="max_position_embeddings 2048"):
        load_tokenizer(job, tiny_model)


def test_cli_validate_runs_the_checks_and_render_does_not(tmp_path, capitals, kubetune_cli):
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job_dict(tmp_path, capitals, dataset={"source": str(tmp_path / "missing.jsonl")}, output={"dir": "/proc/x"})))
    out = subprocess.run([*kubetune_cli, "validate", str(f)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"dataset.source: no such file or directory: {tmp_path}/missing.jsonl" in out.stderr
    assert "output.dir: /proc/x is under /proc" in out.stderr
    skipped = subprocess.run([*kubetune_cli, "validate", str(f), "--no-check-local"], capture_output=True, text=True, timeout=120)
    assert skipped.returncode == 0, skipped.stderr
    render = subprocess.run([*kubetune_cli, "render", str(f)], capture_output=True, text=True, timeout=120)
    assert "no such file or directory" not in render.stderr and "/proc" not in render.stderr


def test_the_local_backend_checks_before_submitting(tmp_path, capitals):
    job = load_spec(job_dict(tmp_path, capitals, dataset={"source": str(tmp_path / "missing.jsonl")}))
    with pytest.raises(SpecError, match="dataset.source: no such file or directory"):
        Client("local").submit(job)
    assert not (tmp_path / "runs").exists()  # refused before anything was written
