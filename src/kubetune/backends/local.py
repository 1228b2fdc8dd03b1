"""The local backend: runs the worker in a child process (torchrun when more than one process).

Each submission gets an id and a registry entry in the state directory (``paths.jobs_dir()``: ``~/.local/state/kubetune/jobs``, or ``$KUBETUNE_HOME/jobs``); the child runs in its own
process group so that cancel ends it and everything it started. A worker that dies without recording a
final state (killed, out of memory) is reported as failed by :meth:`LocalBackend.status`.

The run directory's spec.yaml is the redacted spec (for people and for output.uri); the worker gets the
real one, credentials in its URIs included, in its environment (``$KUBETUNE_WORKER_SPEC``, see
:func:`kubetune.backends._process.worker_env`): never written to disk, gone with the process, inherited by torchrun's workers.

Several submissions of one spec share its run directory. The backend writes a header line naming the job id into
logs/worker.log before each worker starts, so ``status``, ``logs`` and ``cancel`` of an earlier job id concern
that job only (its events' and its log's part, :mod:`kubetune.backends._history`), never the newest one.

Both :meth:`LocalBackend.cancel` and :meth:`LocalBackend.preempt` send the group SIGTERM; a cancel first
leaves ``CANCEL_REQUESTED`` in the run directory, so the worker leaves at once (``cancelled``) instead of
saving a checkpoint first (``preempted``, see :mod:`kubetune.preemption`).
"""

from __future__ import annotations

import json

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from .. import constants as C
from ..errors import BackendError, JobNotFound
from ..events import JobStatus, RunDir, disk_error_reason
from ..paths import jobs_dir
from ..preemption import request_cancel
from ..spec import TuneJob, dump_spec
from ..worker import FINISHED_RUN_HINT, finished_run_message, previous_run
from .base import JobRef
from ._history import earlier_status, is_earlier, job_log, log_has_header, log_header
from ._process import alive as _alive, kill_group as _kill_group, new_job_id, registry_entries, tail as _tail, worker_env

__all__ = ["LocalBackend"]


