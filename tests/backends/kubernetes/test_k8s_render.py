"""Rendering: every flavour x every spec variant validates; topology, secrets and errors are right."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kubetune import constants as C
from kubetune.backends.kubernetes import render, render_text
from kubetune.errors import SpecError
from kubetune.spec import load_spec

from . import specs
from .k8s_validate import CRDS, SCHEMAS, SHARED_SCHEMAS, VENDORED_SCHEMAS, Invalid, validate_all

GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("KUBETUNE_UPDATE_GOLDEN") == "1"  # KUBETUNE_UPDATE_GOLDEN=1 pytest ... rewrites them


def _job(variant: str, overrides: list[str] | None = None, **extra):
    return load_spec(specs.spec(variant, **extra), overrides)


def _workload(objects: list[dict]) -> dict:
    return objects[-1]


def _pod_specs(workload: dict) -> list[dict]:
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]["spec"]]
    if workload["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in workload["spec"]["pytorchReplicaSpecs"].values()]
    raise AssertionError(workload["kind"])


def _main(workload: dict) -> dict:
    return _pod_specs(workload)[0]["containers"][0]


def test_crd_schemas_are_found_and_the_vendored_copies_are_unchanged():
    for rel in CRDS.values():
        assert (SCHEMAS / rel).is_file(), f"CRD schema {rel} not found in {SCHEMAS}"
        if SHARED_SCHEMAS.is_dir():  # the copies in tests/ must be exactly the project's schemas
            assert (VENDORED_SCHEMAS / rel).read_bytes() == (SHARED_SCHEMAS / rel).read_bytes(), rel


@pytest.mark.parametrize("flavor", specs.FLAVORS)
@pytest.mark.parametrize("variant", list(specs.VARIANTS))
def test_render_matrix_validates(variant, flavor):
    objects = render(_job(variant), flavor)
    validate_all(objects)
    kinds = [o["kind"] for o in objects]
    assert kinds[0] == "ConfigMap"
    assert kinds[-1] == {"job": "Job", "pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}[flavor]
    for o in objects:  # every object is found again by its labels
        assert o["metadata"]["labels"][C.LABEL_JOB] == "tune-demo"
        assert o["metadata"]["labels"][C.LABEL_MANAGED_BY] == C.MANAGED_BY_VALUE
    # the text form is the same objects, and rendering is deterministic
    text = render_text(objects)
    assert list(yaml.safe_load_all(text)) == objects
    assert render_text(render(_job(variant), flavor)) == text


@pytest.mark.parametrize("flavor", specs.FLAVORS)
def test_accelerators_by_resource_name(flavor):
    for variant, name, count in (("gpu-pvc", "nvidia.com/gpu", "1"), ("amd-2x4", "amd.com/gpu", "4"), ("gaudi-8", "habana.ai/gaudi", "8"), ("mig", "nvidia.com/mig-1g.10gb", "1")):
        w = _workload(render(_job(variant), flavor))
        res = w["spec"]["trainer"]["resourcesPerNode"] if flavor == "trainjob" else _main(w)["resources"]
        assert res["limits"][name] == count and res["requests"][name] == count, (variant, res)
    cpu = _workload(render(_job("cpu"), flavor))
    res = cpu["spec"]["trainer"]["resourcesPerNode"] if flavor == "trainjob" else _main(cpu)["resources"]
    assert res == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}


def test_default_image_follows_the_version_and_accelerator():
    from kubetune import __version__

    assert _main(_workload(render(_job("cpu"), "job")))["image"] == f"{C.K8S_IMAGE_REPO}:{__version__}"
    assert _main(_workload(render(_job("mig"), "job")))["image"] == f"{C.K8S_IMAGE_REPO}:{__version__}-cuda"
    assert _main(_workload(render(_job("amd-2x4", ["kubernetes.image=null"]), "job")))["image"] == f"{C.K8S_IMAGE_REPO}:{__version__}-rocm"
    assert _main(_workload(render(_job("gaudi-8", ["kubernetes.image=null"]), "job")))["image"] == f"{C.K8S_IMAGE_REPO}:{__version__}-gaudi"
    # No image ships for other vendors (Intel GPUs, ...): the spec must name one.
    with pytest.raises(SpecError, match="kubernetes.image"):
        render(_job("amd-2x4", ["kubernetes.image=null", "resources.accelerator_type=gpu.intel.com/i915"]), "job")


def test_job_single_process_runs_the_worker_directly():
    main = _main(_workload(render(_job("cpu"), "job")))
    assert main["command"] == ["kubetune", "worker"]
    assert main["args"][:2] == ["--spec", C.K8S_SPEC_PATH]
    assert f"output.dir={C.K8S_OUTPUT_DIR}" in main["args"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env[C.ENV_EVENT_STDOUT] == "1"  # logs alone rebuild the status


def test_job_one_node_many_processes_uses_standalone_torchrun():
    main = _main(_workload(render(_job("gaudi-8"), "job")))
    assert main["command"] == ["python", "-m", "kubetune.launch"]  # torchrun with the job's reason and timeouts
    assert main["args"][:3] == ["--standalone", "--nnodes=1", "--nproc-per-node=8"]
    assert main["args"][3:5] == ["-m", "kubetune.worker"]


def test_job_multi_node_is_an_indexed_job_with_a_headless_service():
    objects = render(_job("amd-2x4"), "job")
    svc = next(o for o in objects if o["kind"] == "Service")
    job = _workload(objects)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"]
    main = pod["containers"][0]
    env = {e["name"]: e for e in main["env"]}
    assert env["MASTER_ADDR"]["value"] == f"tune-demo-0.{svc['metadata']['name']}"  # pod 0's DNS name
    assert env["MASTER_PORT"]["value"] == str(C.K8S_RDZV_PORT)
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{C.ANNOTATION_COMPLETION_INDEX}']"
    assert main["args"][:5] == ["--nnodes=2", "--nproc-per-node=4", "--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]
    # the variables referenced with $(...) are defined before use in the same container
    defined = [e["name"] for e in main["env"]]
    for ref in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        assert ref in defined


def test_pytorchjob_topology():
    w = _workload(render(_job("amd-2x4"), "pytorchjob"))
    reps = w["spec"]["pytorchReplicaSpecs"]
    assert reps["Master"]["replicas"] == 1 and reps["Worker"]["replicas"] == 1
    assert w["spec"]["nprocPerNode"] == "4"
    main = reps["Worker"]["template"]["spec"]["containers"][0]
    assert main["name"] == "pytorch"
    # rank and master come from the operator's PET_* variables, which torchrun reads itself
    assert main["args"][:4] == ["--nnodes=2", "--nproc-per-node=4", "-m", "kubetune.worker"]
    assert w["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    single = _workload(render(_job("cpu"), "pytorchjob"))
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"] and "nprocPerNode" not in single["spec"]


def test_trainjob_references_the_runtime_and_sets_topology():
    w = _workload(render(_job("amd-2x4"), "trainjob"))
    assert w["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    t = w["spec"]["trainer"]
    assert (t["numNodes"], t["numProcPerNode"]) == (2, 4)
    patch = w["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == C.K8S_TRAINJOB_STEP
    pod = patch["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["name"] == C.K8S_TRAINJOB_STEP
    assert {v["name"] for v in pod["volumes"]} >= {"spec", "workspace", "dshm"}
    assert pod["affinity"]["podAntiAffinity"]


def _trainjob_pod(workload: dict) -> dict:
    patch = workload["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return patch["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("flavor", specs.FLAVORS)
def test_pods_leave_the_worker_time_to_save_a_checkpoint_when_preempted(flavor):
    """The kubelet's SIGTERM makes the worker checkpoint at its next step boundary; SIGKILL follows after the grace."""
    import copy

    objects = render(_job("amd-2x4"), flavor)  # two nodes: the PyTorchJob has Master and Worker pods
    workload = _workload(objects)
    pods = [_trainjob_pod(workload)] if flavor == "trainjob" else _pod_specs(workload)
    assert len(pods) == (2 if flavor == "pytorchjob" else 1)
    for pod in pods:
        assert pod["terminationGracePeriodSeconds"] == C.K8S_TERMINATION_GRACE_SECONDS
    assert C.K8S_TERMINATION_GRACE_SECONDS >= C.PREEMPT_SAVE_TIMEOUT_S + 30  # the save, then recording the end
    validate_all(objects)
    # the CRD schema checks the field where it is rendered: a wrong value there is refused
    bad = copy.deepcopy(objects)
    for pod in [_trainjob_pod(_workload(bad))] if flavor == "trainjob" else _pod_specs(_workload(bad)):
        pod["terminationGracePeriodSeconds"] = "five minutes"
    with pytest.raises(Invalid, match="terminationGracePeriodSeconds"):
        validate_all(bad)


