"""Cluster serving: a job spec in, a vLLM Deployment and its Service (or a KServe InferenceService,
:mod:`kubetune.serve.kserve`) out. Pure, like ``kubetune render``; the pod is :mod:`kubetune.serve.podspec`'s.

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

from .. import constants as C
from ..errors import SpecError
from ..spec import TuneJob
from .podspec import SERVE_PORT_NAME, ServeSource, lora_rank_option, pod_spec, serve_labels
from .tool_flags import tool_call_args

__all__ = ["render_serve", "ServeSource", "serve_sources", "lora_rank_option", "tool_call_args", "FLAVORS"]

FLAVORS = ("deployment", "kserve")  # what render_serve renders: a Deployment + Service, or a KServe InferenceService


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
    if job.entrypoint is not None:
        raise SpecError(f"{job.name} runs a custom training function ({job.entrypoint.describe()}): kubetune does not know "
                        "which model it saves", hint="serve the model your function saved: kubetune serve PATH (docs/serving.md)")
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
    labels = serve_labels(job)
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

    pod = pod_spec(job, sources, gpus=gpus, image=image, max_model_len=max_model_len, api_key_secret=api_key_secret, extra_args=tools + list(extra_args or []))
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
            "template": {"metadata": template_meta, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [{"name": SERVE_PORT_NAME, "port": C.SERVE_PORT, "targetPort": SERVE_PORT_NAME, "protocol": "TCP"}],
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
