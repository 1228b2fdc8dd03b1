"""Reading a cluster job: its state from the workload's conditions, and why it is stuck or failed.

Pure functions over the API's JSON (dicts): the backend fetches, these decide. Each diagnosis is one
sentence that names the pod and container and says what to change in the spec.
"""

from __future__ import annotations

import re
from typing import Callable

from ... import constants as C

__all__ = ["workload_state", "rank0_pod", "diagnose", "trainer_progress"]

_LOG_TAIL = 15  # log lines quoted in a failure reason


def _true(conditions: list[dict] | None, ctype: str) -> dict | None:
    for c in conditions or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def workload_state(obj: dict, flavor: str) -> tuple[str, str | None]:
    """(state, reason) of a Job, PyTorchJob or TrainJob from its status conditions."""
    md, status = obj.get("metadata", {}), obj.get("status") or {}
    conds = status.get("conditions")
    if (md.get("annotations") or {}).get(C.ANNOTATION_CANCELLED):
        return C.STATE_CANCELLED, "cancelled by kubetune cancel"
    done = "Complete" if flavor in ("job", "trainjob") else "Succeeded"
    if _true(conds, done) or (flavor == "job" and _true(conds, "SuccessCriteriaMet")):
        return C.STATE_SUCCEEDED, None
    failed = _true(conds, "Failed") or (flavor == "job" and _true(conds, "FailureTarget"))
    if failed:
        return C.STATE_FAILED, _condition_text(failed)
    suspended = _true(conds, "Suspended")
    if suspended:
        queue = (md.get("labels") or {}).get(C.LABEL_KUEUE_QUEUE)
        why = f"waiting for Kueue to admit it from queue '{queue}'" if queue else "suspended"
        return C.STATE_PENDING, why
    if flavor == "job" and (status.get("active") or status.get("ready")):
        return C.STATE_RUNNING, None
    if flavor == "pytorchjob" and (_true(conds, "Running") or _true(conds, "Restarting")):
        return C.STATE_RUNNING, None
    if flavor == "trainjob" and any(j.get("active") or j.get("ready") for j in status.get("jobsStatus") or []):
        return C.STATE_RUNNING, None
    return C.STATE_PENDING, None


def _condition_text(c: dict) -> str:
    return ": ".join(x for x in (c.get("reason"), c.get("message")) if x) or c.get("type", "")


def _index(pod: dict) -> str | None:
    md = pod.get("metadata", {})
    labels, ann = md.get("labels") or {}, md.get("annotations") or {}
    return ann.get(C.ANNOTATION_COMPLETION_INDEX) or labels.get(C.ANNOTATION_COMPLETION_INDEX)


def rank0_pod(pods: list[dict]) -> dict | None:
    """The pod whose worker is rank 0 (its log carries the events), newest attempt first."""
    if not pods:
        return None

    def is_rank0(p: dict) -> bool:
        labels = p.get("metadata", {}).get("labels") or {}
        rtype = labels.get("training.kubeflow.org/replica-type")
        if rtype is not None:
            return rtype.lower() == "master"
        idx = _index(p)
        return idx is None or idx == "0"

    candidates = [p for p in pods if is_rank0(p)] or pods
    return max(candidates, key=lambda p: (p.get("metadata", {}).get("creationTimestamp") or "", p["metadata"]["name"]))


def diagnose(pods: list[dict], *, main_container: str, logs_tail: Callable[[str, str], list[str]] | None = None, queue: str | None = None) -> str | None:
    """The first problem the pods show, as advice; None when nothing looks wrong.

    Args:
        pods: the job's pods (API JSON).
        main_container: the worker container's name in this flavour.
        logs_tail: ``(pod, container) -> last lines``, to quote a failed container's log.
        queue: the Kueue queue, named when pods cannot be scheduled.
    """
    checks = (_oom, _image, _config, _unschedulable, _failed_init, _failed_main)
    for check in checks:
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            found = check(pod, main_container=main_container, logs_tail=logs_tail, queue=queue)
            if found:
                return found
    return None


def _statuses(pod: dict, init: bool | None = None) -> list[dict]:
    st = pod.get("status") or {}
    if init is True:
        return st.get("initContainerStatuses") or []
    if init is False:
        return st.get("containerStatuses") or []
    return (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])


def _terminated(cs: dict) -> dict | None:
    state = cs.get("state") or {}
    return state.get("terminated") or (cs.get("lastState") or {}).get("terminated")


def _limit(pod: dict, container: str, resource: str) -> str | None:
    for c in (pod.get("spec") or {}).get("initContainers", []) + (pod.get("spec") or {}).get("containers", []):
        if c.get("name") == container:
            return ((c.get("resources") or {}).get("limits") or {}).get(resource)
    return None


