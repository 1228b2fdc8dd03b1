"""`kubetune render-serve --flavor kserve`: one KServe InferenceService with the same vLLM pod as the Deployment
flavor, validated against KServe v0.20's CRD schema (plus its inline pod as a core Pod with kubernetes-validate);
and vLLM's tool-calling flags on rendered deployments of both flavors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from backends.kubernetes.k8s_validate import validate as validate_object
from kubetune.cli import app
from kubetune.errors import SpecError
from kubetune.serve.deploy import render_serve
from kubetune.spec import load_spec

from .conftest import spec_file
from .test_deploy import validate as validate_deployment

TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


def job(tmp_path, **sections):
    return load_spec(spec_file(tmp_path, **sections))


def kserve(j, **kw) -> dict:
    objects = render_serve(j, flavor="kserve", **kw)
    assert len(objects) == 1, "one InferenceService, no Deployment or Service of kubetune's"
    validate_object(objects[0])  # the CRD's schema, unknown fields, and the inline pod as a core Pod
    return objects[0]


def predictor(isvc: dict) -> tuple[dict, dict]:
    p = isvc["spec"]["predictor"]
    return p, p["containers"][0]


def arg(main: dict, flag: str) -> str:
    return main["args"][main["args"].index(flag) + 1]


def test_lora_job_on_s3_is_one_inference_service_serving_base_plus_adapter(tmp_path):
    isvc = kserve(job(tmp_path, output={"uri": "s3://results/support-bot"}, kubernetes={"namespace": "ml"}))
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["metadata"]["name"] == "support-bot-serve" and isvc["metadata"]["namespace"] == "ml"
    p, main = predictor(isvc)
    assert "annotations" not in p
    assert [c["command"] for c in p["initContainers"]] == [
        ["kubetune", "fetch", "hf://Qwen/Qwen2.5-0.5B-Instruct", "/models/base"],
        ["kubetune", "fetch", "s3://results/support-bot/adapter", "/models/adapters/support-bot"],
    ]
    assert main["name"] == "kserve-container" and main["image"].startswith("vllm/vllm-openai:")
    assert arg(main, "--model") == "/models/base" and arg(main, "--served-model-name") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert "--enable-lora" in main["args"] and arg(main, "--lora-modules") == "support-bot=/models/adapters/support-bot"
    # one port, KServe's default for custom containers, everywhere: vLLM listens where KServe routes and probes
    assert main["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    assert arg(main, "--port") == "8080" and arg(main, "--host") == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"] == {"path": "/health", "port": 8080}, probe
    assert isvc["metadata"]["annotations"] == {
        "serving.kserve.io/enable-prometheus-scraping": "true", "prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics"}
    assert p["minReplicas"] == p["maxReplicas"] == 1 and p["deploymentStrategy"] == {"type": "Recreate"}
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert p["labels"]["kubetune.io/job"] == isvc["metadata"]["labels"]["kubetune.io/job"] == "support-bot"


def test_the_predictor_is_the_deployment_flavor_s_pod(tmp_path):
    j = job(
        tmp_path,
        output={"uri": "s3://results/support-bot"},
        resources={"accelerators": 2, "memory": "64Gi"},
        kubernetes={
            "node_selector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "secrets": {"hf_token": "hf", "s3": "minio"},
            "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
        },
    )
    kw = dict(adapters={"legal": "s3://adapters/legal"}, api_key_secret="serve-key:token", max_model_len=4096)
    p, main = predictor(kserve(j, replicas=3, **kw))
    deployment, _ = render_serve(j, replicas=3, **kw)
    pod = deployment["spec"]["template"]["spec"]
    assert p["initContainers"] == pod["initContainers"] and p["volumes"] == pod["volumes"]
    assert p["nodeSelector"] == {"pool": "gpu"} and p["tolerations"] == pod["tolerations"]
    assert p["minReplicas"] == p["maxReplicas"] == 3
    theirs = pod["containers"][0]
    for key in ("image", "command", "env", "resources", "volumeMounts"):
        assert main[key] == theirs[key], key
    assert [a for a in main["args"] if a != "8080"] == [a for a in theirs["args"] if a != "8000"], "only the port differs"
    key = next(e for e in main["env"] if e["name"] == "VLLM_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "serve-key", "key": "token"}, "the key stays in its Secret"
    fetch_env = {e["name"]: e for e in p["initContainers"][0]["env"]}
    assert fetch_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert arg(main, "--tensor-parallel-size") == "2" and arg(main, "--max-loras") == "2"


def test_merged_and_full_jobs_serve_one_model(tmp_path):
    _, main = predictor(kserve(job(tmp_path, output={"uri": "oci://ghcr.io/acme/support-bot:v1", "merge": True}), merged=True))
    assert "--enable-lora" not in main["args"] and arg(main, "--served-model-name") == "support-bot"
    p, main = predictor(kserve(job(tmp_path, method={"type": "full"}, output={"uri": "s3://results/full"})))
    assert [c["command"][2:] for c in p["initContainers"]] == [["s3://results/full/model", "/models/base"]]
    assert "--enable-lora" not in main["args"] and arg(main, "--model") == "/models/base"


def test_pvc_job_is_read_from_its_volume(tmp_path):
    p, main = predictor(kserve(job(tmp_path, kubernetes={"workspace": {"volume": "pvc", "size": "50Gi"}})))
    assert "initContainers" not in p
    assert {"name": "workspace", "persistentVolumeClaim": {"claimName": "support-bot-workspace", "readOnly": True}} in p["volumes"]
    assert {"name": "workspace", "mountPath": "/workspace", "readOnly": True} in main["volumeMounts"]
    assert arg(main, "--lora-modules") == "support-bot=/workspace/output/adapter"


def test_spec_labels_annotations_and_namespace(tmp_path):
    mine = {"prometheus.kserve.io/path": "/custom", "serving.kserve.io/deploymentMode": "RawDeployment"}
    j = job(tmp_path, output={"uri": "s3://r/x"}, kubernetes={"namespace": "ml", "labels": {"team": "nlp"}, "annotations": mine})
    isvc = kserve(j, namespace="serving")
    assert isvc["metadata"]["namespace"] == "serving", "-n wins over kubernetes.namespace"
    assert isvc["metadata"]["annotations"] == {
        "serving.kserve.io/enable-prometheus-scraping": "true", "prometheus.kserve.io/port": "8080",
        "prometheus.kserve.io/path": "/custom", "serving.kserve.io/deploymentMode": "RawDeployment"}
    assert isvc["metadata"]["labels"]["team"] == isvc["spec"]["predictor"]["labels"]["team"] == "nlp"
    assert isvc["spec"]["predictor"]["annotations"] == mine, "the spec's annotations reach the pods too"
    assert "namespace" not in kserve(job(tmp_path, output={"uri": "s3://r/x"}))["metadata"]


def test_what_cannot_be_served_is_refused_in_both_flavors(tmp_path):
    with pytest.raises(SpecError, match="emptyDir"):
        render_serve(job(tmp_path), flavor="kserve")
    with pytest.raises(SpecError, match="--adapter extra: credentials") as e:
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), adapters={"extra": "https://u:sekrit@h/adapter.tar.gz"}, flavor="kserve")
    assert "sekrit" not in str(e.value)
    with pytest.raises(SpecError, match="--flavor 'knative'") as e:
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), flavor="knative")
    assert "kserve" in str(e.value) and "deployment" in str(e.value)
    # KServe's admission webhook (v0.18+) refuses PYTHONPATH in predictor containers: said before kubectl apply
    with pytest.raises(SpecError, match="PYTHONPATH") as e:
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}, kubernetes={"env": {"PYTHONPATH": "/opt/x"}}), flavor="kserve")
    assert "--flavor deployment" in e.value.hint
    render_serve(job(tmp_path, output={"uri": "s3://r/x"}, kubernetes={"env": {"PYTHONPATH": "/opt/x"}}))  # a Deployment may set it


def test_unknown_flavor_is_one_line_and_exit_2(tmp_path):
    path = spec_file(tmp_path, output={"uri": "s3://results/support-bot"})
    r = subprocess.run([sys.executable, "-m", "kubetune.cli", "render-serve", str(path), "--flavor", "knative"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--flavor 'knative'" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


# --- tool calling --------------------------------------------------------------------------------
def _cli_args(tmp_path, *extra: str, **sections) -> dict[str, list[str]]:
    """The vLLM args of both flavors, as the CLI prints them."""
    path = spec_file(tmp_path, output={"uri": "s3://results/support-bot"}, **sections)
    out = {}
    for flavor in ("deployment", "kserve"):
        r = CliRunner().invoke(app, ["render-serve", str(path), "--flavor", flavor, "-o", "json", *extra])
        assert r.exit_code == 0, r.output
        first = json.loads(r.stdout)["items"][0]  # a kubectl List
        pod = first["spec"]["template"]["spec"] if flavor == "deployment" else first["spec"]["predictor"]
        out[flavor] = pod["containers"][0]["args"]
    return out


def test_chatml_spec_gets_hermes_tool_flags_in_both_flavors(tmp_path):
    for flavor, args in _cli_args(tmp_path, dataset={"chat_template": "chatml"}).items():
        i = args.index("--enable-auto-tool-choice")
        assert args[i : i + 3] == TOOL_FLAGS, flavor
    for flavor, args in _cli_args(tmp_path, "--tool-call-parser", "none", dataset={"chat_template": "chatml"}).items():
        assert "--enable-auto-tool-choice" not in args and "--tool-call-parser" not in args, flavor
    for flavor, args in _cli_args(tmp_path, "--vllm-arg=--tool-call-parser=llama3_json", "--vllm-arg=--enable-auto-tool-choice", dataset={"chat_template": "chatml"}).items():
        assert args[-2:] == ["--tool-call-parser=llama3_json", "--enable-auto-tool-choice"], flavor
        assert "hermes" not in args and args.count("--enable-auto-tool-choice") == 1, flavor


def test_tool_flags_are_added_only_where_the_template_is_known(tmp_path):
    # a hub model's template is unknown until it is fetched: no flags unless asked for
    for args in _cli_args(tmp_path).values():
        assert "--enable-auto-tool-choice" not in args
    for args in _cli_args(tmp_path, "--tool-call-parser", "llama3_json").values():
        assert args[-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    # a named template that renders no tools
    for args in _cli_args(tmp_path, dataset={"chat_template": "llama3"}).values():
        assert "--enable-auto-tool-choice" not in args
    # builtin://tiny-chat's template renders no tools
    assert "--enable-auto-tool-choice" not in render_serve(job(tmp_path, model={"source": "builtin://tiny-chat"}, output={"uri": "s3://r/x"}))[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    with pytest.raises(SpecError, match="--tool-call-parser"):
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), tool_call_parser="hermes; rm -rf /")


def test_local_base_model_whose_template_renders_tools_gets_hermes(tmp_path):
    hermes = tmp_path / "qwen-like"
    hermes.mkdir()
    template = "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}<tool_call>{% endfor %}"
    (hermes / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}), encoding="utf-8")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}), encoding="utf-8")
    staged = {"output": {"uri": "s3://r/x"}, "kubernetes": {"staging_uri": "s3://staging/kt"}}
    _, main = predictor(kserve(job(tmp_path, model={"source": str(hermes)}, **staged)))
    assert main["args"][-3:] == TOOL_FLAGS
    deployment, _ = render_serve(job(tmp_path, model={"source": str(plain)}, **staged))
    validate_deployment([deployment, _])
    assert "--enable-auto-tool-choice" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
