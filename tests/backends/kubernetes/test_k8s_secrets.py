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
    ],
)
def test_uris_with_credentials_are_refused(source):
    job = load_spec(specs.spec("cpu", dataset={"source": source}))
    with pytest.raises(SpecError, match="credentials"):
        render(job, "job")


def test_secret_references_in_init_containers_too():
    pod = render(load_spec(specs.spec("gpu-pvc")), "job")[-1]["spec"]["template"]["spec"]
    fetch = {e["name"] for e in pod["initContainers"][0]["env"]}
    assert {C.ENV_HF_TOKEN, C.ENV_AWS_ACCESS_KEY_ID, C.ENV_AWS_SECRET_ACCESS_KEY} <= fetch  # a gated model needs the token to download
    assert C.ENV_EVENT_STDOUT not in fetch  # only the worker prints events
