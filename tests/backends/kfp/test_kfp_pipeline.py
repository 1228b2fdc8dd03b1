"""The compiled pipeline (KFP IR YAML): components, parameters, images, installs, resources and pod settings."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from kubetune import __version__
from kubetune import constants as C
from kubetune.backends.kfp import render_pipeline
from kubetune.errors import SpecError
from kubetune.spec import load_spec

IMAGE = f"ghcr.io/kubetune/kubetune:{__version__}"


def _ir(spec: dict) -> tuple[dict, dict]:
    """(pipeline spec, platform spec) of the job's compiled pipeline."""
    docs = list(yaml.safe_load_all(render_pipeline(load_spec(spec))))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def _executor(ir: dict, name: str) -> dict:
    return ir["deploymentSpec"]["executors"][f"exec-{name}"]["container"]


def _command(container: dict) -> str:
    return " ".join(container["command"])


def test_cpu_job_compiles_to_fetch_train_publish(tiny_job):
    spec = tiny_job(resources={"cpu": "4", "memory": "16Gi"}, kfp={"memory_limit": "20Gi", "cpu_limit": "6"})
    ir, platform = _ir(spec)

    assert ir["pipelineInfo"]["name"] == "kubetune-tiny"
    assert set(ir["components"]) == {"comp-fetch", "comp-train", "comp-publish"}
    tasks = ir["root"]["dag"]["tasks"]
    assert set(tasks) == {"fetch", "train", "publish"}
    assert tasks["train"]["dependentTasks"] == ["fetch"]
    assert tasks["publish"]["dependentTasks"] == ["train"]
    assert tasks["train"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"] == {"outputArtifactKey": "model", "producerTask": "fetch"}
    assert tasks["publish"]["inputs"]["parameters"]["metrics_json"]["taskOutputParameter"]["producerTask"] == "train"
    assert all(not t.get("cachingOptions", {}).get("enableCache") for t in tasks.values())  # training is never cached

    params = ir["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"spec", "model_uri", "dataset_uri", "eval_dataset_uri", "run_dir"}
    assert params["model_uri"]["defaultValue"] == "builtin://tiny-chat"
    assert params["dataset_uri"]["defaultValue"] == spec["dataset"]["source"]
    assert params["run_dir"]["defaultValue"] == ""
    embedded = yaml.safe_load(params["spec"]["defaultValue"])
    assert embedded["name"] == "tiny" and embedded["training"]["max_steps"] == 6

    train = _executor(ir, "train")
    assert train["image"] == IMAGE
    assert train["resources"]["resourceCpuRequest"] == "4"
    assert train["resources"]["resourceMemoryRequest"] == "16Gi"
    assert train["resources"]["resourceCpuLimit"] == "6"
    assert train["resources"]["resourceMemoryLimit"] == "20Gi"
    assert "accelerator" not in train["resources"]
    assert "resources" not in _executor(ir, "fetch")  # only the train task asks for the node's resources
    # The kubetune image has kubetune: only the kfp SDK is installed at start, and each body calls a stage.
    assert "kubetune==" not in _command(train)
    assert "from kubetune.backends.kfp.stages import train_stage" in _command(train)
    assert "fetch_stage" in _command(_executor(ir, "fetch"))
    assert "publish_stage" in _command(_executor(ir, "publish"))
    labels = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]["podMetadata"]["labels"]
    assert labels == {C.LABEL_JOB: "tiny", C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE}


def test_gpu_job_any_accelerator_name_and_count(tiny_job):
    spec = tiny_job(
        resources={"accelerators": 4, "accelerator_type": "amd.com/gpu", "processes_per_node": 4, "memory": "64Gi"},
        output={"merge": True},
        kfp={"base_image": "rocm/pytorch:latest", "package": "kubetune[qlora]==0.1.0", "pip_index_urls": ["https://pypi.example/simple"]},
    )
    ir, _ = _ir(spec)

    assert set(ir["components"]) == {"comp-fetch", "comp-train", "comp-merge", "comp-publish-merged"}
    tasks = ir["root"]["dag"]["tasks"]
    assert sorted(tasks["publish-merged"]["dependentTasks"]) == ["merge", "train"]
    assert tasks["merge"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]["producerTask"] == "fetch"
    train = _executor(ir, "train")
    accel = train["resources"]["accelerator"]
    assert (accel["resourceType"], accel["resourceCount"]) == ("amd.com/gpu", "4")
    assert train["resources"]["resourceMemoryRequest"] == "64Gi"
    merge = _executor(ir, "merge")
    assert "accelerator" not in merge["resources"] and merge["resources"]["resourceMemoryRequest"] == "64Gi"
    for name in ("fetch", "train", "merge", "publish-merged"):
        c = _executor(ir, name)
        assert c["image"] == "rocm/pytorch:latest"
        assert "'kubetune[qlora]==0.1.0'" in _command(c) and "--index-url https://pypi.example/simple" in _command(c)


def test_nvidia_default_image_is_the_cuda_tag_and_other_images_install_kubetune(tiny_job):
    ir, _ = _ir(tiny_job(resources={"accelerators": 1}))
    train = _executor(ir, "train")
    assert train["image"] == f"{IMAGE}-cuda"
    assert train["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"

    ir, _ = _ir(tiny_job(kfp={"base_image": "python:3.11"}))
    assert f"'kubetune=={__version__}'" in _command(_executor(ir, "fetch"))

    ir, _ = _ir(tiny_job(kfp={"base_image": "registry.example/kubetune-custom:1", "package": ""}))
    assert "kubetune==" not in _command(_executor(ir, "fetch"))


def test_kubernetes_section_goes_on_the_pods(tiny_job):
    spec = tiny_job(
        resources={"accelerators": 1},
        kubernetes={
            "env": {"AWS_ENDPOINT_URL": "http://minio.minio:9000"},
            "secrets": {"hf_token": "hf", "s3": {"secret": "aws-connection"}, "env": [{"var": "WANDB_API_KEY", "secret": "wandb", "key": "key"}]},
            "node_selector": {"nvidia.com/gpu.product": "A100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "image_pull_secrets": ["regcred"],
            "shm_size": "8Gi",
            "active_deadline_seconds": 7200,
        },
    )
    ir, platform = _ir(spec)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in ("fetch", "train", "publish"):
        ex = executors[f"exec-{name}"]
        envs = {e["envVar"]: (s["secretName"], e["secretKey"]) for s in ex["secretAsEnv"] for e in s["keyToEnv"]}
        assert envs == {"HF_TOKEN": ("hf", "token"), "AWS_ACCESS_KEY_ID": ("aws-connection", "AWS_ACCESS_KEY_ID"),
                        "AWS_SECRET_ACCESS_KEY": ("aws-connection", "AWS_SECRET_ACCESS_KEY"), "WANDB_API_KEY": ("wandb", "key")}
        assert [s["secretName"] for s in ex["imagePullSecret"]] == ["regcred"]
        assert {"name": "AWS_ENDPOINT_URL", "value": "http://minio.minio:9000"} in _executor(ir, name)["env"]
    train = executors["exec-train"]
    assert train["nodeSelector"]["labels"] == {"nvidia.com/gpu.product": "A100"}
    assert train["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    assert train["emptyDirMounts"][0]["mountPath"] == "/dev/shm" and train["emptyDirMounts"][0]["sizeLimit"] == "8Gi"
    assert int(train["activeDeadlineSeconds"]) == 7200
    assert "nodeSelector" not in executors["exec-fetch"]  # placement is for the heavy tasks only


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"resources": {"nodes": 2}}, "resources.nodes"),
        ({"resources": {"memory": "lots"}}, "resources.memory"),
        ({"resources": {"accelerators": 1, "accelerator_type": "gpu.intel.com/i915"}}, "kfp.base_image"),  # no image ships for Intel GPUs
    ],
)
def test_settings_kfp_cannot_express_name_their_field(tiny_job, sections, field):
    with pytest.raises(SpecError) as err:
        render_pipeline(load_spec(tiny_job(**sections)))
    assert field in str(err.value)


def test_kfp_section_is_validated(tiny_job):
    with pytest.raises(SpecError) as err:
        load_spec(tiny_job(kfp={"mode": "cluster", "host": "ml-pipeline:8888", "bucket": "s3://Bad_Bucket", "memory_limit": "lots"}))
    text = str(err.value)
    for field in ("kfp.mode", "kfp.host", "kfp.bucket", "kfp.memory_limit"):
        assert field in text
    job = load_spec(tiny_job(kfp={"bucket": "team-bucket/kubetune/", "host": "http://localhost:8888/"}))
    assert job.kfp.bucket == "s3://team-bucket/kubetune" and job.kfp.host == "http://localhost:8888"


def test_render_cli_prints_the_ir_without_importing_torch(tiny_job, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_job(resources={"accelerators": 2, "processes_per_node": 2})), encoding="utf-8")
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from kubetune.cli import app\n"
        f"r = CliRunner().invoke(app, ['render', {str(spec_file)!r}, '--backend', 'kfp'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'torch' not in sys.modules, 'render imported torch'\n"
        "sys.stdout.write(r.stdout)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ir = next(yaml.safe_load_all(out.stdout))
    assert ir["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]["accelerator"]["resourceCount"] == "2"
