"""What `kubetune serve SOURCE --adapter NAME=URI` resolves to: directories to load and the ids clients send."""

from __future__ import annotations

import shutil

import pytest

from kubetune.errors import SourceError, SpecError
from kubetune.serve.options import make_options, parse_adapter_args
from kubetune.serve.sources import model_name_from_uri, resolve_sources

from .conftest import make_run


def test_lora_run_serves_base_plus_its_adapter_named_after_the_job(artifacts):
    plan = resolve_sources(str(artifacts.run))
    assert plan.model_dir == artifacts.base
    assert plan.model_name == "tiny-chat" and plan.default_model == "capitals-bot"
    assert plan.model_ids == ["capitals-bot", "tiny-chat"]
    (a,) = plan.adapters
    assert a.path == artifacts.run / "adapter" and a.base_model == "builtin://tiny-chat" and a.rank == 8
    renamed = resolve_sources(str(artifacts.run), served_model_name="bot")
    assert renamed.model_ids == ["bot", "tiny-chat"]


@pytest.mark.parametrize("artifact", ["merged", "model"])
def test_merged_or_full_run_serves_that_model_alone(artifacts, tmp_path, artifact):
    run = make_run(tmp_path / "run", artifacts.alpha, name="full-job")
    shutil.rmtree(run / "adapter")
    shutil.copytree(artifacts.base, run / artifact)
    plan = resolve_sources(str(run))
    assert plan.model_dir == run / artifact and plan.model_ids == ["full-job"] and plan.adapters == ()


def test_an_adapter_is_not_stacked_silently_on_a_runs_merged_model(artifacts, tmp_path, kubetune_cli):
    """`kubetune serve RUN --adapter X` where RUN holds merged/ (base + its adapter): X was trained on the base, so
    serving it on the merged weights is refused, naming both ways out; naming merged/ itself is a choice."""
    import subprocess

    from kubetune.spec import dump_spec, load_spec

    run = make_run(tmp_path / "run", artifacts.alpha, name="merged-job")
    shutil.copytree(artifacts.base, run / "merged")
    with pytest.raises(SpecError) as e:
        resolve_sources(str(run), {"beta": str(artifacts.beta)})
    assert f"--adapter beta={artifacts.beta}" in e.value.message and "merged model" in e.value.message
    assert f"kubetune serve builtin://tiny-chat --adapter merged-job={run} --adapter beta={artifacts.beta}" in e.value.hint
    assert f"kubetune serve {run / 'merged'} --adapter beta=" in e.value.hint
    r = subprocess.run([*kubetune_cli, "serve", str(run), "--adapter", f"beta={artifacts.beta}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "would be stacked on top of it" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # merged/ named as SOURCE: stacking is what the user asked for
    plan = resolve_sources(str(run / "merged"), {"beta": str(artifacts.beta)})
    assert plan.model_dir == run / "merged" and plan.model_ids == ["merged", "beta"]
    # an adapter whose run was trained on this merged model belongs on it
    on_merged = make_run(tmp_path / "second", artifacts.beta, name="second")
    job = load_spec(on_merged / "spec.yaml").with_overrides({"model.source": str(run / "merged")})
    (on_merged / "spec.yaml").write_text(dump_spec(job), encoding="utf-8")
    assert resolve_sources(str(run), {"second": str(on_merged)}).model_ids == ["merged-job", "second"]


def test_unfinished_run_is_refused(artifacts, tmp_path):
    run = make_run(tmp_path / "run", artifacts.alpha, name="pending")
    shutil.rmtree(run / "adapter")
    with pytest.raises(SourceError, match="no trained model yet"):
        resolve_sources(str(run))


def test_model_directory_and_uri(artifacts):
    assert resolve_sources(str(artifacts.base)).model_ids == [artifacts.base.name]
    plan = resolve_sources("builtin://tiny-chat", {"a": str(artifacts.alpha), "b": str(artifacts.run)})
    assert plan.model_ids == ["tiny-chat", "a", "b"]
    assert plan.adapter_for("b").path == artifacts.run / "adapter"
    assert plan.adapter_for("tiny-chat") is None


def test_run_layout_on_s3_is_served_like_a_run_directory(artifacts, s3):
    from kubetune.storage import push

    push(artifacts.run, s3.uri("runs/capitals-bot"))
    push(artifacts.beta, s3.uri("adapters/beta"))
    plan = resolve_sources(s3.uri("runs/capitals-bot"), {"beta": s3.uri("adapters/beta")})
    assert plan.model_ids == ["capitals-bot", "tiny-chat", "beta"]
    assert (plan.adapters[0].path / "adapter_config.json").is_file()
    assert (plan.adapter_for("beta").path / "adapter_model.safetensors").is_file()


def test_unservable_sources_say_what_to_do(artifacts, tmp_path):
    with pytest.raises(SourceError, match="no such run directory") as e:
        resolve_sources(str(tmp_path / "missing"))
    assert "hint" in str(e.value)
    with pytest.raises(SourceError, match="adapter, not a model") as e:
        resolve_sources(str(artifacts.alpha))
    assert "--adapter" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="not a run directory"):
        resolve_sources(str(tmp_path / "empty"))
    with pytest.raises(SourceError, match="no LoRA adapter there"):
        resolve_sources("builtin://tiny-chat", {"x": str(artifacts.base)})
    with pytest.raises(SourceError, match="no such directory"):
        resolve_sources("builtin://tiny-chat", {"x": str(tmp_path / "nope")})


def test_names_must_be_unique(artifacts):
    with pytest.raises(SpecError, match="used twice"):
        resolve_sources("builtin://tiny-chat", {"tiny-chat": str(artifacts.alpha)})
    with pytest.raises(SpecError, match="used twice"):
        resolve_sources(str(artifacts.run), {"capitals-bot": str(artifacts.beta)})


def test_adapter_arguments():
    assert parse_adapter_args(["a=runs/x", "b = s3://bucket/p"]) == {"a": "runs/x", "b": "s3://bucket/p"}
    for bad in (["runs/x"], ["=runs/x"], ["a="], ["a b=x"]):
        with pytest.raises(SpecError):
            parse_adapter_args(bad)
    with pytest.raises(SpecError, match="twice"):
        parse_adapter_args(["a=x", "a=y"])


def test_options_are_validated_naming_the_option():
    with pytest.raises(SpecError, match="--port"):
        make_options(port=70000)
    with pytest.raises(SpecError, match="--engine"):
        make_options(engine="tgi")
    assert make_options().host == "127.0.0.1"


@pytest.mark.parametrize(
    "uri, name",
    [
        ("builtin://tiny-chat", "tiny-chat"),
        ("hf://Qwen/Qwen2.5-0.5B-Instruct@main", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("s3://bucket/models/llama-8b/", "llama-8b"),
        ("oci://ghcr.io/acme/bot:v1", "bot:v1"),
        ("https://example.com/m/model.tar.gz", "model"),
        ("/data/models/my-model", "my-model"),
    ],
)
def test_model_names_from_uris(uri, name):
    assert model_name_from_uri(uri) == name
