"""Validate rendered objects the way a cluster would, without a cluster.

- Core kinds (Job, Service, ConfigMap, PersistentVolumeClaim, Pod, Secret, Namespace, ServiceAccount, Role, RoleBinding): ``kubernetes-validate`` in strict mode
  (unknown fields are errors) against the oldest Kubernetes we support and the newest it ships.
- Custom resources (PyTorchJob, TrainJob, Kaito's Workspace, KServe's InferenceService, Kueue's LocalQueue): the CRD's ``openAPIV3Schema`` from ``../shared/schemas`` with
  ``jsonschema``, plus an unknown-field walk (a structural schema prunes unknown fields silently; we want to
  hear about them), plus the CEL rules the plain schema cannot express, plus each embedded pod template
  checked again as a core Pod.
- Rules neither can express: names are RFC 1035 labels of at most 63 characters, mounts name existing
  volumes, env and container names are unique, Services select the pods they serve.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

SHARED_SCHEMAS = (Path(__file__).resolve().parents[3] / ".." / "shared" / "schemas").resolve()
VENDORED_SCHEMAS = Path(__file__).resolve().parent / "crds"  # unchanged copies, for machines without shared/
SCHEMAS = SHARED_SCHEMAS if SHARED_SCHEMAS.is_dir() else VENDORED_SCHEMAS
K8S_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
CORE_KINDS = {"ConfigMap", "Service", "PersistentVolumeClaim", "Job", "Pod", "Secret", "Namespace", "ServiceAccount", "Role", "RoleBinding",
              "Deployment", "Ingress"}  # the last two: the Helm chart of kubetune server (deploy/helm/kubetune)
CRDS = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow-training-operator-v1.9/kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "kubeflow-trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml",
    ("kaito.sh/v1beta1", "Workspace"): "kaito/kaito.sh_workspaces.yaml",
    ("serving.kserve.io/v1beta1", "InferenceService"): "kserve-v0.20.0/serving.kserve.io_inferenceservices.yaml",
    ("kueue.x-k8s.io/v1beta1", "LocalQueue"): "kueue-v0.19.2/kueue.x-k8s.io_localqueues.yaml",
}
# Fields of a KServe predictor that are KServe's own (ComponentExtensionSpec, framework specs), not the inline PodSpec's.
KSERVE_COMPONENT_FIELDS = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType", "autoScaling", "containerConcurrency",
    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
    "storageUris", "storageContainerName", "workerSpec", "model", "huggingface", "sklearn", "xgboost", "tensorflow",
    "pytorch", "triton", "onnx", "pmml", "lightgbm", "paddle",
}
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class Invalid(AssertionError):
    pass


@lru_cache(maxsize=None)
def crd_schema(api_version: str, kind: str) -> dict:
    path = SCHEMAS / CRDS[(api_version, kind)]
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    version = api_version.split("/")[1]
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{path} has no version {version}")


def validate(obj: dict) -> None:
    """Raise Invalid with every problem found in one rendered object."""
    problems: list[str] = []
    kind = obj.get("kind")
    name = obj.get("metadata", {}).get("name", "")
    if not RFC1035.match(name) or len(name) > 63:
        problems.append(f"metadata.name '{name}' is not an RFC 1035 label of at most 63 characters")
    if kind in CORE_KINDS:
        problems += _core(obj)
        if kind in ("Job", "Deployment"):
            problems += _pod_rules(obj["spec"]["template"]["spec"], "spec.template.spec")
            problems += _core(_as_pod(obj["spec"]["template"]))
    elif (obj.get("apiVersion"), kind) in CRDS:
        schema = crd_schema(obj["apiVersion"], kind)
        v = jsonschema.Draft7Validator(schema)
        problems += [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(obj)]
        problems += _unknown_fields(obj, schema, "")
        if kind == "PyTorchJob":
            for rtype, rspec in obj["spec"]["pytorchReplicaSpecs"].items():
                where = f"spec.pytorchReplicaSpecs.{rtype}.template.spec"
                problems += _pod_rules(rspec["template"]["spec"], where)
                problems += [f"{rtype} pod: {p}" for p in _core(_as_pod(rspec["template"]))]
                if not any(c["name"] == "pytorch" for c in rspec["template"]["spec"]["containers"]):
                    problems.append(f"{where}: the training operator needs a container named 'pytorch'")
        if kind == "TrainJob":
            problems += _trainjob_cel(obj)
        if kind == "InferenceService":
            predictor = obj["spec"]["predictor"]
            pod = {k: v for k, v in predictor.items() if k not in KSERVE_COMPONENT_FIELDS}
            problems += _pod_rules(pod, "spec.predictor")
            problems += [f"predictor pod: {p}" for p in _core(_as_pod({"metadata": {"labels": predictor.get("labels", {})}, "spec": pod}))]
            if [c["name"] for c in pod.get("containers", [])][:1] != ["kserve-container"]:
                problems.append("spec.predictor.containers: KServe routes to the container named 'kserve-container'")
    else:
        problems.append(f"no validator for {obj.get('apiVersion')}/{kind}")
    if problems:
        raise Invalid(f"{kind}/{name}:\n  " + "\n  ".join(problems))


def validate_all(objects: list[dict]) -> None:
    for o in objects:
        validate(o)
    _cross_rules(objects)


def _core(obj: dict) -> list[str]:
    out = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            out.append(f"k8s {version}: {'.'.join(map(str, e.path))}: {e.message}")
    return out


def _as_pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **template.get("metadata", {})}, "spec": template["spec"]}


def _unknown_fields(value, schema: dict, path: str) -> list[str]:
    """Fields the schema does not declare: the API server would drop them (or reject them under Strict)."""
    out: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return out
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if props is not None and k in props:
                out += _unknown_fields(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += _unknown_fields(v, extra, f"{path}.{k}")
            elif props is not None:
                out.append(f"{path}.{k}: unknown field")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += _unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


def _trainjob_cel(obj: dict) -> list[str]:
    """The x-kubernetes-validations of the v2.3 TrainJob CRD that matter for a create."""
    out = []
    name = obj["metadata"]["name"]
    if not RFC1035.match(name):
        out.append("metadata.name must match RFC 1035 DNS label format")
    if len(name) > 63:
        out.append("metadata.name must be no more than 63 characters")
    for key in ("model", "dataset"):
        uri = obj["spec"].get("initializer", {}).get(key, {}).get("storageUri")
        if uri is not None and uri != "" and not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$", uri):
            out.append(f"spec.initializer.{key}.storageUri must be a URI")
    return out


def _pod_rules(spec: dict, where: str) -> list[str]:
    out = []
    volumes = {v["name"] for v in spec.get("volumes", [])}
    if len(volumes) != len(spec.get("volumes", [])):
        out.append(f"{where}.volumes: duplicate names")
    containers = spec.get("initContainers", []) + spec["containers"]
    names = [c["name"] for c in containers]
    if len(set(names)) != len(names):
        out.append(f"{where}: duplicate container names {names}")
    for c in containers:
        if not RFC1035.match(c["name"]):
            out.append(f"{where}: container name '{c['name']}' is not a DNS label")
        paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if len(set(paths)) != len(paths):
            out.append(f"{where}: container {c['name']} mounts one path twice")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                out.append(f"{where}: container {c['name']} mounts unknown volume {m['name']}")
        env_names = [e["name"] for e in c.get("env", [])]
        if len(set(env_names)) != len(env_names):
            out.append(f"{where}: container {c['name']} sets an env var twice")
        res = c.get("resources", {})
        for k, v in res.get("limits", {}).items():
            if "/" in k or k.startswith("hugepages-"):
                if res.get("requests", {}).get(k, v) != v:
                    out.append(f"{where}: {k} requests must equal limits")
        if any(k.startswith("hugepages-") for k in res.get("limits", {})) and not ({"cpu", "memory"} & set(res.get("requests", {}))):
            out.append(f"{where}: hugepages require cpu or memory requests")
    return out


def _cross_rules(objects: list[dict]) -> None:
    """Services select the pods they serve; pods mount the ConfigMaps and PVCs that are rendered or named."""
    problems = []
    by_kind: dict[str, list[dict]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    for svc in by_kind.get("Service", []):
        sel = svc["spec"]["selector"]
        jobs = by_kind.get("Job", []) + by_kind.get("Deployment", [])
        if not any(all(j["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items()) for j in jobs):
            problems.append(f"Service {svc['metadata']['name']} selects no rendered pod")
        for j in jobs:
            sub = j["spec"]["template"]["spec"].get("subdomain")
            if sub and sub != svc["metadata"]["name"]:
                problems.append(f"Job subdomain {sub} is not the Service {svc['metadata']['name']}")
    cms = {o["metadata"]["name"] for o in by_kind.get("ConfigMap", [])}
    for o in objects:
        for vol in _all_volumes(o):
            cm = vol.get("configMap", {}).get("name")
            if cm and cm not in cms:
                problems.append(f"{o['kind']} mounts ConfigMap {cm}, which is not rendered")
    if problems:
        raise Invalid("\n".join(problems))


def _all_volumes(obj: dict) -> list[dict]:
    found: list[dict] = []

    def walk(v):
        if isinstance(v, dict):
            if isinstance(v.get("volumes"), list):
                found.extend(v["volumes"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(obj.get("spec", {}))
    return found
