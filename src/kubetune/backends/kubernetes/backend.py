"""The Kubernetes backend: submit rendered objects, follow them through labels and pod logs, cancel them.

A job on the cluster is found by its labels (``kubetune.io/job``, ``app.kubernetes.io/managed-by``); its
progress is rebuilt from the ``KUBETUNE_EVENT`` lines the rank-0 worker prints; its state comes from the
workload's conditions, and a stuck or failed job's reason from its pods (:mod:`.diagnose`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from ... import constants as C
from ...errors import BackendError, JobNotFound
from ...events import JobStatus, parse_event_line, status_from_events
from ...spec import TuneJob
from ..base import JobRef
from . import api as A
from .diagnose import diagnose, rank0_pod, trainer_progress, workload_state
from .kaito_run import main_container, output_image, output_volume, pod_selector, progress_events, workspace_state
from .pod import cluster_inputs
from .render import WORKLOAD_KINDS, render
from .uploads import stage_inputs

__all__ = ["KubernetesBackend"]

_TIMEOUT = 30  # seconds per API call (log streams excepted)
_EVENTS_TTL = 1.0  # seconds the parsed events of one job are reused (status and events poll together)
_CORE = {  # kind -> (API group accessor, method suffix, RBAC resource)
    "ConfigMap": ("core", "config_map", "configmaps"),
    "Service": ("core", "service", "services"),
    "PersistentVolumeClaim": ("core", "persistent_volume_claim", "persistentvolumeclaims"),
    "Pod": ("core", "pod", "pods"),
    "Job": ("batch", "job", "jobs"),
}
_KIND_FLAVOR = {kind: flavor for flavor, (_, kind, _) in WORKLOAD_KINDS.items()}


class KubernetesBackend:
    """Run jobs on a Kubernetes cluster.

    Args:
        namespace: where jobs go and are looked up (default: ``kubernetes.namespace``, else the kubeconfig
            context's namespace, else ``default``).
        context: the kubeconfig context (default: the current one).
        kubeconfig: a kubeconfig file (default: ``$KUBECONFIG`` or ``~/.kube/config``; in a pod, in-cluster).
        flavor: force a flavour for submissions (default: the spec's ``kubernetes.flavor``).
        push: the upload function for staging local inputs (default: :func:`kubetune.storage.push`).
        cache_seconds: how long one read of the worker's log serves ``status`` and ``events`` (a follower
            polls both; this halves the log traffic).
    """

    name = "kubernetes"

    def __init__(
        self,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        *,
        flavor: str | None = None,
        push: Callable[..., dict] | None = None,
        cache_seconds: float = _EVENTS_TTL,
    ) -> None:
        self._namespace = namespace
        self._context = context
        self._kubeconfig = kubeconfig
        self._flavor = flavor
        self._push = push
        self._cache_seconds = cache_seconds
        self._cluster: A.Cluster | None = None
        self._cancelled: set[tuple[str, str]] = set()
        self._events_cache: dict[tuple[str, str], tuple[float, list[dict], list[dict], bool]] = {}

    # --- the protocol ------------------------------------------------------------------------
    def submit(self, job: TuneJob) -> JobRef:
        """Stage local inputs, then create the job's objects; returns at once.

        Raises:
            SpecError: the spec cannot run on a cluster as written.
            BackendError: staging or an API call failed (the message says what to do).
        """
        flavor = self._flavor or job.kubernetes.flavor
        run_id = f"{job.name}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
        render(job, flavor)  # spec errors before any upload or API call
        ns = self._namespace or job.kubernetes.namespace or self.cluster.namespace  # no cluster configured: said here
        if any(i.local is not None for i in cluster_inputs(job)):  # an upload can be long: the API server answers first
            self._list("Pod", ns, f"{C.LABEL_JOB}={job.name}")
        stage_inputs(job, push=self._push)
        objects = render(job, flavor, run_id=run_id, namespace=ns)
        workload = objects[-1]
        pvcs = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
        dependents = [o for o in objects[:-1] if o["kind"] != "PersistentVolumeClaim"]
        for pvc in pvcs:  # outlives the job on purpose (results, resume); an existing one is reused
            try:
                self._create(pvc, ns)
            except BackendError as e:
                if "already exists" not in e.message:
                    raise
        if flavor == "kaito":  # Kaito's webhook reads the training config when the Workspace is created: it goes first
            return self._submit_kaito(job, dependents, workload, ns, run_id)
        created = self._create(workload, ns)
        owner = {
            "apiVersion": workload["apiVersion"],
            "kind": workload["kind"],
            "name": workload["metadata"]["name"],
            "uid": created["metadata"]["uid"],
        }
        try:
            for obj in dependents:  # owned by the workload: deleted with it (TTL, cancel)
                obj["metadata"]["ownerReferences"] = [owner]
                self._create_or_replace(obj, ns)
        except BackendError:
            self._delete(workload["kind"], workload["metadata"]["name"], ns, missing_ok=True)
            raise
        return JobRef(id=job.name, backend=self.name, name=job.name, extra={"namespace": ns, "flavor": flavor, "run_id": run_id})

    def _submit_kaito(self, job: TuneJob, config: list[dict], workspace: dict, ns: str, run_id: str) -> JobRef:
        """The training config ConfigMap, then the Workspace (no owner reference: the ConfigMap exists first;
        ``cancel`` deletes both). A dataset staged to S3 reaches Kaito's data-downloader as a presigned https URL."""
        data = workspace.get("tuning", {}).get("input", {})
        if any(u.startswith("s3://") for u in data.get("urls", [])):
            from ...storage.s3_client import presign_get

            data["urls"] = [presign_get(u, C.K8S_KAITO_PRESIGN_SECONDS) if u.startswith("s3://") else u for u in data["urls"]]
        for obj in config:
            self._create_or_replace(obj, ns)
        try:
            self._create(workspace, ns)
        except BackendError:
            for obj in config:
                self._delete(obj["kind"], obj["metadata"]["name"], ns, missing_ok=True)
            raise
        return JobRef(id=job.name, backend=self.name, name=job.name, extra={"namespace": ns, "flavor": "kaito", "run_id": run_id})

    def status(self, ref: JobRef) -> JobStatus:
        """State from the workload's conditions, progress from the worker's events, reason from the pods."""
        ref = self._ref(ref)
        ns, flavor = ref.extra["namespace"], ref.extra["flavor"]
        try:
            obj = self._get_workload(ref)
        except JobNotFound:
            if (ns, ref.id) in self._cancelled:
                return JobStatus(state=C.STATE_CANCELLED, reason="cancelled", job_id=ref.id, name=ref.name, backend=self.name)
            raise self._not_found(ref.id, ns) from None
        state, reason = workspace_state(obj) if flavor == "kaito" else workload_state(obj, flavor)
        # An ended workload's events are read once more after it ended: a cached read from while it ran would miss
        # the worker's last lines for good (a follower that sees the end stops reading).
        events, pods = self._events_and_pods(ref, final=state in C.TERMINAL_STATES)
        if state == C.STATE_RUNNING and pods and not any((p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed") for p in pods):
            state = C.STATE_PENDING  # "active" counts pods that are still waiting for a node or an image
        st = status_from_events(events)
        worker_reason = st.reason if st.state == C.STATE_FAILED else None
        if state == C.STATE_FAILED and st.state == C.STATE_PREEMPTED:  # evicted after saving: a rerun resumes
            state, reason = C.STATE_PREEMPTED, st.reason
        st.state = state
        st.job_id, st.name, st.backend = ref.id, ref.name or ref.id, self.name
        st.created_at = _epoch(obj["metadata"].get("creationTimestamp"))
        progress = trainer_progress(obj)
        if st.loss is None and "loss" in progress:
            st.loss = progress["loss"]
        if st.eta_seconds is None and "eta_seconds" in progress:
            st.eta_seconds = progress["eta_seconds"]
        st.extra = {"namespace": ns, "flavor": flavor, "pods": {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in pods}}
        if "progress_percentage" in progress:
            st.extra["progress_percentage"] = progress["progress_percentage"]
        if flavor == "kaito" and output_image(obj):  # where Kaito's sidecar pushes (pushed once it succeeded)
            st.extra["output_image"] = output_image(obj)
        elif flavor == "kaito" and output_volume(obj):  # the claim Kaito writes the adapter to
            st.extra["output_volume"] = output_volume(obj)
        main = self._main(ref, rank0_pod(pods))
        if state not in (C.STATE_SUCCEEDED, C.STATE_CANCELLED, C.STATE_PREEMPTED):
            found = diagnose(pods, main_container=main or "", logs_tail=lambda p, c: self._tail(p, c, ns), queue=_queue(obj))
            if state == C.STATE_FAILED:
                st.reason = worker_reason or found or reason or "failed"
                code = _exit_code(rank0_pod(pods), main or "")
                if code is not None:
                    st.extra["exit_code"] = code
            else:
                st.reason = found or reason
        elif state in (C.STATE_CANCELLED, C.STATE_PREEMPTED):
            st.reason = reason
        return st

    def events(self, ref: JobRef) -> list[dict]:
        """The worker's events, parsed from the rank-0 pod's log."""
        return self._events_and_pods(self._ref(ref))[0]

    def logs(self, ref: JobRef, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """The rank-0 pod's log: its init containers' (prefixed ``[name]``) then the worker's (each job has its
        own pods: ``all_runs`` changes nothing).

        With ``follow``, waits for the worker to start and streams until it ends.
        """
        ref = self._ref(ref)
        return self._follow_logs(ref) if follow else iter(self._all_logs(ref))

    def cancel(self, ref: JobRef) -> None:
        """Mark the workload cancelled, then delete it with its pods, ConfigMap and Service (a PVC stays)."""
        ref = self._ref(ref)
        ns, flavor = ref.extra["namespace"], ref.extra["flavor"]
        kind = WORKLOAD_KINDS[flavor][1]
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            self._patch(kind, ref.id, ns, {"metadata": {"annotations": {C.ANNOTATION_CANCELLED: stamp}}})
        except JobNotFound:
            raise self._not_found(ref.id, ns) from None
        self._delete(kind, ref.id, ns, missing_ok=True)
        self._delete("ConfigMap", f"{ref.id}-{C.K8S_KAITO_CONFIG_SUFFIX}" if flavor == "kaito" else f"{ref.id}-spec", ns, missing_ok=True)
        if flavor == "job":
            self._delete("Service", ref.id, ns, missing_ok=True)
        self._cancelled.add((ns, ref.id))
        self._events_cache.pop((ns, ref.id), None)

    def list(self) -> list[JobRef]:
        """kubetune's jobs in the namespace, newest first (kinds whose CRD is not installed are skipped)."""
        ns = self.namespace
        found = []
        for obj in self._workloads(ns, f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY_VALUE}"):
            found.append(obj)
        found.sort(key=lambda o: o["metadata"].get("creationTimestamp") or "", reverse=True)
        return [self._ref_of(o, ns) for o in found]

    def resolve(self, key: str) -> JobRef:
        """The JobRef of a job name (``flavor/name`` picks a flavour when one name has several)."""
        ns = self.namespace
        flavor, _, name = key.rpartition("/")
        objs = [o for o in self._workloads(ns, f"{C.LABEL_JOB}={name}") if not flavor or _KIND_FLAVOR[o["kind"]] == flavor]
        objs = [o for o in objs if o["metadata"]["name"] == name]
        if not objs:
            if (ns, name) in self._cancelled:
                return JobRef(id=name, backend=self.name, name=name, extra={"namespace": ns, "flavor": flavor or "job"})
            raise self._not_found(name, ns)
        newest = max(objs, key=lambda o: o["metadata"].get("creationTimestamp") or "")
        return self._ref_of(newest, ns)

    def download(self, job_id: str, dest: str | Path) -> Path:
        """Bring a finished job's outputs to ``dest``: from its ``output.uri``, else from its workspace PVC.

        Returns:
            The local directory holding the outputs.

        Raises:
            BackendError: the outputs lived in an emptyDir (gone with the pod), or the copy failed.
        """
        from ...spec import load_spec
        from ...spec.reader import parse_spec_text

        ref = self._ref(job_id)
        ns = ref.extra["namespace"]
        cm = self._get("ConfigMap", f"{ref.id}-spec", ns)
        job = load_spec(parse_spec_text(cm["data"][C.K8S_SPEC_KEY], f"ConfigMap {ref.id}-spec")[0])
        if job.output.uri:
            from ...storage import fetch

            return Path(fetch(job.output.uri, dest, use_cache=False))
        if job.kubernetes.workspace.volume == "pvc":
            from .download import download

            return download(self, job, namespace=ns, dest=Path(dest))
        raise BackendError(
            f"job {ref.id} kept its outputs in an emptyDir workspace, which is gone with its pod",
            hint="set output.uri: s3://... or oci://... (the worker publishes there), or kubernetes.workspace.volume: pvc",
        )

    # --- connection --------------------------------------------------------------------------
    @property
    def cluster(self) -> A.Cluster:
        """The API client, connected on first use."""
        if self._cluster is None:
            self._cluster = A.connect(context=self._context, kubeconfig=self._kubeconfig)
        return self._cluster

    @property
    def namespace(self) -> str:
        """The namespace jobs are listed in (the spec's or the kubeconfig's)."""
        return self._namespace or self.cluster.namespace

    # --- objects -----------------------------------------------------------------------------
    def _api(self, kind: str, verb: str):
        """(callable, leading args, RBAC resource) of ``verb`` on ``kind``."""
        if kind in _CORE:
            group, suffix, resource = _CORE[kind]
            api = self.cluster.core() if group == "core" else self.cluster.batch()
            return getattr(api, f"{verb}_namespaced_{suffix}"), (), resource
        flavor = _KIND_FLAVOR[kind]
        api_version, _, plural = WORKLOAD_KINDS[flavor]
        group, version = api_version.split("/")
        custom_verb = {"read": "get"}.get(verb, verb)
        return getattr(self.cluster.custom(), f"{custom_verb}_namespaced_custom_object"), (group, version), plural

    def _create(self, obj: dict, ns: str) -> dict:
        kind, name = obj["kind"], obj["metadata"]["name"]
        fn, lead, resource = self._api(kind, "create")
        args = (*lead, ns, resource, obj) if lead else (ns, obj)
        with A.api_call(self.cluster, "create", resource, namespace=ns, name=name, kind=kind):
            return self.cluster.to_dict(fn(*args, _request_timeout=_TIMEOUT))

    def _create_or_replace(self, obj: dict, ns: str) -> None:
        try:
            self._create(obj, ns)
        except BackendError as e:
            if "already exists" not in e.message:
                raise
            self._delete(obj["kind"], obj["metadata"]["name"], ns, missing_ok=True)  # left over from an earlier run
            self._create(obj, ns)

    def _get(self, kind: str, name: str, ns: str) -> dict:
        fn, lead, resource = self._api(kind, "read")
        args = (*lead, ns, resource, name) if lead else (name, ns)
        with A.api_call(self.cluster, "get", resource, namespace=ns, name=name, kind=kind):
            return self.cluster.to_dict(fn(*args, _request_timeout=_TIMEOUT))

    def _list(self, kind: str, ns: str, selector: str) -> list[dict]:
        fn, lead, resource = self._api(kind, "list")
        args = (*lead, ns, resource) if lead else (ns,)
        with A.api_call(self.cluster, "list", resource, namespace=ns, kind=kind):
            result = self.cluster.to_dict(fn(*args, label_selector=selector, _request_timeout=_TIMEOUT))
        items = result.get("items") or []
        for item in items:  # typed lists omit kind/apiVersion on items
            item.setdefault("kind", kind)
        return items

    def _patch(self, kind: str, name: str, ns: str, body: dict) -> None:
        fn, lead, resource = self._api(kind, "patch")
        args = (*lead, ns, resource, name, body) if lead else (name, ns, body)
        with A.api_call(self.cluster, "patch", resource, namespace=ns, name=name, kind=kind):
            fn(*args, _request_timeout=_TIMEOUT)

    def _delete(self, kind: str, name: str, ns: str, *, missing_ok: bool = False) -> None:
        fn, lead, resource = self._api(kind, "delete")
        args = (*lead, ns, resource, name) if lead else (name, ns)
        try:
            with A.api_call(self.cluster, "delete", resource, namespace=ns, name=name, kind=kind):
                fn(*args, propagation_policy="Background", _request_timeout=_TIMEOUT)
        except JobNotFound:
            if not missing_ok:
                raise

    def _workloads(self, ns: str, selector: str) -> list[dict]:
        out = []
        for flavor, (_, kind, _) in WORKLOAD_KINDS.items():
            try:
                out += self._list(kind, ns, selector)
            except JobNotFound:
                continue  # this operator's CRD is not installed
            except BackendError as e:
                if flavor != "job" and "forbidden" in e.message:
                    continue  # no RBAC on an operator's kind we may not use
                raise
        return out

    def _get_workload(self, ref: JobRef) -> dict:
        return self._get(WORKLOAD_KINDS[ref.extra["flavor"]][1], ref.id, ref.extra["namespace"])

    def _ref(self, ref: JobRef | str) -> JobRef:
        if isinstance(ref, JobRef) and "namespace" in ref.extra and "flavor" in ref.extra:
            return ref
        return self.resolve(ref.id if isinstance(ref, JobRef) else str(ref))

    def _ref_of(self, obj: dict, ns: str) -> JobRef:
        md = obj["metadata"]
        labels = md.get("labels") or {}
        extra = {"namespace": md.get("namespace") or ns, "flavor": _KIND_FLAVOR[obj["kind"]]}
        if labels.get(C.LABEL_RUN_ID):
            extra["run_id"] = labels[C.LABEL_RUN_ID]
        return JobRef(id=md["name"], backend=self.name, name=labels.get(C.LABEL_JOB, md["name"]), extra=extra)

    def _not_found(self, name: str, ns: str) -> JobNotFound:
        return JobNotFound(
            f"no kubetune job '{name}' in namespace '{ns}'",
            hint="it was cancelled, removed after kubernetes.ttl_seconds_after_finished, or runs in another namespace (--namespace)",
        )

    # --- pods, logs and events ---------------------------------------------------------------
    def _pods(self, ref: JobRef) -> list[dict]:
        if ref.extra["flavor"] == "kaito":  # Kaito builds the pods: they carry its Job's labels, not kubetune's
            return self._list("Pod", ref.extra["namespace"], pod_selector(ref.id))
        return self._list("Pod", ref.extra["namespace"], f"{C.LABEL_JOB}={ref.id},{C.LABEL_FLAVOR}={ref.extra['flavor']}")

    def _main(self, ref: JobRef, pod: dict | None) -> str | None:
        """The container whose log is the job's: kubetune's worker, or Kaito's tuning container."""
        if ref.extra["flavor"] == "kaito":
            return main_container(pod) if pod is not None else None
        return C.K8S_MAIN_CONTAINER[ref.extra["flavor"]]

    def _read_log(self, pod: str, container: str, ns: str, *, tail: int | None = None) -> str:
        kwargs: dict[str, Any] = {"container": container, "_request_timeout": _TIMEOUT}
        if tail:
            kwargs["tail_lines"] = tail
        try:
            with A.api_call(self.cluster, "get", "pods/log", namespace=ns, name=pod, kind="Pod"):
                return self.cluster.core().read_namespaced_pod_log(pod, ns, **kwargs) or ""
        except BackendError as e:
            if "not found" in e.message or "400" in e.message:
                return ""  # not started yet, or already gone
            raise

    def _tail(self, pod: str, container: str, ns: str) -> list[str]:
        return self._read_log(pod, container, ns, tail=50).splitlines()

    def _events_and_pods(self, ref: JobRef, final: bool = False) -> tuple[list[dict], list[dict]]:
        """The worker's events and the job's pods, cached for a moment; ``final``: the workload has ended, so a
        cached read taken before it ended does not count."""
        key = (ref.extra["namespace"], ref.id)
        cached = self._events_cache.get(key)
        if cached and time.monotonic() - cached[0] < self._cache_seconds and (cached[3] or not final):
            return cached[1], cached[2]
        pods = self._pods(ref)
        pod = rank0_pod(pods)
        main = self._main(ref, pod)
        events: list[dict] = []
        if pod is not None and main and _started(pod, main):
            text = self._read_log(pod["metadata"]["name"], main, ref.extra["namespace"])
            if ref.extra["flavor"] == "kaito":  # Kaito's trainer prints the Trainer's log dicts, not kubetune events
                events = progress_events(text)
            else:
                events = [ev for ev in map(parse_event_line, text.splitlines()) if ev is not None]
        self._events_cache[key] = (time.monotonic(), events, pods, final)
        return events, pods

    def _all_logs(self, ref: JobRef) -> list[str]:
        ns = ref.extra["namespace"]
        pod = rank0_pod(self._pods(ref))
        if pod is None:
            return []
        main = self._main(ref, pod)
        lines: list[str] = []
        name = pod["metadata"]["name"]
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if _started(pod, cs["name"]):
                lines += [f"[{cs['name']}] {line}" for line in self._read_log(name, cs["name"], ns).splitlines()]
        if main and _started(pod, main):
            lines += self._read_log(name, main, ns).splitlines()
        if ref.extra["flavor"] == "kaito":  # Kaito's sidecar pushes the adapter image: its log says where, or why not
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if cs["name"] != main and _started(pod, cs["name"]):
                    lines += [f"[{cs['name']}] {line}" for line in self._read_log(name, cs["name"], ns).splitlines()]
        return lines

    def _follow_logs(self, ref: JobRef, poll: float = 1.0) -> Iterator[str]:
        ns, flavor = ref.extra["namespace"], ref.extra["flavor"]
        while True:  # wait for the worker container to start, or the job to end without it
            pod = rank0_pod(self._pods(ref))
            main = self._main(ref, pod)
            if pod is not None and main and _started(pod, main):
                break
            obj = self._get_workload(ref)
            state, _ = workspace_state(obj) if flavor == "kaito" else workload_state(obj, flavor)
            if state in C.TERMINAL_STATES:
                yield from self._all_logs(ref)
                return
            time.sleep(poll)
        with A.api_call(self.cluster, "get", "pods/log", namespace=ns, name=pod["metadata"]["name"], kind="Pod"):
            resp = self.cluster.core().read_namespaced_pod_log(pod["metadata"]["name"], ns, container=main, follow=True, _preload_content=False)
        try:
            buf = b""
            for chunk in resp.stream(4096):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
            if buf:
                yield buf.decode("utf-8", "replace")
        finally:
            resp.release_conn()


def _started(pod: dict, container: str) -> bool:
    st = pod.get("status") or {}
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        if cs.get("name") == container:
            state = cs.get("state") or {}
            return bool(state.get("running") or state.get("terminated") or cs.get("lastState", {}).get("terminated"))
    return False


def _exit_code(pod: dict | None, container: str) -> int | None:
    if pod is None:
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            t = (cs.get("state") or {}).get("terminated") or {}
            return t.get("exitCode")
    return None


def _queue(obj: dict) -> str | None:
    return (obj.get("metadata", {}).get("labels") or {}).get(C.LABEL_KUEUE_QUEUE)


def _epoch(ts: Any) -> float | None:
    if not ts:
        return None
    if isinstance(ts, datetime):
        return ts.timestamp()
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
