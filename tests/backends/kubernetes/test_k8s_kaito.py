"""The kaito flavour: a Kaito tuning Workspace plus the ConfigMap of its training config, from the resolved spec.

The Workspace validates against Kaito's CRD (v1beta1), the ConfigMap with kubernetes-validate; the rules of
Kaito's admission webhook that a schema cannot hold are checked here (`_kaito_webhook`), and the training
config carries exactly the values kubetune's own engine would train with.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C
from kubetune.backends.kubernetes import render, render_text
from kubetune.errors import SpecError
from kubetune.spec import load_spec

from .cli_process import run_kubetune
from .k8s_validate import validate_all
from .specs import merge

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("KUBETUNE_UPDATE_GOLDEN") == "1"

KAITO = {
    "name": "phi3-capitals",
    "model": {"source": "hf://microsoft/Phi-3-mini-4k-instruct"},
    "dataset": {"source": "https://example.com/data/capitals.jsonl"},
    "method": {"type": "lora"},
    "training": {"epochs": 2, "batch_size": 4},
    "output": {"uri": "oci://registry.example.com/adapters/phi3-capitals:0.1.0"},
    "resources": {"accelerators": 1},
    "kubernetes": {
        "flavor": "kaito",
        "namespace": "ml",
        "kaito": {"instance_type": "Standard_NC24ads_A100_v4", "push_secret": "registry-push"},
    },
}


def _spec(**over) -> dict:
    return merge(KAITO, over)


def _job(overrides: list[str] | None = None, **over):
    return load_spec(_spec(**over), overrides)


def _config(objects: list[dict]) -> dict:
    return yaml.safe_load(objects[0]["data"][C.K8S_KAITO_CONFIG_KEY])["training_config"]


def _kaito_webhook(objects: list[dict]) -> None:
    """What Kaito's webhook checks on create (api/v1beta1 workspace_validation.go, tuning_config_validation.go)."""
    cm, ws = objects
    tuning = ws["tuning"]
    assert tuning["method"] in ("lora", "qlora")
    assert tuning["config"] == cm["metadata"]["name"] and cm["metadata"].get("namespace") == ws["metadata"].get("namespace")
    assert tuning["preset"]["name"]
    sources = [k for k in ("urls", "image", "volumeSource") if tuning["input"].get(k)]
    assert len(sources) == 1, f"exactly one of urls, image, volume: {tuning['input']}"
    out = tuning["output"]
    assert (out.get("image") and out.get("imagePushSecret")) or (out.get("volumeSource") and not out.get("image")), f"an image or a volume: {out}"
    assert ws["resource"].get("count", 1) == 1 and "partition" not in ws["resource"]
    assert ws["resource"]["labelSelector"]["matchLabels"]
    text = cm["data"]["training_config.yaml"]
    sections = yaml.safe_load(text)["training_config"]
    assert set(sections) <= {"ModelConfig", "QuantizationConfig", "LoraConfig", "TrainingArguments", "DatasetConfig", "DataCollator"}
    out = sections["TrainingArguments"]["output_dir"]
    clean = os.path.normpath(out if out.startswith("/mnt") else os.path.join("/mnt", out))
    assert clean != "/mnt" and clean.startswith("/mnt/"), f"Kaito refuses output_dir {out!r}"
    four = sections["QuantizationConfig"].get("load_in_4bit", False)
    assert four is (tuning["method"] == "qlora"), "qlora needs load_in_4bit, lora must not set it"


