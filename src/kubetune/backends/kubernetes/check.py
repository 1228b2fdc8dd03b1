"""``kubetune cluster check``: what a cluster has installed, and what that lets kubetune do there.

The story of one check: read the API groups the server serves (discovery, ``/apis``) and, for each operator
kubetune can use, the resources of its group (``/apis/GROUP/VERSION``); look for the Kubeflow Pipelines API
Service; list the namespace's Kueue LocalQueues; then ask the API server, with one SelfSubjectAccessReview per
verb and resource, whether the caller may create what each available flavour needs in the namespace.

Only reads (and reviews, which change nothing) are made. What cannot be read (a 403 on an optional call)
is reported as unknown, never as missing; 401 and an unreachable server are one error (:func:`api_call`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import constants as C
from ...errors import BackendError
from .api import Cluster, api_call

__all__ = ["COMPONENTS", "check", "FLAVOUR_NEEDS"]


@dataclass(frozen=True)
class Component:
    """An operator kubetune can use: its API group and the resources that tell it is installed."""

    name: str
    group: str
    resources: tuple[str, ...]  # all of them served: installed
    enables: str  # the flavour or feature, as the report names it


# The order is the report's.
COMPONENTS = (
    Component("Kubeflow Trainer", "trainer.kubeflow.org", ("trainjobs",), "flavour trainjob"),
    Component("Kubeflow training-operator", "kubeflow.org", ("pytorchjobs",), "flavour pytorchjob"),
    Component("Kaito", C.K8S_KAITO_API_VERSION.split("/")[0], ("workspaces",), "flavour kaito"),
    Component("Kueue", "kueue.x-k8s.io", ("localqueues", "clusterqueues"), "queues (kubernetes.queue)"),
)
KFP_NAME = "Kubeflow Pipelines"
KFP_GROUP = "pipelines.kubeflow.org"  # KFP's Kubernetes-native API (Pipeline objects), where a release serves it
KUEUE_GROUP = "kueue.x-k8s.io"

# flavour -> the component it needs (None: plain Kubernetes) and the (verb, group, resource) it creates or reads.
# Every flavour also stores the resolved spec in a ConfigMap and follows its pods' logs.
_COMMON = (("create", "", "configmaps"), ("list", "", "pods"), ("get", "", "pods/log"))
FLAVOUR_NEEDS: dict[str, tuple[str | None, tuple[tuple[str, str, str], ...]]] = {
    "job": (None, (("create", "batch", "jobs"), *_COMMON)),
    "pytorchjob": ("Kubeflow training-operator", (("create", "kubeflow.org", "pytorchjobs"), *_COMMON)),
    "trainjob": ("Kubeflow Trainer", (("create", "trainer.kubeflow.org", "trainjobs"), *_COMMON)),
    "kaito": ("Kaito", (("create", "kaito.sh", "workspaces"), *_COMMON)),
}


def check(cluster: Cluster, namespace: str) -> dict:
    """What is installed and what kubetune may do in ``namespace``.

    Returns:
        ``{"cluster", "namespace", "components": [...], "flavours": [...], "features": [...]}``: per component
        ``installed`` (True/False/None for unknown) and ``api`` (Kubeflow Trainer: its ``runtimes`` too); per
        flavour ``available`` and ``allowed`` (True/False/None) with the ``missing`` permissions and a ``note``
        where something else is missing; per feature ``available`` and a ``note``.

    Raises:
        BackendError: 401, an unreachable API server, or discovery refused.
    """
    served = _served_groups(cluster)
    components = [_component(cluster, c, served) for c in COMPONENTS]
    components.append(_kfp(cluster, served))
    installed = {c["name"]: c["installed"] for c in components}
    notes = {"trainjob": _runtimes(cluster, components[0])} if installed["Kubeflow Trainer"] else {}
    flavours = []
    for flavour, (needs, rules) in FLAVOUR_NEEDS.items():
        available = True if needs is None else installed[needs]
        allowed, missing = _may(cluster, namespace, rules) if available else (None, [])
        flavours.append({"flavour": flavour, "available": available, "allowed": allowed, "missing": missing,
                         **({"needs": needs} if needs else {}), **({"note": notes[flavour]} if notes.get(flavour) else {})})
    features = [_queues(cluster, namespace, installed["Kueue"], served), _kfp_feature(components[-1])]
    return {"cluster": cluster.host, "namespace": namespace, "components": components, "flavours": flavours, "features": features}


# --- discovery ------------------------------------------------------------------------------------------
def _served_groups(cluster: Cluster) -> dict[str, list[str]]:
    """API group -> its served versions, the preferred one first."""
    from kubernetes import client

    try:
        with api_call(cluster, "get", "API groups (discovery)", namespace="-"):
            groups = cluster.to_dict(client.ApisApi(cluster.api).get_api_versions())
    except BackendError as e:
        if _status(e) != 403:
            raise
        raise BackendError(
            f"forbidden: the API server at {cluster.host} refused its list of API groups (/apis) to you",
            hint="every authenticated user may read it by default (ClusterRole system:discovery); ask a cluster admin",
        ) from e.__cause__
    out = {}
    for g in groups.get("groups") or []:
        preferred = (g.get("preferredVersion") or {}).get("version")
        versions = [v["version"] for v in g.get("versions") or []]
        out[g["name"]] = sorted(versions, key=lambda v: v != preferred)
    return out


def _resources(cluster: Cluster, group: str, version: str) -> set[str] | None:
    """The resources ``group/version`` serves (None: that discovery document could not be read)."""
    try:
        with api_call(cluster, "get", f"{group}/{version} resources (discovery)", namespace="-"):
            doc = cluster.to_dict(cluster.custom().get_api_resources(group, version))
    except BackendError as e:
        if _status(e) in (403, 404, 503):  # 503: an aggregated API whose backend is down
            return None
        raise
    return {r["name"] for r in doc.get("resources") or []}


def _component(cluster: Cluster, c: Component, served: dict[str, list[str]]) -> dict:
    row = {"name": c.name, "installed": False, "api": None, "enables": c.enables}
    unknown = False
    for version in served.get(c.group, []):
        found = _resources(cluster, c.group, version)
        if found is None:
            unknown = True
        elif set(c.resources) <= found:
            return {**row, "installed": True, "api": f"{c.group}/{version}"}
    if unknown:
        row["installed"] = None
    return row


def _runtimes(cluster: Cluster, trainer: dict) -> str | None:
    """The trainjob flavour references a ClusterTrainingRuntime (``torch-distributed`` unless the spec names
    another): list them onto the component's row; a note when the default one is missing."""
    group, version = trainer["api"].split("/")
    try:
        with api_call(cluster, "list", "clustertrainingruntimes", namespace="-"):
            doc = cluster.custom().list_cluster_custom_object(group, version, "clustertrainingruntimes")
    except BackendError as e:
        if _status(e) not in (403, 404):
            raise
        return "its ClusterTrainingRuntimes could not be listed"
    names = sorted(i["metadata"]["name"] for i in doc.get("items") or [])
    trainer["runtimes"] = names
    if C.K8S_TRAINJOB_RUNTIME not in names:
        return (f"no ClusterTrainingRuntime {C.K8S_TRAINJOB_RUNTIME} (the default kubernetes.trainjob.runtime): install Trainer's "
                "runtimes, or name one of yours" + (f" ({', '.join(names)})" if names else ""))
    return None


