"""Talking to a KFP server: connect, upload local inputs, submit, follow, terminate, read pod logs.

Every call goes through the kfp SDK's ``kfp.Client`` (KFP REST API v2beta1: healthz, experiments, runs)
or, for pod logs, the Kubernetes API; their errors become one :class:`~kubetune.errors.BackendError`
that says whether the host was unreachable, the credentials were refused or the run failed, with the
run's URL where there is one. Credentials, in order: ``$KUBETUNE_KFP_TOKEN``; the kubeconfig's bearer
token with ``kfp.token_from_kubeconfig``; none with an explicit host (a port-forward); and without a
host, the kfp SDK's kube credentials (in-cluster, else the kubeconfig through the API server's proxy).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ... import constants as C
from ...errors import BackendError, JobNotFound
from ...spec import KfpSpec, TuneJob

__all__ = ["KfpServer", "RunInfo", "TaskInfo", "stage_inputs", "map_state"]

_AUTH_HINT = (
    f"set {C.ENV_KFP_TOKEN} to a token the server accepts (OpenShift AI: export {C.ENV_KFP_TOKEN}=$(oc whoami -t)), "
    "or kfp.token_from_kubeconfig: true after `oc login`"
)
_HOST_HINT = (
    f"check kfp.host or ${C.ENV_KFP_ENDPOINT}; without a route, port-forward the API: "
    "kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888 and use http://localhost:8888"
)

# KFP runtime states -> kubetune states (CANCELING is still running: the pods are being stopped).
_STATES = {
    "RUNTIME_STATE_UNSPECIFIED": C.STATE_PENDING,
    "PENDING": C.STATE_PENDING,
    "PAUSED": C.STATE_PENDING,
    "RUNNING": C.STATE_RUNNING,
    "CANCELING": C.STATE_RUNNING,
    "SUCCEEDED": C.STATE_SUCCEEDED,
    "SKIPPED": C.STATE_SUCCEEDED,
    "FAILED": C.STATE_FAILED,
    "CANCELED": C.STATE_CANCELLED,
}


def map_state(kfp_state: str | None) -> str:
    """The kubetune state of a KFP runtime state."""
    return _STATES.get(str(kfp_state or "PENDING").upper(), C.STATE_PENDING)


@dataclass
class TaskInfo:
    """One task of a run as the server reports it."""

    name: str
    state: str
    error: str | None = None
    pod_name: str | None = None


@dataclass
class RunInfo:
    """A run as the server reports it."""

    run_id: str
    state: str
    error: str | None = None
    tasks: list[TaskInfo] = field(default_factory=list)

    @property
    def failed_task(self) -> TaskInfo | None:
        """The first task that failed (None when none did)."""
        return next((t for t in self.tasks if t.state == "FAILED"), None)


class KfpServer:
    """A connected KFP API (use :meth:`connect`).

    Args:
        client: the ``kfp.Client``.
        host: the API endpoint, when one was given.
        ui_host: base URL of the UI for run links.
        spec: the job's kfp section (namespace, experiment, kube context).
    """

    def __init__(self, client: Any, *, host: str | None, ui_host: str | None, spec: KfpSpec) -> None:
        self.client = client
        self.host = host
        self.ui_host = ui_host
        self.spec = spec

    @classmethod
    def connect(cls, spec: KfpSpec, *, host: str | None = None) -> "KfpServer":
        """Check the server answers and accepts the credentials, then return a client for it.

        Args:
            spec: the job's kfp section.
            host: the endpoint (default: kfp.host, else ``$KF_PIPELINES_ENDPOINT``).

        Raises:
            BackendError: kfp is not installed, the host is unreachable or the credentials are refused.
        """
        host = (host or spec.host or os.environ.get(C.ENV_KFP_ENDPOINT) or "").rstrip("/") or None
        token = os.environ.get(C.ENV_KFP_TOKEN) or (_kubeconfig_token(spec) if spec.token_from_kubeconfig else None)
        if host:
            _probe(host, token, verify=spec.verify_ssl)
        try:
            import kfp
        except ImportError as e:
            raise BackendError("the kfp backend needs the kfp package", hint="pip install 'kubetune[kfp]'") from e
        where = host or "the cluster of the current kubeconfig context"
        with _quiet(), _errors(where, None):
            client = kfp.Client(
                host=host, existing_token=token, namespace=spec.namespace or "kubeflow", ui_host=spec.ui_host,
                verify_ssl=spec.verify_ssl, kube_context=spec.kube_context,
            )
        ui = spec.ui_host or os.environ.get("KF_PIPELINES_UI_ENDPOINT") or host
        return cls(client, host=host, ui_host=ui.rstrip("/") if ui else None, spec=spec)

    def run_url(self, run_id: str) -> str | None:
        """The run's page in the KFP UI (None when no UI address is known)."""
        return C.KFP_RUN_URL.format(ui=self.ui_host, run_id=run_id) if self.ui_host else None

    def submit(self, package: Path, *, arguments: dict, run_name: str, service_account: str | None = None) -> str:
        """Create a run of the compiled pipeline ``package``; return its run id."""
        s = self.spec
        with _quiet(), _errors(self.host or "the KFP API", None):
            result = self.client.create_run_from_pipeline_package(
                str(package), arguments=arguments, run_name=run_name, experiment_name=s.experiment,
                namespace=s.namespace, pipeline_root=s.pipeline_root, enable_caching=s.caching,
                service_account=service_account,
            )
        return result.run_id

    def get_run(self, run_id: str) -> RunInfo:
        """The run's state, error and tasks.

        Raises:
            JobNotFound: the server has no such run.
        """
        with _quiet(), _errors(self.host or "the KFP API", self.run_url(run_id), run_id=run_id):
            run = self.client.get_run(run_id)
        tasks = []
        for t in getattr(run.run_details, "task_details", None) or []:
            tasks.append(TaskInfo(name=t.display_name or "", state=str(t.state or ""), error=_message(t.error), pod_name=t.pod_name))
        return RunInfo(run_id=run_id, state=str(run.state or "PENDING"), error=_message(run.error), tasks=tasks)

    def terminate(self, run_id: str) -> None:
        """Ask the server to stop the run."""
        with _quiet(), _errors(self.host or "the KFP API", self.run_url(run_id), run_id=run_id):
            self.client.terminate_run(run_id)

    def pod_log(self, pod: str) -> list[str]:
        """The log lines of a task's pod (its main container), through the Kubernetes API.

        Raises:
            BackendError: no kube credentials, or the API refused; the message points at the KFP UI.
        """
        try:
            import urllib3
            from kubernetes import client, config
            from kubernetes.client.exceptions import ApiException
            from kubernetes.config.config_exception import ConfigException
        except ImportError as e:  # pragma: no cover - kubernetes is a dependency
            raise BackendError("reading pod logs needs the kubernetes package") from e
        try:
            try:
                config.load_incluster_config()
                namespace = self.spec.namespace
            except ConfigException:
                kubeconfig = os.environ.get("KUBECONFIG")  # read now: the kubernetes package reads it once, at import
                config.load_kube_config(config_file=kubeconfig, context=self.spec.kube_context)
                contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
                if self.spec.kube_context:
                    active = next((c for c in contexts if c["name"] == self.spec.kube_context), active)
                namespace = self.spec.namespace or (active or {}).get("context", {}).get("namespace")
            text = client.CoreV1Api().read_namespaced_pod_log(pod, namespace or "kubeflow", container=C.KFP_MAIN_CONTAINER)
        except (ConfigException, ApiException, OSError, urllib3.exceptions.HTTPError) as e:
            status = getattr(e, "status", None)
            why = f"HTTP {status} {getattr(e, 'reason', '')}".strip() if status else str(e).splitlines()[0]
            raise BackendError(f"cannot read the log of pod {pod}: {why}",
                               hint="set kfp.namespace and kube credentials that may read pods; the KFP UI shows the logs too") from e
        return text.splitlines()


