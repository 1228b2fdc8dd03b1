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
import errno
import fcntl
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator

from . import constants as C
from .redact import redact_data

__all__ = ["EventType", "RunDir", "RunLock", "JobStatus", "make_event", "event_line", "parse_event_line", "status_from_events", "disk_error_reason"]


def _now() -> float:
    return round(time.time(), 3)


class EventType(str, Enum):
    """The ``type`` of an event. A ``str`` enum: a member equals (and hashes like) its value, and
    :func:`make_event` stores the plain value, so events.jsonl and stdout hold ``"stage"``, never the enum's name.
    """

    STATE = "state"  # the job's state changed (data: state, reason, job_id, pid, ...)
    STAGE = "stage"  # the worker entered a stage or reports within one (data: stage)
    METRICS = "metrics"  # progress: step, total_steps, loss, learning rate, throughput, ...
    CHECKPOINT = "checkpoint"  # a checkpoint was saved, removed, synced or resumed from (data: path, step)
    WARNING = "warning"  # something the user should know that does not stop the job
    ERROR = "error"  # why the job failed (message: the reason)
    DONE = "done"  # the job succeeded and its artifacts are complete

    def __str__(self) -> str:  # f"{EventType.STAGE}" is "stage" on every Python version
        return self.value

    __format__ = str.__format__


def make_event(type: EventType | str, message: str = "", **data: Any) -> dict:
    """An event record: ``time``, ``type``, and the message and data when given.

    Args:
        type: an :class:`EventType` (or its value, e.g. ``"stage"``).
        message: one line for people reading the log.
        data: JSON-able fields that :meth:`JobStatus.apply` and readers use.

    Returns:
        The record, with ``type`` stored as a plain string.

    Raises:
        ValueError: ``type`` is not an event type.
    """
    ev: dict[str, Any] = {"time": _now(), "type": EventType(type).value}
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
        """Whether the job has ended (succeeded, failed or cancelled)."""
        return self.state in C.TERMINAL_STATES

    def to_dict(self) -> dict:
        """The JSON form of status.json (unset fields left out)."""
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, d: dict) -> "JobStatus":
        """A status from its JSON form; a field of the wrong type (a damaged or hand-edited file) is dropped."""
        if not isinstance(d, dict):
            raise ValueError("status is not a JSON object")
        known = {}
        for k in cls.__dataclass_fields__:
            if k not in d:
                continue
            v = d[k]
            if k in _INT_FIELDS:
                v = v if isinstance(v, int) and not isinstance(v, bool) else None
            elif k in _FLOAT_FIELDS:
                v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            elif k == "extra":
                v = v if isinstance(v, dict) else {}
            elif v is not None and not isinstance(v, str):
                v = str(v)
            if v is not None or k == "extra":
                known[k] = v
        if "step" in known and known["step"] is None:
            known.pop("step")
        return cls(**known)

    def apply(self, event: dict) -> None:
        """Update from one event (how logs alone rebuild a status)."""
        t, data = event.get("type"), event.get("data") or {}
        self.updated_at = event.get("time", self.updated_at)
        if t == EventType.STATE:
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
        elif t == EventType.STAGE:
            self.stage = data.get("stage", self.stage)
            if self.state == C.STATE_PENDING:
                self.state = C.STATE_RUNNING
        elif t == EventType.METRICS:
            for k in ("step", "total_steps", "epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_second", "eta_seconds", "peak_memory_mb"):
                if data.get(k) is not None:
                    setattr(self, k, data[k])
            self.extra.update({k: data[k] for k in C.PREFERENCE_STATUS_KEYS if data.get(k) is not None})
            # The device the job trains on (named once) and its newest telemetry sample (training/telemetry.py).
            self.extra.update({k: data[k] for k in ("device", "devices") if data.get(k)})
        elif t == EventType.ERROR:
            self.reason = event.get("message", self.reason)
        elif t == EventType.DONE:
            self.stage = None


