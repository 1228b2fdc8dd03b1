"""Cluster serving on KServe: a job spec in, one ``serving.kserve.io/v1beta1`` InferenceService out. Pure.

The predictor is the same pod as the Deployment flavor's (:mod:`kubetune.serve.deploy`), written inline as
KServe allows for custom containers: the init containers that ``kubetune fetch`` the base model and adapters,
then vLLM's OpenAI server in the container KServe expects (``kserve-container``) listening on KServe's default
port for custom containers, 8080. KServe creates the Deployment and Service (RawDeployment) or the Knative
Service (Serverless) from it; vLLM's metrics are announced with KServe's own Prometheus annotations.
"""

from __future__ import annotations

from ..errors import SpecError
from ..spec import TuneJob
from .podspec import ServeSource, pod_spec, serve_labels

__all__ = ["render_inference_service", "KSERVE_API_VERSION", "KSERVE_CONTAINER", "KSERVE_PORT"]

KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
KSERVE_CONTAINER = "kserve-container"  # the predictor container KServe routes to and reports on
KSERVE_PORT = 8080  # KServe's default port of a custom predictor container (and Knative's)
_BLOCKED_ENV = ("PYTHONPATH",)  # KServe's admission webhook refuses these in predictor containers (v0.18 and later)


def render_inference_service(
    job: TuneJob,
    sources: list[ServeSource],
    *,
    gpus: int,
    replicas: int,
    image: str | None,
    namespace: str | None,
    max_model_len: int | None,
    api_key_secret: str | None,
    extra_args: list[str],
) -> list[dict]:
    """The InferenceService that serves ``sources`` with vLLM (checked by :func:`~kubetune.serve.deploy.render_serve`).

    ``replicas`` pins the predictor's ``minReplicas`` and ``maxReplicas`` (KServe's autoscaler is not asked to
    scale accelerators up and down); its Deployment is recreated on updates, as the Deployment flavor's is.

    Returns:
        [InferenceService] as a plain dict.

    Raises:
        SpecError: the pod sets an environment variable KServe refuses (``PYTHONPATH``).
    """
    blocked = sorted({k for k in job.kubernetes.env if k in _BLOCKED_ENV})
    if blocked:
        raise SpecError(
            f"kubernetes.env sets {', '.join(blocked)}, which KServe's admission webhook refuses in an InferenceService's containers",
            hint="leave it out of kubernetes.env for --flavor kserve, or render the Deployment flavor (--flavor deployment)",
        )
    pod = pod_spec(
        job, sources, gpus=gpus, image=image, max_model_len=max_model_len, api_key_secret=api_key_secret, extra_args=extra_args,
        container=KSERVE_CONTAINER, port=KSERVE_PORT, port_name=None,  # Knative accepts only unnamed, http1 or h2c ports
    )
    labels = serve_labels(job)
    # KServe's documented switch for metrics (it sets the pod's prometheus.io annotations from these); vLLM serves
    # /metrics on its API port. The spec's own kubernetes.annotations win.
    scrape = {"serving.kserve.io/enable-prometheus-scraping": "true", "prometheus.kserve.io/port": str(KSERVE_PORT), "prometheus.kserve.io/path": "/metrics"}
    meta: dict = {"name": f"{job.name}-serve"}
    ns = namespace or job.kubernetes.namespace
    if ns:
        meta["namespace"] = ns
    meta["labels"] = dict(labels)
    meta["annotations"] = {**scrape, **dict(job.kubernetes.annotations or {})}
    predictor: dict = {
        "minReplicas": replicas,
        "maxReplicas": replicas,
        # Recreate: a rolling update would need a second set of accelerators while both versions run (RawDeployment).
        "deploymentStrategy": {"type": "Recreate"},
        "labels": dict(labels),  # on the predictor's pods, as on the Deployment flavor's
        **({"annotations": dict(job.kubernetes.annotations)} if job.kubernetes.annotations else {}),
        **pod,
    }
    return [{"apiVersion": KSERVE_API_VERSION, "kind": "InferenceService", "metadata": meta, "spec": {"predictor": predictor}}]
