"""Following a Kaito tuning Workspace: its state from the Workspace's conditions, its tuning pod, and the
progress Kaito's trainer prints.

Kaito creates a batch Job named after the Workspace, whose pod runs its own ``fine_tuning.py`` (not kubetune's
worker): a ``data-downloader`` init container, the tuning container, and a sidecar that pushes the adapter
as an image once training is done. So there are no kubetune events to read: the state comes from the
Workspace's conditions (``TuningStarted``, ``TuningComplete``, ``TuningFailed``; ``WorkspaceSucceeded`` on
newer Kaito), the pods are found by the Job's ``job-name`` label, and the progress (loss, learning rate,
step/total) is parsed from the Hugging Face Trainer's log lines, best effort.
"""

from __future__ import annotations

import ast
import re

from ... import constants as C
from ...events import EventType, make_event

__all__ = ["workspace_state", "pod_selector", "main_container", "progress_events", "output_image", "output_volume"]

# tqdm's bar as the Trainer prints it: " 12%|█▏        | 12/100 [00:31<03:48,  2.60s/it]"
_BAR = re.compile(r"(\d+)/(\d+) \[")


def workspace_state(obj: dict) -> tuple[str, str | None]:
    """(state, reason) of a tuning Workspace from its status conditions."""
    md, status = obj.get("metadata", {}), obj.get("status") or {}
    if (md.get("annotations") or {}).get(C.ANNOTATION_CANCELLED):
        return C.STATE_CANCELLED, "cancelled by kubetune cancel"
    conds = {c.get("type"): c for c in status.get("conditions") or []}

    def true(name: str) -> dict | None:
        c = conds.get(name)
        return c if c and c.get("status") == "True" else None

    if true("TuningComplete") or true("WorkspaceSucceeded"):
        return C.STATE_SUCCEEDED, None
    failed = true("TuningFailed")
    if failed is None and (conds.get("WorkspaceSucceeded") or {}).get("status") == "False" and "fail" in str(conds["WorkspaceSucceeded"].get("reason", "")).lower():
        failed = conds["WorkspaceSucceeded"]
    if failed:
        return C.STATE_FAILED, ": ".join(x for x in (failed.get("reason"), failed.get("message")) if x) or "tuning failed"
    if true("TuningStarted") or true("JobStarted"):
        return C.STATE_RUNNING, None
    for name in ("ResourceReady", "NodeClaimReady", "MachineReady"):  # still provisioning the GPU node
        c = conds.get(name)
        if c and c.get("status") == "False" and c.get("message"):
            return C.STATE_PENDING, f"{name}: {c['message']}"
    return C.STATE_PENDING, None


def pod_selector(name: str) -> str:
    """The label selector of the tuning Job's pods (Kubernetes labels a Job's pods with its name)."""
    return f"job-name={name}"


def main_container(pod: dict) -> str | None:
    """The tuning container: the pod's first container (the image-pushing sidecar comes after it)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return containers[0]["name"] if containers else None


def progress_events(log: str, *, time: float | None = None) -> list[dict]:
    """``metrics`` events from the Trainer's log dicts (``{'loss': 1.2, 'learning_rate': ..., 'epoch': 0.5}``),
    each with the step/total of the progress bar printed before it."""
    events = []
    step = total = None
    for line in log.splitlines():
        for m in _BAR.finditer(line):
            step, total = int(m.group(1)), int(m.group(2))
        start = line.find("{'")
        if start < 0 or "'loss'" not in line and "'eval_loss'" not in line and "'train_loss'" not in line:
            continue
        try:
            d = ast.literal_eval(line[start : line.rindex("}") + 1])
        except (ValueError, SyntaxError):
            continue
        if not isinstance(d, dict):
            continue
        data = {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if "train_loss" in data and "loss" not in data:  # the summary at the end of training
            data["loss"] = data["train_loss"]
        data.update({k: v for k, v in (("step", step), ("total_steps", total)) if v is not None})
        if "loss" in data or "eval_loss" in data:
            what = f"loss={data['loss']:.4f}" if "loss" in data else f"eval_loss={data['eval_loss']:.4f}"
            ev = make_event(EventType.METRICS, f"step {step or '?'}/{total or '?'} {what} (Kaito)", **data)
            if time is not None:
                ev["time"] = time
            events.append(ev)
    return events


def output_image(obj: dict) -> str | None:
    """The image Kaito pushes the adapter to (the Workspace's ``tuning.output.image``: Kaito's Workspace has no ``spec``)."""
    return (((obj.get("tuning") or {}).get("output") or {}).get("image")) or None


def output_volume(obj: dict) -> str | None:
    """The PersistentVolumeClaim Kaito writes the adapter to (``tuning.output.volumeSource``), as ``pvc://CLAIM``."""
    source = (((obj.get("tuning") or {}).get("output") or {}).get("volumeSource")) or {}
    claim = (source.get("persistentVolumeClaim") or {}).get("claimName")
    return f"pvc://{claim}" if claim else None
