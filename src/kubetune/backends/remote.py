"""A kubetune server as a backend: the :class:`~kubetune.backends.base.Backend` protocol over the server's
native API (``/v1/jobs``, docs/server.md), so ``kubetune.Client("http://host:8000", api_key=...)`` and the CLI's
``--server URL`` submit and follow jobs there exactly as they do locally.

Not in ``BACKENDS`` (it is chosen by a URL, not a name). httpx is imported on first use.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from .. import constants as C
from ..errors import BackendError, JobNotFound
from ..events import JobStatus
from .base import JobRef

__all__ = ["RemoteBackend", "is_server_url", "ENV_SERVER", "ENV_API_KEY"]

ENV_SERVER = "KUBETUNE_SERVER"  # the CLI's --server default
ENV_API_KEY = "KUBETUNE_API_KEY"  # the key sent to it when none is given
# the server's status names -> kubetune's job states
_STATES = {"validating_files": C.STATE_PENDING, "queued": C.STATE_PENDING, "running": C.STATE_RUNNING, "paused": C.STATE_PREEMPTED,
           "succeeded": C.STATE_SUCCEEDED, "failed": C.STATE_FAILED, "cancelled": C.STATE_CANCELLED}


def is_server_url(value: str | None) -> bool:
    """Whether ``value`` names a server (``http://`` or ``https://``) rather than a backend."""
    return bool(value) and str(value).startswith(("http://", "https://"))


class RemoteBackend:
    """Jobs on a kubetune server. ``url``: its address (with or without ``/v1``); ``api_key``: else ``$KUBETUNE_API_KEY``."""

    name = "server"

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        import httpx

        self.url = url.rstrip("/").removesuffix("/v1")
        key = api_key or os.environ.get(ENV_API_KEY)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.url + "/v1", headers=headers, timeout=timeout)

    # -- the protocol -------------------------------------------------------------------------------
    def submit(self, job: Any) -> JobRef:
        """Send the resolved spec to ``POST /v1/jobs``; the server queues it (its per-project limit) and runs it."""
        from ..spec import spec_to_dict

        data = self._call("POST", "/jobs", json={"spec": spec_to_dict(job)})
        return self._ref(data)

    def status(self, ref: JobRef) -> JobStatus:
        """The job's status as the server recorded it."""
        d = self._call("GET", f"/jobs/{ref.id}")
        progress = d.get("progress") or {}
        error = d.get("error") or {}
        return JobStatus(state=_STATES.get(d["status"], d["status"]), step=int(progress.get("step") or 0), total_steps=progress.get("total_steps"),
                         epoch=progress.get("epoch"), loss=progress.get("loss"), learning_rate=progress.get("learning_rate"),
                         eta_seconds=progress.get("eta_seconds"), reason=error.get("message"), job_id=d["id"], name=d.get("name"),
                         backend=self.name, run_dir=None, created_at=d.get("created_at"), started_at=d.get("started_at"), finished_at=d.get("finished_at"))

    def events(self, ref: JobRef) -> list[dict]:
        """Every event of the job, oldest first (the worker's, as in events.jsonl, and the server's own)."""
        return [{"time": e["time"], "type": e["type"], "message": e["message"], **({"data": e["data"]} if e.get("data") else {})}
                for e in self._call("GET", f"/jobs/{ref.id}/events")["data"]]

    def logs(self, ref: JobRef, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """The worker's log lines, streamed by the server (``follow``: until the job ends)."""
        import httpx

        try:
            with self._http.stream("GET", f"/jobs/{ref.id}/logs", params={"follow": str(follow).lower()}, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    self._raise(r)
                for line in r.iter_lines():
                    yield line
        except httpx.HTTPError as e:
            raise BackendError(f"{self.url}: {e}") from None

    def cancel(self, ref: JobRef) -> None:
        """Cancel the job on the server."""
        self._call("POST", f"/jobs/{ref.id}/cancel")

    def delete(self, ref: JobRef) -> None:
        """Cancel the job if it runs, and remove it and its run directory from the server."""
        self._call("DELETE", f"/jobs/{ref.id}")

    def list(self) -> list[JobRef]:
        """The project's jobs on the server, newest first."""
        out: list[JobRef] = []
        after = None
        while True:
            page = self._call("GET", "/jobs", params={"limit": 100, **({"after": after} if after else {})})
            out += [self._ref(d) for d in page["data"]]
            if not page.get("has_more") or not page["data"]:
                return out
            after = page["data"][-1]["id"]

    def resolve(self, key: str) -> JobRef:
        """The job with id ``key``, or the newest one named ``key``."""
        try:
            return self._ref(self._call("GET", f"/jobs/{key}"))
        except JobNotFound:
            for ref in self.list():
                if ref.name == key:
                    return ref
            raise

    # -- sweeps: the server plans the trials and runs each as a job of the project (docs/server.md) --------------
    def submit_sweep(self, job: Any) -> dict:
        """Send a spec with a ``sweep:`` section to ``POST /v1/sweeps``; the ``kubetune.sweep`` object (trials queued)."""
        from ..spec import spec_to_dict

        return self._call("POST", "/sweeps", json={"spec": spec_to_dict(job)})

    def sweep(self, sweep_id: str) -> dict:
        """The sweep's trials (values, status, objective) and its best finished trial.

        Raises:
            JobNotFound: no such sweep in this key's project.
        """
        return self._call("GET", f"/sweeps/{sweep_id}")

    def list_sweeps(self) -> list[dict]:
        """The project's sweeps on the server."""
        return self._call("GET", "/sweeps")["data"]

    def cancel_sweep(self, sweep_id: str) -> dict:
        """Cancel the sweep's trials that have not ended; the sweep as it is then."""
        return self._call("POST", f"/sweeps/{sweep_id}/cancel")

    # -- helpers --------------------------------------------------------------------------------------
    def _ref(self, d: dict) -> JobRef:
        return JobRef(id=d["id"], backend=self.name, name=d.get("name") or "", extra={"server": self.url, "status": d.get("status")})

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise BackendError(f"cannot reach the kubetune server at {self.url}: {e}", hint="check --server / $KUBETUNE_SERVER") from None
        if r.status_code >= 400:
            self._raise(r)
        return r.json()

    def _raise(self, r: Any) -> None:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            message = r.text[:500]
        if r.status_code == 401:
            raise BackendError(f"{self.url}: {message}", hint=f"pass api_key= or set ${ENV_API_KEY} (kubetune server keys create)")
        if r.status_code == 404:
            raise JobNotFound(f"{self.url}: {message}")
        raise BackendError(f"{self.url}: {message} (HTTP {r.status_code})")
