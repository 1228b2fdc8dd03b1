"""The vLLM serving pod shared by ``render-serve``'s flavors (a Deployment's template, a KServe predictor).

Init containers ``kubetune fetch`` each :class:`ServeSource` that has a URI into an emptyDir under ``/models``;
sources without one are read from the job's PVC, mounted read-only. The main container runs vLLM's OpenAI
server on the models, with credentials and the API key by Secret reference. Pure: no cluster, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import constants as C
from ..errors import SpecError
from ..spec import TuneJob

__all__ = ["ServeSource", "serve_labels", "pod_spec", "lora_rank_option", "SERVE_PORT_NAME"]

SERVE_PORT_NAME = "http"
_SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_STARTUP_SECONDS = 1800  # a large model's first download and load; readiness takes over after it

@dataclass(frozen=True)
class ServeSource:
    """One directory the vLLM container reads.

    Attributes:
        role: ``base`` (the model vLLM loads) or ``adapter``.
        name: the model id clients send (``served-model-name`` or the LoRA name).
        path: where it is inside the pod.
        uri: what an init container fetches to ``path`` (None: already on the mounted PVC).
    """

    role: str
    name: str
    path: str
    uri: str | None


def lora_rank_option(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds ``rank``.

    Raises:
        SpecError: the rank is above vLLM's largest.
    """
    for r in C.SERVE_VLLM_LORA_RANKS:
        if rank <= r:
            return r
    raise SpecError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({C.SERVE_VLLM_LORA_RANKS[-1]})", hint="merge the adapter (output.merge: true) and serve it with --merged")


def serve_labels(job: TuneJob) -> dict[str, str]:
    """The labels of every serving object and pod: kubetune's, then the spec's ``kubernetes.labels``."""
    labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_JOB: job.name, C.LABEL_COMPONENT: C.COMPONENT_SERVE}
    labels.update(job.kubernetes.labels)
    return labels


