"""`kubetune render-serve`: the vLLM Deployment and Service for a job's result, validated like a cluster would
(``kubernetes-validate`` in strict mode, oldest supported and newest Kubernetes) plus the rules the schema
cannot express (the Service selects the pods, mounts name volumes)."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from backends.kubernetes.k8s_validate import validate as validate_crd_object
from kubetune.errors import SpecError
from kubetune.serve.deploy import render_serve
from kubetune.spec import load_spec

from .conftest import spec_file

K8S_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())


def validate(objects: list[dict]) -> None:
    for obj in objects:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    deployment, service = objects
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items(), "the Service selects the serving pods"
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    assert len({c["name"] for c in containers}) == len(containers)
    for c in containers:
        assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes, c["name"]


def job(tmp_path, **sections):
    return load_spec(spec_file(tmp_path, **sections))


def parts(objects):
    deployment, service = objects
    spec = deployment["spec"]["template"]["spec"]
    main = spec["containers"][0]
    return deployment, service, spec, main


def arg(main: dict, flag: str) -> str:
    return main["args"][main["args"].index(flag) + 1]


def test_lora_job_on_s3_serves_hub_base_plus_adapter(tmp_path):
    objects = render_serve(job(tmp_path, output={"uri": "s3://results/support-bot"}, resources={"accelerators": 1}))
    validate(objects)
    deployment, service, spec, main = parts(objects)
    assert deployment["kind"] == "Deployment" and deployment["metadata"]["name"] == "support-bot-serve"
    assert [c["command"] for c in spec["initContainers"]] == [
        ["kubetune", "fetch", "hf://Qwen/Qwen2.5-0.5B-Instruct", "/models/base"],
        ["kubetune", "fetch", "s3://results/support-bot/adapter", "/models/adapters/support-bot"],
    ]
    assert main["image"].startswith("vllm/vllm-openai:")
    assert arg(main, "--model") == "/models/base" and arg(main, "--served-model-name") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert "--enable-lora" in main["args"] and arg(main, "--lora-modules") == "support-bot=/models/adapters/support-bot"
    assert arg(main, "--max-lora-rank") == "16" and arg(main, "--host") == "0.0.0.0"
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert main["startupProbe"]["httpGet"]["path"] == "/health"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    # Prometheus finds vLLM's metrics through the conventional pod annotations
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}


def test_the_spec_s_annotations_win_over_the_scrape_annotations(tmp_path):
    mine = {"prometheus.io/scrape": "false", "team": "nlp"}
    deployment, *_ = render_serve(job(tmp_path, output={"uri": "s3://results/x"}, kubernetes={"annotations": mine}))
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "false", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics", "team": "nlp"}


def test_oci_output_is_fetched_by_tag(tmp_path):
    objects = render_serve(job(tmp_path, output={"uri": "oci://ghcr.io/acme/support-bot:v1", "merge": True}))
    validate(objects)
    _, _, spec, _ = parts(objects)
    assert spec["initContainers"][1]["command"][2] == "oci://ghcr.io/acme/support-bot:v1"
    merged = render_serve(job(tmp_path, output={"uri": "oci://ghcr.io/acme/support-bot:v1", "merge": True}), merged=True)
    validate(merged)
    _, _, spec, main = parts(merged)
    assert [c["command"][2] for c in spec["initContainers"]] == ["oci://ghcr.io/acme/support-bot:v1-merged"]
    assert "--enable-lora" not in main["args"] and arg(main, "--served-model-name") == "support-bot"


def test_pvc_job_is_read_from_its_volume(tmp_path):
    objects = render_serve(job(tmp_path, kubernetes={"workspace": {"volume": "pvc", "size": "50Gi"}}))
    validate(objects)
    _, _, spec, main = parts(objects)
    assert "initContainers" not in spec, "the job already fetched the base model onto the PVC"
    assert {"name": "workspace", "persistentVolumeClaim": {"claimName": "support-bot-workspace", "readOnly": True}} in spec["volumes"]
    assert {"name": "workspace", "mountPath": "/workspace", "readOnly": True} in main["volumeMounts"]
    assert arg(main, "--model") == "/workspace/model"
    assert arg(main, "--lora-modules") == "support-bot=/workspace/output/adapter"


def test_full_fine_tune_serves_its_model(tmp_path):
    objects = render_serve(job(tmp_path, method={"type": "full"}, output={"uri": "s3://results/full"}))
    validate(objects)
    _, _, spec, main = parts(objects)
    assert [c["command"][2:] for c in spec["initContainers"]] == [["s3://results/full/model", "/models/base"]]
    assert "--enable-lora" not in main["args"]


def test_extra_adapters_accelerators_secrets_and_placement(tmp_path):
    j = job(
        tmp_path,
        output={"uri": "s3://results/support-bot"},
        resources={"accelerators": 2, "accelerator_type": "amd.com/gpu", "cpu": "8", "memory": "64Gi"},
        kubernetes={
            "namespace": "ml",
            "image": "registry.local/kubetune:dev",
            "node_selector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "secrets": {"hf_token": "hf", "s3": "minio"},
        },
    )
    objects = render_serve(j, adapters={"legal": "s3://adapters/legal", "hr": "oci://ghcr.io/acme/hr:v2"}, replicas=2, api_key_secret="serve-key", max_model_len=4096)
    validate(objects)
    deployment, service, spec, main = parts(objects)
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == "ml"
    assert deployment["spec"]["replicas"] == 2
    assert arg(main, "--tensor-parallel-size") == "2" and arg(main, "--max-model-len") == "4096"
    assert main["resources"]["limits"] == {"memory": "64Gi", "amd.com/gpu": "2"}
    assert arg(main, "--max-loras") == "3"
    i = main["args"].index("--lora-modules")
    assert main["args"][i + 1 : i + 4] == ["support-bot=/models/adapters/support-bot", "legal=/models/adapters/legal", "hr=/models/adapters/hr"]
    assert [c["command"][2] for c in spec["initContainers"]][2:] == ["s3://adapters/legal", "oci://ghcr.io/acme/hr:v2"]
    assert all(c["image"] == "registry.local/kubetune:dev" for c in spec["initContainers"])
    fetch_env = {e["name"]: e for e in spec["initContainers"][0]["env"]}
    assert fetch_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert fetch_env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "minio"
    assert fetch_env["KUBETUNE_HOME"]["value"].startswith("/models/")
    key = next(e for e in main["env"] if e["name"] == "VLLM_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "serve-key", "key": "api-key"}
    assert spec["nodeSelector"] == {"pool": "gpu"} and spec["tolerations"][0]["key"] == "gpu"


def test_local_base_model_is_served_from_its_staged_copy(tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    j = job(tmp_path, model={"source": str(model)}, output={"uri": "s3://results/x"}, kubernetes={"staging_uri": "s3://staging/kt"})
    objects = render_serve(j)
    validate(objects)
    assert parts(objects)[2]["initContainers"][0]["command"][2].startswith("s3://staging/kt/")
    with pytest.raises(SpecError, match="local path"):
        render_serve(job(tmp_path, model={"source": str(model)}, output={"uri": "s3://results/x"}))


def test_results_a_pod_cannot_reach_are_refused(tmp_path):
    with pytest.raises(SpecError, match="emptyDir") as e:
        render_serve(job(tmp_path))
    assert "output.uri" in str(e.value)
    with pytest.raises(SpecError, match="machine that ran the job"):
        render_serve(job(tmp_path, output={"uri": "file:///tmp/out"}))
    with pytest.raises(SpecError, match="no merged model"):
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), merged=True)
    with pytest.raises(SpecError, match="local path"):
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), adapters={"a": "runs/a"})
    with pytest.raises(SpecError, match="DoRA"):
        render_serve(job(tmp_path, method={"type": "dora"}, output={"uri": "s3://r/x"}))
    with pytest.raises(SpecError, match="used twice"):
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), adapters={"support-bot": "s3://r/y"})
    saved = {"type": "lora", "lora": {"modules_to_save": ["embed_tokens"]}}  # vLLM would fail at the first request
    with pytest.raises(SpecError, match="modules_to_save") as e:
        render_serve(job(tmp_path, method=saved, output={"uri": "s3://r/x", "merge": True}))
    assert e.value.hint == "serve the merged model with --merged"  # the job writes it already
    with pytest.raises(SpecError, match="modules_to_save") as e:
        render_serve(job(tmp_path, method=saved, output={"uri": "s3://r/x"}))
    assert "--merged" in e.value.hint and "set output.merge: true" in e.value.hint
    validate(render_serve(job(tmp_path, method=saved, output={"uri": "s3://r/x", "merge": True}), merged=True))
    with pytest.raises(SpecError, match="api-key-secret"):
        render_serve(job(tmp_path, output={"uri": "s3://r/x"}), api_key_secret="Bad_Name")


@pytest.mark.parametrize(
    ("options", "kinds"),
    [(["--set", "resources.accelerators=1"], ["Deployment", "Service"]), (["--flavor", "kserve", "-o", "yaml"], ["InferenceService"])],
    ids=["deployment", "kserve"],
)
def test_render_serve_cli_prints_yaml_without_importing_torch(tmp_path, options, kinds):
    path = spec_file(tmp_path, output={"uri": "s3://results/support-bot"})
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from kubetune.cli import app\n"
        f"r = CliRunner().invoke(app, ['render-serve', {str(path)!r}, '--adapter', 'legal=s3://a/legal', *{options!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules and 'fastapi' not in sys.modules, 'render-serve stays light'\n"
        "print(r.output)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    assert [d["kind"] for d in docs] == kinds
    if kinds == ["InferenceService"]:
        validate_crd_object(docs[0])  # the KServe CRD's schema and the inline pod's rules
        pod = docs[0]["spec"]["predictor"]
    else:
        validate(docs)
        pod = docs[0]["spec"]["template"]["spec"]
    assert "legal=/models/adapters/legal" in pod["containers"][0]["args"]


def test_render_dash_dash_serve_prints_the_same_objects(tmp_path):
    path = spec_file(tmp_path, output={"uri": "s3://results/support-bot"})
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from kubetune.cli import app\n"
        f"r = CliRunner().invoke(app, ['render', {str(path)!r}, '--serve', '-n', 'ml'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules and 'fastapi' not in sys.modules, 'render --serve stays light'\n"
        "print(r.output)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    validate(docs)
    assert docs == render_serve(job(tmp_path, output={"uri": "s3://results/support-bot"}), namespace="ml")
    r = subprocess.run([sys.executable, "-m", "kubetune.cli", "render", str(path), "--serve", "--backend", "kfp"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--serve" in r.stderr and "Traceback" not in r.stderr