def test_trainjob_fetches_inputs_before_the_worker():
    w = _workload(render(_job("gpu-pvc"), "trainjob"))
    cmd = w["spec"]["trainer"]["command"]
    assert cmd[:2] == ["sh", "-c"]
    lines = cmd[2].splitlines()
    assert lines[0] == "set -e"
    assert lines[1] == "kubetune fetch hf://Qwen/Qwen2.5-0.5B-Instruct@main /workspace/model"
    assert lines[2] == "kubetune fetch s3://datasets/capitals/capitals.jsonl /workspace/data"
    assert lines[3].startswith("exec kubetune worker --spec /etc/kubetune/spec.yaml")


def test_trainjob_initializers_take_hf_and_s3_sources():
    job = _job("gpu-pvc", ["kubernetes.trainjob.initializers=true"])
    objects = render(job, "trainjob")
    validate_all(objects)
    w = _workload(objects)
    init = w["spec"]["initializer"]
    assert init["model"] == {"storageUri": "hf://Qwen/Qwen2.5-0.5B-Instruct@main", "secretRef": {"name": "hf-token"}}
    assert init["dataset"] == {"storageUri": "s3://datasets/capitals/capitals.jsonl", "secretRef": {"name": "s3-credentials"}}
    t = w["spec"]["trainer"]
    assert t["command"] == ["kubetune", "worker"]  # nothing left to fetch
    assert "dataset.source=/workspace/dataset" in t["args"] and "model.source=/workspace/model" in t["args"]
    pod = w["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "workspace" not in {v["name"] for v in pod["volumes"]}  # the runtime's initializer volume is /workspace


def test_trainjob_refuses_fields_it_cannot_express():
    with pytest.raises(SpecError, match=r"kubernetes.priority_class.*kubernetes.backoff_limit"):
        render(_job("cpu", ["kubernetes.priority_class=high", "kubernetes.backoff_limit=2"]), "trainjob")
    with pytest.raises(SpecError, match="secrets.env_from"):
        render(_job("cpu", ["kubernetes.secrets.env_from=[extra]"]), "trainjob")
    # the same spec is fine for the other flavours
    for flavor in ("job", "pytorchjob"):
        validate_all(render(_job("cpu", ["kubernetes.priority_class=high", "kubernetes.backoff_limit=2", "kubernetes.secrets.env_from=[extra]"]), flavor))


@pytest.mark.parametrize("flavor", ["job", "pytorchjob"])
def test_init_containers_fetch_into_the_workspace(flavor):
    pod = _pod_specs(_workload(render(_job("gpu-pvc"), flavor)))[0]
    inits = {c["name"]: c for c in pod["initContainers"]}
    assert inits["fetch-model"]["command"] == ["kubetune", "fetch", "hf://Qwen/Qwen2.5-0.5B-Instruct@main", C.K8S_MODEL_DIR]
    assert inits["fetch-data"]["command"] == ["kubetune", "fetch", "s3://datasets/capitals/capitals.jsonl", C.K8S_DATA_DIR]
    args = pod["containers"][0]["args"]
    assert f"model.source={C.K8S_MODEL_DIR}" in args and f"dataset.source={C.K8S_DATA_DIR}" in args
    assert "model.revision=null" in args  # the revision was fetched already
    # builtin:// is resolved by the worker itself: no init container
    cpu = _pod_specs(_workload(render(_job("cpu"), flavor)))[0]
    assert [c["name"] for c in cpu["initContainers"]] == ["fetch-data"]
    assert not any(a.startswith("model.source=") for a in cpu["containers"][0]["args"])
    # model.revision wins over an @REV written in the source (docs/spec.md), also in the init container
    pinned = _pod_specs(_workload(render(_job("gpu-pvc", ["model.source=hf://Qwen/Qwen2.5-0.5B-Instruct@v1", "model.revision=v2"]), flavor)))[0]
    fetch_model = {c["name"]: c for c in pinned["initContainers"]}["fetch-model"]
    assert fetch_model["command"][2] == "hf://Qwen/Qwen2.5-0.5B-Instruct@v2"


def test_pvc_workspace_and_kueue_queue():
    objects = render(_job("gpu-pvc"), "job")
    pvc = next(o for o in objects if o["kind"] == "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "tune-demo-workspace"
    assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}, "storageClassName": "fast-ssd"}
    job = _workload(objects)
    assert job["metadata"]["labels"][C.LABEL_KUEUE_QUEUE] == "team-a-gpu"
    assert job["metadata"]["namespace"] == "team-a"
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert vols["workspace"] == {"name": "workspace", "persistentVolumeClaim": {"claimName": "tune-demo-workspace"}}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    # an existing claim is used as is, and no PVC is rendered
    objects = render(_job("gpu-pvc", ["kubernetes.workspace.claim_name=shared-models"]), "job")
    assert "PersistentVolumeClaim" not in [o["kind"] for o in objects]


