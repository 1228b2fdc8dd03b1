"""The worker: fetch -> prepare data -> train -> publish. The only code that trains.

Every backend runs this, as ``kubetune worker --spec FILE`` or ``python -m kubetune.worker --spec FILE``
(torchrun launches the module form once per process). Only rank 0 writes the run directory.
Each stage is also a plain function (:func:`fetch_inputs`, :func:`prepare_data`, ...) that init
containers, KFP components and tests call on their own.

The local backend passes ``--spec-from-env`` instead of ``--spec``: the resolved spec, credentials in its
URIs included, arrives as JSON in ``$KUBETUNE_WORKER_SPEC`` (the run directory's spec.yaml is redacted, so
the worker cannot take its URIs from there). Everything the worker prints, logs or records is redacted
(:mod:`kubetune.redact`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import constants as C
from . import preemption, ranks
from .errors import BackendError, KubetuneError
from .events import EventType, RunDir, RunLock, disk_error_reason, make_event
from .preemption import Preempted
from .spec import TuneJob, dump_spec, load_spec
from .training import distributed

__all__ = ["run_worker", "run_custom", "previous_run", "finished_run_message", "check_device", "set_cpu_threads", "fetch_inputs", "prepare_data", "publish", "main"]

log = logging.getLogger("kubetune.worker")


def run_worker(job: TuneJob, run_dir: str | os.PathLike | None = None, *, job_id: str | None = None) -> int:
    """Run the whole job in this process and return an exit code (0 ok, 2 user error, 1 bug).

    The run directory records every step; its final state is succeeded, failed, cancelled or preempted
    (a SIGTERM that was not a user's cancel: a checkpoint is saved at the next step boundary first, exit 143).
    Rank 0 holds the run directory's lock for its whole life (a second worker on the same directory exits 2
    naming the holder's pid). A run directory that holds a finished run is never destroyed on the way in: the
    same spec has nothing to do (exit 0), another spec is refused (exit 2) unless ``training.resume=never``.
    """
    distributed.follow_launcher()  # a rank never outlives the launcher that started it
    is_main = ranks.is_main_process()
    run = RunDir(run_dir or job.output_dir, echo=os.environ.get(C.ENV_EVENT_STDOUT) == "1")
    handed_down = bool(os.environ.get(C.ENV_RUN_LOCK_FD))  # a local submitter checked the run dir and holds its lock
    lock = None
    try:
        if not handed_down:
            verdict, diffs = previous_run(job, run)
            if verdict == "same":
                print(f"[kubetune] {run.path} already holds a finished run of this spec: nothing to do "
                      "(training.resume=never trains again from scratch)", flush=True)
                return 0
            if verdict == "different":
                raise BackendError(finished_run_message(run, diffs), hint=FINISHED_RUN_HINT)
        if is_main:
            lock = _take_lock(run)
            (run.path / C.CANCEL_REQUEST_FILE).unlink(missing_ok=True)  # a cancel of an earlier run is not this one's
            run.spec_file.write_text(dump_spec(job), encoding="utf-8")
            run.start(job_id=job_id, worker_pid=os.getpid(), **distributed.state_extra())
    except KubetuneError as e:  # nothing of this run was recorded: the directory belongs to someone else
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:
        print(f"error: cannot write the run directory: {disk_error_reason(e, run.path) or e}\n"
              f"  hint: choose an output.dir on a writable file system with free space", file=sys.stderr, flush=True)
        return 2
    _install_signal_handlers(run if is_main else None, run.path)
    sync = None
    try:
        started = time.time()
        check_device(job, run, is_main)  # before fetching gigabytes: a pod without its GPUs fails now
        if job.entrypoint is not None:  # the user's own training function instead of fetch -> prepare -> train
            return run_custom(job, run, is_main=is_main, started=started)
        threads = set_cpu_threads(job)
        if threads is not None:
            _stage(run, is_main, C.STAGE_FETCH, threads)
        _stage(run, is_main, C.STAGE_FETCH, "fetching model and data")
        inputs = fetch_inputs(job)
        sync = _output_sync(job, run, is_main)
        _stage(run, is_main, C.STAGE_PREPARE, "preparing data")
        tokenizer, prepared = prepare_data(job, inputs, run if is_main else None)
        if is_main:  # the new run has proven it can start: only now is an earlier result replaced
            for stale in (run.done_file, run.result_file):
                stale.unlink(missing_ok=True)
        _stage(run, is_main, C.STAGE_TRAIN, "training")
        from .training.sft import run_sft

        metrics = run_sft(job, inputs["model"], prepared, run, tokenizer=tokenizer, sync=sync, reference_path=inputs.get("reference"))
        if is_main:
            _stage(run, is_main, C.STAGE_PUBLISH, "publishing results")
            metrics["data"] = prepared.stats
            metrics["cpu_threads"] = _torch_threads()
            metrics["total_seconds"] = round(time.time() - started, 2)
            publish(job, run, inputs, metrics, sync=sync)
            run.succeed()
        return 0
    except Preempted as e:
        if sync is not None:  # the checkpoint's upload to output.uri, within what is left of the grace period
            sync.close(timeout=preemption.seconds_left())
            sync = None
        return _preempted(run, is_main, e)
    except KubetuneError as e:
        _record_failure(run, is_main, str(e), 2)
        distributed.record_error(str(e))
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:
        disk = disk_error_reason(e, run.path)
        if disk is not None:  # the disk filled (or went read-only) under the run: the user's to fix, not a bug
            message = f"{disk}\n  hint: free space there or choose an output.dir with room for checkpoints and the model"
            _record_failure(run, is_main, message, 2)
            distributed.record_error(message)
            print(f"error: {message}", file=sys.stderr, flush=True)
            return 2
        traceback.print_exc()  # a bug: keep the traceback in the log, the reason in the status
        reason = f"{type(e).__name__}: {e}"
        _record_failure(run, is_main, reason, 1)
        distributed.record_error(reason, traceback.format_exc())
        return 1
    finally:
        if sync is not None:
            sync.close(timeout=600)
        if lock is not None:
            lock.release()


def run_custom(job: TuneJob, run: RunDir, *, is_main: bool, started: float) -> int:
    """``entrypoint``: call the user's function on this rank (:mod:`kubetune.training.custom`); rank 0 publishes what it
    reported and returned (result.json, output.uri, DONE). Raises what the function's run raises: :func:`run_worker` (and
    the KFP stage) record failures and handle signals as for the built-in fine-tune. Returns 0."""
    from .training.custom import run_entrypoint

    threads = set_cpu_threads(job)
    if threads is not None:
        _stage(run, is_main, C.STAGE_TRAIN, threads)
    sync = None
    if job.output.uri and is_main:  # the run record is published there at the end (checkpoints are the function's own)
        from .storage import OutputSync

        sync = OutputSync(job.output.uri)
    try:
        if is_main:  # a new run replaces an earlier run's result only once it runs
            for stale in (run.done_file, run.result_file):
                stale.unlink(missing_ok=True)
        _stage(run, is_main, C.STAGE_TRAIN, f"running {job.entrypoint.describe()} on {ranks.world_size()} process(es)")
        result = run_entrypoint(job, run, is_main=is_main)
        if is_main:
            _stage(run, is_main, C.STAGE_PUBLISH, "publishing results")
            result["total_seconds"] = round(time.time() - started, 2)
            publish(job, run, {}, result, sync=sync)
            run.succeed()
        return 0
    finally:
        if sync is not None:
            sync.close(timeout=600)


def _take_lock(run: RunDir) -> "RunLock | None":
    """The run directory's lock for this worker: the one its submitter handed down, else a fresh one.

    Under the kubetune launcher started by a local submitter the launcher holds the handed-down lock for its
    ranks; a worker started any other way (a pod, ``kubetune worker``, a hand-started launcher) takes it here.
    """
    run.init()
    inherited = RunLock.inherited(run.lock_file)
    if inherited is not None:
        return inherited
    if os.environ.get(C.ENV_RUN_LOCK_FD) and distributed.launcher_records_state():
        return None
    return run.lock()


def _record_failure(run: RunDir, is_main: bool, reason: str, code: int) -> None:
    """Record ``reason`` as the job's failure; on a full disk, free what is garbage anyway and try once more."""
    if not is_main:
        return
    for attempt in (1, 2):
        try:
            # under the kubetune launcher, the launcher records the first failing rank's error as the state
            run.fail(reason, code, state=not distributed.launcher_records_state())
            return
        except OSError as e:
            if attempt == 2:
                print(f"error: could not record the failure in {run.path}: {e}", file=sys.stderr, flush=True)
                return
            _free_garbage(run)


