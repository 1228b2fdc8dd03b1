"""The worker: fetch -> prepare data -> train -> publish. The only code that trains.

Every backend runs this, as ``kubetune worker --spec FILE`` or ``python -m kubetune.worker --spec FILE``
(torchrun launches the module form once per process). Only rank 0 writes the run directory.
Each stage is also a plain function (:func:`fetch_inputs`, :func:`prepare_data`, ...) that init
containers, KFP components and tests call on their own.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import constants as C
from . import distributed, preemption
from .errors import KubetuneError, SourceError
from .events import RunDir, make_event
from .preemption import Preempted
from .spec import TuneJob, dump_spec, load_spec

__all__ = ["run_worker", "fetch_inputs", "materialize", "prepare_data", "publish", "main"]

log = logging.getLogger("kubetune.worker")


def run_worker(job: TuneJob, run_dir: str | os.PathLike | None = None, *, job_id: str | None = None) -> int:
    """Run the whole job in this process and return an exit code (0 ok, 2 user error, 1 bug).

    The run directory records every step; its final state is succeeded, failed, cancelled or preempted
    (a SIGTERM that was not a user's cancel: a checkpoint is saved at the next step boundary first, exit 143).
    """
    distributed.follow_launcher()  # a rank never outlives the launcher that started it
    rank = int(os.environ.get("RANK", "0"))
    is_main = rank == 0
    run = RunDir(run_dir or job.output_dir, echo=os.environ.get(C.ENV_EVENT_STDOUT) == "1")
    if is_main:
        run.init()
        for stale in (run.done_file, run.result_file):
            stale.unlink(missing_ok=True)
        run.spec_file.write_text(dump_spec(job), encoding="utf-8")
        run.set_state(C.STATE_RUNNING, job_id=job_id, worker_pid=os.getpid(), **distributed.state_extra())
    _install_signal_handlers(run if is_main else None, run.path)
    sync = None
    try:
        started = time.time()
        _stage(run, is_main, C.STAGE_FETCH, "fetching model and data")
        inputs = fetch_inputs(job)
        sync = _output_sync(job, run, is_main)
        _stage(run, is_main, C.STAGE_PREPARE, "preparing data")
        tokenizer, prepared = prepare_data(job, inputs, run if is_main else None)
        _stage(run, is_main, C.STAGE_TRAIN, "training")
        from .training.sft import run_sft

        metrics = run_sft(job, inputs["model"], prepared, run, tokenizer=tokenizer, sync=sync)
        if is_main:
            _stage(run, is_main, C.STAGE_PUBLISH, "publishing results")
            metrics["data"] = prepared.stats
            metrics["total_seconds"] = round(time.time() - started, 2)
            publish(job, run, inputs, metrics, sync=sync)
            run.set_state(C.STATE_SUCCEEDED)
            run.emit(make_event("done", "job succeeded"))
            run.mark_done()
        return 0
    except Preempted as e:
        if sync is not None:  # the checkpoint's upload to output.uri, within what is left of the grace period
            sync.close(timeout=preemption.seconds_left())
            sync = None
        return _preempted(run, is_main, e)
    except KubetuneError as e:
        if is_main:
            run.emit(make_event("error", str(e)))
            if not distributed.launcher_records_state():  # else the launcher records the first failing rank's error
                run.set_state(C.STATE_FAILED, reason=str(e), exit_code=2)
        distributed.record_error(str(e))
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # a bug: keep the traceback in the log, the reason in the status
        traceback.print_exc()
        reason = f"{type(e).__name__}: {e}"
        if is_main:
            run.emit(make_event("error", reason))
            if not distributed.launcher_records_state():
                run.set_state(C.STATE_FAILED, reason=reason, exit_code=1)
        distributed.record_error(reason, traceback.format_exc())
        return 1
    finally:
        if sync is not None:
            sync.close(timeout=600)


def _stage(run: RunDir, is_main: bool, stage: str, message: str) -> None:
    print(f"[kubetune] {message}", flush=True)
    if is_main:
        run.emit(make_event("stage", message, stage=stage))


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
        run.emit(make_event("warning", str(e), path=ckpt, step=e.step, preempted=True))
        if not distributed.launcher_records_state():
            run.set_state(C.STATE_PREEMPTED, reason=str(e), exit_code=128 + signal.SIGTERM, checkpoint=ckpt)
    distributed.record_error(str(e), preempted=True)
    return 128 + signal.SIGTERM


# --- stages ----------------------------------------------------------------------------------
def materialize(uri: str) -> Path:
    """A model or dataset URI as a local path (builtin models are generated, remote ones fetched)."""
    if uri.startswith(f"{C.BUILTIN_SCHEME}://"):
        from .training.builtin import materialize as builtin

        return builtin(uri.split("://", 1)[1].strip("/"))
    if "://" not in uri or uri.startswith("file://"):
        p = Path(uri.removeprefix("file://")).expanduser()
        if not p.exists():
            raise SourceError(f"{uri}: no such file or directory", hint="check the path (relative paths resolve against the current directory, then the spec's)")
        return p
    from . import storage

    return storage.fetch(uri)


def fetch_inputs(job: TuneJob) -> dict[str, Path | None]:
    """Fetch the model and datasets; returns local paths under keys model, dataset, eval_dataset."""
    model_uri = job.model.source
    if job.model.revision and model_uri.startswith("hf://") and "@" not in model_uri:
        model_uri = f"{model_uri}@{job.model.revision}"
    return {
        "model": materialize(model_uri),
        "dataset": materialize(job.dataset.source),
        "eval_dataset": materialize(job.dataset.eval_source) if job.dataset.eval_source else None,
    }


def prepare_data(job: TuneJob, inputs: dict, run: RunDir | None) -> tuple[Any, Any]:
    """Load the tokenizer and turn the dataset into trainer-ready rows."""
    from .data import prepare_datasets
    from .training.sft import load_tokenizer

    tokenizer = load_tokenizer(job, inputs["model"])
    prepared = prepare_datasets(
        job,
        tokenizer,
        source=inputs["dataset"],
        eval_source=inputs.get("eval_dataset"),
        log=(lambda m: run.emit(make_event("stage", m, stage=C.STAGE_PREPARE, **{}))) if run else (lambda m: None),
        warn=(lambda m: run.emit(make_event("warning", m, stage=C.STAGE_PREPARE))) if run else None,
    )
    if run is not None:
        run.emit(make_event("metrics", "data prepared", data=prepared.stats))
    return tokenizer, prepared


def publish(job: TuneJob, run: RunDir, inputs: dict, metrics: dict, *, sync: Any = None) -> None:
    """Write result.json, merge when asked, and upload to output.uri."""
    if job.output.merge and job.method.type != "full":
        from .training.merge import merge_run

        merge_run(run.path, base_model=inputs["model"], trust_remote_code=job.model.trust_remote_code)
        run.emit(make_event("stage", "merged adapter into merged/", stage=C.STAGE_PUBLISH))
    run.write_result(metrics)
    if sync is not None:
        sync.publish(run.path)
        run.emit(make_event("stage", f"published to {job.output.uri}", stage=C.STAGE_PUBLISH))


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
    """``python -m kubetune.worker --spec FILE [--set k=v ...] [--run-dir DIR] [--job-id ID]``."""
    p = argparse.ArgumentParser(prog="kubetune worker", description="Run one job in this process.")
    p.add_argument("--spec", required=True, help="job spec YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="override a field, e.g. training.epochs=1")
    p.add_argument("--run-dir", default=None, help="run directory (default: output.dir of the spec)")
    p.add_argument("--job-id", default=os.environ.get(C.ENV_JOB_ID))
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        job = load_spec(a.spec, a.overrides)
    except KubetuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_worker(job, a.run_dir, job_id=a.job_id)


if __name__ == "__main__":
    sys.exit(main())
