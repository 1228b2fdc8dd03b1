"""No secret value ever appears in rendered output: secrets travel by reference only."""

from __future__ import annotations

import pytest

from kubetune import constants as C
from kubetune.backends.kubernetes import render, render_text
from kubetune.errors import SpecError
from kubetune.spec import load_spec

from . import specs

# Values a careless renderer could pick up from the environment of the machine that renders.
SECRET_VALUES = {
    "HF_TOKEN": "hf_SeCrEtTokenValue1234567890",
    "AWS_ACCESS_KEY_ID": "AKIASECRETKEYID0000",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzSECRETSESSION",
    "WANDB_API_KEY": "wandb-secret-api-key-value",
    "HUGGING_FACE_HUB_TOKEN": "hf_AnotherSecretToken0987",
}


@pytest.fixture
def secret_env(monkeypatch):
    for k, v in SECRET_VALUES.items():
        monkeypatch.setenv(k, v)
    return SECRET_VALUES


@pytest.mark.parametrize("flavor", specs.FLAVORS)
@pytest.mark.parametrize("variant", list(specs.VARIANTS))
def test_no_secret_value_in_any_render(secret_env, variant, flavor):
    job = load_spec(specs.spec("gpu-pvc") if variant == "gpu-pvc" else specs.spec(variant, kubernetes={"secrets": specs.VARIANTS["gpu-pvc"]["kubernetes"]["secrets"]}))
    for output in ("yaml", "json"):
        text = render_text(render(job, flavor), output)
        for name, value in secret_env.items():
            assert value not in text, f"{name}'s value leaked into the {flavor} render"


@pytest.mark.parametrize("flavor", specs.FLAVORS)
def test_secrets_are_references(flavor):
    objects = render(load_spec(specs.spec("gpu-pvc")), flavor)
    assert "Secret" not in [o["kind"] for o in objects]
    w = objects[-1]
    if flavor == "trainjob":
        env_lists = [w["spec"]["trainer"]["env"]]
    else:
        pods = [w["spec"]["template"]["spec"]] if flavor == "job" else [r["template"]["spec"] for r in w["spec"]["pytorchReplicaSpecs"].values()]
        env_lists = [c["env"] for p in pods for c in p["initContainers"] + p["containers"]]
    for env in env_lists:
        by_name = {e["name"]: e for e in env}
        assert by_name[C.ENV_HF_TOKEN] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
        assert by_name[C.ENV_AWS_ACCESS_KEY_ID]["valueFrom"]["secretKeyRef"] == {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"}
        assert by_name[C.ENV_AWS_SECRET_ACCESS_KEY]["valueFrom"]["secretKeyRef"] == {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"}
        assert by_name["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key", "optional": True}
        for e in env:  # a variable named like a secret never carries a literal value
            if any(w in e["name"] for w in ("TOKEN", "SECRET", "KEY")):
                assert "value" not in e, e


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "DB_PASSWORD", "OPENAI_APIKEY"])
def test_plain_env_refuses_secret_looking_names(name):
    with pytest.raises(SpecError, match="looks like a secret"):
        load_spec(specs.spec("cpu", kubernetes={"env": {name: "value"}}))


@pytest.mark.parametrize(
    "source",
    [
        "https://user:hunter2@example.com/data.jsonl",
        "https://bucket.s3.amazonaws.com/data.jsonl?X-Amz-Signature=abc&X-Amz-Credential=def",
        "https://example.blob.core.windows.net/c/data.jsonl?sig=abc",
        "https://ghp_tokenAsUser42@example.com/data.jsonl",  # a user name alone: a token
        "https://example.com/data.jsonl?pwd=hunter3",
        "https://example.com/data.jsonl?access=hunter4",
        "https://example.com/data.jsonl?Api-Key=hunter5",
        "https://example.com/data.jsonl?%74oken=hunter6",
        "https://example.blob.core.windows.net/c/data.jsonl?sv=2022&se=2030&sp=r",
        "https://user:hun/ter7@example.com/data.jsonl",
    ],
)
def test_uris_with_credentials_are_refused(source):
    job = load_spec(specs.spec("cpu", dataset={"source": source}))
    with pytest.raises(SpecError, match="credentials") as e:
        render(job, "job")
    assert "dataset.source" in str(e.value)
    assert "hunter" not in str(e.value) and "ghp_" not in str(e.value)  # the field is named, never the value