def _free_garbage(run: RunDir) -> None:
    """Remove what no reader would ever use: unfinished checkpoints and temporary files."""
    import shutil

    from .training.checkpoints import incomplete_checkpoints

    for p in incomplete_checkpoints(run.checkpoints_dir):
        shutil.rmtree(p, ignore_errors=True)
    for tmp in run.path.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


# --- a run directory that already holds a run --------------------------------------------------
FINISHED_RUN_HINT = "rerun with --restart (training.resume=never) to start over there, or choose another output.dir"
# How to treat earlier checkpoints, and how many CPU threads compute it, are not part of what a run is.
_IGNORED_FOR_RERUN = (("training", "resume"), ("training", "cpu_threads"))


def previous_run(job: TuneJob, run: RunDir) -> tuple[str, list[str]]:
    """What the run directory holds, compared with ``job``: ``("none"|"same"|"different", differing fields)``.

    ``same``: a finished run (DONE and result.json) of this very spec; ``different``: a finished run of
    another spec, with the fields that differ (``training.epochs: 20 -> 1``). With ``training.resume=never``
    the answer is always ``none``: the user asked to start over.
    """
    if job.training.resume == "never":
        return "none", []
    saved = run.finished_spec()
    if saved is None:
        return "none", []
    import yaml

    try:
        before = yaml.safe_load(saved)
    except yaml.YAMLError:
        before = None
    now = yaml.safe_load(dump_spec(job))
    for section, key in _IGNORED_FOR_RERUN:
        for d in (before, now):
            if isinstance(d, dict) and isinstance(d.get(section), dict):
                d[section].pop(key, None)
    if not isinstance(before, dict):
        return "different", ["spec.yaml: unreadable"]
    diffs = _diff(before, now)
    return ("same", []) if not diffs else ("different", diffs)


