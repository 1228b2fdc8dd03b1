"""The SDK front: a thin Client whose methods delegate to a backend, and the one-call ``train()``."""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

from .backends.base import JobRef, get_backend
from .errors import BackendError
from .events import JobStatus
from .spec import TuneJob, load_spec

__all__ = ["Client", "JobRef", "train"]


class Client:
    """Submit and follow jobs on one backend.

    Args:
        backend: "local" (default), "kubernetes" or "kfp".
        **options: passed to the backend (e.g. ``namespace`` for kubernetes).
    """

    def __init__(self, backend: str = "local", **options: Any) -> None:
        self.backend = get_backend(backend, **options)

    def submit(self, job: TuneJob | str | os.PathLike | dict, overrides: list[str] | None = None) -> JobRef:
        """Start ``job`` (a TuneJob, a spec path or a dict) and return its reference at once."""
        if not isinstance(job, TuneJob):
            job = load_spec(job, overrides)
        elif overrides:
            job = load_spec(job.model_dump(mode="json"), overrides)
        return self.backend.submit(job)

    def status(self, ref: JobRef | str) -> JobStatus:
        """The job's current state, stage and progress."""
        return self.backend.status(self._ref(ref))

    def events(self, ref: JobRef | str) -> list[dict]:
        """All events so far."""
        return self.backend.events(self._ref(ref))

    def logs(self, ref: JobRef | str, follow: bool = False) -> Iterator[str]:
        """The worker's log lines (``follow``: until the job ends)."""
        return self.backend.logs(self._ref(ref), follow=follow)

    def cancel(self, ref: JobRef | str) -> None:
        """Stop the job and everything it started; its state becomes ``cancelled``."""
        self.backend.cancel(self._ref(ref))

    def preempt(self, ref: JobRef | str) -> JobStatus | None:
        """Stop the job as a preemption does: it saves a checkpoint first, ends ``preempted``, and a rerun resumes.

        Raises:
            BackendError: the backend does not run the job's processes itself (only ``local`` does).
        """
        preempt = getattr(self.backend, "preempt", None)
        if preempt is None:
            raise BackendError(
                f"the {self.backend.name} backend cannot stop a job as a preemption",
                hint="use cancel, or let the cluster preempt it",
            )
        return preempt(self._ref(ref))

    def list(self) -> list[JobRef]:
        """Jobs this backend knows, newest first."""
        return self.backend.list()

    def wait(self, ref: JobRef | str, timeout: float | None = None, poll: float = 0.5) -> JobStatus:
        """Block until the job reaches a terminal state and return that status.

        Raises:
            BackendError: ``timeout`` seconds passed first.
        """
        ref = self._ref(ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.backend.status(ref)
            if st.terminal:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise BackendError(f"job {ref.id} still {st.state} after {timeout:.0f}s")
            time.sleep(poll)

    def _ref(self, ref: JobRef | str) -> JobRef:
        if isinstance(ref, JobRef):
            return ref
        resolve = getattr(self.backend, "resolve", None)
        return resolve(ref) if resolve else JobRef(id=str(ref), backend=self.backend.name)


def train(
    model: str,
    dataset: str,
    *,
    method: str = "lora",
    name: str = "kubetune-job",
    backend: str = "local",
    wait: bool = True,
    **sections: Any,
) -> JobStatus | JobRef:
    """Fine-tune in one call (Kubeflow KEP-2003's ``train()``).

    Args:
        model: model URI, e.g. ``builtin://tiny-chat`` or ``hf://Qwen/Qwen2.5-0.5B-Instruct``.
        dataset: dataset URI or path.
        method: full, lora, qlora or dora.
        name: job name.
        backend: where to run it.
        wait: block until the job ends and return its status (else return the JobRef).
        **sections: other spec sections as dicts, e.g. ``training={"epochs": 1}``, ``output={"dir": "runs/x"}``.

    Returns:
        The final JobStatus (``wait=True``) or the JobRef.
    """
    spec: dict[str, Any] = {"name": name, "model": {"source": model}, "dataset": {"source": dataset}}
    spec["method"] = {"type": method, **sections.pop("method", {})}
    spec.update(sections)
    client = Client(backend)
    ref = client.submit(spec)
    return client.wait(ref) if wait else ref
