"""kubetune's launcher: ``python -m kubetune.launch``, a drop-in for ``torchrun`` (same arguments).

torchrun (``torch.distributed.run``) starts one worker process per rank; this module runs it in-process and
adds what torchrun alone does not:

- when a rank fails, :func:`launch` finds the rank that failed *first* -- not the ranks that died of it
  ("connection closed by peer") or were stopped by torchrun afterwards -- and records that rank's error as the
  job's ``failed`` reason in the run directory (:func:`root_cause`, :func:`failure_reason`);
- the spec's rendezvous timeout (``resources.rendezvous_timeout_seconds``) for nodes that wait for each other;
- a SIGTERM to the launcher is a preemption (an evicted pod, a spot node going away): its ranks save a
  checkpoint at the next step boundary (:mod:`kubetune.preemption`) and it records ``preempted``; after
  ``kubetune cancel`` (which says so in the run directory first) it records ``cancelled``.

It sits beside the worker: it starts workers, and what each rank does about the others lives in
:mod:`kubetune.training.distributed`. ``python -m kubetune.distributed`` (what pods rendered by older kubetune
versions run) is the same launcher. torch is imported lazily, when a launch starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import constants as C
from .errors import KubetuneError

__all__ = ["launch", "main", "RankFailure", "root_cause", "failure_reason"]

# The signals torchrun's agent handles by stopping the workers (torch's default: SIGTERM,SIGINT,SIGHUP,SIGQUIT).
_ENV_SIGNALS = "TORCHELASTIC_SIGNALS_TO_HANDLE"
# Text of errors a rank gets because *another* rank died: the peer is the root cause, not this rank.
_PEER_ERRORS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crashing",
    "remote process exited",
    "distbackenderror",
    "nccl communicator was aborted",
    "socket timeout",
    "timed out",
    "timeout",
)


@dataclass
class RankFailure:
    """One failed rank, as torchrun reports it."""

    rank: int
    exitcode: int
    message: str = ""
    time: float = 0.0
    pid: int | None = None
    local_rank: int | None = None
    preempted: bool = False  # stopped for a preemption after saving (its own record says so)

    @property
    def signal_name(self) -> str | None:
        """The signal that ended the rank (``SIGKILL``, ...), None when it exited with a code."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def stopped_by_launcher(self) -> bool:
        """Ended by the SIGTERM torchrun sends the survivors once another rank failed."""
        return self.exitcode in (-signal.SIGTERM, 128 + signal.SIGTERM)

    @property
    def peer_error(self) -> bool:
        """Failed because another rank went away (its own error is a symptom)."""
        text = self.message.lower()
        return any(p in text for p in _PEER_ERRORS)

    @property
    def timed_out(self) -> bool:
        """Its error says it waited too long (for the other ranks, in a collective)."""
        text = self.message.lower()
        return "timed out" in text or "timeout" in text

    def describe(self) -> str:
        """One line for the job's reason: the rank's own error, else the signal or exit code that ended it."""
        if self.message and not self.message.startswith("To enable traceback"):
            return f"rank {self.rank} failed: {self.message}"
        if self.signal_name:
            text = f"rank {self.rank} was killed by {self.signal_name}"
            if self.exitcode == -signal.SIGKILL:
                text += " (killed from outside, or by the kernel's out-of-memory killer: check the machine's memory)"
            return text
        return f"rank {self.rank} exited with code {self.exitcode} without recording an error (see its lines in the log)"


def root_cause(failures: list[RankFailure]) -> RankFailure:
    """The failure that started it: a rank's own error before peer errors, before ranks torchrun stopped,
    before ranks that stopped for a preemption."""

    def key(f: RankFailure) -> tuple:
        return (3 if f.preempted else 2 if f.stopped_by_launcher else 1 if f.peer_error else 0, f.time, f.rank)

    return min(failures, key=key)


def failure_reason(failures: list[RankFailure], *, collective_timeout: int | None = None) -> tuple[RankFailure, str]:
    """The root cause among ``failures`` and the job's ``failed`` reason, which names its rank and error."""
    first = root_cause(failures)
    others = [f for f in failures if f is not first]
    if first.peer_error and first.timed_out:
        limit = f" ({collective_timeout} s, resources.collective_timeout_seconds)" if collective_timeout else ""
        stopped = [f.rank for f in others if f.stopped_by_launcher]
        who = f"rank {', '.join(map(str, stopped))} " if stopped else "a rank "
        reason = (
            f"rank {first.rank} timed out waiting for the other ranks{limit}: {who}stopped responding "
            f"(hung, or much slower than the rest); its error: {first.message}"
        )
    elif first.peer_error:
        reason = (
            f"{first.describe()} (rank {first.rank} lost its connection to another rank, which failed first: "
            "if it ran on another node, its error is in that node's log)"
        )
    else:
        reason = first.describe()
        if others:
            reason += f" ({len(others)} other rank{'s' if len(others) > 1 else ''} stopped after it)"
    return first, reason