_INT_FIELDS = frozenset({"step", "total_steps", "pid"})
_FLOAT_FIELDS = frozenset({"epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_second", "eta_seconds",
                           "peak_memory_mb", "created_at", "started_at", "updated_at", "finished_at"})


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
        """``spec.yaml``: the resolved spec (secrets redacted)."""
        return self.path / C.SPEC_FILE

    @property
    def status_file(self) -> Path:
        """``status.json``: state, stage and progress."""
        return self.path / C.STATUS_FILE

    @property
    def events_file(self) -> Path:
        """``events.jsonl``: one event a line, every submission's."""
        return self.path / C.EVENTS_FILE

    @property
    def logs_dir(self) -> Path:
        """``logs/``: the worker's and the stages' logs."""
        return self.path / C.LOGS_DIR

    @property
    def worker_log(self) -> Path:
        """``logs/worker.log``: the worker process's stdout and stderr."""
        return self.logs_dir / C.WORKER_LOG

    @property
    def checkpoints_dir(self) -> Path:
        """``checkpoints/``: complete checkpoints only (each with its marker)."""
        return self.path / C.CHECKPOINTS_DIR

    @property
    def result_file(self) -> Path:
        """``result.json``: the final metrics."""
        return self.path / C.RESULT_FILE

    @property
    def done_file(self) -> Path:
        """``DONE``: written last, when everything else is complete."""
        return self.path / C.DONE_FILE

    def exists(self) -> bool:
        """Whether a job has recorded a status here."""
        return self.status_file.is_file()

    # writing -------------------------------------------------------------------------------
    def init(self) -> None:
        """Create the directory and its ``logs/`` (once per writer)."""
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
            if event.get("type") != EventType.METRICS or time.monotonic() - self._status_written >= self.status_interval:
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
        """Replace status.json with ``status`` (atomic rename)."""
        self.init()
        status.updated_at = status.updated_at or _now()
        _atomic_write(self.status_file, json.dumps(redact_data(status.to_dict()), indent=2, default=str))

    def set_state(self, state: str, reason: str | None = None, **extra: Any) -> None:
        """Record a state change (``state`` event; ``extra`` goes into the status)."""
        data: dict[str, Any] = {"state": state, **extra}
        if reason:
            data["reason"] = reason
        self.emit(make_event(EventType.STATE, f"{state}" + (f": {reason}" if reason else ""), **data))

    def write_result(self, result: dict) -> None:
        """Write result.json (atomic rename; credentials in it redacted)."""
        _atomic_write(self.result_file, json.dumps(redact_data(result), indent=2, default=str))

    def mark_done(self) -> None:
        """Write ``DONE``: the job succeeded and every file above is complete."""
        _atomic_write(self.done_file, f"{_now()}\n")

    # the lifecycle: every writer (worker, launcher, backends, KFP stages) records a run through these --------
    def start(self, state: str = C.STATE_RUNNING, **extra: Any) -> None:
        """Record that the run began: ``pending`` when a backend accepted it, ``running`` when a worker took it.

        ``extra`` (job id, pids, where the run lives) goes into the status.
        """
        self.init()
        self.set_state(state, **extra)

    def submitted(self, job_id: str, *, name: str, backend: str, spec_text: str, **extra: Any) -> None:
        """Record that a backend accepted a job: its resolved spec, a fresh status (no earlier run's progress) and
        the ``pending`` state that marks where this submission's events begin. An earlier ``DONE``/result.json stay
        until the new run has proven it can start."""
        self.init()
        self.spec_file.write_text(spec_text, encoding="utf-8")
        self.write_status(JobStatus(state=C.STATE_PENDING, job_id=job_id, name=name, backend=backend, run_dir=str(self.path),
                                    created_at=time.time()))
        self.start(C.STATE_PENDING, job_id=job_id, **{k: v for k, v in extra.items() if v is not None})

    def stage(self, stage: str, message: str, *, say: bool = False, **data: Any) -> dict:
        """Record progress within a stage (``fetch``, ``prepare``, ``train``, ``publish``); ``say`` also prints it."""
        if say:
            print(f"[kubetune] {message}", flush=True)
        return self.emit(make_event(EventType.STAGE, message, stage=stage, **data))

    def fail(self, reason: str, exit_code: int | None = None, *, state: bool = True, unless_ended: bool = False,
             **extra: Any) -> None:
        """Record a failure: an ``error`` event and, with ``state``, the ``failed`` state with its exit code.

        Args:
            reason: what went wrong and what to do about it (the message the user reads).
            exit_code: the process's exit code (2: a user's mistake, 1: a bug).
            state: False records only the error event (the launcher records the state of a multi-rank run).
            unless_ended: do nothing when the run already ended (the first reason recorded is the better one).
            extra: more fields for the status (``kfp_state``, ``checkpoint``).
        """
        if unless_ended:
            st = self.read_status()
            if st is not None and st.terminal:
                return
        self.emit(make_event(EventType.ERROR, reason))
        if state:
            if exit_code is not None:
                extra["exit_code"] = exit_code
            self.set_state(C.STATE_FAILED, reason=reason, **extra)

    def succeed(self, message: str = "job succeeded", **extra: Any) -> None:
        """Record success: the ``succeeded`` state, a ``done`` event, then ``DONE`` (written last)."""
        self.set_state(C.STATE_SUCCEEDED, **extra)
        self.emit(make_event(EventType.DONE, message))
        self.mark_done()

    # reading -------------------------------------------------------------------------------
    def read_status(self) -> JobStatus | None:
        """The recorded status; None when there is none or it cannot be read (missing, damaged, unreadable)."""
        try:
            return JobStatus.from_dict(json.loads(self.status_file.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):  # ValueError covers JSON and UTF-8 decoding errors
            return None

    def read_events(self) -> list[dict]:
        """Every event so far (damaged lines skipped)."""
        return list(self.iter_events())

    def iter_events(self) -> Iterator[dict]:
        """The events one by one (damaged lines and non-objects skipped)."""
        try:
            with open(self.events_file, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue  # a line being written right now, or damaged
                    if isinstance(ev, dict):
                        yield ev
        except (OSError, ValueError):  # missing, unreadable, or not text
            return

    def read_result(self) -> dict | None:
        """result.json as a dict (None when missing or damaged)."""
        try:
            data = json.loads(self.result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def is_done(self) -> bool:
        """Whether ``DONE`` is there."""
        return self.done_file.is_file()

    def finished_spec(self) -> str | None:
        """The saved spec of a finished run (DONE, result.json and spec.yaml all readable), else None."""
        if not self.is_done() or self.read_result() is None:
            return None
        try:
            return self.spec_file.read_text(encoding="utf-8")
        except (OSError, ValueError):
            return None

    # the writer's lock ------------------------------------------------------------------------
    @property
    def lock_file(self) -> Path:
        """``.kubetune.lock``: the lock one writer holds (see :class:`RunLock`)."""
        return self.path / C.RUN_LOCK_FILE

    def lock(self) -> "RunLock":
        """Take the run directory's exclusive lock for this process (and the children it hands it to).

        Raises:
            RunDirInUse: another live process holds it (the message names its pid).
        """
        self.init()
        return RunLock.acquire(self.lock_file)

    def holder_pid(self) -> int | None:
        """The pid recorded by the lock's current holder (None when free or unknown)."""
        return RunLock.holder(self.lock_file)


class RunLock:
    """An exclusive ``flock`` on a run directory's lock file; the file records the holder's pid.

    The kernel drops the lock when the last process holding its descriptor ends, however it ends, so a
    killed worker never leaves a stale lock. A local submitter takes the lock, then hands the descriptor to
    its worker (``pass_fds`` and :data:`constants.ENV_RUN_LOCK_FD`), which keeps it for its whole life.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, path: Path) -> "RunLock":
        """Take the lock at ``path`` without waiting; raises RunDirInUse naming the holder's pid."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            from .errors import RunDirInUse

            pid = cls.holder(path)
            who = f"process {pid}" if pid else "another process"
            raise RunDirInUse(
                f"{path.parent} is in use: {who} is writing it",
                hint="wait for that job to end or cancel it (kubetune list shows it), or choose another output.dir",
                holder_pid=pid,
            ) from None
        lock = cls(path, fd)
        lock.record(os.getpid())
        return lock

    @classmethod
    def inherited(cls, path: Path) -> "RunLock | None":
        """The lock handed down by a local submitter (:data:`constants.ENV_RUN_LOCK_FD`), if this process has it."""
        raw = os.environ.get(C.ENV_RUN_LOCK_FD, "")
        if not raw.isdigit():
            return None
        fd = int(raw)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            return None
        if not same:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the same open file: succeeds when we hold it
        except OSError:
            return None
        lock = cls(path, fd)
        lock.record(os.getpid())
        return lock

    @staticmethod
    def holder(path: Path) -> int | None:
        """The pid the lock file records (None when unknown)."""
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            return None
        return int(text) if text.isdigit() else None

    def record(self, pid: int) -> None:
        """Write ``pid`` into the lock file (who holds it, for the loser's message)."""
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{pid}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds all the same

    def release(self) -> None:
        """Close this process's descriptor. The lock ends when no process holds the open file any more; no
        explicit unlock, which would also end it for a child that inherited the descriptor."""
        if self.fd < 0:
            return
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system"}
# How libraries that do not raise OSError say the disk is full (torch's zip writer, safetensors' Rust io::Error).
_DISK_FULL_TEXTS = ("No space left on device", "StorageFull", "file write failed", "Disk quota exceeded")


def disk_error_reason(exc: BaseException, where: str | os.PathLike | None = None) -> str | None:
    """A one-line reason when ``exc`` is a failed write of the run directory's disk, else None.

    ``"no space left on device writing PATH"`` for an OSError (its filename, else ``where``), and for the
    wrapped forms torch and safetensors raise when the disk fills during a save.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
            path = e.filename or where
            return _DISK_ERRNOS[e.errno] + (f" writing {path}" if path else "")
        text = str(e)
        if any(t in text for t in _DISK_FULL_TEXTS):
            return "no space left on device" + (f" writing under {where}" if where else "")
        e = e.__cause__ or e.__context__
    if where is not None:  # torch's zip writer reports a short write only as "unexpected pos N vs M"
        free = _free_bytes(Path(where))
        if free is not None and free < _NEARLY_FULL_BYTES:
            return f"no space left on device writing under {where} ({free} bytes free)"
    return None


_NEARLY_FULL_BYTES = 1 << 20  # a failure with less than this free on the run's file system is a full disk


def _free_bytes(path: Path) -> int | None:
    import shutil

    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None
