"""``kubetune deliver SRC DEST --backend kubernetes``: the copy as a batch/v1 Job in the cluster.

:func:`render_job` is pure (options in, the Job out; ``--render`` prints it): one container of the kubetune
image runs ``kubetune deliver SRC DEST``, which fetches, writes and verifies (kubetune.storage.deliver).
Credentials reach it only as Secret references (``envFrom`` and ``env[].valueFrom.secretKeyRef``), never as
values; the URIs are refused when they carry credentials. Retries: the storage layer's own, then the Job's
``backoffLimit`` starts a new pod.

:func:`run` creates the Job and follows its pods' logs (the progress lines) until the Job ends.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

from ... import constants as C
from ...errors import BackendError, SpecError
from ...redact import has_credentials
from ...spec.cluster import K8S_QUANTITY_RE
from .api import Cluster, api_call
from .pod import CREDENTIALS_HINT
from .staging import is_local

__all__ = ["DeliverOptions", "render_job", "run", "default_name"]

_CREDENTIAL_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|ACCESS_KEY|API_KEY|CREDENTIAL", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class DeliverOptions:
    """What the Job needs besides SRC and DEST (the CLI's options)."""

    name: str
    namespace: str  # "": none in the object (a render without -n: kubectl apply uses the current namespace)
    image: str
    secrets: list[str] = field(default_factory=list)  # envFrom: every key of each Secret
    secret_env: list[str] = field(default_factory=list)  # VAR=SECRET[:KEY]: one variable from one key
    env: list[str] = field(default_factory=list)  # KEY=VALUE: plain values (an endpoint, a region), never credentials
    retries: int = C.K8S_DELIVER_RETRIES
    service_account: str | None = None
    disk: str | None = None  # ephemeral storage for the download (request and emptyDir sizeLimit)


def default_name(src: str, dest: str) -> str:
    """``deliver-<digest of SRC and DEST>-<random>``: recognisable per pair, distinct per run."""
    digest = hashlib.sha256(f"{src}\0{dest}".encode()).hexdigest()[:8]
    return f"deliver-{digest}-{secrets.token_hex(2)}"


def render_job(src: str, dest: str, opts: DeliverOptions) -> dict:
    """The Job that delivers ``src`` to ``dest`` in the cluster.

    Raises:
        SpecError: a local SRC or DEST (the pod cannot see this machine), credentials in a URI or a plain
            ``--env`` value, a malformed option.
    """
    for what, uri in (("SRC", src), ("DEST", dest)):
        if is_local(uri):
            raise SpecError(
                f"{what} {uri} is a local path, which a pod in the cluster cannot " + ("read" if what == "SRC" else "write to usefully"),
                hint="run the delivery here (drop --backend kubernetes), or name " + ("a URI the cluster can fetch (hf://, s3://, https://, oci://)"
                                                                                       if what == "SRC" else "s3:// or oci://"),
            )
        if has_credentials(uri):
            raise SpecError(f"{what} carries credentials in its URI; they would be visible in the Job", hint=CREDENTIALS_HINT.format(staging="s3://"))
    if not _NAME.match(opts.name):
        raise SpecError(f"--name {opts.name!r} is not a valid Job name: lowercase letters, digits and '-', at most 63")
    if opts.retries < 0:
        raise SpecError("--retries must be 0 or more")
    # the download goes to the cache under KUBETUNE_HOME / HF_HOME, both on the workspace volume (--disk sizes it)
    env = [{"name": C.ENV_HOME, "value": C.K8S_HOME_DIR}, {"name": "HF_HOME", "value": C.K8S_HF_HOME}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    names = {e["name"] for e in env}
    for item in opts.env:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise SpecError(f"--env '{item}' is not KEY=VALUE", hint="e.g. --env AWS_ENDPOINT_URL=http://minio.minio:9000")
        if _CREDENTIAL_NAME.search(key) or has_credentials(value):
            raise SpecError(f"--env {key}: a credential would be written into the Job", hint=f"keep it in a Secret: --secret-env {key}=SECRET[:KEY] or --secret SECRET")
        env.append({"name": key, "value": value})
        names.add(key)
    for item in opts.secret_env:
        var, sep, ref = item.partition("=")
        secret, _, key = ref.partition(":")
        if not sep or not _ENV_NAME.match(var) or not secret:
            raise SpecError(f"--secret-env '{item}' is not VAR=SECRET[:KEY]", hint="e.g. --secret-env HF_TOKEN=hf-token:token")
        if var in names:
            raise SpecError(f"--secret-env {var}: the variable is also set by --env or kubetune")
        env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key or var}}})
        names.add(var)
    labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_DELIVER: opts.name}
    container: dict = {
        "name": C.K8S_DELIVER_CONTAINER,
        "image": opts.image,
        "command": ["kubetune", "deliver", src, dest],
        "env": env,
        "volumeMounts": [{"name": "workspace", "mountPath": C.K8S_WORKSPACE}],
    }
    if opts.secrets:
        container["envFrom"] = [{"secretRef": {"name": s}} for s in opts.secrets]
    volume: dict = {"name": "workspace", "emptyDir": {}}
    if opts.disk:
        if not K8S_QUANTITY_RE.match(opts.disk):
            raise SpecError(f"--disk {opts.disk!r} is not a quantity", hint="e.g. --disk 200Gi")
        container["resources"] = {"requests": {"ephemeral-storage": opts.disk}}
        volume["emptyDir"] = {"sizeLimit": opts.disk}
    pod: dict = {"restartPolicy": "Never", "containers": [container], "volumes": [volume]}
    if opts.service_account:
        pod["serviceAccountName"] = opts.service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": opts.name, **({"namespace": opts.namespace} if opts.namespace else {}), "labels": dict(labels)},
        "spec": {
            "backoffLimit": opts.retries,
            "ttlSecondsAfterFinished": C.K8S_DELIVER_TTL_S,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


# --- running it ----------------------------------------------------------------------------------------
def run(cluster: Cluster, job: dict, echo: Callable[[str], None], *, poll: float = 2.0, timeout: float | None = None) -> None:
    """Create the Job, print its pods' log lines as they come, return once it succeeded.

    Raises:
        BackendError: the Job failed (its last attempt's log lines were printed; the reason is named), or
            ``timeout`` seconds passed, or an API error (401, 403, an unreachable server).
    """
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    with api_call(cluster, "create", "jobs", namespace=ns, name=name, kind="Job"):
        cluster.batch().create_namespaced_job(ns, job)
    echo(f"job/{name} created in namespace {ns}; following its pods' logs")
    printed: dict[str, int] = {}  # pod -> log lines printed (a log read again is not printed twice)
    done: set[str] = set()  # pods whose container ended and whose log was printed to the end
    waiting: dict[str, str] = {}  # pod -> the last waiting reason said (said again only when it changes)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = _job_status(cluster, ns, name)
        for pod in _pods(cluster, ns, name):
            pname = pod["metadata"]["name"]
            if pname in done:
                continue
            if not _started(pod):
                why = _waiting(pod)
                if why and waiting.get(pname) != why:  # an image that cannot be pulled keeps a Job pending, never failed
                    echo(f"pod {pname} is waiting: {why}")
                    waiting[pname] = why
                continue
            if pname not in printed and printed:
                echo(f"attempt {len(printed) + 1}: pod {pname}")
            printed.setdefault(pname, 0)
            lines = _log(cluster, ns, pname)
            for line in lines[printed[pname]:]:
                echo(line)
            printed[pname] = max(printed[pname], len(lines))
            if _ended(pod):
                done.add(pname)
        if status == "succeeded":
            return
        if status == "failed":
            reason = _failure(cluster, ns, name)
            raise BackendError(f"job/{name} failed in namespace {ns}: {reason}",
                               hint=f"the log above shows the last attempt's error; kubectl describe job/{name} -n {ns} shows the pods")
        if deadline is not None and time.monotonic() > deadline:
            raise BackendError(f"job/{name} did not finish within {timeout:.0f}s", hint=f"it keeps running: kubectl logs -f job/{name} -n {ns}")
        time.sleep(poll)


def _job_status(cluster: Cluster, ns: str, name: str) -> str:
    with api_call(cluster, "get", "jobs", namespace=ns, name=name, kind="Job"):
        job = cluster.to_dict(cluster.batch().read_namespaced_job(name, ns))
    st = job.get("status") or {}
    for cond in st.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    if st.get("succeeded"):
        return "succeeded"
    return "running"


def _failure(cluster: Cluster, ns: str, name: str) -> str:
    with api_call(cluster, "get", "jobs", namespace=ns, name=name, kind="Job"):
        job = cluster.to_dict(cluster.batch().read_namespaced_job(name, ns))
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason') or 'Failed'}: {cond.get('message') or ''}".rstrip(": ")
    return "Failed"


def _pods(cluster: Cluster, ns: str, name: str) -> list[dict]:
    with api_call(cluster, "list", "pods", namespace=ns):
        listed = cluster.to_dict(cluster.core().list_namespaced_pod(ns, label_selector=f"{C.LABEL_DELIVER}={name}"))
    return sorted(listed.get("items") or [], key=lambda p: p["metadata"].get("creationTimestamp") or "")


def _container_state(pod: dict) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == C.K8S_DELIVER_CONTAINER:
            return cs.get("state") or {}
    return {}


def _started(pod: dict) -> bool:
    state = _container_state(pod)
    return bool(state.get("running") or state.get("terminated"))


def _waiting(pod: dict) -> str:
    """Why the container has not started: its waiting reason and message, else the pod's unschedulable condition."""
    w = _container_state(pod).get("waiting") or {}
    if w.get("reason"):
        return f"{w['reason']}: {w.get('message') or ''}".rstrip(": ")
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".rstrip(": ")
    return ""


def _ended(pod: dict) -> bool:
    return bool(_container_state(pod).get("terminated")) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _log(cluster: Cluster, ns: str, pod: str) -> list[str]:
    try:
        with api_call(cluster, "get", "pods/log", namespace=ns, name=pod, kind="Pod"):
            text = cluster.core().read_namespaced_pod_log(pod, ns, container=C.K8S_DELIVER_CONTAINER) or ""
    except BackendError as e:
        if getattr(e.__cause__, "status", None) in (400, 404):
            return []  # not started yet, or already gone
        raise
    return text.splitlines()