def _failures(err: Any) -> list[RankFailure]:
    """RankFailures from torch's ChildFailedError."""
    out = []
    for global_rank, f in err.failures.items():
        data = f.error_file_data if isinstance(f.error_file_data, dict) else {}
        ours = data.get("kubetune") if isinstance(data.get("kubetune"), dict) else {}
        msg = f.message.get("message", "") if isinstance(f.message, dict) else str(f.message or "")
        if f.exitcode < 0 and msg.startswith("Signal "):
            msg = ""  # torch's "Signal 9 (SIGKILL) received by PID n": describe() says it better
        out.append(
            RankFailure(
                rank=int(global_rank), exitcode=int(f.exitcode), message=str(ours.get("message") or msg).strip(),
                time=float(ours.get("time") or f.timestamp or 0), pid=f.pid, local_rank=f.local_rank,
                preempted=bool(ours.get("preempted")),
            )
        )
    return out


def launch(argv: list[str]) -> int:
    """Run torchrun with ``argv`` in this process; record how the job ended in its run directory.

    ``argv`` is exactly what ``torchrun`` takes, ending in ``-m kubetune.worker --spec FILE [--run-dir DIR]``.
    The run directory is written only by the launcher whose node runs rank 0 (rank 0 records the launcher's
    pid when it starts), so several launches sharing one run directory never fight over it.

    A SIGTERM to the launcher is a preemption unless ``kubetune cancel`` asked for it: the launcher creates
    the file named by ``KUBETUNE_PREEMPT_FILE`` (which tells its ranks so), torchrun passes SIGTERM on and waits
    up to ``PREEMPT_SAVE_TIMEOUT_S`` for them to save, and the job ends ``preempted``.

    Returns:
        0 on success; 2 when the first failure was a user error (exit code 2); 128+N after signal N (143 after
        a preemption); else 1.
    """
    from torch.distributed import DistStoreError
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    job, run_dir = _job_of(args)
    if job is not None and not args.rdzv_conf:
        # How long nodes wait for each other at start-up: `timeout` for a static rendezvous (--master-addr),
        # `join_timeout` for c10d (--rdzv-endpoint); each backend ignores the other's key.
        t = job.resources.rendezvous_timeout_seconds
        args.rdzv_conf = f"timeout={t},join_timeout={t}"
    os.environ[C.ENV_LAUNCHER_PID] = str(os.getpid())  # inherited by the workers; rank 0 records it
    if C.ENV_OMP_NUM_THREADS in os.environ:  # the user's choice: every rank uses it
        os.environ.pop(C.ENV_THREADS_AUTO, None)
    else:  # torchrun will set OMP_NUM_THREADS=1, its default: the ranks divide the free cores instead (kubetune.cpu)
        os.environ[C.ENV_THREADS_AUTO] = "1"
    preempt_file = Path(tempfile.gettempdir()) / f"kubetune-preempt-{os.getpid()}"
    preempt_file.unlink(missing_ok=True)
    os.environ[C.ENV_PREEMPT_FILE] = str(preempt_file)  # inherited by the workers: exists once this launcher is preempted
    # torchrun's own SIGTERM handler would forward the signal before anyone can tell the ranks it is a preemption:
    # the launcher keeps SIGTERM (torchrun still stops the ranks with SIGTERM on its way out) and torchrun the rest.
    handled = getattr(args, "signals_to_handle", None) or os.environ.get(_ENV_SIGNALS) or "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    handled = ",".join(s.strip() for s in handled.split(",") if s.strip() and s.strip() != "SIGTERM")
    os.environ[_ENV_SIGNALS] = handled  # torchrun sets it from its --signals-to-handle option where it has one
    if hasattr(args, "signals_to_handle"):
        args.signals_to_handle = handled
    if getattr(args, "shutdown_timeout", 0) is None:  # where torchrun has it: how long it waits for the ranks to exit
        args.shutdown_timeout = C.PREEMPT_SAVE_TIMEOUT_S  # they finish a step and save a checkpoint first

    def on_term(signum: int, frame: Any) -> None:
        if not _cancel_requested(run_dir):
            preempt_file.touch()
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        torchrun.run(args)
        return 0
    except ChildFailedError as e:
        print(str(e), file=sys.stderr, flush=True)  # torch's table of every failed rank
        failures = _failures(e)
        if failures and all(f.preempted for f in failures):  # another node was preempted; every rank saved and left
            _record_end(run_dir, C.STATE_PREEMPTED, failures[0].message, exit_code=128 + signal.SIGTERM)
            return 128 + signal.SIGTERM
        first, reason = failure_reason(failures, collective_timeout=job.resources.collective_timeout_seconds if job else None)
        code = 2 if first.exitcode == 2 else 1
        print(f"error: {reason}", file=sys.stderr, flush=True)
        _record_end(run_dir, C.STATE_FAILED, reason, exit_code=code, failed_rank=first.rank)
        return code
    except (DistStoreError, RendezvousError) as e:  # the nodes never all met: no rank started
        limit = f" within {job.resources.rendezvous_timeout_seconds} s (resources.rendezvous_timeout_seconds)" if job else ""
        print(
            f"error: the nodes did not all join{limit}: {str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}\n"
            f"  hint: start the other node(s) with the same --nnodes, --master-addr and --master-port and their own "
            f"--node-rank, and check that they can reach {args.master_addr}:{args.master_port}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except (_Terminated, SignalException, KeyboardInterrupt) as e:  # a signal reached the launcher
        signum = int(getattr(e, "signum", getattr(e, "sigval", signal.SIGINT)))
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM and not _cancel_requested(run_dir):
            _record_end(run_dir, C.STATE_PREEMPTED, _preempted_reason(run_dir, name), exit_code=128 + signum)
        else:
            _record_end(run_dir, C.STATE_CANCELLED, f"received signal {name}")
        return 128 + signum
    finally:
        signal.signal(signal.SIGTERM, previous)
        preempt_file.unlink(missing_ok=True)


def _cancel_requested(run_dir: Path | None) -> bool:
    """``kubetune cancel`` asked for this launcher's SIGTERM (see :func:`kubetune.preemption.request_cancel`)."""
    from .preemption import sigterm_kind

    return run_dir is not None and sigterm_kind(run_dir) == "cancel"


def _preempted_reason(run_dir: Path | None, signal_name: str) -> str:
    """The preempted state's reason: which checkpoint the ranks saved (the newest complete one)."""
    from .training.checkpoints import complete_checkpoints

    newest = complete_checkpoints(run_dir / C.CHECKPOINTS_DIR) if run_dir is not None else []
    saved = f"the newest complete checkpoint is {newest[-1].name}" if newest else "no checkpoint was saved"
    return f"preempted (the launcher received {signal_name}): {saved}; rerun the same spec to resume"


class _Terminated(Exception):
    """A signal reached the launcher (raised by its SIGTERM handler to stop torchrun's wait)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# The modules whose ranks this launcher follows: the worker, and the KFP task that runs an entrypoint job's function
# (`-m kubetune.backends.kfp.stages custom --spec FILE --run-dir DIR`, backends/kfp/stages.py).
_RANK_MODULES = ("kubetune.worker", "kubetune.backends.kfp.stages")


def _job_of(args: argparse.Namespace) -> tuple[Any, Path | None]:
    """The job and run directory named by the worker's arguments (None, None when it cannot be told)."""
    if not (args.module and args.training_script in _RANK_MODULES):
        return None, None
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--spec")
    p.add_argument("--spec-from-env", action="store_true")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--run-dir")
    known, _ = p.parse_known_args(args.training_script_args)
    source: Any = known.spec
    if known.spec_from_env:  # the local backend's way (worker.py); left in the environment for the workers
        try:
            source = json.loads(os.environ.get(C.ENV_WORKER_SPEC) or "")
        except ValueError:
            source = None
    if not source:
        return None, None
    from .spec import load_spec

    try:
        job = load_spec(source, known.overrides)
    except KubetuneError:
        return None, Path(known.run_dir) if known.run_dir else None  # the workers report the spec error
    return job, Path(known.run_dir) if known.run_dir else job.output_dir


def _record_end(run_dir: Path | None, state: str, reason: str, **extra: Any) -> None:
    """Record the job's end, if this launcher owns the run directory and the job has not ended already."""
    if run_dir is None:
        return
    from .events import EventType, RunDir, make_event

    run = RunDir(run_dir, echo=os.environ.get(C.ENV_EVENT_STDOUT) == "1")
    st = run.read_status()
    if st is None or st.extra.get("launcher_pid") != os.getpid():
        return  # rank 0 runs under another launcher (another node), or never started
    if st.state == C.STATE_SUCCEEDED:  # rank 0 finished and published; a later failure does not undo that
        run.emit(make_event(EventType.WARNING, f"after the job succeeded: {reason}"))
        return
    if st.terminal and st.state == state:
        return
    if state == C.STATE_FAILED:
        run.emit(make_event(EventType.ERROR, reason))
    run.set_state(state, reason=reason, **extra)


def main(argv: list[str] | None = None) -> int:
    """``python -m kubetune.launch [torchrun options] -m kubetune.worker --spec FILE [...]``: :func:`launch`, with
    credentials redacted from what it prints.

    Returns:
        The exit code (see :func:`launch`).
    """
    from .redact import install

    install(stdout=True, stderr=True)  # torch's failure table repeats the ranks' errors: no credential in it
    return launch(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