def _kfp(cluster: Cluster, served: dict[str, list[str]]) -> dict:
    """KFP: its API Service (``ml-pipeline`` in ``kubeflow``), else its API group."""
    row = {"name": KFP_NAME, "installed": False, "api": None, "enables": "kfp remote (--backend kfp)"}
    where = f"service/{C.K8S_KFP_SERVICE} in {C.K8S_KFP_NAMESPACE}"
    try:
        with api_call(cluster, "get", "services", namespace=C.K8S_KFP_NAMESPACE, name=C.K8S_KFP_SERVICE, kind="Service"):
            cluster.core().read_namespaced_service(C.K8S_KFP_SERVICE, C.K8S_KFP_NAMESPACE)
        return {**row, "installed": True, "api": where}
    except BackendError as e:
        if _status(e) not in (403, 404):
            raise
        forbidden = _status(e) == 403
    if KFP_GROUP in served:
        return {**row, "installed": True, "api": f"{KFP_GROUP}/{served[KFP_GROUP][0]}"}
    if forbidden:
        return {**row, "installed": None, "note": f"you may not read services in '{C.K8S_KFP_NAMESPACE}'"}
    return row


# --- features -----------------------------------------------------------------------------------------
def _queues(cluster: Cluster, namespace: str, kueue: bool | None, served: dict[str, list[str]]) -> dict:
    row: dict = {"feature": "queues", "available": kueue, "local_queues": None}
    if not kueue:
        row["note"] = "install Kueue (https://kueue.sigs.k8s.io/docs/installation/) to queue jobs" if kueue is False else "Kueue's API could not be read"
        return row
    version = served[KUEUE_GROUP][0]
    try:
        with api_call(cluster, "list", "localqueues", namespace=namespace):
            doc = cluster.custom().list_namespaced_custom_object(KUEUE_GROUP, version, namespace, "localqueues")
    except BackendError as e:
        if _status(e) not in (403, 404):
            raise
        row["note"] = f"the LocalQueues of '{namespace}' could not be listed ({_status(e)})"
        return row
    names = sorted(i["metadata"]["name"] for i in doc.get("items") or [])
    row["local_queues"] = names
    if names:
        row["note"] = f"set kubernetes.queue: {names[0]}" + (f" (or {', '.join(names[1:])})" if names[1:] else "")
    else:
        row["available"] = False
        row["note"] = f"no LocalQueue in '{namespace}': kubetune cluster init -n {namespace} --queue CLUSTERQUEUE creates one"
    return row


def _kfp_feature(kfp: dict) -> dict:
    row = {"feature": "kfp remote", "available": kfp["installed"]}
    if kfp["installed"]:
        row["note"] = "--backend kfp reaches it through the API server's service proxy, or set kfp.host"
    else:
        row["note"] = kfp.get("note") or "no Kubeflow Pipelines API found (kfp local runs need no cluster)"
    return row


# --- permissions --------------------------------------------------------------------------------------
def _may(cluster: Cluster, namespace: str, rules) -> tuple[bool | None, list[str]]:
    """(all allowed, the ones denied) by SelfSubjectAccessReviews; (None, []) when reviews cannot be made."""
    missing = []
    for verb, group, resource in rules:
        allowed = _review(cluster, namespace, verb, group, resource)
        if allowed is None:
            return None, []
        if not allowed:
            missing.append(f"{verb} {resource}{'.' + group if group else ''}")
    return not missing, missing


def _review(cluster: Cluster, namespace: str, verb: str, group: str, resource: str) -> bool | None:
    from kubernetes import client

    plural, _, sub = resource.partition("/")
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": plural, **({"subresource": sub} if sub else {})}
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": attributes}}
    try:
        with api_call(cluster, "create", "selfsubjectaccessreviews", namespace=namespace):
            review = cluster.to_dict(client.AuthorizationV1Api(cluster.api).create_self_subject_access_review(body))
    except BackendError as e:
        if _status(e) in (403, 404):
            return None
        raise
    return bool((review.get("status") or {}).get("allowed"))


def _status(e: BackendError) -> int | None:
    return getattr(e.__cause__, "status", None)