def test_multi_node_pvc_needs_read_write_many_and_fetches_per_pod():
    with pytest.raises(SpecError, match="ReadWriteMany"):
        render(_job("amd-2x4", ["kubernetes.workspace.volume=pvc", "kubernetes.workspace.size=1Ti"]), "job")
    job = _job("amd-2x4", ["kubernetes.workspace.volume=pvc", "kubernetes.workspace.size=1Ti", "kubernetes.workspace.access_modes=[ReadWriteMany]"])
    for flavor in specs.FLAVORS:
        objects = render(job, flavor)
        validate_all(objects)
    pod = _workload(render(job, "job"))["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in pod["initContainers"][0]["volumeMounts"]}
    assert mounts[C.K8S_DATA_DIR]["name"] == "inputs"  # each pod its own copy: no concurrent writers on the PVC


def test_gaudi_hugepages_and_security_context():
    w = _workload(render(_job("gaudi-8"), "job"))
    pod = w["spec"]["template"]["spec"]
    main = pod["containers"][0]
    assert main["resources"]["limits"]["hugepages-2Mi"] == main["resources"]["requests"]["hugepages-2Mi"] == "9800Mi"
    assert {"name": "hugepages", "mountPath": C.K8S_HUGEPAGES_DIR} in main["volumeMounts"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
    assert main["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_NICE"]}}
    assert w["spec"]["activeDeadlineSeconds"] == 86400
    with pytest.raises(SpecError, match="hugepages needs resources.memory"):
        render(_job("gaudi-8", ["resources.memory=null", "resources.cpu=null"]), "job")