def pod_spec(
    job: TuneJob,
    sources: list[ServeSource],
    *,
    gpus: int,
    image: str | None,
    max_model_len: int | None,
    api_key_secret: str | None,
    extra_args: list[str],
    container: str = C.SERVE_CONTAINER,
    port: int = C.SERVE_PORT,
    port_name: str | None = SERVE_PORT_NAME,
) -> dict:
    """The serving pod: init containers that fetch the sources, then vLLM's server in ``container`` on ``port``
    (probes name the port when it has a name, else its number)."""
    from ..backends.kubernetes import pod as P

    uses_pvc = any(s.uri is None for s in sources)
    fetches = [s for s in sources if s.uri is not None]
    ws = job.kubernetes.workspace
    volumes: list[dict] = [{"name": "models", "emptyDir": {"sizeLimit": ws.size} if ws.volume == "emptyDir" and ws.size else {}}]
    if uses_pvc:
        claim = P.names(job)["pvc"]
        volumes.append({"name": "workspace", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", **({"sizeLimit": job.kubernetes.shm_size} if job.kubernetes.shm_size else {})}})

    env_fetch = _fetch_env(job)
    init = []
    for s in fetches:
        c: dict = {
            "name": f"fetch-{s.role}" if s.role == "base" else f"fetch-adapter-{len(init)}",
            "image": job.kubernetes.image or _kubetune_image(),
            "command": ["kubetune", "fetch", s.uri, s.path],
            "env": env_fetch,
            "volumeMounts": [{"name": "models", "mountPath": C.SERVE_MODELS_DIR}],
        }
        init.append(_with_job_settings(c, job))

    mounts = [{"name": "models", "mountPath": C.SERVE_MODELS_DIR}, {"name": "dshm", "mountPath": C.K8S_SHM_DIR}]
    if uses_pvc:
        mounts.append({"name": "workspace", "mountPath": C.K8S_WORKSPACE, "readOnly": True})
    probe_port: str | int = port_name or port
    main: dict = {
        "name": container,
        "image": image or C.SERVE_VLLM_IMAGE,
        "command": ["python3", "-m", C.SERVE_VLLM_MODULE],
        "args": _vllm_args(job, sources, gpus=gpus, max_model_len=max_model_len, port=port) + list(extra_args),
        "env": _serve_env(job, api_key_secret),
        "ports": [{**({"name": port_name} if port_name else {}), "containerPort": port, "protocol": "TCP"}],
        "resources": _resources(job, gpus),
        "volumeMounts": mounts,
        "startupProbe": _probe(period=10, failures=_STARTUP_SECONDS // 10, port=probe_port),
        "readinessProbe": _probe(period=5, failures=3, port=probe_port),
        "livenessProbe": _probe(period=30, failures=3, port=probe_port),
    }
    _with_job_settings(main, job)
    spec: dict = {}
    if init:
        spec["initContainers"] = init
    spec["containers"] = [main]
    spec["volumes"] = volumes
    spec.update(P.pod_scheduling(job))
    psc = P.pod_security_context(job)
    if psc:
        spec["securityContext"] = psc
    return spec


def _vllm_args(job: TuneJob, sources: list[ServeSource], *, gpus: int, max_model_len: int | None, port: int = C.SERVE_PORT) -> list[str]:
    base = sources[0]
    args = ["--model", base.path, "--served-model-name", base.name, "--host", "0.0.0.0", "--port", str(port)]
    adapters = [s for s in sources if s.role == "adapter"]
    if adapters:
        if job.method.type == "dora":
            raise SpecError("method.type dora: vLLM serves LoRA adapters, not DoRA", hint="set output.merge: true and serve the merged model with --merged")
        args += ["--enable-lora", "--max-loras", str(len(adapters)), "--max-lora-rank", str(lora_rank_option(job.method.lora.r))]
        args += ["--lora-modules", *[f"{a.name}={a.path}" for a in adapters]]
    if gpus > 1:
        args += ["--tensor-parallel-size", str(gpus)]
    if job.model.trust_remote_code:
        args.append("--trust-remote-code")
    if job.model.dtype != "auto":
        args += ["--dtype", job.model.dtype]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    return args


def _resources(job: TuneJob, gpus: int) -> dict:
    from ..backends.kubernetes import pod as P

    job = job.model_copy(update={"resources": job.resources.model_copy(update={"accelerators": gpus, "processes_per_node": 1, "nodes": 1})})
    return P.resources(job)  # validates the accelerator name and quantities like the training render


def _serve_env(job: TuneJob, api_key_secret: str | None) -> list[dict]:
    env = [{"name": "HF_HOME", "value": f"{C.SERVE_MODELS_DIR}/.cache/huggingface"}]
    env += [{"name": k, "value": v} for k, v in job.kubernetes.env.items() if k != "HF_HOME"]
    if api_key_secret:
        secret, _, key = api_key_secret.partition(":")
        key = key or "api-key"
        if not _SECRET_NAME_RE.match(secret) or len(secret) > 253 or not _SECRET_KEY_RE.match(key):
            raise SpecError(f"--api-key-secret '{api_key_secret}': expected SECRET[:KEY], a Secret name and one of its keys")
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def _fetch_env(job: TuneJob) -> list[dict]:
    """The training init containers' env (credentials by Secret reference), with caches under /models."""
    from ..backends.kubernetes import pod as P

    moved = {C.ENV_HOME: f"{C.SERVE_MODELS_DIR}/.kubetune", "HF_HOME": f"{C.SERVE_MODELS_DIR}/.cache/huggingface"}
    out = []
    for e in P.env_vars(job, main=False):
        if e["name"] in moved and "value" in e:
            e = {"name": e["name"], "value": moved[e["name"]]}
        out.append(e)
    return out


def _probe(*, period: int, failures: int, port: str | int = SERVE_PORT_NAME) -> dict:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5}


def _kubetune_image() -> str:
    from .._version import __version__

    return f"{C.K8S_IMAGE_REPO}:{__version__}"


def _with_job_settings(container: dict, job) -> dict:
    """``container`` with the spec's image pull policy, ``envFrom`` and security context, where set."""
    from ..backends.kubernetes import pod as P

    if job.kubernetes.image_pull_policy:
        container["imagePullPolicy"] = job.kubernetes.image_pull_policy
    if P.env_from(job):
        container["envFrom"] = P.env_from(job)
    sc = P.container_security_context(job)
    if sc:
        container["securityContext"] = sc
    return container