def stage_inputs(job: TuneJob, job_id: str) -> tuple[TuneJob, list[dict]]:
    """Upload the job's local model/dataset files to the bucket and return the job with their s3:// URIs.

    Directories travel as one ``.tar.gz`` (the fetch task unpacks it, as seed 000's model tarball);
    files keep their names, whose suffixes tell the dataset type.

    Returns:
        The job to submit, and one ``{"field", "path", "uri", "bytes"}`` record per upload.

    Raises:
        BackendError: local files but no bucket configured.
        SourceError: an upload failed.
    """
    if job.entrypoint is not None:  # its function fetches what it needs; its code travels as a pipeline parameter
        return job, []
    data = job.model_dump(mode="json")
    slots: list[tuple[str, dict, str, str]] = [("model", data["model"], "source", "model.source"),
                                              ("dataset", data["dataset"], "source", "dataset.source")]
    if data["dataset"].get("eval_source"):
        slots.append(("eval", data["dataset"], "eval_source", "dataset.eval_source"))
    for i, entry in enumerate(data["dataset"].get("mix") or []):
        slots.append((f"mix-{i}", entry, "source", f"dataset.mix[{i}].source"))
    if data["dataset"].get("preprocess"):  # the code of dataset.preprocess, which the train task fetches
        slots.append(("preprocess", data["dataset"]["preprocess"], "file", "dataset.preprocess.file"))
    local = [(slot, holder, key, name) for slot, holder, key, name in slots if _is_local(holder[key])]
    if not local:
        return job, []
    bucket = job.kfp.bucket or (f"s3://{os.environ[C.ENV_KFP_S3_BUCKET].strip('/')}" if os.environ.get(C.ENV_KFP_S3_BUCKET) else None)
    if not bucket:
        names = ", ".join(name for *_, name in local)
        raise BackendError(
            f"{names}: local files cannot reach a KFP server; kubetune uploads them to a bucket, and none is set",
            hint=f"set kfp.bucket: s3://BUCKET[/PREFIX] or ${C.ENV_KFP_S3_BUCKET} (AWS_* variables for its credentials), "
            "or give s3://, hf:// or oci:// URIs",
        )
    from ... import storage

    prefix = f"{bucket}/{C.KFP_STAGING_PREFIX}/{job.name}/{job_id}"
    uploads = []
    for slot, holder, key, name in local:
        path = Path(holder[key].removeprefix("file://")).expanduser()
        if path.is_dir():
            uri = f"{prefix}/{slot}/{path.name}.tar.gz"
            summary = storage.push(path, uri, tar=True)
        else:
            uri = f"{prefix}/{slot}/{path.name}"
            summary = storage.push(path, uri)
        uploads.append({"field": name, "path": str(path), "uri": uri, "bytes": summary.get("bytes")})
    # with_overrides: the job keeps which fields its spec set (a dumped spec would count every preset value as set)
    return job.with_overrides({u["field"].replace("[", ".").replace("]", ""): u["uri"] for u in uploads}), uploads