def test_ttl_backoff_and_scheduling_fields():
    w = _workload(render(_job("gpu-pvc", ["kubernetes.backoff_limit=3", "kubernetes.ttl_seconds_after_finished=60", "kubernetes.priority_class=high"]), "job"))
    assert (w["spec"]["backoffLimit"], w["spec"]["ttlSecondsAfterFinished"]) == (3, 60)
    pod = w["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "high" and pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["enableServiceLinks"] is False


def test_spec_configmap_is_the_job_the_pod_runs(tmp_path):
    job = _job("gpu-pvc")
    for flavor in specs.FLAVORS:
        cm = render(job, flavor)[0]
        path = tmp_path / C.K8S_SPEC_KEY
        path.write_text(cm["data"][C.K8S_SPEC_KEY], encoding="utf-8")
        again = load_spec(path)
        assert again.model_dump(exclude={"kubernetes"}) == job.model_dump(exclude={"kubernetes"})
        assert again.kubernetes.flavor == flavor


def test_local_paths_need_a_staging_uri(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n', encoding="utf-8")
    job = _job("cpu", dataset={"source": str(data)})
    with pytest.raises(SpecError) as e:
        render(job, "job")
    assert "dataset.source is a local path" in str(e.value) and "kubernetes.staging_uri" in str(e.value)
    staged = _job("cpu", ["kubernetes.staging_uri=s3://bucket/staging/"], dataset={"source": str(data)})
    objects = render(staged, "job")
    init = objects[-1]["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][2] == "s3://bucket/staging/tune-demo/data/train.jsonl"
    assert str(tmp_path) not in render_text(objects)  # the user's local paths never reach the cluster


@pytest.mark.parametrize(
    "override, match",
    [
        (["resources.accelerators=1", "resources.accelerator_type=gpu"], "resources.accelerator_type"),
        (["resources.memory=lots"], "resources.memory"),
    ],
)
def test_bad_resources_name_the_field(override, match):
    with pytest.raises(SpecError, match=match):
        render(_job("cpu", override), "job")


def test_unknown_flavor():
    with pytest.raises(SpecError, match="unknown flavor 'mpijob'"):
        render(_job("cpu"), "mpijob")


@pytest.mark.parametrize(
    "override, match",
    [
        (["kubernetes.namespace=Team_A"], "kubernetes.namespace"),
        (["kubernetes.workspace.volume=pvc"], "needs a size"),
        (["kubernetes.labels={kubetune.io/job: x}"], "reserved"),
        (["kubernetes.tolerations=[{operator: Exists, value: x}]"], "takes no value"),
        (["kubernetes.shm_size=16 GB"], "quantity"),
        (["kubernetes.staging_uri=gs://bucket"], "s3://"),
        (["kubernetes.affinity={nodeAfinity: {}}"], "unknown affinity keys"),
    ],
)
def test_spec_section_errors_name_the_field(override, match):
    with pytest.raises(SpecError, match=match):
        _job("cpu", override)


# --- golden files ------------------------------------------------------------------------------
GOLDEN_CASES = [("cpu", "job"), ("gpu-pvc", "pytorchjob"), ("amd-2x4", "job"), ("gaudi-8", "trainjob")]
_SPEC_PLACEHOLDER = "<the resolved spec: see test_spec_configmap_is_the_job_the_pod_runs>\n"


@pytest.mark.parametrize("variant, flavor", GOLDEN_CASES)
def test_golden(variant, flavor):
    objects = render(_job(variant), flavor)
    # The ConfigMap holds the whole resolved spec, which grows with every new spec field; it is
    # checked by a round trip instead, so these files change only when the rendering does.
    objects[0]["data"][C.K8S_SPEC_KEY] = _SPEC_PLACEHOLDER
    text = render_text(objects)
    path = GOLDEN / f"{variant}-{flavor}.yaml"
    if UPDATE_GOLDEN or not path.exists():
        if not UPDATE_GOLDEN and os.environ.get("CI"):
            pytest.fail(f"golden file {path.name} is missing; run KUBETUNE_UPDATE_GOLDEN=1 pytest tests/backends/kubernetes")
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"render changed; if intended: KUBETUNE_UPDATE_GOLDEN=1 pytest {__file__}"


def test_mixed_datasets_are_fetched_and_the_spec_points_at_them(tmp_path):
    from kubetune.spec import DatasetSpec

    if "mix" not in DatasetSpec.model_fields:
        pytest.skip("dataset.mix is not part of the spec yet")
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"prompt": "a", "completion": "b"}\n', encoding="utf-8")
    job = _job("amd-2x4", ["kubernetes.staging_uri=s3://bucket/stage"], dataset={"source": "s3://datasets/main.jsonl", "mix": [{"source": "hf://datasets/org/more"}, {"source": str(extra)}]})
    for flavor in specs.FLAVORS:
        validate_all(render(job, flavor))
    objects = render(job, "job")
    pod = objects[-1]["spec"]["template"]["spec"]
    inits = {c["name"]: c["command"] for c in pod["initContainers"]}
    assert inits["fetch-mix-0"] == ["kubetune", "fetch", "hf://datasets/org/more", f"{C.K8S_WORKSPACE}/mix-0"]
    assert inits["fetch-mix-1"] == ["kubetune", "fetch", "s3://bucket/stage/tune-demo/mix-1/extra.jsonl", f"{C.K8S_WORKSPACE}/mix-1"]
    assert not any(a.startswith("dataset.mix") for a in pod["containers"][0]["args"])  # --set cannot address list items
    spec = yaml.safe_load(objects[0]["data"][C.K8S_SPEC_KEY])
    assert [m["source"] for m in spec["dataset"]["mix"]] == [f"{C.K8S_WORKSPACE}/mix-0", f"{C.K8S_WORKSPACE}/mix-1"]
    assert spec["dataset"]["source"] == "s3://datasets/main.jsonl"  # main sources keep their URI; the worker gets --set
    # several nodes on one PVC: every input, mixed ones too, goes to the pod's own emptyDir
    shared = _job("amd-2x4", ["kubernetes.workspace.volume=pvc", "kubernetes.workspace.size=1Ti", "kubernetes.workspace.access_modes=[ReadWriteMany]"], dataset={"source": "s3://d/main.jsonl", "mix": [{"source": "s3://d/more.jsonl"}]})
    mounts = {m["mountPath"]: m["name"] for m in render(shared, "job")[-1]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[f"{C.K8S_WORKSPACE}/mix-0"] == "inputs"


@pytest.mark.parametrize("flavor", ["job", "pytorchjob"])
def test_a_full_dpo_reference_is_fetched_like_the_model(flavor):
    """method.dpo.reference gets its own init container, and the worker reads the fetched copy."""
    job = _job("gpu-pvc", ["method.type=full", "method.objective=dpo", "method.dpo.reference=hf://Qwen/Qwen2.5-0.5B-Instruct@sft-v1"])
    pod = _pod_specs(_workload(render(job, flavor)))[0]
    inits = {c["name"]: c for c in pod["initContainers"]}
    ref_dir = f"{C.K8S_WORKSPACE}/reference"
    assert inits["fetch-reference"]["command"] == ["kubetune", "fetch", "hf://Qwen/Qwen2.5-0.5B-Instruct@sft-v1", ref_dir]
    assert f"method.dpo.reference={ref_dir}" in pod["containers"][0]["args"]