# --- renders ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_lora_and_qlora_render_valid_objects(method):
    objects = render(_job(method={"type": method}))  # kubernetes.flavor: kaito picks the flavour
    assert [o["kind"] for o in objects] == ["ConfigMap", "Workspace"]
    validate_all(objects)  # ConfigMap: kubernetes-validate strict; Workspace: the v1beta1 CRD schema, names
    _kaito_webhook(objects)
    cm, ws = objects
    assert ws["apiVersion"] == "kaito.sh/v1beta1"
    assert ws["metadata"]["name"] == "phi3-capitals" and cm["metadata"]["name"] == "phi3-capitals-kaito-config"
    for o in objects:
        assert o["metadata"]["namespace"] == "ml"
        assert o["metadata"]["labels"] == {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_JOB: "phi3-capitals", C.LABEL_FLAVOR: "kaito"}
    assert ws["resource"] == {"instanceType": "Standard_NC24ads_A100_v4", "labelSelector": {"matchLabels": {C.LABEL_JOB: "phi3-capitals"}}}
    assert ws["tuning"] == {
        "preset": {"name": "phi-3-mini-4k-instruct"},
        "method": method,
        "config": "phi3-capitals-kaito-config",
        "input": {"name": "phi3-capitals", "urls": ["https://example.com/data/capitals.jsonl"]},
        "output": {"image": "registry.example.com/adapters/phi3-capitals:0.1.0", "imagePushSecret": "registry-push"},
    }
    assert render_text(render(_job(method={"type": method}))) == render_text(objects)  # deterministic


def test_flag_picks_kaito_and_namespace_override():
    spec = _spec()
    spec["kubernetes"]["flavor"] = "job"
    spec["kubernetes"].pop("namespace")
    objects = render(load_spec(spec), "kaito", namespace="team-b")
    assert [o["kind"] for o in objects] == ["ConfigMap", "Workspace"]
    assert {o["metadata"]["namespace"] for o in objects} == {"team-b"}
    no_ns = render(load_spec(spec), "kaito")
    assert all("namespace" not in o["metadata"] for o in no_ns)  # like the other flavours: none unless asked
    validate_all(no_ns)


def test_config_holds_the_resolved_hyperparameters():
    from kubetune.training.model import precision

    gpu = {"type": "cuda", "bf16": True, "name": "A100"}
    # qlora preset (dropout 0.05, warmup 0.03, clip 0.3, checkpointing) + the user's overrides
    job = _job(
        ["method.lora.r=64", "training.learning_rate=5e-5", "training.gradient_accumulation_steps=4"],
        method={"type": "qlora"},
        dataset={"eval_split": 0.1},
    )
    cfg = _config(render(job))
    lora, args, quant = cfg["LoraConfig"], cfg["TrainingArguments"], cfg["QuantizationConfig"]
    assert lora["r"] == 64 == job.method.lora.r
    assert lora["lora_alpha"] == job.method.lora.alpha == 32
    assert lora["lora_dropout"] == job.method.lora.dropout == 0.05  # from the qlora preset
    assert lora["bias"] == "none"
    assert args["learning_rate"] == 5e-5
    assert args["num_train_epochs"] == job.training.epochs == 2 and "max_steps" not in args
    assert args["per_device_train_batch_size"] == 4
    assert args["gradient_accumulation_steps"] == job.accumulation_steps == 4
    assert args["lr_scheduler_type"] == job.training.lr_scheduler == "cosine"
    assert args["warmup_ratio"] == job.training.warmup_ratio == 0.03
    assert args["max_grad_norm"] == job.training.max_grad_norm == 0.3
    assert args["weight_decay"] == job.training.weight_decay
    assert args["gradient_checkpointing"] is True
    assert args["seed"] == job.training.seed and args["save_strategy"] == "epoch" and args["save_total_limit"] == 2
    assert args["eval_strategy"] == "epoch"  # kubetune evaluates whenever it checkpoints
    prec = precision(job, gpu)  # what kubetune's engine would load and compute in on a bf16 GPU
    assert cfg["ModelConfig"] == {"torch_dtype": prec.weights, "local_files_only": True, "device_map": "auto"}
    assert quant == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": prec.compute_4bit, "bnb_4bit_use_double_quant": True}
    assert args["bf16"] is (prec.amp == "bf16") and args["fp16"] is False
    assert cfg["DataCollator"] == {"mlm": False}
    assert cfg["DatasetConfig"] == {"shuffle_dataset": True, "shuffle_seed": 42, "train_test_split": 0.9}


