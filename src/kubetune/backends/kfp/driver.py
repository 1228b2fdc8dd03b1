"""Local mode's driver process: runs the job's pipeline with the KFP local runner, on this machine.

``python -m kubetune.backends.kfp.driver --run-dir DIR --job-id ID`` is what :class:`KfpBackend` starts
(in its own session, output to ``logs/worker.log``). It builds the pipeline, points
``kfp.local.SubprocessRunner(use_venv=False)`` at ``DIR/kfp`` as the pipeline root (so every task's KFP
artifacts sit in the run directory), and calls the pipeline: each component runs as a subprocess of this
one with this Python environment, and writes its events into the run directory itself. This process
only records the start and, when a task died without recording why, the failure.

The job comes from ``$KUBETUNE_WORKER_SPEC`` when :class:`KfpBackend` set it (the spec as submitted; the run
directory's spec.yaml is the redacted copy), else from spec.yaml. The driver's output (the log) is redacted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import time
import traceback

from ... import constants as C
from ...errors import KubetuneError
from ...events import RunDir
from ...spec import load_spec

__all__ = ["run_local_pipeline", "main"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_local_pipeline(run: RunDir, *, job_id: str | None = None) -> int:
    """Run the pipeline of the spec in ``run`` with the KFP local runner; return 0 when the job succeeded.

    The run directory's final state is succeeded (written by the publish component), or failed with the
    reason a component recorded, or with the local runner's own message when no component could.
    """
    try:
        job = load_spec(_submitted_spec() or run.spec_file)
        from kfp import local

        from .pipeline import build_pipeline, pipeline_arguments

        pipeline = build_pipeline(job, local=True)
        root = run.path / C.KFP_LOCAL_ROOT
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
        run.start(job_id=job_id, kfp_pipeline_root=str(root), kfp_mode="local")
        pipeline(**pipeline_arguments(job, run.path))
    except KubetuneError as e:
        _fail(run, str(e), 2)
        return 2
    except Exception as e:  # the local runner reports a failed task as RuntimeError; anything else is a bug
        failed_task = isinstance(e, RuntimeError) and "finished with status" in str(e)
        if failed_task:  # raise_on_error makes the runner raise its failure line instead of logging it: log it here
            print(f"{time.strftime('%H:%M:%S')} - ERROR - {_ANSI.sub('', str(e))}", file=sys.stderr, flush=True)
        else:
            traceback.print_exc()
        _fail(run, _ANSI.sub("", str(e)), 1)
        return 1
    st = run.read_status()
    if st is None or not st.terminal:
        _fail(run, "the pipeline ended without publishing a result (see logs/worker.log)", 1)
        return 1
    return 0 if st.state == C.STATE_SUCCEEDED else 1


def _submitted_spec() -> dict | None:
    """The spec KfpBackend handed over in the environment (removed from it: the tasks get theirs as arguments)."""
    text = os.environ.pop(C.ENV_WORKER_SPEC, None)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _fail(run: RunDir, reason: str, code: int) -> None:
    """Record a failure unless a component already recorded one (its reason is the better one)."""
    run.fail(reason, code, unless_ended=True)


class _PlainText(io.TextIOBase):
    """A stream that drops the local runner's terminal colours on the way to the log file."""

    def __init__(self, target) -> None:
        self._target = target

    def write(self, text: str) -> int:
        self._target.write(_ANSI.sub("", text))
        return len(text)

    def flush(self) -> None:
        self._target.flush()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the driver process."""
    p = argparse.ArgumentParser(prog="kubetune-kfp-driver", description="Run a job's pipeline with the KFP local runner.")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--job-id", default=None)
    a = p.parse_args(argv)
    from ...redact import install

    sys.stdout, sys.stderr = _PlainText(sys.stdout), _PlainText(sys.stderr)
    install(stdout=True, stderr=True)  # the runner streams every task's output through here: logs/worker.log
    return run_local_pipeline(RunDir(a.run_dir), job_id=a.job_id)


if __name__ == "__main__":
    sys.exit(main())
