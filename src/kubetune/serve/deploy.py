"""Cluster serving: a job spec in, a vLLM Deployment and its Service out. Pure, like ``kubetune render``.

What the pod serves is what the job produces:

- LoRA/QLoRA/DoRA job: the base model (``model.source``) plus the job's adapter, through vLLM's LoRA
  options (``--enable-lora --lora-modules NAME=PATH``); ``merged=True`` serves ``merged/`` instead.
- full fine-tune: the trained ``model/``.

The artifacts are read from ``output.uri`` (s3://, oci://) by init containers running
``kubetune fetch URI /models/...``, or, without an output.uri, straight from the job's PVC
(``kubernetes.workspace.volume: pvc``), mounted read-only. Hub models (hf://) and other remote base
models are fetched the same way; a local base model is served from its staged copy
(``kubernetes.staging_uri``), exactly as the training job reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import constants as C
from ..errors import SpecError
from ..spec import TuneJob

__all__ = ["render_serve", "ServeSource", "serve_sources", "lora_rank_option", "tool_call_args", "FLAVORS"]

FLAVORS = ("deployment", "kserve")  # what render_serve renders: a Deployment + Service, or a KServe InferenceService

_SERVE_PORT_NAME = "http"
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


def render_serve(
    job: TuneJob,
    *,
    adapters: dict[str, str] | None = None,
    merged: bool = False,
    replicas: int = 1,
    accelerators: int | None = None,
    image: str | None = None,
    namespace: str | None = None,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    api_key_secret: str | None = None,
    extra_args: list[str] | None = None,
    flavor: str = "deployment",
    tool_call_parser: str | None = None,
) -> list[dict]:
    """The objects that serve ``job``'s result with vLLM's OpenAI server: a Deployment and its Service, or a KServe
    InferenceService (``flavor="kserve"``).

    Args:
        job: the validated job whose output is served.
        adapters: more LoRA adapters, NAME -> URI the cluster can fetch (s3://, oci://, hf://, https://).
        merged: serve the job's ``merged/`` model (needs ``output.merge: true`` and an ``output.uri``).
        replicas: pods behind the Service.
        accelerators: accelerators per pod (default: ``resources.accelerators``, at least 1); more than
            one shards the model (``--tensor-parallel-size``).
        image: the vLLM image (default :data:`~kubetune.constants.SERVE_VLLM_IMAGE`).
        namespace: overrides ``kubernetes.namespace``.
        served_model_name: the id of the job's model (default: the job name).
        max_model_len: vLLM's ``--max-model-len`` (default: the model's).
        api_key_secret: ``SECRET[:KEY]`` whose value clients must send as a bearer key (env VLLM_API_KEY).
        extra_args: passed to vLLM unchanged (a tool-call flag among them replaces kubetune's).
        flavor: ``deployment`` (a Deployment and a Service) or ``kserve`` (one serving.kserve.io/v1beta1
            InferenceService with the same pod).
        tool_call_parser: vLLM's ``--tool-call-parser`` (with ``--enable-auto-tool-choice``); ``none``: no tool
            flags; None: ``hermes`` when the served chat template is known to render tools, else none.

    Returns:
        [Deployment, Service], or [InferenceService], as plain dicts.

    Raises:
        SpecError: the job's result cannot be reached from a pod, or an option is invalid (named).
    """
    if flavor not in FLAVORS:
        raise SpecError(f"--flavor '{flavor}': expected one of {', '.join(FLAVORS)}", hint="deployment (the default) or kserve (a KServe InferenceService)")
    if replicas < 1:
        raise SpecError(f"--replicas must be at least 1, got {replicas}")
    from ..backends.kubernetes.pod import refuse_credentials

    refuse_credentials(job, extra={f"--adapter {k}": v for k, v in (adapters or {}).items()})
    name = f"{job.name}-serve"
    sources = serve_sources(job, adapters=adapters or {}, merged=merged, served_model_name=served_model_name)
    gpus = accelerators if accelerators is not None else max(job.resources.accelerators, 1)
    if gpus < 1:
        raise SpecError(f"--accelerators must be at least 1 (vLLM serves on accelerators), got {gpus}")
    tools = tool_call_args(job, tool_call_parser, extra_args or [])
    if flavor == "kserve":
        from .kserve import render_inference_service

        return render_inference_service(
            job, sources, gpus=gpus, replicas=replicas, image=image, namespace=namespace, max_model_len=max_model_len,
            api_key_secret=api_key_secret, extra_args=tools + list(extra_args or []),
        )
    labels = _labels(job)
    selector = {C.LABEL_JOB: job.name, C.LABEL_COMPONENT: C.COMPONENT_SERVE}
    ns = namespace or job.kubernetes.namespace

    def meta(obj_name: str) -> dict:
        m: dict = {"name": obj_name}
        if ns:
            m["namespace"] = ns
        m["labels"] = dict(labels)
        if job.kubernetes.annotations:
            m["annotations"] = dict(job.kubernetes.annotations)
        return m

    pod_spec = _pod_spec(job, sources, gpus=gpus, image=image, max_model_len=max_model_len, api_key_secret=api_key_secret, extra_args=tools + list(extra_args or []))
    # Prometheus' conventional scrape annotations: vLLM serves its metrics at /metrics on the API port (outside the
    # API key's reach). The spec's own kubernetes.annotations win.
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(C.SERVE_PORT), "prometheus.io/path": "/metrics"}
    template_meta: dict = {"labels": dict(labels), "annotations": {**scrape, **dict(job.kubernetes.annotations or {})}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name),
        "spec": {
            "replicas": replicas,
            # Recreate: a rolling update would need a second set of accelerators while both versions run.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [{"name": _SERVE_PORT_NAME, "port": C.SERVE_PORT, "targetPort": _SERVE_PORT_NAME, "protocol": "TCP"}],
        },
    }
    return [deployment, service]


# --- what is served, from where -------------------------------------------------------------------
def serve_sources(job: TuneJob, *, adapters: dict[str, str], merged: bool = False, served_model_name: str | None = None) -> list[ServeSource]:
    """The base model and adapters of the serving pod, in vLLM's order (base first).

    Raises:
        SpecError: the job's output is unreachable from a pod, or an adapter URI is local.
    """
    from ..backends.kubernetes import pod as P

    name = served_model_name or job.name
    full = job.method.type == "full"
    out_uri = job.output.uri
    on_pvc = job.kubernetes.workspace.volume == "pvc"
    if out_uri and out_uri.startswith("file://"):
        raise SpecError(
            f"output.uri {out_uri} is a path on the machine that ran the job; a serving pod cannot read it",
            hint="publish the run to s3:// or oci:// (kubetune push RUN URI) and set output.uri to it",
        )
    if not out_uri and not on_pvc:
        raise SpecError(
            f"job {job.name} keeps its results in an emptyDir that is gone when its pod ends: nothing to serve",
            hint="set output.uri (s3://... or oci://...) or kubernetes.workspace.volume: pvc, and run the job again",
        )
    if merged and not job.output.merge:
        raise SpecError("--merged: the job writes no merged model", hint="set output.merge: true, or serve the adapter (leave out --merged)")
    if merged and full:
        raise SpecError("--merged: a full fine-tune has no adapter to merge; its model/ is served as it is")

    sources: list[ServeSource] = []
    if full or merged:
        artifact = C.MERGED_DIR if merged else C.MODEL_DIR
        sources.append(ServeSource("base", name, C.SERVE_BASE_DIR, _artifact_uri(out_uri, artifact)) if out_uri else ServeSource("base", name, f"{C.K8S_OUTPUT_DIR}/{artifact}", None))
    else:
        if job.method.lora.modules_to_save:  # vLLM starts, then fails at the adapter's first request
            raise SpecError(
                f"method.lora.modules_to_save {job.method.lora.modules_to_save}: the job's adapter stores fully trained "
                "modules, which vLLM's LoRA support cannot load",
                hint="serve the merged model with --merged" + ("" if job.output.merge else " (set output.merge: true and run the job again)"),
            )
        model = next(i for i in P.cluster_inputs(job) if i.field == "model.source")
        from .sources import model_name_from_uri

        base_name = model_name_from_uri(job.model.source)
        if on_pvc and model.dest is not None and not out_uri and job.resources.nodes == 1:
            sources.append(ServeSource("base", base_name, model.dest, None))  # the job fetched it onto the PVC
        else:
            sources.append(ServeSource("base", base_name, C.SERVE_BASE_DIR, model.uri))
        if out_uri:
            sources.append(ServeSource("adapter", name, f"{C.SERVE_ADAPTERS_DIR}/{name}", _artifact_uri(out_uri, C.ADAPTER_DIR)))
        else:
            sources.append(ServeSource("adapter", name, f"{C.K8S_OUTPUT_DIR}/{C.ADAPTER_DIR}", None))
    for extra, uri in adapters.items():
        if "://" not in uri or uri.startswith("file://"):
            raise SpecError(
                f"--adapter {extra}={uri}: a local path cannot be read by the serving pod",
                hint=f"push it first (kubetune push {uri} s3://BUCKET/PREFIX) and pass that URI",
            )
        sources.append(ServeSource("adapter", extra, f"{C.SERVE_ADAPTERS_DIR}/{extra}", uri))
    seen: set[str] = set()
    for s in sources:
        if s.name in seen:
            raise SpecError(f"model name '{s.name}' is used twice", hint="give each --adapter its own name")
        seen.add(s.name)
    return sources


def _artifact_uri(out_uri: str, artifact: str) -> str:
    """Where OutputSync publishes an artifact: PREFIX/adapter for s3://, TAG (adapter, model) or TAG-merged for oci://."""
    if out_uri.startswith("oci://"):
        return f"{out_uri}-merged" if artifact == C.MERGED_DIR else out_uri
    return f"{out_uri.rstrip('/')}/{artifact}"


def lora_rank_option(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds ``rank``.

    Raises:
        SpecError: the rank is above vLLM's largest.
    """
    for r in C.SERVE_VLLM_LORA_RANKS:
        if rank <= r:
            return r
    raise SpecError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({C.SERVE_VLLM_LORA_RANKS[-1]})", hint="merge the adapter (output.merge: true) and serve it with --merged")


# --- tool calling --------------------------------------------------------------------------------
_TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")
_PARSER_RE = re.compile(r"^[A-Za-z0-9][-_.A-Za-z0-9]*$")


def tool_call_args(job: TuneJob, parser: str | None, extra_args: list[str]) -> list[str]:
    """vLLM's tool-calling flags for the served model: ``--enable-auto-tool-choice --tool-call-parser PARSER``.

    ``parser`` names vLLM's parser (``none``: no flags); None means ``hermes`` when the chat template the model is
    served with is known at render time to render tools in the Hermes form (:func:`default_tool_parser`). A
    tool-call flag among ``extra_args`` (the user's ``--vllm-arg``) replaces kubetune's flags.

    Raises:
        SpecError: ``parser`` is not a parser name.
    """
    if parser is not None and not _PARSER_RE.match(parser):
        raise SpecError(f"--tool-call-parser '{parser}': expected a vLLM tool-call parser name (hermes, llama3_json, mistral, ...) or none")
    if any(a.split("=")[0] in _TOOL_FLAGS for a in extra_args):
        return []
    chosen = default_tool_parser(job) if parser is None else parser
    return [] if chosen is None or chosen == "none" else ["--enable-auto-tool-choice", "--tool-call-parser", chosen]


def default_tool_parser(job: TuneJob) -> str | None:
    """``hermes`` when the served chat template renders tools in the Hermes form, as far as can be known without
    fetching anything: ``dataset.chat_template: chatml`` (kubetune's chatml renders tools that way), or no named
    template and a base model that is a local directory or a builtin:// model whose template does. None otherwise
    (a hub or bucket model's template is unknown until it is fetched: pass ``--tool-call-parser``)."""
    from .vllm import hermes_tools_in, renders_hermes_tools

    named = job.dataset.chat_template
    if named is not None:
        from ..data.templates import CHAT_TEMPLATES

        return "hermes" if named == "chatml" and CHAT_TEMPLATES[named].tool_calling else None
    source = job.model.source
    if source.startswith("builtin://"):
        from ..training.builtin import CHATML_TEMPLATE

        return "hermes" if hermes_tools_in(CHATML_TEMPLATE) else None
    from pathlib import Path

    local = Path(source.removeprefix("file://")) if "://" not in source or source.startswith("file://") else None
    return "hermes" if local is not None and local.is_dir() and renders_hermes_tools(local) else None


# --- the pod ---------------------------------------------------------------------------------------
def _labels(job: TuneJob) -> dict[str, str]:
    labels = {C.LABEL_MANAGED_BY: C.MANAGED_BY_VALUE, C.LABEL_JOB: job.name, C.LABEL_COMPONENT: C.COMPONENT_SERVE}
    labels.update(job.kubernetes.labels)
    return labels


def _pod_spec(
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
    port_name: str | None = _SERVE_PORT_NAME,
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
        if job.kubernetes.image_pull_policy:
            c["imagePullPolicy"] = job.kubernetes.image_pull_policy
        if P.env_from(job):
            c["envFrom"] = P.env_from(job)
        sc = P.container_security_context(job)
        if sc:
            c["securityContext"] = sc
        init.append(c)

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
    if job.kubernetes.image_pull_policy:
        main["imagePullPolicy"] = job.kubernetes.image_pull_policy
    if P.env_from(job):
        main["envFrom"] = P.env_from(job)
    sc = P.container_security_context(job)
    if sc:
        main["securityContext"] = sc
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


def _probe(*, period: int, failures: int, port: str | int = _SERVE_PORT_NAME) -> dict:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5}


def _kubetune_image() -> str:
    from .._version import __version__

    return f"{C.K8S_IMAGE_REPO}:{__version__}"