def test_lora_steps_and_no_quantization():
    job = _job(["training.max_steps=300", "training.save_steps=50", "training.warmup_steps=10", "model.dtype=float16"])
    cfg = _config(render(job))
    assert cfg["QuantizationConfig"] == {"load_in_4bit": False}
    assert cfg["LoraConfig"]["lora_dropout"] == 0.0  # the lora preset, not qlora's
    args = cfg["TrainingArguments"]
    assert args["max_steps"] == 300 and args["save_strategy"] == "steps" and args["save_steps"] == 50
    assert args["warmup_steps"] == 10 and "warmup_ratio" not in args
    assert cfg["ModelConfig"]["torch_dtype"] == "float16" and args["fp16"] is True and args["bf16"] is False
    assert "eval_strategy" not in args and cfg["DatasetConfig"]["train_test_split"] == 1.0
    assert args["gradient_checkpointing"] is False


def test_config_keys_are_fields_kaitos_parsers_know():
    """Kaito parses each section with HfArgumentParser, which fails on unknown keys: every key must be a field."""
    import dataclasses
    import inspect

    import transformers
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, DataCollatorForLanguageModeling, TrainingArguments

    # Kaito's tuning image pins transformers 4.50 (presets/workspace/dependencies/requirements.txt); these keys
    # exist there and were removed in transformers 5, which may be the one installed here.
    removed_in_5 = {"warmup_ratio"} if int(transformers.__version__.split(".")[0]) >= 5 else set()

    for method in ("lora", "qlora"):
        cfg = _config(render(_job(["training.save_steps=10", "training.eval_steps=5"], method={"type": method}, dataset={"eval_split": 0.2})))
        fields = {
            "TrainingArguments": {f.name for f in dataclasses.fields(TrainingArguments)} | removed_in_5,
            "LoraConfig": {f.name for f in dataclasses.fields(LoraConfig)},
            "DataCollator": {f.name for f in dataclasses.fields(DataCollatorForLanguageModeling)},
            "QuantizationConfig": set(inspect.signature(BitsAndBytesConfig.__init__).parameters),
            # Kaito's own classes (presets/workspace/tuning/text-generation/cli.py)
            "ModelConfig": {"torch_dtype", "local_files_only", "device_map", "trust_remote_code", "revision", "chat_template"},
            "DatasetConfig": {"shuffle_dataset", "shuffle_seed", "train_test_split", "dataset_path", "response_column", "messages_column", "context_column"},
        }
        for section, values in cfg.items():
            unknown = set(values) - fields[section]
            assert not unknown, f"{section}: {unknown} would stop Kaito's parser"
            for key, value in values.items():  # flattened to CLI args: scalars or lists of scalars only
                assert not isinstance(value, dict), f"{section}.{key}"
                assert not isinstance(value, list) or all(isinstance(v, str) for v in value), f"{section}.{key}"


