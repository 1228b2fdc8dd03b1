"""Results come back: from the job's output URI, or from its workspace PVC through a short-lived pod.

A PVC cannot be read from outside the cluster, so kubetune does what ``kubectl cp`` does: it starts a
pod that mounts the claim read-only, streams ``tar`` of ``/workspace/output`` out through ``exec``
(base64, so any client version carries it as text), unpacks it safely, and deletes the pod.
"""

from __future__ import annotations

import base64
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ... import constants as C
from ...errors import BackendError
from ...spec import TuneJob
from . import api as A
from . import pod as P
from .diagnose import diagnose

if TYPE_CHECKING:
    from .backend import KubernetesBackend

__all__ = ["data_access_pod", "download"]

_WAIT_SECONDS = 300  # for the copy pod to start
_COPY_CONTAINER = "copy"


def data_access_pod(job: TuneJob, *, claim: str, namespace: str | None = None) -> dict:
    """A pod that mounts the job's workspace PVC read-only and idles until it is deleted (at most an hour)."""
    image = job.kubernetes.image or P.default_image(job.model_copy(update={"resources": job.resources.model_copy(update={"accelerators": 0})}))
    md: dict = {"name": f"{job.name}-download", "labels": {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_JOB: job.name}}
    if namespace:
        md["namespace"] = namespace
    container: dict = {
        "name": _COPY_CONTAINER,
        "image": image,
        "command": ["sleep", "3600"],
        "volumeMounts": [{"name": "workspace", "mountPath": C.K8S_WORKSPACE, "readOnly": True}],
    }
    sc = P.container_security_context(job)
    if sc:
        container["securityContext"] = sc
    spec: dict = {"restartPolicy": "Never", "activeDeadlineSeconds": 3600}  # never outlives a forgotten download
    k = job.kubernetes
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in k.image_pull_secrets]
    psc = P.pod_security_context(job)
    if psc:
        spec["securityContext"] = psc
    spec["enableServiceLinks"] = False
    spec["containers"] = [container]
    spec["volumes"] = [{"name": "workspace", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}


def download(backend: "KubernetesBackend", job: TuneJob, *, namespace: str, dest: Path, poll: float = 1.0) -> Path:
    """Copy ``/workspace/output`` of the job's PVC to ``dest`` through a short-lived pod.

    Raises:
        BackendError: the pod does not start, the copy fails, or the job wrote no output there.
    """
    ws = job.kubernetes.workspace
    claim = ws.claim_name or P.names(job)["pvc"]
    pod = data_access_pod(job, claim=claim, namespace=namespace)
    name = pod["metadata"]["name"]
    backend._delete("Pod", name, namespace, missing_ok=True)  # a leftover from an interrupted download
    backend._create(pod, namespace)
    try:
        _wait_running(backend, name, namespace, poll)
        data = _exec_tar(backend, name, namespace)
    finally:
        backend._delete("Pod", name, namespace, missing_ok=True)
    from ...storage.archive import unpack

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "output.tar.gz"
        archive.write_bytes(data)
        unpack(archive, dest, label=f"PVC {claim}:{C.K8S_OUTPUT_DIR}", kind="tar")
    return dest


def _wait_running(backend: "KubernetesBackend", name: str, ns: str, poll: float) -> None:
    deadline = time.monotonic() + _WAIT_SECONDS
    while True:
        pod = backend._get("Pod", name, ns)
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            return
        problem = diagnose([pod], main_container=_COPY_CONTAINER)
        if problem or phase in ("Failed", "Succeeded"):
            raise BackendError(f"the download pod {name} did not start: {problem or phase}")
        if time.monotonic() > deadline:
            raise BackendError(f"the download pod {name} is still {phase or 'Pending'} after {_WAIT_SECONDS}s", hint=f"kubectl describe pod {name} -n {ns}")
        time.sleep(poll)


def _exec_tar(backend: "KubernetesBackend", name: str, ns: str) -> bytes:
    from kubernetes.stream import stream

    # members named like "adapter/...", not "./adapter/...": a "." member is refused by the safe unpacker
    script = (
        f"cd {C.K8S_OUTPUT_DIR} 2>/dev/null || {{ echo 'no {C.K8S_OUTPUT_DIR} on the PVC' >&2; exit 3; }}; "
        "(set -o pipefail) 2>/dev/null && set -o pipefail; ls -A | tar czf - -T - | base64"
    )
    cluster = backend.cluster
    out, err = [], []
    with A.api_call(cluster, "get", "pods/exec", namespace=ns, name=name, kind="Pod"):
        resp = stream(
            cluster.core().connect_get_namespaced_pod_exec, name, ns, container=_COPY_CONTAINER,
            command=["sh", "-c", script], stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
        )
        try:
            while resp.is_open():
                resp.update(timeout=1)
                if resp.peek_stdout():
                    out.append(resp.read_stdout())
                if resp.peek_stderr():
                    err.append(resp.read_stderr())
            code = resp.returncode
        finally:
            resp.close()
    if code != 0:
        raise BackendError(f"copying {C.K8S_OUTPUT_DIR} out of pod {name} failed (exit {code}): {''.join(err).strip()[-500:]}")
    return base64.b64decode("".join(out))