def finished_run_message(run: RunDir, diffs: list[str]) -> str:
    """The one line that says why a rerun on a finished run with another spec is refused."""
    shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    return f"{run.path} holds a finished run of a different spec ({shown}); nothing was changed"


def _diff(before: Any, now: Any, prefix: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(now, dict):
        out: list[str] = []
        for key in list(dict.fromkeys([*before, *now])):
            out += _diff(before.get(key), now.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if before == now else [f"{prefix}: {_short(before)} -> {_short(now)}"]


def _short(value: Any) -> str:
    text = "unset" if value is None else str(value)
    return text if len(text) <= 48 else "..." + text[-45:]  # a path's end tells paths apart


def _stage(run: RunDir, is_main: bool, stage: str, message: str) -> None:
    if is_main:
        run.stage(stage, message, say=True)
    else:
        print(f"[kubetune] {message}", flush=True)


def _install_signal_handlers(run: RunDir | None, run_path: Path) -> None:
    def on_term(signum, frame):
        if preemption.in_progress():  # the checkpoint is being saved; the grace period's SIGKILL is the hard stop
            print("[kubetune] SIGTERM again: still saving the preemption checkpoint", flush=True)
            return
        kind = preemption.sigterm_kind(run_path)
        if kind == "preempt" and preemption.request(signum):
            print("[kubetune] SIGTERM: saving a checkpoint at the end of this step, then stopping", flush=True)
            return  # the training loop checkpoints at its next step boundary; run_worker records `preempted`
        if run is not None and not distributed.launcher_records_state():  # else that launcher records it
            try:
                run.set_state(*distributed.terminated_state(signum, kind))
            except Exception:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def _preempted(run: RunDir, is_main: bool, e: Preempted) -> int:
    """Record a preemption (rank 0, unless the launcher that started the ranks does) and return the exit code."""
    print(f"[kubetune] {e}", flush=True)
    if is_main:
        ckpt = str(e.checkpoint) if e.checkpoint else None
        run.emit(make_event(EventType.WARNING, str(e), path=ckpt, step=e.step, preempted=True))
        if not distributed.launcher_records_state():
            run.set_state(C.STATE_PREEMPTED, reason=str(e), exit_code=128 + signal.SIGTERM, checkpoint=ckpt)
    distributed.record_error(str(e), preempted=True)
    return 128 + signal.SIGTERM


# --- stages ----------------------------------------------------------------------------------
def check_device(job: TuneJob, run: RunDir, is_main: bool) -> None:
    """Compare ``resources.accelerators`` with the device this process sees; warnings become events (rank 0).

    Raises:
        TrainError: in a Kubernetes pod, the spec asks for accelerators and the pod sees none.
    """
    from .training.devices import check_accelerators, device_info

    for warning in check_accelerators(job.resources, device_info()):
        if is_main:
            run.emit(make_event(EventType.WARNING, warning))
            print(f"[kubetune] warning: {warning}", flush=True)


def set_cpu_threads(job: TuneJob) -> str | None:
    """Before anything heavy runs: on a CPU, give torch the threads :mod:`kubetune.cpu` chooses (the spec's
    ``training.cpu_threads``, else ``OMP_NUM_THREADS``, else the free cores) and return the line that says
    how many and why; on an accelerator, leave torch's default and return None (or a note that the field is ignored)."""
    from .training.devices import device_info, is_accelerator

    if is_accelerator(device_info()):
        return f"training.cpu_threads={job.training.cpu_threads} is ignored: training on an accelerator" if job.training.cpu_threads else None
    from .cpu import apply_threads, cpu_threads

    choice = cpu_threads(job.training.cpu_threads)
    apply_threads(choice)
    return choice.describe()


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process (recorded in result.json as ``cpu_threads``; None on an accelerator)."""
    import torch

    from .training.devices import device_info, is_accelerator

    return None if is_accelerator(device_info()) else torch.get_num_threads()


def fetch_inputs(job: TuneJob) -> dict[str, Path | None]:
    """Fetch the model and datasets (:func:`kubetune.storage.fetch`); returns local paths under keys model,
    dataset, eval_dataset, reference (``method.dpo.reference``). ``model.revision`` wins over an ``@REV`` in the model's URI (``ModelSpec.pinned_source``)."""
    from .storage import fetch

    return {
        "model": fetch(job.model.pinned_source),
        "dataset": fetch(job.dataset.source),
        "eval_dataset": fetch(job.dataset.eval_source) if job.dataset.eval_source else None,
        "reference": fetch(job.method.dpo.reference) if job.method.objective == "dpo" and job.method.dpo.reference else None,
    }


def prepare_data(job: TuneJob, inputs: dict, run: RunDir | None) -> tuple[Any, Any]:
    """Load the tokenizer and turn the dataset into trainer-ready rows."""
    from .data import prepare_datasets
    from .training.sft import load_tokenizer

    tokenizer = load_tokenizer(job, inputs["model"])
    if job.dataset.preprocess is not None:  # the user's function over the rows first (cached like prepared data)
        from .data.preprocess import preprocess_inputs

        inputs = preprocess_inputs(job, inputs, log=(lambda m: run.stage(C.STAGE_PREPARE, m)) if run else (lambda m: None))
    if job.method.preference:  # prompt / chosen / rejected pairs for DPO and ORPO
        from .data.preference import prepare_preference as prepare_datasets  # noqa: F811 - same signature
    prepared = prepare_datasets(
        job,
        tokenizer,
        source=inputs["dataset"],
        eval_source=inputs.get("eval_dataset"),
        log=(lambda m: run.stage(C.STAGE_PREPARE, m)) if run else (lambda m: None),
        warn=(lambda m: run.emit(make_event(EventType.WARNING, m, stage=C.STAGE_PREPARE))) if run else None,
    )
    if run is not None:
        run.emit(make_event(EventType.METRICS, "data prepared", data=prepared.stats))
    return tokenizer, prepared


def publish(job: TuneJob, run: RunDir, inputs: dict, metrics: dict, *, sync: Any = None) -> None:
    """Write result.json, merge when asked, and upload to output.uri."""
    if job.output.merge and job.method.type != "full":
        from .training.merge import merge_run

        merge_run(run.path, base_model=inputs["model"], trust_remote_code=job.model.trust_remote_code)
        run.stage(C.STAGE_PUBLISH, "merged adapter into merged/")
    run.write_result(metrics)
    if sync is not None:
        sync.publish(run.path)
        run.stage(C.STAGE_PUBLISH, f"published to {job.output.uri}")


def _output_sync(job: TuneJob, run: RunDir, is_main: bool):
    if not job.output.uri or not is_main:
        return None
    from .storage import OutputSync

    sync = OutputSync(job.output.uri)
    if job.training.resume == "auto":
        from .training.checkpoints import pull_checkpoint

        pull_checkpoint(sync, run)  # verified after the download, like the local ones
    return sync


# --- entry point -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m kubetune.worker (--spec FILE | --spec-from-env) [--set k=v ...] [--run-dir DIR] [--job-id ID]``."""
    p = argparse.ArgumentParser(prog="kubetune worker", description="Run one job in this process.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", help="job spec YAML")
    src.add_argument("--spec-from-env", action="store_true", help=f"read the resolved spec (JSON) from ${C.ENV_WORKER_SPEC}")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="override a field, e.g. training.epochs=1")
    p.add_argument("--run-dir", default=None, help="run directory (default: output.dir of the spec)")
    p.add_argument("--job-id", default=os.environ.get(C.ENV_JOB_ID))
    a = p.parse_args(argv)
    from .redact import install

    install(stdout=True, stderr=True)  # logs/worker.log: no credential from any print, traceback or logger
    from .quiet import disable_library_progress_bars, quiet_library_notices

    quiet_library_notices()  # worker.log holds kubetune's lines and warnings, not library notices
    disable_library_progress_bars()  # nor tqdm bars (kubetune's progress events say the same)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        job = load_spec(_spec_from_env() if a.spec_from_env else a.spec, a.overrides)
    except KubetuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_worker(job, a.run_dir, job_id=a.job_id)


def _spec_from_env() -> dict:
    """The spec the local backend handed over in ``$KUBETUNE_WORKER_SPEC``, removed from the environment so that
    no process this worker starts inherits it.

    Raises:
        SpecError: the variable is missing or not a JSON object.
    """
    from .errors import SpecError

    text = os.environ.pop(C.ENV_WORKER_SPEC, None)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise SpecError(f"--spec-from-env: ${C.ENV_WORKER_SPEC} holds no job spec",
                        hint="this option is for the local backend's worker; run a spec file with --spec FILE")
    return data


if __name__ == "__main__":
    sys.exit(main())