# --- mapping details -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source, preset, targets, expected",
    [
        ("hf://microsoft/Phi-3-mini-4k-instruct", None, "all-linear", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        ("hf://meta-llama/Llama-3.1-8B-Instruct@main", None, "attention", ["q_proj", "k_proj", "v_proj", "o_proj"]),
        ("hf://tiiuae/falcon-7b", None, "mlp", ["dense_h_to_4h", "dense_4h_to_h"]),
        ("s3://models/my-llama", "llama-3.1-8b-instruct", "all-linear", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        ("hf://org/SomethingNew-7B", None, ["q_proj", "v_proj"], ["q_proj", "v_proj"]),
    ],
)
def test_preset_and_target_modules(source, preset, targets, expected):
    kaito = {"instance_type": "Standard_NC24ads_A100_v4", "push_secret": "registry-push"}
    if preset:
        kaito["preset"] = preset
    job = _job(model={"source": source}, method={"type": "lora", "lora": {"target_modules": targets}}, kubernetes={"kaito": kaito})
    objects = render(job)
    want = preset or source.split("/")[-1].split("@")[0].lower()
    assert objects[1]["tuning"]["preset"]["name"] == want
    assert _config(objects)["LoraConfig"]["target_modules"] == expected


def test_oci_dataset_is_an_input_image_with_pull_secrets():
    job = _job(dataset={"source": "oci://registry.example.com/data/capitals:1"}, kubernetes={"image_pull_secrets": ["registry-pull"]})
    objects = render(job)
    validate_all(objects)
    _kaito_webhook(objects)
    assert objects[1]["tuning"]["input"] == {"name": "phi3-capitals", "image": "registry.example.com/data/capitals:1", "imagePullSecrets": ["registry-pull"]}


def test_volumes_in_and_out_are_persistent_volume_claims():
    job = _job(dataset={"source": "pvc://team-data"}, output={"uri": "pvc://team-adapters"}, kubernetes={"kaito": {"push_secret": None}})
    objects = render(job)
    validate_all(objects)  # volumeSource is a v1 volume source inside the CRD's schema
    _kaito_webhook(objects)
    tuning = objects[1]["tuning"]
    assert tuning["input"] == {"name": "phi3-capitals", "volumeSource": {"persistentVolumeClaim": {"claimName": "team-data", "readOnly": True}}}
    assert tuning["output"] == {"volumeSource": {"persistentVolumeClaim": {"claimName": "team-adapters"}}}  # no push Secret needed


@pytest.mark.parametrize("flavor", ["job", "pytorchjob", "trainjob"])
def test_a_volume_uri_is_the_kaito_flavours_only(flavor):
    with pytest.raises(SpecError) as e:
        render(_job(dataset={"source": "pvc://team-data"}, kubernetes={"flavor": flavor}))
    assert "dataset.source: pvc://team-data is a PersistentVolumeClaim, which only kubernetes.flavor kaito mounts" in e.value.message
    assert "--flavor kaito" in e.value.hint


def test_own_gpu_nodes_by_node_selector():
    spec = _spec(kubernetes={"node_selector": {"accelerator": "nvidia-a100"}})
    del spec["kubernetes"]["kaito"]["instance_type"]  # Kaito's node auto-provisioning off: bring your nodes
    objects = render(load_spec(spec))
    validate_all(objects)
    assert objects[1]["resource"] == {"labelSelector": {"matchLabels": {"accelerator": "nvidia-a100"}}}


# --- what does not fit ----------------------------------------------------------------------------
ERRORS = [
    (dict(method={"type": "full"}), ["method.type full", "kaito tunes with lora or qlora; use --flavor job"]),
    (dict(method={"type": "dora"}), ["method.type dora", "use --flavor job"]),
    (dict(method={"type": "lora", "objective": "dpo"}), ["method.objective dpo", "supervised fine-tuning only"]),
    (dict(dataset={"source": "examples/data/capitals.jsonl"}), ["dataset.source", "local path", "Kaito's data-downloader fetches http(s) URLs, an image or a volume (pvc://CLAIM)", "oci://"]),
    (dict(dataset={"source": "s3://datasets/capitals.jsonl"}), ["dataset.source s3://", "Kaito's data-downloader fetches http(s) URLs, an image or a volume"]),
    (dict(dataset={"source": "https://localhost:8080/capitals.jsonl"}), ["dataset.source", "localhost"]),
    (dict(output={"uri": None}), ["output.uri (unset)", "as an image or onto a volume", "oci://", "pvc://CLAIM"]),
    (dict(output={"uri": "s3://results/phi3"}), ["output.uri s3://results/phi3", "oci://"]),
    (dict(dataset={"source": "pvc://team-data/capitals"}), ["dataset.source pvc://team-data/capitals", "whole volume", "pvc://team-data"]),
    (dict(output={"uri": "pvc://Team_Out"}), ["output.uri pvc://Team_Out", "not a PersistentVolumeClaim name"]),
    (dict(dataset={"mix": [{"source": "https://example.com/more.jsonl"}]}), ["dataset.mix", "one dataset"]),
    (dict(dataset={"eval_source": "https://example.com/eval.jsonl"}), ["dataset.eval_source", "dataset.eval_split"]),
    (dict(dataset={"preprocess": {"file": "https://example.com/prep.py"}}), ["dataset.preprocess", "runs no kubetune code", "--flavor job"]),
    (dict(resources={"accelerators": 2, "processes_per_node": 2}), ["resources.processes_per_node 2", "kubernetes.kaito.instance_type"]),
    (dict(resources={"nodes": 2}), ["resources.nodes 2", "one node"]),
    (dict(model={"source": "builtin://tiny-chat"}), ["model.source builtin://tiny-chat", "no Kaito preset"]),
    (dict(model={"source": "s3://models/llama"}), ["model.source s3://models/llama", "kubernetes.kaito.preset"]),
    (dict(kubernetes={"kaito": {"push_secret": None}}), ["kubernetes.kaito.push_secret"]),
    (dict(resources={"accelerators": 1, "accelerator_type": "nvidia.com/mig-1g.10gb"}), ["resources.accelerator_type", "MIG"]),
    (dict(kubernetes={"tolerations": [{"key": "gpu", "operator": "Exists"}], "shm_size": "8Gi"}), ["kubernetes.tolerations", "kubernetes.shm_size", "--flavor job"]),
    (dict(resources={"memory": "32Gi"}), ["resources.memory"]),
    (dict(output={"merge": True}), ["output.merge"]),
    (dict(training={"resume": "runs/old/checkpoints/step-100"}), ["training.resume"]),
    (dict(model={"attn_implementation": "flash_attention_2"}), ["model.attn_implementation"]),
    (dict(model={"source": "hf://org/SomethingNew-7B"}), ["method.lora.target_modules all-linear", "SomethingNew-7B".lower()]),
]


@pytest.mark.parametrize("over, needles", ERRORS, ids=[", ".join(n[:1]) for _, n in ERRORS])
def test_what_kaito_cannot_run_is_one_clear_error(over, needles):
    with pytest.raises(SpecError) as e:
        render(_job(**over))
    text = f"{e.value.message}\n{e.value.hint or ''}"
    for needle in needles:
        assert needle in text, f"{needle!r} not in: {text}"


def test_no_instance_type_nor_node_selector():
    spec = _spec()
    del spec["kubernetes"]["kaito"]["instance_type"]
    with pytest.raises(SpecError, match=r"kubernetes.kaito.instance_type") as e:
        render(load_spec(spec))
    assert "kubernetes.node_selector" in e.value.hint


def test_secret_references_never_their_values(monkeypatch):
    values = {"HF_TOKEN": "hf_SeCrEtTokenValue1234567890", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY", "DOCKER_PASSWORD": "d0ck3r-pa55w0rd"}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    job = _job(dataset={"source": "oci://registry.example.com/data/capitals:1"}, kubernetes={"image_pull_secrets": ["registry-pull"]})
    for output in ("yaml", "json"):
        text = render_text(render(job), output)
        for name, value in values.items():
            assert value not in text, f"{name}'s value leaked"
        assert "registry-push" in text and "registry-pull" in text  # the Secrets by name only
    assert "Secret" not in [o["kind"] for o in render(job)]
    # kubetune's secret references have no place in a Kaito pod: refused, not dropped silently
    with pytest.raises(SpecError, match=r"kubernetes.secrets"):
        render(_job(kubernetes={"secrets": {"hf_token": "hf-token"}}))


def test_golden():
    objects = render(_job(method={"type": "qlora"}, dataset={"eval_split": 0.1}))
    text = render_text(objects)
    path = GOLDEN / "kaito-qlora-phi3.yaml"
    if UPDATE_GOLDEN or not path.exists():
        if not UPDATE_GOLDEN and os.environ.get("CI"):
            pytest.fail(f"golden file {path.name} is missing; run KUBETUNE_UPDATE_GOLDEN=1 pytest tests/backends/kubernetes")
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"render changed; if intended: KUBETUNE_UPDATE_GOLDEN=1 pytest {__file__}"


# --- the CLI and the backend -----------------------------------------------------------------------
def _kubetune(*args: str) -> subprocess.CompletedProcess:
    return run_kubetune(*args, env={"KUBETUNE_HOME": os.environ.get("KUBETUNE_HOME", "/tmp/kth-kaito-tests")}, probe=True)


def test_cli_render_is_instant_and_errors_exit_2(tmp_path):
    spec = _spec()
    spec["kubernetes"]["flavor"] = "job"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    r = _kubetune("render", str(path), "--flavor", "kaito")
    assert r.returncode == 0, r.stderr
    assert [o["kind"] for o in yaml.safe_load_all(r.stdout)] == ["ConfigMap", "Workspace"]
    assert "HEAVY []" in r.stderr, r.stderr  # no torch, transformers, peft or kubernetes client
    bad = _kubetune("render", str(path), "--flavor", "kaito", "--set", "dataset.source=s3://datasets/capitals.jsonl")
    assert bad.returncode == 2
    assert "dataset.source s3://datasets/capitals.jsonl" in bad.stderr and "Traceback" not in bad.stderr


WS = (C.K8S_KAITO_API_VERSION, "workspaces")
TRAINER_LOG = """loading preset phi-3-mini-4k-instruct
  3%|▎         | 3/100 [00:09<04:51,  3.00s/it]{'loss': 2.3061, 'grad_norm': 1.25, 'learning_rate': 0.0002, 'epoch': 0.06}
 10%|█         | 10/100 [00:30<04:30,  3.00s/it]{'loss': 1.7342, 'grad_norm': 0.98, 'learning_rate': 0.00018, 'epoch': 0.2}
"""


@pytest.fixture
def double():
    from .apiserver_double import CRD_GROUPS, ApiServerDouble

    d = ApiServerDouble(crds=(*CRD_GROUPS, C.K8S_KAITO_API_VERSION), namespaces=("default", "ml")).start()
    yield d
    d.stop()


@pytest.fixture
def backend(double, tmp_path):
    from kubetune.backends import get_backend

    return get_backend("kubernetes", kubeconfig=str(double.kubeconfig(tmp_path / "kubeconfig")), cache_seconds=0)


def _tuning_pod(double, *, main_state: dict | None = None, phase: str = "Running", logs: str = TRAINER_LOG) -> dict:
    """The pod Kaito's tuning Job runs: data-downloader, the tuning container, the image-pushing sidecar."""
    from .apiserver_double import make_pod

    pod = make_pod("phi3-capitals-x7k2p", {"job-name": "phi3-capitals", "batch.kubernetes.io/job-name": "phi3-capitals"},
                   main="phi3-capitals", image="mcr.microsoft.com/aks/kaito/kaito-phi-3-mini-4k-instruct:0.0.3", phase=phase,
                   init=[("data-downloader", {"terminated": {"exitCode": 0, "reason": "Completed"}})], main_state=main_state)
    pod["spec"]["containers"].append({"name": "docker-sidecar", "image": "docker:dind"})
    pod["status"]["containerStatuses"].append({"name": "docker-sidecar", "image": "docker:dind", "imageID": "", "ready": True, "restartCount": 0,
                                               "state": {"running": {"startedAt": "2023-11-14T22:13:20Z"}}})
    return double.add_pod("ml", pod, logs={"data-downloader": "downloaded capitals.jsonl\n", "phi3-capitals": logs,
                                          "docker-sidecar": "waiting for training to finish\n"})


def _conditions(double, *conds: tuple[str, str, str]) -> None:
    double.set_status(*WS, "ml", "phi3-capitals", {"conditions": [{"type": t, "status": s, "reason": r, "message": r} for t, s, r in conds]})


def test_run_status_logs_cancel(double, backend):
    ref = backend.submit(_job())
    assert (ref.id, ref.extra["flavor"], ref.extra["namespace"]) == ("phi3-capitals", "kaito", "ml")
    ws = double.get(*WS, "ml", "phi3-capitals")
    cm = double.get("v1", "configmaps", "ml", "phi3-capitals-kaito-config")
    assert ws["tuning"]["config"] == cm["metadata"]["name"] and ws["metadata"]["labels"][C.LABEL_RUN_ID] == ref.extra["run_id"]
    posts = [path for m, path in double.requests if m == "POST"]
    assert posts.index("/api/v1/namespaces/ml/configmaps") < posts.index("/apis/kaito.sh/v1beta1/namespaces/ml/workspaces")  # Kaito's webhook reads it
    assert backend.status(ref).state == C.STATE_PENDING
    _conditions(double, ("ResourceReady", "False", "provisioning Standard_NC24ads_A100_v4"))
    st = backend.status(ref)
    assert st.state == C.STATE_PENDING and "provisioning Standard_NC24ads_A100_v4" in st.reason

    _tuning_pod(double)
    _conditions(double, ("ResourceReady", "True", "ok"), ("TuningStarted", "True", "started"))
    st = backend.status(ref)
    # Kaito's trainer prints no kubetune events: the progress comes from the Trainer's own log lines.
    assert (st.state, st.step, st.total_steps, st.loss) == (C.STATE_RUNNING, 10, 100, 1.7342)
    assert [e["data"]["loss"] for e in backend.events(ref)] == [2.3061, 1.7342]
    lines = list(backend.logs(ref))
    assert lines[0] == "[data-downloader] downloaded capitals.jsonl" and lines[1] == "loading preset phi-3-mini-4k-instruct"
    assert lines[-1] == "[docker-sidecar] waiting for training to finish"
    assert list(backend.logs(ref, follow=True)) == TRAINER_LOG.splitlines()
    # listed with kubetune's other jobs, and found by name
    from kubetune.backends import get_backend

    in_ml = get_backend("kubernetes", kubeconfig=backend._kubeconfig, namespace="ml", cache_seconds=0)
    assert [r.id for r in in_ml.list()] == ["phi3-capitals"] and in_ml.resolve("phi3-capitals").extra["flavor"] == "kaito"
    assert in_ml.status("phi3-capitals").loss == 1.7342  # `kubetune status phi3-capitals -n ml`

    _conditions(double, ("TuningStarted", "True", "started"), ("TuningComplete", "True", "done"))
    st = backend.status(ref)
    assert st.state == C.STATE_SUCCEEDED and st.extra["output_image"] == "registry.example.com/adapters/phi3-capitals:0.1.0"

    backend.cancel(ref)
    assert double.get(*WS, "ml", "phi3-capitals") is None
    assert double.get("v1", "configmaps", "ml", "phi3-capitals-kaito-config") is None
    assert any(m == "PATCH" and "workspaces" in path for m, path in double.requests)  # marked cancelled first
    assert backend.status(ref).state == C.STATE_CANCELLED


def test_a_failed_tuning_pod_is_diagnosed(double, backend):
    ref = backend.submit(_job())
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    _tuning_pod(double, main_state=oom, phase="Failed", logs=TRAINER_LOG + "torch.OutOfMemoryError: CUDA out of memory\n")
    _conditions(double, ("TuningStarted", "True", "started"), ("TuningFailed", "True", "JobFailed"))
    st = backend.status(ref)
    assert st.state == C.STATE_FAILED
    assert "phi3-capitals" in st.reason and "memory" in st.reason.lower()  # the container, and what to do about it
    assert st.extra["exit_code"] == 137 and st.loss == 1.7342


def test_kaito_conditions_map_to_states():
    from kubetune.backends.kubernetes.kaito_run import progress_events, workspace_state

    def ws(*conds, **md):
        return {"metadata": md, "status": {"conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conds]}}

    assert workspace_state(ws()) == (C.STATE_PENDING, None)
    assert workspace_state(ws(("WorkspaceSucceeded", "True", "ok")))[0] == C.STATE_SUCCEEDED  # newer Kaito
    assert workspace_state(ws(("WorkspaceSucceeded", "False", "WorkspaceFailed")))[0] == C.STATE_FAILED
    assert workspace_state(ws(("TuningFailed", "True", "BackoffLimitExceeded"))) == (C.STATE_FAILED, "BackoffLimitExceeded")
    assert workspace_state(ws(annotations={C.ANNOTATION_CANCELLED: "2026-01-01T00:00:00Z"}))[0] == C.STATE_CANCELLED
    # the Trainer's end-of-training summary counts as the last loss; lines that are not its dicts are ignored
    evs = progress_events("{'train_runtime': 300.1, 'train_loss': 1.5, 'epoch': 2.0}\nnot {'a dict\n")
    assert [e["data"]["loss"] for e in evs] == [1.5]


@pytest.mark.parametrize(
    "kaito, field",
    [({"preset": "Phi_3"}, "kubernetes.kaito.preset"), ({"push_secret": "Bad Secret"}, "kubernetes.kaito.push_secret"), ({"instance_type": "a b"}, "kubernetes.kaito.instance_type")],
)
def test_kaito_section_is_checked_when_the_spec_loads(kaito, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        load_spec(_spec(kubernetes={"kaito": kaito}))


def test_a_local_dataset_is_staged_and_given_to_kaito_as_a_presigned_url(double, backend, s3, tmp_path):
    import urllib.request

    data = tmp_path / "capitals.jsonl"
    data.write_text('{"prompt": "Capital of France?", "completion": "Paris"}\n', encoding="utf-8")
    job = _job([f"dataset.source={data}", f"kubernetes.staging_uri={s3.uri('staging')}"])
    # a render (pure) shows where kubetune run uploads the file; only a submission can sign a URL
    (_, ws) = render(job, "kaito")
    assert ws["tuning"]["input"]["urls"] == [s3.uri("staging/phi3-capitals/data/capitals.jsonl")]
    backend.submit(job)
    (url,) = double.get(*WS, "ml", "phi3-capitals")["tuning"]["input"]["urls"]
    assert url.startswith(s3.endpoint) and "X-Amz-Signature=" in url and "X-Amz-Expires=604800" in url
    with urllib.request.urlopen(url, timeout=10) as r:  # what Kaito's data-downloader does with it
        assert r.read() == data.read_bytes()
    folder = _job([f"dataset.source={tmp_path}", f"kubernetes.staging_uri={s3.uri('staging')}"])
    with pytest.raises(SpecError, match="is a folder"):
        render(folder, "kaito")


def test_a_run_that_writes_to_a_volume_reports_the_claim(double, backend):
    ref = backend.submit(_job(dataset={"source": "pvc://team-data"}, output={"uri": "pvc://team-adapters"}, kubernetes={"kaito": {"push_secret": None}}))
    ws = double.get(*WS, "ml", "phi3-capitals")
    assert ws["tuning"]["output"] == {"volumeSource": {"persistentVolumeClaim": {"claimName": "team-adapters"}}}
    _conditions(double, ("TuningStarted", "True", "started"), ("TuningComplete", "True", "done"))
    st = backend.status(ref)
    assert st.state == C.STATE_SUCCEEDED and st.extra["output_volume"] == "pvc://team-adapters" and "output_image" not in st.extra