def _is_local(value: str) -> bool:
    return "://" not in value or value.startswith("file://")


# --- errors -------------------------------------------------------------------------------------
def _probe(host: str, token: str | None, *, verify: bool) -> None:
    """One quick healthz request, so that a wrong host or token fails at once with a clear message."""
    import httpx

    url = f"{host}{C.KFP_API_PREFIX}/healthz"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(url, headers=headers, timeout=15.0, verify=verify, follow_redirects=False)
    except httpx.HTTPError as e:
        raise BackendError(f"cannot reach the KFP API at {host}: {type(e).__name__}: {e}", hint=_HOST_HINT) from e
    if r.status_code in (401, 403) or 300 <= r.status_code < 400:  # an auth proxy redirects to its login page
        what = "no credentials" if not token else "the token"
        raise BackendError(f"the KFP API at {host} refused {what} (HTTP {r.status_code} on {url})", hint=_AUTH_HINT)
    if r.status_code != 200:
        raise BackendError(f"the KFP API at {host} answered HTTP {r.status_code} on {url}: {r.text.strip()[:200]}", hint=_HOST_HINT)
    try:
        r.json()
    except ValueError:
        raise BackendError(f"{url} answered with something other than the KFP API (not JSON): {r.text.strip()[:120]!r}",
                           hint=_HOST_HINT) from None


def _kubeconfig_token(spec: KfpSpec) -> str:
    try:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=spec.kube_context, client_configuration=cfg)
    except Exception as e:
        raise BackendError(f"kfp.token_from_kubeconfig: cannot load the kubeconfig: {e}", hint="run oc login / kubectl config use-context") from e
    value = (cfg.api_key or {}).get("authorization", "")
    token = value.split(" ", 1)[1] if value.lower().startswith("bearer ") else value
    if not token:
        raise BackendError("kfp.token_from_kubeconfig: the kubeconfig context has no bearer token (it uses client certificates?)",
                           hint=_AUTH_HINT)
    return token


@contextlib.contextmanager
def _errors(where: str, url: str | None, *, run_id: str | None = None) -> Iterator[None]:
    """kfp SDK / KFP API errors -> BackendError naming the host and the run's URL."""
    see = f" (run: {url})" if url else ""
    try:
        yield
    except BackendError:
        raise
    except Exception as e:
        import urllib3
        from kfp_server_api.exceptions import ApiException

        if isinstance(e, ApiException):
            status = e.status or 0
            if status == 0:
                raise BackendError(f"cannot reach the KFP API at {where}: {e.reason}{see}", hint=_HOST_HINT) from e
            if status in (401, 403):
                raise BackendError(f"the KFP API at {where} refused the credentials (HTTP {status}){see}", hint=_AUTH_HINT) from e
            if status == 404 and run_id:
                raise JobNotFound(f"the KFP API at {where} has no run {run_id}", hint="kubetune list --backend kfp shows submitted jobs") from e
            raise BackendError(f"the KFP API at {where} answered HTTP {status}: {_body_message(e)}{see}") from e
        if isinstance(e, (urllib3.exceptions.HTTPError, OSError, TimeoutError)):
            raise BackendError(f"cannot reach the KFP API at {where}: {type(e).__name__}: {e}{see}", hint=_HOST_HINT) from e
        if isinstance(e, ValueError):  # the SDK's own checks (e.g. two experiments with one name)
            raise BackendError(f"KFP: {e}{see}") from e
        raise


def _body_message(e: Any) -> str:
    body = e.body.decode("utf-8", "replace") if isinstance(e.body, bytes) else str(e.body or e.reason or "")
    try:
        data = json.loads(body)
        return str(data.get("message") or data.get("error") or body)[:300]
    except (ValueError, AttributeError):
        return body.strip()[:300]


def _message(status: Any) -> str | None:
    """The message of a google.rpc.Status (a run's or a task's error)."""
    if status is None:
        return None
    msg = getattr(status, "message", None) if not isinstance(status, dict) else status.get("message")
    return msg or None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The kfp SDK prints links and warns about API versions; kubetune reports those itself."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield
