"""Event records and the run-directory contract (DESIGN.md section 3).

A run directory holds ``spec.yaml``, ``status.json``, ``events.jsonl``, ``logs/``, ``checkpoints/``,
the final artifacts, ``result.json`` and ``DONE`` (written last). :class:`RunDir` is the one writer and
reader of these files; every backend, the CLI, the SDK and sweeps go through it.

Workers on a cluster also print each event to stdout as ``KUBETUNE_EVENT {json}`` so that the pod
logs alone rebuild the status (:func:`status_from_events`).

Every string written here (event messages and data, status reasons, results) passes through
:func:`kubetune.redact.redact_data` first: an error that names ``https://user:pass@host/...`` is recorded as
``https://***@host/...``, in the run directory and in the copies published from it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from . import constants as C
from .redact import redact_data

__all__ = ["RunDir", "JobStatus", "make_event", "event_line", "parse_event_line", "status_from_events"]


def _now() -> float:
    return round(time.time(), 3)


def make_event(type: str, message: str = "", **data: Any) -> dict:
    """An event record: ``time``, ``type`` (stage|metrics|checkpoint|warning|error|done|state), message, data."""
    ev: dict[str, Any] = {"time": _now(), "type": type}
    if message:
        ev["message"] = message
    if data:
        ev["data"] = data
    return ev


def event_line(event: dict) -> str:
    """The stdout form of an event (one line, fixed prefix)."""
    return C.EVENT_LINE_PREFIX + json.dumps(event, separators=(",", ":"), default=str)


def parse_event_line(line: str) -> dict | None:
    """The event in a log line printed by :func:`event_line`, or None."""
    idx = line.find(C.EVENT_LINE_PREFIX)
    if idx < 0:
        return None
    try:
        ev = json.loads(line[idx + len(C.EVENT_LINE_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return ev if isinstance(ev, dict) and "type" in ev else None


@dataclass
class JobStatus:
    """What ``status.json`` holds: state, stage and progress of one job."""

    state: str = C.STATE_PENDING
    stage: str | None = None
    step: int = 0
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    tokens_per_second: float | None = None
    eta_seconds: float | None = None
    peak_memory_mb: float | None = None
    reason: str | None = None
    job_id: str | None = None
    name: str | None = None
    backend: str | None = None
    run_dir: str | None = None
    pid: int | None = None
    created_at: float | None = None
    started_at: float | None = None
    updated_at: float | None = None
    finished_at: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in C.TERMINAL_STATES

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, d: dict) -> "JobStatus":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def apply(self, event: dict) -> None:
        """Update from one event (how logs alone rebuild a status)."""
        t, data = event.get("type"), event.get("data") or {}
        self.updated_at = event.get("time", self.updated_at)
        if t == "state":
            self.state = data.get("state", self.state)
            if data.get("reason"):
                self.reason = data["reason"]
            for k, v in data.items():
                if k in ("job_id", "pid"):
                    if v is not None:
                        setattr(self, k, v)
                elif k not in ("state", "reason"):
                    self.extra[k] = v
            if self.state == C.STATE_RUNNING and self.started_at is None:
                self.started_at = event.get("time")
            if self.state in C.TERMINAL_STATES:
                self.finished_at = event.get("time")
        elif t == "stage":
            self.stage = data.get("stage", self.stage)
            if self.state == C.STATE_PENDING:
                self.state = C.STATE_RUNNING
        elif t == "metrics":
            for k in ("step", "total_steps", "epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_second", "eta_seconds", "peak_memory_mb"):
                if data.get(k) is not None:
                    setattr(self, k, data[k])
        elif t == "error":
            self.reason = event.get("message", self.reason)
        elif t == "done":
            self.stage = None


def status_from_events(events: Iterable[dict], base: JobStatus | None = None) -> JobStatus:
    """Fold events into a status (used for cluster jobs whose only record is their log)."""
    st = base or JobStatus()
    for ev in events:
        st.apply(ev)
    return st


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# Progress (``metrics``) events fold into status.json at most this often; every event is appended to
# events.jsonl at once, and any other event (state, stage, checkpoint, warning, ...) writes status.json at
# once together with the metrics held back. Rewriting status.json (write + rename) at every training step
# frees the old file's blocks each time; on ext4 mounted with `discard` that is a synchronous discard in the
# training thread, which sleeps and wakes on another core with cold caches (measured: 7 migrations/s and
# ~10% fewer tokens/s on 2 CPU cores; bench/train_throughput.py).
STATUS_INTERVAL_S = 1.0


class RunDir:
    """Reader and writer of one run directory.

    Args:
        path: the directory (created on first write).
        echo: also print each event to stdout with the fixed prefix (workers on clusters).
        status_interval: seconds between status.json rewrites for progress events (0: every event).
    """

    def __init__(self, path: str | os.PathLike, *, echo: bool = False, status_interval: float = STATUS_INTERVAL_S) -> None:
        self.path = Path(path)
        self.echo = echo
        self.status_interval = status_interval
        self._pending: list[dict] = []  # metrics events not yet folded into status.json
        self._status_written = float("-inf")  # monotonic time of this writer's last status.json write
        self._inited = False
        self._lock = threading.RLock()  # the output sync's thread emits beside the training thread

    # paths ---------------------------------------------------------------------------------
    @property
    def spec_file(self) -> Path:
        return self.path / C.SPEC_FILE

    @property
    def status_file(self) -> Path:
        return self.path / C.STATUS_FILE

    @property
    def events_file(self) -> Path:
        return self.path / C.EVENTS_FILE

    @property
    def logs_dir(self) -> Path:
        return self.path / C.LOGS_DIR

    @property
    def worker_log(self) -> Path:
        return self.logs_dir / C.WORKER_LOG

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / C.CHECKPOINTS_DIR

    @property
    def result_file(self) -> Path:
        return self.path / C.RESULT_FILE

    @property
    def done_file(self) -> Path:
        return self.path / C.DONE_FILE

    def exists(self) -> bool:
        return self.status_file.is_file()

    # writing -------------------------------------------------------------------------------
    def init(self) -> None:
        if self._inited and self.logs_dir.is_dir():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self._inited = True

    def emit(self, event: dict) -> dict:
        """Append an event to events.jsonl (and stdout when echoing) and fold it into status.json.

        A progress (``metrics``) event that comes within ``status_interval`` of the last status.json write
        is folded in with the next write (the next event of another type, the next progress event after the
        interval, :meth:`flush`, or the process's exit); events.jsonl always has every event at once.
        """
        self.init()
        event = redact_data(event)
        line = json.dumps(event, separators=(",", ":"), default=str)
        with self._lock:
            with open(self.events_file, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            if self.echo:
                print(event_line(event), file=sys.stdout, flush=True)
            self._pending.append(event)
            if event.get("type") != "metrics" or time.monotonic() - self._status_written >= self.status_interval:
                self.flush()
            elif len(self._pending) == 1:
                atexit.register(self.flush)  # a worker that ends between two writes still leaves its last progress
        return event

    def flush(self) -> None:
        """Fold the progress events held back into status.json now."""
        with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, []
            atexit.unregister(self.flush)
            st = self.read_status() or JobStatus()
            for event in pending:
                st.apply(event)
            self.write_status(st)
            self._status_written = time.monotonic()

    def write_status(self, status: JobStatus) -> None:
        self.init()
        status.updated_at = status.updated_at or _now()
        _atomic_write(self.status_file, json.dumps(redact_data(status.to_dict()), indent=2, default=str))

    def set_state(self, state: str, reason: str | None = None, **extra: Any) -> None:
        data: dict[str, Any] = {"state": state, **extra}
        if reason:
            data["reason"] = reason
        self.emit(make_event("state", f"{state}" + (f": {reason}" if reason else ""), **data))

    def write_result(self, result: dict) -> None:
        _atomic_write(self.result_file, json.dumps(redact_data(result), indent=2, default=str))

    def mark_done(self) -> None:
        _atomic_write(self.done_file, f"{_now()}\n")

    # reading -------------------------------------------------------------------------------
    def read_status(self) -> JobStatus | None:
        try:
            return JobStatus.from_dict(json.loads(self.status_file.read_text(encoding="utf-8")))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def read_events(self) -> list[dict]:
        return list(self.iter_events())

    def iter_events(self) -> Iterator[dict]:
        try:
            with open(self.events_file, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line being written right now
        except FileNotFoundError:
            return

    def read_result(self) -> dict | None:
        try:
            return json.loads(self.result_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def is_done(self) -> bool:
        return self.done_file.is_file()