@pytest.mark.parametrize(
    "sections,field",
    [
        ({"output": {"uri": "s3://AKIAX:sekrit@bucket/out"}}, "output.uri"),
        ({"model": {"source": "hf://user:hf_sekrit@org/model"}}, "model.source"),
        ({"dataset": {"source": "s3://data/a.jsonl", "mix": [{"source": "https://h/b.jsonl?token=sekrit"}]}}, "dataset.mix.0.source"),
        ({"kubernetes": {"env": {"HF_ENDPOINT": "https://u:sekrit@mirror.example"}}}, "kubernetes.env.HF_ENDPOINT"),
        ({"kfp": {"pip_index_urls": ["https://u:sekrit@pypi.example/simple"]}}, "kfp.pip_index_urls.0"),
        ({"kfp": {"package": "kubetune @ git+https://ghp_sekrit@github.com/o/kubetune"}}, "kfp.package"),
    ],
)
@pytest.mark.parametrize("flavor", specs.FLAVORS)
def test_credentials_anywhere_in_the_spec_are_refused(sections, field, flavor):
    """Every field of the spec goes into the ConfigMap: a credential in any of them is refused, by name."""
    job = load_spec(specs.spec("cpu", **sections))
    with pytest.raises(SpecError, match="credentials") as e:
        render(job, flavor)
    assert field in str(e.value) and "sekrit" not in str(e.value) and "kubernetes.secrets" in str(e.value)


def test_kfp_and_render_serve_refuse_credentials_too():
    from kubetune.backends.kfp.pipeline import build_pipeline
    from kubetune.serve.deploy import render_serve

    job = load_spec(specs.spec("cpu", dataset={"source": "https://h/d.jsonl?pwd=sekrit"}))
    for local in (True, False):  # the local runner puts the spec on every task's command line
        with pytest.raises(SpecError, match="dataset.source: credentials") as e:
            build_pipeline(job, local=local)
        assert "sekrit" not in str(e.value) and "kfp.bucket" in str(e.value)
    served = load_spec(specs.spec("cpu", output={"uri": "s3://bucket/out"}))
    with pytest.raises(SpecError, match="--adapter extra: credentials") as e:
        render_serve(served, adapters={"extra": "https://u:sekrit@h/adapter.tar.gz"})
    assert "sekrit" not in str(e.value)


@pytest.mark.parametrize(
    "env,warned",
    [
        ({"DB_PASS": "x"}, ["DB_PASS"]),
        ({"GITHUB_PAT": "x"}, ["GITHUB_PAT"]),
        ({"WANDB_KEY": "x", "SSH_KEY": "y"}, ["WANDB_KEY", "SSH_KEY"]),
        ({"MY_PWD": "x", "SESSION_ID": "y", "BASIC_AUTH": "z"}, ["MY_PWD", "SESSION_ID", "BASIC_AUTH"]),
        ({"SOME_SETTING": "ghp_abcdefghijklmnop"}, ["SOME_SETTING"]),  # by the value's shape
        ({"AWS_ENDPOINT_URL": "http://minio:9000", "NCCL_DEBUG": "INFO", "HF_HOME": "/x"}, []),
    ],
)
def test_secret_like_env_values_warn(env, warned, tmp_path, kubetune_cli):
    """Names that probably hold a credential are accepted with a warning naming them and kubernetes.secrets.env."""
    import subprocess

    import yaml

    from kubetune.spec import dump_spec, spec_warnings

    data = specs.spec("cpu", kubernetes={"env": env})
    job = load_spec(data)
    got = spec_warnings(job)
    assert [w.split(":", 1)[0] for w in got] == [f"kubernetes.env.{n}" for n in warned]
    assert all("kubernetes.secrets.env" in w and f"var: {w.split(':', 1)[0].rsplit('.', 1)[1]}" in w for w in got)
    shown = yaml.safe_load(dump_spec(job))["kubernetes"]["env"]  # spec.yaml and validate mask the values
    assert all(shown[n] == C.REDACTED for n in warned)
    if not warned:
        return
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    for cmd in (["validate", str(path)], ["render", str(path)]):
        r = subprocess.run([*kubetune_cli, *cmd], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        for n in warned:
            assert f"warning: kubernetes.env.{n}:" in r.stderr, (cmd, r.stderr)
        assert "warning" not in r.stdout  # stdout stays the spec / the objects alone


def test_secret_references_in_init_containers_too():
    pod = render(load_spec(specs.spec("gpu-pvc")), "job")[-1]["spec"]["template"]["spec"]
    fetch = {e["name"] for e in pod["initContainers"][0]["env"]}
    assert {C.ENV_HF_TOKEN, C.ENV_AWS_ACCESS_KEY_ID, C.ENV_AWS_SECRET_ACCESS_KEY} <= fetch  # a gated model needs the token to download
    assert C.ENV_EVENT_STDOUT not in fetch  # only the worker prints events
