"""The edge to the cluster: loading the ``kubernetes`` client and turning its errors into advice.

Every call the backend makes goes through :func:`api_call`, which turns an ``ApiException`` or a
connection failure into one :class:`~kubetune.errors.BackendError` that says what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ...errors import BackendError, JobNotFound

__all__ = ["Cluster", "connect", "api_call", "OPERATORS"]

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# kind -> (what to install, how), for "the cluster does not know this kind"
OPERATORS = {
    "PyTorchJob": (
        "the Kubeflow training operator v1 (PyTorchJob, kubeflow.org/v1)",
        'kubectl apply --server-side -k "github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref=v1.9.2"',
    ),
    "TrainJob": (
        "Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1) and its torch-distributed runtime",
        'kubectl apply --server-side -k "github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0" '
        '&& kubectl apply --server-side -k "github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref=v2.3.0"',
    ),
}


@dataclass
class Cluster:
    """A connected API client and where it points.

    Attributes:
        api: a ``kubernetes.client.ApiClient``.
        namespace: the namespace of the kubeconfig context (or the pod's, in-cluster), else ``default``.
        host: the API server URL (for messages).
    """

    api: Any
    namespace: str
    host: str

    def core(self):
        """The CoreV1 API (pods, logs, ConfigMaps, Secrets, Services)."""
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def batch(self):
        """The BatchV1 API (Jobs)."""
        from kubernetes import client

        return client.BatchV1Api(self.api)

    def custom(self):
        """The custom objects API (PyTorchJob, TrainJob, Workspace)."""
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def to_dict(self, obj: Any) -> dict:
        """A client model object as the API's JSON (camelCase keys)."""
        return obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)


def connect(*, context: str | None = None, kubeconfig: str | None = None) -> Cluster:
    """Connect with a kubeconfig (``kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``) or in-cluster config.

    Raises:
        BackendError: the ``kubernetes`` package is missing, or no usable configuration exists.
    """
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise BackendError("the 'kubernetes' package is not installed", hint="pip install kubernetes") from e
    default_file = Path(os.path.expanduser("~/.kube/config"))
    named = kubeconfig or os.environ.get("KUBECONFIG")
    files = [f for f in (named or "").split(os.pathsep) if f.strip()]
    if files and not any(Path(f).expanduser().is_file() for f in files):
        origin = "the kubeconfig" if kubeconfig else "KUBECONFIG names"
        raise BackendError(
            f"no Kubernetes cluster configured: {origin} {named}, which does not exist",
            hint="point KUBECONFIG at your cluster's kubeconfig (`kubectl config view` shows the one kubectl uses)",
        )
    try:
        if kubeconfig or os.environ.get("KUBECONFIG") or default_file.is_file():
            api = config.new_client_from_config(config_file=kubeconfig, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            chosen = next((c for c in contexts if c["name"] == context), active) if context else active
            namespace = (chosen or {}).get("context", {}).get("namespace") or "default"
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            api = client.ApiClient(cfg)
            namespace = _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.is_file() else "default"
        else:
            raise BackendError(
                "no Kubernetes configuration found (no kubeconfig, not running in a pod)",
                hint="point KUBECONFIG at your cluster's kubeconfig, or check `kubectl config current-context`",
            )
    except ConfigException as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or str(default_file)
        raise BackendError(f"cannot use the kubeconfig {where}: {e}", hint="check `kubectl config get-contexts`") from e
    return Cluster(api=api, namespace=namespace, host=api.configuration.host)


@contextlib.contextmanager
def api_call(cluster: Cluster, verb: str, resource: str, *, namespace: str, name: str | None = None, kind: str | None = None) -> Iterator[None]:
    """Run one API call; translate its failure into a BackendError with advice.

    Args:
        verb, resource: the RBAC verb and resource (``create``, ``jobs``), named in a 403's advice.
        namespace, name: where and what, for messages.
        kind: the object kind, to tell a missing CRD apart from a missing object.
    """
    try:
        from kubernetes.client.exceptions import ApiException
    except ImportError:  # pragma: no cover
        ApiException = ()  # type: ignore[assignment]
    import urllib3

    try:
        yield
    except ApiException as e:  # type: ignore[misc]
        raise _translate(e, cluster, verb, resource, namespace, name, kind) from e
    except (urllib3.exceptions.HTTPError, ConnectionError, OSError) as e:
        raise BackendError(
            f"cannot reach the Kubernetes API server at {cluster.host}: {_reason(e)}",
            hint="check the kubeconfig context (`kubectl cluster-info`), your VPN, or the cluster's state",
        ) from e


def _reason(e: Exception) -> str:
    inner = getattr(e, "reason", None)
    return str(inner or e).split(": ", 1)[-1][:200]


def _status_body(e) -> dict:
    try:
        body = json.loads(e.body or "")
        return body if isinstance(body, dict) else {}
    except (TypeError, ValueError):
        return {}


def _translate(e, cluster: Cluster, verb: str, resource: str, namespace: str, name: str | None, kind: str | None) -> BackendError:
    body = _status_body(e)
    message = body.get("message") or (e.body or e.reason or "").strip()[:300]
    what = f"{kind or resource} '{name}'" if name else (kind or resource)
    if e.status == 401:
        return BackendError(
            f"the API server at {cluster.host} rejected the credentials (401 Unauthorized)",
            hint="log in again or refresh the kubeconfig token; `kubectl auth whoami` shows who you are",
        )
    if e.status == 403:
        return BackendError(
            f"forbidden: you may not {verb} {resource} in namespace '{namespace}' (RBAC): {message}",
            hint=f"ask a cluster admin for a Role granting '{verb}' on '{resource}' in '{namespace}' "
            "(deploy/rbac.yaml lists everything kubetune uses), or pick a namespace you own",
        )
    if e.status == 404:
        details = body.get("details") or {}
        if details.get("kind") == "namespaces":
            return BackendError(
                f"namespace '{namespace}' does not exist",
                hint=f"create it (kubectl create namespace {namespace}) or set kubernetes.namespace / --namespace",
            )
        if verb == "create" and kind in OPERATORS:
            what_op, how = OPERATORS[kind]
            return BackendError(
                f"the cluster has no {kind} kind (no matches for kind \"{kind}\"): {what_op} is not installed",
                hint=f"install it ({how}), or use --flavor job, which needs no operator",
            )
        return JobNotFound(f"{what} not found in namespace '{namespace}'", hint="check the name and --namespace; `kubetune list --backend kubernetes` shows jobs")
    if e.status == 409:
        return BackendError(
            f"{what} already exists in namespace '{namespace}'",
            hint=f"cancel it first (kubetune cancel {name} --backend kubernetes) or give the job another name (--set name=...)",
        )
    if e.status == 422:
        return BackendError(f"the API server refused {what}: {message}", hint="fix the field it names in the spec's kubernetes section")
    return BackendError(f"Kubernetes API error {e.status} {e.reason} while trying to {verb} {resource} in '{namespace}': {message}")
