"""The SDK front: a thin Client whose methods delegate to a backend, and the one-call ``train()``."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from .backends import JobRef, get_backend
from .errors import BackendError, SpecError
from .events import JobStatus
from .preflight import check_local
from .spec import TuneJob, load_spec

__all__ = ["Client", "JobRef", "train"]


class Client:
    """Submit and follow jobs on one backend, or on a kubetune server.

    Args:
        backend: "local" (default), "kubernetes" or "kfp"; or a server's URL (``http://host:8000``, docs/server.md).
        **options: passed to the backend (e.g. ``namespace`` for kubernetes; ``api_key`` for a server, else
            ``$KUBETUNE_API_KEY``).
    """

    def __init__(self, backend: str = "local", **options: Any) -> None:
        from .backends.remote import RemoteBackend, is_server_url

        self.backend = RemoteBackend(backend, **options) if is_server_url(backend) else get_backend(backend, **options)

    def submit(
        self, job: TuneJob | str | os.PathLike | dict, overrides: Mapping[str, Any] | Iterable[str] | None = None
    ) -> JobRef:
        """Start ``job`` (a TuneJob, a spec path or a dict) and return its reference at once.

        Args:
            job: the job, or a spec file or dict to load.
            overrides: ``"path=value"`` strings or a mapping of dotted paths to values; on a TuneJob they go
                through :meth:`TuneJob.with_overrides`, so method presets follow a changed ``method.type``.

        Raises:
            SpecError: the spec or an override is invalid; on the local backend, also a local source that
                does not exist or an output.dir that cannot be written (:func:`kubetune.preflight.check_local`).
        """
        job = load_spec(job, overrides) if not isinstance(job, TuneJob) else job.with_overrides(overrides) if overrides else job
        if self.backend.name == "local":
            check_local(job)
        return self.backend.submit(job)

    def status(self, ref: JobRef | str) -> JobStatus:
        """The job's current state, stage and progress."""
        return self.backend.status(self._ref(ref))

    def events(self, ref: JobRef | str) -> list[dict]:
        """All events so far."""
        return self.backend.events(self._ref(ref))

    def logs(self, ref: JobRef | str, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """The job's worker log lines (``follow``: until the job ends).

        Local jobs of one spec share a run directory and its log: only this job's part, from the header line that
        names its id; ``all_runs`` adds the earlier jobs' parts, each after its own header.
        """
        return self.backend.logs(self._ref(ref), follow=follow, all_runs=all_runs)

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

    # -- Kubeflow Trainer SDK's names (TrainerClient) ------------------------------------------------
    def train(self, job: TuneJob | str | os.PathLike | dict, overrides: Mapping[str, Any] | Iterable[str] | None = None) -> JobRef:
        """Start ``job`` and return its reference at once (:meth:`submit` under the Kubeflow SDK's name)."""
        return self.submit(job, overrides)

    def list_jobs(self) -> list[JobStatus]:
        """Every job's status, newest first."""
        return [self.status(ref) for ref in self.list()]

    def get_job(self, ref: JobRef | str) -> JobStatus:
        """One job's status (:meth:`status` under the Kubeflow SDK's name)."""
        return self.status(ref)

    def get_job_logs(self, ref: JobRef | str, follow: bool = False) -> Iterator[str]:
        """The job's log lines (:meth:`logs`; ``follow``: until the job ends)."""
        return self.logs(ref, follow=follow)

    def wait_for_job_status(self, ref: JobRef | str, status: str | Iterable[str] = "succeeded", timeout: float | None = 600,
                            poll: float = 1.0) -> JobStatus:
        """Block until the job's state is one of ``status`` and return that status.

        Raises:
            BackendError: the job ended in another state first, or ``timeout`` seconds passed.
        """
        wanted = {status} if isinstance(status, str) else set(status)
        ref = self._ref(ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.backend.status(ref)
            if st.state in wanted:
                return st
            if st.terminal:
                raise BackendError(f"job {ref.id} ended {st.state}, not {' or '.join(sorted(wanted))}" + (f": {st.reason}" if st.reason else ""))
            if deadline is not None and time.monotonic() > deadline:
                raise BackendError(f"job {ref.id} still {st.state} after {timeout:.0f}s")
            time.sleep(poll)

    def delete_job(self, ref: JobRef | str) -> None:
        """Stop the job if it runs and remove it with its records and run directory (a kubetune server's jobs).

        Raises:
            BackendError: the backend keeps no job records to delete (local, kubernetes, kfp: use :meth:`cancel`).
        """
        delete = getattr(self.backend, "delete", None)
        if delete is None:
            raise BackendError(f"the {self.backend.name} backend cannot delete jobs", hint="cancel it, and remove its run directory yourself")
        delete(self._ref(ref))

    def resolve(self, key: str) -> JobRef:
        """The job named by ``key``: its id, its name (the newest submission) or its run directory."""
        return self.backend.resolve(key)

    def _ref(self, ref: JobRef | str) -> JobRef:
        return ref if isinstance(ref, JobRef) else self.backend.resolve(str(ref))


def train(
    model: str | None = None,
    dataset: str | None = None,
    *,
    method: str = "lora",
    name: str = "kubetune-job",
    backend: str = "local",
    wait: bool = True,
    func: Callable[..., Any] | None = None,
    func_args: Mapping[str, Any] | None = None,
    packages: Iterable[str] | None = None,
    env: Mapping[str, str] | None = None,
    **sections: Any,
) -> JobStatus | JobRef:
    """Fine-tune in one call (Kubeflow KEP-2003's ``train()``), or run your own training function (``func``).

    Args:
        model: model URI, e.g. ``builtin://tiny-chat`` or ``hf://Qwen/Qwen2.5-0.5B-Instruct`` (the built-in fine-tune).
        dataset: dataset URI or path (the built-in fine-tune).
        method: full, lora, qlora or dora (the built-in fine-tune).
        name: job name.
        backend: where to run it.
        wait: block until the job ends and return its status (else return the JobRef).
        func: a plain, self-contained function to run under torchrun on every process instead of the built-in
            fine-tune (Kubeflow's CustomTrainer): its source is shipped (``entrypoint.source``), so it imports what it
            uses inside its body; it reports through :func:`kubetune.report` (docs/custom-training.md).
        func_args: keyword arguments of ``func`` (JSON values).
        packages: pip requirements the pods install before ``func`` runs (the local backend installs nothing and
            refuses missing ones).
        env: environment variables set in every process before ``func`` is loaded.
        **sections: other spec sections as dicts, e.g. ``training={"epochs": 1}``, ``output={"dir": "runs/x"}``,
            ``resources={"processes_per_node": 2}``.

    Returns:
        The final JobStatus (``wait=True``) or the JobRef.

    Raises:
        SpecError: neither ``func`` nor model and dataset given, both given, or ``func`` cannot be shipped.
    """
    spec: dict[str, Any] = {"name": name}
    if func is not None:
        if model is not None or dataset is not None:
            raise SpecError("train(): give func (your own training function) or model and dataset (the built-in fine-tune), not both")
        from .training.custom import function_source

        spec["entrypoint"] = {"source": function_source(func), "function": func.__name__, "args": dict(func_args or {}),
                              "packages": list(packages or []), "env": dict(env or {})}
    else:
        if model is None or dataset is None:
            raise SpecError("train(): give model and dataset (the built-in fine-tune), or func (your own training function)")
        if func_args is not None or packages is not None or env is not None:
            raise SpecError("train(): func_args, packages and env go with func", hint="for the built-in fine-tune use kubernetes={'env': {...}}")
        spec.update({"model": {"source": model}, "dataset": {"source": dataset}})
        spec["method"] = {"type": method, **sections.pop("method", {})}
    spec.update(sections)
    client = Client(backend)
    ref = client.submit(spec)
    return client.wait(ref) if wait else ref