class LocalBackend:
    """Run jobs as local processes."""

    name = "local"

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}

    # -- submit ------------------------------------------------------------------------------
    def submit(self, job: TuneJob) -> JobRef:
        """Start the worker for ``job`` and return at once.

        The run directory's lock is taken here and handed to the worker, so of two submissions on one
        directory at the same moment exactly one starts (the other raises :class:`RunDirInUse`). A directory
        holding a finished run of the same spec starts nothing and returns that run's reference
        (``extra["already_complete"]``); a finished run of another spec is refused unless
        ``training.resume=never``.
        """
        run = RunDir(job.output_dir)
        try:
            lock = run.lock()
        except OSError as e:
            raise BackendError(
                f"output.dir {run.path}: cannot write there: {disk_error_reason(e, run.path) or e.strerror or e}",
                hint="choose an output.dir on a writable file system with free space",
            ) from None
        try:
            verdict, diffs = previous_run(job, run)
            if verdict == "same":
                return self._finished_ref(job, run)
            if verdict == "different":
                raise BackendError(finished_run_message(run, diffs), hint=FINISHED_RUN_HINT)
            return self._start(job, run, lock)
        except OSError as e:
            raise BackendError(
                f"output.dir {run.path}: cannot write there: {disk_error_reason(e, run.path) or e.strerror or e}",
                hint="choose an output.dir on a writable file system with free space",
            ) from None
        finally:
            lock.release()  # the worker holds its own copy of the descriptor from here on

    def _start(self, job: TuneJob, run: RunDir, lock) -> JobRef:
        job_id = new_job_id(job.name)
        env = {**worker_env(job, job_id), C.ENV_RUN_LOCK_FD: str(lock.fd)}  # fails for a too large spec before anything changes
        (run.path / C.CANCEL_REQUEST_FILE).unlink(missing_ok=True)  # an earlier run's cancel is not this one's
        run.submitted(job_id, name=job.name, backend=self.name, spec_text=dump_spec(job))
        cmd = _worker_command(job, run)
        log = open(run.worker_log, "ab")
        try:
            log.write((log_header(job_id) + "\n").encode())  # logs/worker.log is appended per job: where this one's begins
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, pass_fds=(lock.fd,))
        except OSError as e:
            raise BackendError(f"could not start the worker: {e}") from e
        finally:
            log.close()
        lock.record(proc.pid)
        self._procs[proc.pid] = proc
        st = run.read_status() or JobStatus()
        st.pid, st.job_id, st.name, st.backend, st.run_dir = proc.pid, job_id, job.name, self.name, str(run.path)
        run.write_status(st)
        ref = JobRef(id=job_id, backend=self.name, name=job.name, run_dir=str(run.path), extra={"pid": proc.pid})
        (jobs_dir() / f"{job_id}.json").write_text(
            json.dumps({"id": job_id, "name": job.name, "run_dir": str(run.path), "pid": proc.pid, "created": time.time()}), encoding="utf-8"
        )
        return ref

    def _finished_ref(self, job: TuneJob, run: RunDir) -> JobRef:
        st = run.read_status() or JobStatus()
        if st.state != C.STATE_SUCCEEDED:  # DONE and result.json say it finished; the status must agree
            st.state = C.STATE_SUCCEEDED
            run.write_status(st)
        return JobRef(id=st.job_id or job.name, backend=self.name, name=job.name, run_dir=str(run.path),
                      extra={"already_complete": True})

    # -- follow ------------------------------------------------------------------------------
    def status(self, ref: JobRef) -> JobStatus:
        """The job's status from its run directory; a worker that died without recording its end is marked failed.

        status.json holds the newest job in the directory; an earlier job's final status is folded from its
        own events in events.jsonl.
        """
        run = self._run(ref)
        st = run.read_status()
        if st is None:
            raise JobNotFound(f"job {ref.id}: no status in {run.path}")
        if is_earlier(ref.id, st):
            return earlier_status(run, ref.id, st, name=ref.name or None, backend=self.name)
        pid = st.pid or (st.extra or {}).get("worker_pid")
        if st.state == C.STATE_PENDING and not pid and time.time() - (st.updated_at or st.created_at or time.time()) > C.LOCAL_START_GRACE_S:
            return _record_end(run, st, C.REASON_NEVER_STARTED)
        if not st.terminal and pid and not self._is_running(pid):
            time.sleep(0.2)  # the worker may be writing its final state right now
            st = run.read_status() or st
            if not st.terminal:
                code = self._exit_code(pid)
                reason = "the worker process ended without recording a result"
                reason += f" (exit code {code})" if code is not None else " (killed?)"
                tail = _tail(run.worker_log, 5)
                if tail:
                    reason += "; last log lines:\n" + tail
                st = _record_end(run, st, reason)
        return st

    def events(self, ref: JobRef) -> list[dict]:
        """Every event in the run directory's events.jsonl (earlier submissions' included)."""
        return self._run(ref).read_events()

    def logs(self, ref: JobRef, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """The job's part of logs/worker.log, from its header line; ``follow`` keeps reading until the job ends.

        ``all_runs``: the whole log, every earlier job's part too, each after its header line.
        """
        run = self._run(ref)
        own = log_has_header(run.worker_log, ref.id)
        return job_log(self._log_lines(ref, run, follow), ref.id, own_header=own, all_runs=all_runs)

    def _log_lines(self, ref: JobRef, run: RunDir, follow: bool) -> Iterator[str]:
        path = run.worker_log
        pos = 0
        while True:
            if path.is_file():
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(pos)
                    for line in f:
                        yield line.rstrip("\n")
                    pos = f.tell()
            if not follow or self.status(ref).terminal:
                if follow and path.is_file():  # lines written between the last read and the end
                    with open(path, encoding="utf-8", errors="replace") as f:
                        f.seek(pos)
                        for line in f:
                            yield line.rstrip("\n")
                return
            time.sleep(0.3)

    def cancel(self, ref: JobRef) -> None:
        """Stop the job's worker (its whole process group) and record ``cancelled``; nothing is saved."""
        run = self._run(ref)
        st = run.read_status()
        if st is None or st.terminal or is_earlier(ref.id, st):  # an earlier job in the directory has ended
            return
        # The process this backend started: status.json's pid, else the one the reference carries, else the worker's
        # own (a worker's status write that raced the submitter's can have dropped the pid from status.json).
        pid = st.pid or (ref.extra or {}).get("pid") or (st.extra or {}).get("worker_pid")
        if pid:
            request_cancel(run.path, pid)  # a user's cancel, not a preemption: the worker leaves at once
            self._stop_group(pid, 10)
        st = run.read_status()
        if st is None or not st.terminal:
            run.set_state(C.STATE_CANCELLED, reason="cancelled by user")

    def preempt(self, ref: JobRef, timeout: float = C.PREEMPT_SAVE_TIMEOUT_S) -> JobStatus | None:
        """Stop the job as a preemption does: it saves a checkpoint at the next step boundary and ends ``preempted``.

        Sends the worker's process group SIGTERM and waits up to ``timeout`` seconds before killing what is
        left. Rerunning the spec resumes from the checkpoint. Returns the final status (None when there is none).
        """
        run = self._run(ref)
        st = run.read_status()
        if st is not None and is_earlier(ref.id, st):
            return self.status(ref)  # an earlier job in the directory has ended
        if st is None or st.terminal:
            return st
        pid = st.pid or (ref.extra or {}).get("pid") or (st.extra or {}).get("worker_pid")
        if pid:
            self._stop_group(pid, timeout)
        st = run.read_status()
        if st is None or not st.terminal:
            run.set_state(C.STATE_PREEMPTED, reason=f"stopped by SIGTERM; the worker did not save a checkpoint within {timeout:.0f} s and was killed")
            st = run.read_status()
        return st

    def _stop_group(self, pid: int, timeout: float) -> None:
        """SIGTERM to the group, up to ``timeout`` seconds for it to end, then SIGKILL."""
        _kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._group_alive(pid) and time.monotonic() < deadline:
            self._reap(pid)
            time.sleep(0.1)
        if self._group_alive(pid):
            _kill_group(pid, signal.SIGKILL)
            # A killed process still takes a moment to go (a large one's memory is torn down first, longer on a busy
            # machine); until it has, it holds the run directory's lock. Return once it is gone, so that a cancel
            # followed by a rerun of the same spec finds the directory free.
            deadline = time.monotonic() + 30
            while self._group_alive(pid) and time.monotonic() < deadline:
                self._reap(pid)
                time.sleep(0.05)
        self._reap(pid)

    def list(self) -> list[JobRef]:
        """The jobs this machine's local backend started (newest first), from the jobs index."""
        return [JobRef(id=d["id"], backend=self.name, name=d.get("name", ""), run_dir=d.get("run_dir"), extra={"pid": d.get("pid")})
                for d in registry_entries(jobs_dir())]

    def resolve(self, key: str) -> JobRef:
        """A job by id, by run directory, or by name (its newest submission)."""
        p = Path(key).expanduser()
        if (p / C.STATUS_FILE).is_file():
            st = RunDir(p).read_status() or JobStatus()
            return JobRef(id=st.job_id or p.name, backend=self.name, name=st.name or "", run_dir=str(p.absolute()))
        entry = jobs_dir() / f"{key}.json"
        if entry.is_file():
            d = json.loads(entry.read_text(encoding="utf-8"))
            return JobRef(id=d["id"], backend=self.name, name=d.get("name", ""), run_dir=d["run_dir"], **({"extra": {"pid": d["pid"]}} if d.get("pid") else {}))
        for ref in self.list():
            if ref.name == key:
                return ref
        raise JobNotFound(f"no local job '{key}'", hint="kubetune list shows job ids; a run directory works too")

    # -- helpers -----------------------------------------------------------------------------
    def _run(self, ref: JobRef) -> RunDir:
        if ref.run_dir:
            return RunDir(ref.run_dir)
        return RunDir(self.resolve(ref.id).run_dir or "")

    def _reap(self, pid: int) -> None:
        proc = self._procs.get(pid)
        if proc is not None:
            proc.poll()

    def _exit_code(self, pid: int) -> int | None:
        proc = self._procs.get(pid)
        return proc.poll() if proc is not None else None

    def _is_running(self, pid: int) -> bool:
        self._reap(pid)
        return _alive(pid)

    def _group_alive(self, pgid: int) -> bool:
        self._reap(pgid)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and (fields[0] != "Z" or _threads_exiting(entry)):  # fields[2] is pgrp, fields[0] the state
                return True
        return False


def _threads_exiting(proc: Path) -> bool:
    """A process whose main thread is a zombie while its other threads (torch's, a user function's) still exit: they
    share its open files, so it holds the run directory's lock until the last of them is gone."""
    try:
        tasks = list((proc / "task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
        except (OSError, IndexError):
            continue
    return False


def _record_end(run: RunDir, st: JobStatus, reason: str) -> JobStatus:
    """Record that a job failed without its worker saying so; a run directory that cannot be written any more
    (a full disk, say) still gets the failure reported, only not saved."""
    try:
        run.fail(reason)
        return run.read_status() or st
    except OSError as e:
        st.state, st.reason = C.STATE_FAILED, f"{reason} (not recorded in {run.path}: {disk_error_reason(e, run.path) or e})"
        return st


def _worker_command(job: TuneJob, run: RunDir) -> list[str]:
    args = ["-m", "kubetune.worker", "--spec-from-env", "--run-dir", str(run.path)]
    r = job.resources
    if r.world_size == 1:
        return [sys.executable, *args]
    if r.nodes > 1:
        raise BackendError(
            f"resources.nodes={r.nodes}: the local backend runs one node",
            hint="use --backend kubernetes, or start `python -m kubetune.launch` on each machine (see docs/distributed.md)",
        )
    # torchrun, through kubetune's launcher: it records the first failing rank's error as the job's reason
    return [
        sys.executable, "-m", "kubetune.launch", "--standalone",
        f"--nproc-per-node={r.processes_per_node}", "--max-restarts=0", *args,
    ]