def _oom(pod: dict, **_) -> str | None:
    for cs in _statuses(pod):
        t = _terminated(cs)
        if t and t.get("reason") == "OOMKilled":
            limit = _limit(pod, cs["name"], "memory")
            return (
                f"container {cs['name']} of pod {pod['metadata']['name']} ran out of memory (OOMKilled"
                + (f", limit {limit}" if limit else "")
                + "): raise resources.memory, or lower training.batch_size or training.max_seq_length, "
                "or set training.gradient_checkpointing: true"
            )
    return None


def _image(pod: dict, **_) -> str | None:
    for cs in _statuses(pod):
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
            return (
                f"pod {pod['metadata']['name']} cannot pull image {cs.get('image', '?')} ({w['reason']}: {w.get('message', '').strip()}): "
                "check kubernetes.image (built from deploy/, pushed to a registry the nodes reach) and kubernetes.image_pull_secrets"
            )
    return None


def _config(pod: dict, **_) -> str | None:
    for cs in _statuses(pod):
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason") in ("CreateContainerConfigError", "CreateContainerError"):
            msg = w.get("message", "")
            m = re.search(r'secret "([^"]+)" not found', msg)
            hint = (
                f"create the Secret (kubectl create secret generic {m.group(1)} --from-literal=KEY=VALUE) in the job's namespace"
                if m
                else "check the Secrets and keys named under kubernetes.secrets"
            )
            return f"container {cs['name']} of pod {pod['metadata']['name']} cannot start ({w['reason']}: {msg}): {hint}"
    return None


def _unschedulable(pod: dict, queue: str | None = None, **_) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            msg = c.get("message", "")
            advice = []
            missing = sorted(set(re.findall(r"Insufficient ([\w./-]+)", msg)))
            if missing:
                advice.append(
                    f"no node has enough free {', '.join(missing)}: lower resources (accelerators, cpu, memory), check "
                    "resources.accelerator_type matches what the device plugin advertises (kubectl describe node)"
                )
            if "untolerated taint" in msg or "taint" in msg:
                advice.append("the nodes are tainted: add kubernetes.tolerations")
            if "node affinity" in msg or "node selector" in msg.lower():
                advice.append("no node matches kubernetes.node_selector / affinity")
            if "persistentvolumeclaim" in msg.lower() or "unbound" in msg:
                advice.append("the workspace PVC is not bound: check kubernetes.workspace.storage_class and access_modes")
            if queue:
                advice.append(f"or Kueue queue '{queue}' has no quota for it")
            return f"pod {pod['metadata']['name']} cannot be scheduled ({msg}): " + ("; ".join(advice) or "see `kubectl describe pod`")
    return None


def _tail(logs_tail, pod: str, container: str) -> str:
    if logs_tail is None:
        return ""
    try:
        lines = [line for line in logs_tail(pod, container) if not line.startswith(C.EVENT_LINE_PREFIX)][-_LOG_TAIL:]
    except Exception:  # noqa: BLE001 - a diagnosis never fails because logs are gone
        return ""
    return ("; last log lines:\n    " + "\n    ".join(lines)) if lines else ""


def _failed_init(pod: dict, logs_tail=None, **_) -> str | None:
    for cs in _statuses(pod, init=True):
        t = _terminated(cs)
        if t and t.get("exitCode", 0) != 0:
            what = cs["name"].removeprefix("fetch-")
            return (
                f"fetching the {what} failed in init container {cs['name']} of pod {pod['metadata']['name']} "
                f"(exit {t.get('exitCode')}): check the URI and its credentials (kubernetes.secrets)" + _tail(logs_tail, pod["metadata"]["name"], cs["name"])
            )
    return None


def _failed_main(pod: dict, main_container: str, logs_tail=None, **_) -> str | None:
    for cs in _statuses(pod, init=False):
        if cs.get("name") != main_container:
            continue
        w = (cs.get("state") or {}).get("waiting") or {}
        t = _terminated(cs)
        if w.get("reason") == "CrashLoopBackOff" or (t and t.get("exitCode", 0) != 0):
            code = t.get("exitCode") if t else "?"
            how = "keeps crashing (CrashLoopBackOff)" if w.get("reason") == "CrashLoopBackOff" else f"exited with code {code}"
            return f"the worker in pod {pod['metadata']['name']} {how}" + _tail(logs_tail, pod["metadata"]["name"], cs["name"])
    return None


def trainer_progress(obj: dict) -> dict:
    """Kubeflow Trainer's ``status.trainerStatus`` (KEP-2779), when the runtime reports it."""
    ts = (obj.get("status") or {}).get("trainerStatus") or {}
    out: dict = {}
    if ts.get("progressPercentage") is not None:
        out["progress_percentage"] = ts["progressPercentage"]
    if ts.get("estimatedRemainingSeconds") is not None:
        out["eta_seconds"] = ts["estimatedRemainingSeconds"]
    for m in ts.get("metrics") or []:
        try:
            out[m["name"]] = float(m["value"])
        except (KeyError, TypeError, ValueError):
            continue
    return out
