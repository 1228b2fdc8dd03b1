"""KfpBackend: the Backend protocol for Kubeflow Pipelines, local runner or server (``kfp.mode``).

Local mode starts :mod:`.driver` as a child process in its own session (cancel ends it and every task
it started); the components write the run directory themselves. Remote mode uploads local inputs to the
bucket, submits the compiled pipeline, and mirrors the server's run and task states into the local run
directory whenever ``status`` is asked, so ``kubetune status``/``list``/``run`` read it as any other job.

Each submission is recorded under ``$KUBETUNE_HOME/kfp-jobs/<id>.json``; the run directory's status
keeps the KFP coordinates (``kfp_mode``, ``kfp_run_id``, ``kfp_host``, ``run_url``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ... import constants as C
from ...errors import BackendError, JobNotFound, KubetuneError
from ...events import EventType, JobStatus, RunDir, disk_error_reason, make_event
from ...paths import state_path
from ...spec import TuneJob, dump_spec, load_spec
from ...worker import FINISHED_RUN_HINT, finished_run_message, previous_run
from ..base import JobRef
from .._process import alive as _alive, kill_group as _kill_group, new_job_id, registry_entries, tail as _tail, worker_env

__all__ = ["KfpBackend"]


class KfpBackend:
    """Run jobs as Kubeflow pipelines: with the KFP local runner on this machine, or on a KFP server.

    Args:
        poll_seconds: a remote run's state is fetched from the server at most this often.
    """

    name = "kfp"

    def __init__(self, *, poll_seconds: float = 2.0) -> None:
        self.poll_seconds = poll_seconds
        self._procs: dict[int, subprocess.Popen] = {}
        self._servers: dict[tuple, object] = {}
        self._polled: dict[str, float] = {}  # KFP run id -> when the server was last asked (monotonic)

    # -- submit ------------------------------------------------------------------------------
    def submit(self, job: TuneJob) -> JobRef:
        """Start the job's pipeline (``kfp.mode``: local or remote) and return at once."""
        return self._submit_remote(job) if job.kfp.mode == "remote" else self._submit_local(job)

    def _submit_local(self, job: TuneJob) -> JobRef:
        from .pipeline import build_pipeline

        build_pipeline(job, local=True)  # a setting KFP cannot express fails here, before any process starts
        run = RunDir(job.output_dir)
        try:
            lock = run.lock()  # handed to the driver, which holds it until the pipeline ends
        except OSError as e:
            raise BackendError(f"output.dir {run.path}: cannot write there: {disk_error_reason(e, run.path) or e.strerror or e}",
                               hint="choose an output.dir on a writable file system with free space") from None
        try:
            verdict, diffs = previous_run(job, run)
            if verdict == "same":
                st = run.read_status() or JobStatus()
                return JobRef(id=st.job_id or job.name, backend=self.name, name=job.name, run_dir=str(run.path),
                              extra={"mode": "local", "already_complete": True})
            if verdict == "different":
                raise BackendError(finished_run_message(run, diffs), hint=FINISHED_RUN_HINT)
            job_id = _new_id(job)
            # the spec as submitted travels in memory (spec.yaml is the redacted copy); a spec too large for it
            # fails before the run directory changes
            env = {**worker_env(job, job_id), C.ENV_RUN_LOCK_FD: str(lock.fd)}
            _start_run_dir(run, job, job_id, kfp_mode="local")
            cmd = [sys.executable, "-m", "kubetune.backends.kfp.driver", "--run-dir", str(run.path), "--job-id", job_id]
            log = open(run.worker_log, "ab")
            try:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True, pass_fds=(lock.fd,))
            except OSError as e:
                raise BackendError(f"could not start the KFP local runner: {e}") from e
            finally:
                log.close()
            lock.record(proc.pid)
        finally:
            lock.release()
        self._procs[proc.pid] = proc
        st = run.read_status() or JobStatus()
        st.pid = proc.pid
        run.write_status(st)
        _register(job_id, job.name, run.path, mode="local", pid=proc.pid)
        return JobRef(id=job_id, backend=self.name, name=job.name, run_dir=str(run.path), extra={"mode": "local", "pid": proc.pid})

    def _submit_remote(self, job: TuneJob) -> JobRef:
        from .pipeline import build_pipeline, compile_pipeline, pipeline_arguments
        from .remote import stage_inputs

        build_pipeline(job)  # spec problems first: nothing uploaded, nothing submitted
        verdict, diffs = previous_run(job, RunDir(job.output_dir))
        if verdict == "same":
            st = RunDir(job.output_dir).read_status() or JobStatus()
            return JobRef(id=st.job_id or job.name, backend=self.name, name=job.name, run_dir=str(job.output_dir),
                          extra={"mode": "remote", "already_complete": True})
        if verdict == "different":
            raise BackendError(finished_run_message(RunDir(job.output_dir), diffs), hint=FINISHED_RUN_HINT)
        server = self._connect(job)
        job_id = _new_id(job)
        staged, uploads = stage_inputs(job, job_id)
        run = RunDir(job.output_dir)
        _start_run_dir(run, staged, job_id, kfp_mode="remote", kfp_host=server.host)
        for up in uploads:
            run.stage(C.STAGE_FETCH, f"uploaded {up['field']} {up['path']} to {up['uri']}", **up)
        try:
            with tempfile.TemporaryDirectory(prefix="kubetune-kfp-") as tmp:
                package = compile_pipeline(staged, Path(tmp) / "pipeline.yaml")
                run_id = server.submit(package, arguments=pipeline_arguments(staged), run_name=job_id,
                                       service_account=job.kubernetes.service_account)
        except KubetuneError as e:
            run.fail(str(e), 2)
            raise
        for stale in (run.done_file, run.result_file):  # the server accepted the new run: the old result is history
            stale.unlink(missing_ok=True)
        url = server.run_url(run_id)
        run.stage(C.STAGE_FETCH, f"submitted KFP run {run_id}" + (f": {url}" if url else ""), kfp_run_id=run_id, run_url=url)
        st = run.read_status() or JobStatus()
        st.extra.update({"kfp_run_id": run_id, "run_url": url} if url else {"kfp_run_id": run_id})
        run.write_status(st)
        _register(job_id, job.name, run.path, mode="remote", run_id=run_id, host=server.host, run_url=url)
        return JobRef(id=job_id, backend=self.name, name=job.name, run_dir=str(run.path),
                      extra={"mode": "remote", "run_id": run_id, "run_url": url})

    # -- follow ------------------------------------------------------------------------------
    def status(self, ref: JobRef) -> JobStatus:
        """The job's status; for a remote run, the server's state is fetched and recorded first."""
        run = self._run(ref)
        st = run.read_status()
        if st is None:
            raise JobNotFound(f"job {ref.id}: no status in {run.path}")
        if st.terminal:
            if st.extra.get("kfp_mode") == "local" and st.pid and _is_driver(st.pid, run.path):
                self._await_exit(st.pid)  # the last task recorded the end; the runner still writes its last log lines
            return st
        if st.extra.get("kfp_mode") == "remote":
            return self._mirror(run, st)
        if st.pid and not self._is_running(st.pid):
            time.sleep(0.2)  # the driver may be writing its final state right now
            st = run.read_status() or st
            if not st.terminal:
                reason = "the KFP local runner ended without recording a result (killed?)"
                tail = _tail(run.worker_log, 5)
                run.fail(reason + (f"; last log lines:\n{tail}" if tail else ""))
                st = run.read_status() or st
        return st

    def events(self, ref: JobRef) -> list[dict]:
        """Every event recorded in the run directory."""
        return self._run(ref).read_events()

    def logs(self, ref: JobRef, follow: bool = False, all_runs: bool = False) -> Iterator[str]:
        """Local mode: the runner's log (every task's output; every earlier run's in the run directory too, whatever
        ``all_runs`` says). Remote: each task pod's log, in pipeline order."""
        run = self._run(ref)
        st = run.read_status() or JobStatus()
        if st.extra.get("kfp_mode") == "remote":
            return self._remote_logs(ref, run, st, follow)
        return self._local_logs(ref, run, follow)

    def _local_logs(self, ref: JobRef, run: RunDir, follow: bool) -> Iterator[str]:
        pos = 0
        while True:
            if run.worker_log.is_file():
                with open(run.worker_log, encoding="utf-8", errors="replace") as f:
                    f.seek(pos)
                    for line in f:
                        yield line.rstrip("\n")
                    pos = f.tell()
            if not follow:
                return
            if self.status(ref).terminal:
                follow = False  # one last read of what was written meanwhile
                continue
            time.sleep(0.3)

    def _remote_logs(self, ref: JobRef, run: RunDir, st: JobStatus, follow: bool) -> Iterator[str]:
        server = self._server_for(run, st)
        run_id = st.extra["kfp_run_id"]
        printed: dict[str, int] = {}
        while True:
            info = server.get_run(run_id)
            for task in info.tasks:
                if not task.pod_name or task.name not in _TASK_ORDER:
                    continue
                lines = server.pod_log(task.pod_name)
                if task.pod_name not in printed:
                    yield f"== {task.name} ({task.pod_name}) =="
                for line in lines[printed.get(task.pod_name, 0):]:
                    yield line
                printed[task.pod_name] = len(lines)
            if not follow or self.status(ref).terminal:
                return
            time.sleep(2.0)

    def cancel(self, ref: JobRef) -> None:
        """Stop the job: the local runner and its tasks, or the server's run."""
        run = self._run(ref)
        st = run.read_status()
        if st is None or st.terminal:
            return
        if st.extra.get("kfp_mode") == "remote":
            self._server_for(run, st).terminate(st.extra["kfp_run_id"])
            run.set_state(C.STATE_CANCELLED, reason="cancelled by user (KFP run terminated)")
            return
        if st.pid:  # the driver leads a session of its own: the runner and every task it started
            _kill_group(st.pid, signal.SIGTERM)
            if not self._await_group_exit(st.pid, 10):
                _kill_group(st.pid, signal.SIGKILL)
                self._await_group_exit(st.pid, 10)
        st = run.read_status()
        if st is None or not st.terminal:
            run.set_state(C.STATE_CANCELLED, reason="cancelled by user")

    def list(self) -> list[JobRef]:
        """KFP jobs this machine submitted, newest first."""
        return [
            JobRef(id=d["id"], backend=self.name, name=d.get("name", ""), run_dir=d.get("run_dir"),
                   extra={k: d[k] for k in ("mode", "pid", "run_id", "run_url") if d.get(k) is not None})
            for d in registry_entries(_jobs_dir())
        ]

    def resolve(self, key: str) -> JobRef:
        """A job by id, by KFP run id, by run directory, or by name (its newest submission)."""
        p = Path(key).expanduser()
        if (p / C.STATUS_FILE).is_file():
            st = RunDir(p).read_status() or JobStatus()
            return JobRef(id=st.job_id or p.name, backend=self.name, name=st.name or "", run_dir=str(p.absolute()))
        refs = self.list()
        for ref in refs:
            if key in (ref.id, ref.extra.get("run_id")):
                return ref
        for ref in refs:
            if ref.name == key:
                return ref
        raise JobNotFound(f"no kfp job '{key}'", hint="kubetune list --backend kfp shows job ids; a run directory works too")

    # -- remote mirror -----------------------------------------------------------------------
    def _mirror(self, run: RunDir, st: JobStatus) -> JobStatus:
        """Fetch the server's view of the run and record what changed as events."""
        run_id = st.extra.get("kfp_run_id")
        if not run_id:
            return st  # submission did not get that far
        last = self._polled.get(run_id, float("-inf"))
        if time.monotonic() - last < self.poll_seconds:
            return st  # `kubetune run` asks twice a second; the server is asked at most every few seconds
        self._polled[run_id] = time.monotonic()
        server = self._server_for(run, st)
        info = server.get_run(run_id)
        url = server.run_url(run_id)
        seen = dict(st.extra.get("kfp_tasks") or {})
        for task in info.tasks:
            if task.name in _TASK_ORDER and seen.get(task.name) != task.state:
                seen[task.name] = task.state
                run.emit(make_event(EventType.STAGE, f"task {task.name}: {task.state.lower()}", stage=_TASK_ORDER[task.name],
                                    task=task.name, task_state=task.state))
        state = _map_state(info.state)
        if state == C.STATE_PENDING and st.state == C.STATE_RUNNING:
            state = st.state  # uploading was already running; states only move forward
        if state != st.state:
            if state == C.STATE_FAILED:
                failed = info.failed_task
                why = info.error or (f"task {failed.name} failed" + (f": {failed.error}" if failed and failed.error else "")
                                     if failed else "the run failed")
                run.fail(f"KFP run {run_id} failed: {why}" + (f"; see {url}" if url else ""), 1, kfp_state=info.state)
            elif state == C.STATE_SUCCEEDED:
                self._fetch_result(run)  # result.json before the state: a reader that sees succeeded finds it
                run.succeed("job succeeded" + (f" ({url})" if url else ""), kfp_state=info.state)
            else:
                reason = "the KFP run was cancelled" if state == C.STATE_CANCELLED else None
                run.set_state(state, reason=reason, kfp_state=info.state)
        st = run.read_status() or st
        st.extra["kfp_tasks"] = seen
        run.write_status(st)
        return st

    def _fetch_result(self, run: RunDir) -> None:
        """result.json from output.uri, where the publish task put it (best effort: a warning otherwise)."""
        try:
            job = load_spec(run.spec_file)
        except KubetuneError:
            return
        uri = job.output.uri
        if not uri or not uri.startswith(("s3://", "file://")):
            return
        try:
            from ... import storage

            with tempfile.TemporaryDirectory(prefix="kubetune-result-") as tmp:
                path = storage.fetch(f"{uri.rstrip('/')}/{C.RESULT_FILE}", Path(tmp), use_cache=False)
                result = json.loads((path if path.is_file() else path / C.RESULT_FILE).read_text(encoding="utf-8"))
            run.write_result(result)
        except (KubetuneError, OSError, ValueError) as e:
            run.emit(make_event(EventType.WARNING, f"could not read {C.RESULT_FILE} from {uri}: {e}"))

    # -- helpers -----------------------------------------------------------------------------
    def _connect(self, job: TuneJob, host: str | None = None):
        from .remote import KfpServer

        key = (host or job.kfp.host, job.kfp.namespace, job.kfp.kube_context, job.kfp.ui_host)
        if key not in self._servers:
            self._servers[key] = KfpServer.connect(job.kfp, host=host)
        return self._servers[key]

    def _server_for(self, run: RunDir, st: JobStatus):
        job = load_spec(run.spec_file)
        return self._connect(job, host=st.extra.get("kfp_host"))

    def _run(self, ref: JobRef) -> RunDir:
        if ref.run_dir:
            return RunDir(ref.run_dir)
        return RunDir(self.resolve(ref.id).run_dir or "")

    def _await_exit(self, pid: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self._is_running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _await_group_exit(self, pgid: int, timeout: float) -> bool:
        """Wait until no process of group ``pgid`` runs; True if none does.

        Then a moment more for the exited ones to be reaped (the driver by this process when it started it,
        orphaned tasks by init), so that none is left in the process table either.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._is_running(pgid)  # reaps the driver when this process started it
            if not _group_members(pgid, zombies=False):
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        settle = time.monotonic() + 3
        while _group_members(pgid) and time.monotonic() < settle:
            self._is_running(pgid)
            time.sleep(0.05)
        return True

    def _is_running(self, pid: int) -> bool:
        proc = self._procs.get(pid)
        if proc is not None:
            proc.poll()
        return _alive(pid)


# Task names in the pipeline -> the stage they stand for (also the order logs are shown in).
_TASK_ORDER = {"fetch": C.STAGE_FETCH, "train": C.STAGE_TRAIN, "merge": C.STAGE_PUBLISH, "publish": C.STAGE_PUBLISH}


def _map_state(kfp_state: str) -> str:
    from .remote import map_state

    return map_state(kfp_state)


def _new_id(job: TuneJob) -> str:
    return new_job_id(job.name)


def _start_run_dir(run: RunDir, job: TuneJob, job_id: str, **extra: object) -> None:
    """A fresh start in the run directory: the resolved spec, no stale progress, a pending state."""
    run.submitted(job_id, name=job.name, backend="kfp", spec_text=dump_spec(job), **extra)


def _jobs_dir() -> Path:
    return state_path(C.KFP_JOBS_DIR)


def _register(job_id: str, name: str, run_dir: Path, **fields: object) -> None:
    entry = {"id": job_id, "name": name, "run_dir": str(run_dir), "created": time.time(), **fields}
    (_jobs_dir() / f"{job_id}.json").write_text(json.dumps(entry), encoding="utf-8")


def _is_driver(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` is still the driver of ``run_dir`` (not a process that got its id since)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return not Path("/proc/self").exists() and _alive(pid)  # no /proc (macOS): trust the id
    except OSError:
        return False
    if b"kubetune.backends.kfp.driver" not in args or b"--run-dir" not in args[:-1]:
        return False
    given = os.fsdecode(args[args.index(b"--run-dir") + 1])
    return os.path.realpath(given) == os.path.realpath(run_dir)


def _group_members(pgid: int, *, zombies: bool = True) -> list[int]:
    """Processes of group ``pgid`` (with ``zombies``: also those exited but not reaped yet)."""
    if not Path("/proc/self").exists():  # no /proc (macOS): the group leader is all one can see
        return [pgid] if _alive(pgid) else []
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and (zombies or fields[0] != "Z"):
                members.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return members
