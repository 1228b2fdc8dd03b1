"""What the pipeline's components run: the worker's stages, between KFP artifacts and a run directory.

Each function here is called by one component of :mod:`.components` inside its task (a pod on a KFP
server, a subprocess under the local runner) and tells one step of the story:

    fetch_stage    worker.fetch_inputs -> model and data artifacts (a model tarball is unpacked)
    train_stage    worker.prepare_data + training.sft.run_sft -> the adapter (or full model) artifact
    merge_stage    training.merge.merge_run -> the merged model artifact
    publish_stage  worker.publish -> result.json, output.uri, the run record artifact, DONE

``run_dir`` is kubetune's run directory when the tasks share this machine's file system (local mode:
``kubetune status``/``logs`` read it while the pipeline runs). On a server it is empty: each task works in
a scratch run directory and prints its events to stdout with the fixed prefix, so the pod logs alone
rebuild the status, and the outputs travel as artifacts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

from ... import constants as C
from ... import ranks
from ...errors import KubetuneError
from ...events import RunDir
from ...spec import TuneJob, dump_spec, load_spec
from ...spec.reader import parse_spec_text

__all__ = ["fetch_stage", "train_stage", "merge_stage", "publish_stage", "custom_stage", "main"]


def fetch_stage(
    spec_text: str,
    run_dir: str,
    *,
    model_uri: str,
    dataset_uri: str,
    eval_dataset_uri: str,
    model_dir: str,
    dataset_dir: str,
    eval_dir: str,
) -> None:
    """Fetch the model and datasets (the pipeline's URI parameters win over the spec's) into artifact folders.

    Raises:
        SystemExit: the stage failed (recorded in the run directory first).
    """
    run = _open_run(run_dir)
    with _stage_failures(run):
        job = load_spec(parse_spec_text(spec_text, "the pipeline's spec parameter")[0]).with_overrides(
            {"model.source": model_uri, "dataset.source": dataset_uri, "dataset.eval_source": eval_dataset_uri or None}
        )
        _stage(run, C.STAGE_FETCH, "fetching model and data")
        from ...worker import fetch_inputs

        inputs = fetch_inputs(job)
        _place_model(inputs["model"], Path(model_dir))
        _place_data(inputs["dataset"], Path(dataset_dir))
        if inputs.get("eval_dataset") is not None:
            _place_data(inputs["eval_dataset"], Path(eval_dir))
        else:
            Path(eval_dir).mkdir(parents=True, exist_ok=True)  # an artifact must exist; empty means "none"
        run.stage(C.STAGE_FETCH, f"fetched {model_uri} and {dataset_uri}")


def train_stage(spec_text: str, run_dir: str, *, model_dir: str, dataset_dir: str, eval_dir: str, trained_dir: str) -> dict:
    """Prepare the data and train; copy the adapter (or full model) into ``trained_dir``; return the metrics.

    More than one process (``resources.processes_per_node``) re-runs this stage under torchrun.
    """
    job = load_spec(parse_spec_text(spec_text, "the pipeline's spec parameter")[0])
    if job.resources.world_size > 1 and "RANK" not in os.environ:
        return _train_torchrun(job, spec_text, run_dir, model_dir=model_dir, dataset_dir=dataset_dir, eval_dir=eval_dir,
                               trained_dir=trained_dir)
    is_main = ranks.is_main_process()
    run = _open_run(run_dir)
    inputs: dict[str, Any] = {
        "model": Path(model_dir),
        "dataset": _data_source(Path(dataset_dir)),
        "eval_dataset": _data_source(Path(eval_dir)) if job.dataset.eval_source else None,
    }
    sync = None
    with _stage_failures(run if is_main else None):
        if is_main and job.output.uri:
            from ...storage import OutputSync

            sync = OutputSync(job.output.uri)
            if job.training.resume == "auto":
                from ...training.checkpoints import pull_checkpoint

                pull_checkpoint(sync, run)  # verified after the download, like the local ones
        try:
            from ...worker import check_device, prepare_data, set_cpu_threads

            check_device(job, run, is_main)
            threads = set_cpu_threads(job)
            if threads is not None:
                _stage(run if is_main else None, C.STAGE_PREPARE, threads)
            _stage(run if is_main else None, C.STAGE_PREPARE, "preparing data")
            tokenizer, prepared = prepare_data(job, inputs, run if is_main else None)
            if is_main:  # the new run has proven it can start: only now is an earlier result replaced
                for stale in (run.done_file, run.result_file):
                    stale.unlink(missing_ok=True)
            _stage(run if is_main else None, C.STAGE_TRAIN, "training")
            from ...training.sft import run_sft

            reference = None
            if job.method.objective == "dpo" and job.method.dpo.reference:  # a full DPO fine-tune's frozen reference
                from ...storage import fetch

                reference = fetch(job.method.dpo.reference)
            metrics = run_sft(job, inputs["model"], prepared, run, tokenizer=tokenizer, sync=sync, reference_path=reference)
        finally:
            if sync is not None:
                sync.close(timeout=600)
        metrics["data"] = prepared.stats
        if is_main:
            _link_tree(run.path / (C.MODEL_DIR if job.method.type == "full" else C.ADAPTER_DIR), Path(trained_dir))
        return metrics


def merge_stage(spec_text: str, run_dir: str, *, model_dir: str, trained_dir: str, merged_dir: str) -> None:
    """Merge the trained adapter into the base model; the result goes to ``merged_dir`` (and the run directory)."""
    run = _open_run(run_dir)
    with _stage_failures(run):
        job = load_spec(parse_spec_text(spec_text, "the pipeline's spec parameter")[0])
        _stage(run, C.STAGE_PUBLISH, "merging the adapter into the base model")
        adapter = run.path / C.ADAPTER_DIR
        if not adapter.is_dir():
            _link_tree(Path(trained_dir), adapter)
        from ...training.merge import merge_run

        merged = merge_run(run.path, base_model=model_dir, trust_remote_code=job.model.trust_remote_code)
        _link_tree(merged, Path(merged_dir))
        run.stage(C.STAGE_PUBLISH, "merged adapter into merged/")


def publish_stage(
    spec_text: str,
    run_dir: str,
    *,
    metrics_json: str,
    trained_dir: str,
    record_dir: str,
    merged_dir: str | None = None,
) -> None:
    """Write result.json, upload to output.uri, copy the run record to ``record_dir``, then mark the run done."""
    run = _open_run(run_dir)
    with _stage_failures(run):
        job = load_spec(parse_spec_text(spec_text, "the pipeline's spec parameter")[0])
        _stage(run, C.STAGE_PUBLISH, "publishing results")
        artifact = C.MODEL_DIR if job.method.type == "full" else C.ADAPTER_DIR
        if not (run.path / artifact).is_dir():
            _link_tree(Path(trained_dir), run.path / artifact)
        if merged_dir and not (run.path / C.MERGED_DIR).is_dir():
            _link_tree(Path(merged_dir), run.path / C.MERGED_DIR)
        if not run.spec_file.is_file():
            run.spec_file.write_text(dump_spec(job), encoding="utf-8")
        metrics = json.loads(metrics_json)
        st = run.read_status()
        if st is not None and st.started_at:
            metrics["total_seconds"] = round(time.time() - st.started_at, 2)
        sync = None
        if job.output.uri:
            from ...storage import OutputSync

            sync = OutputSync(job.output.uri)
        from ...worker import publish

        # The merge already ran as its own task; publish only writes and uploads.
        unmerged = job.model_copy(update={"output": job.output.model_copy(update={"merge": False})})
        try:
            publish(unmerged, run, {"model": None}, metrics, sync=sync)
        finally:
            if sync is not None:
                sync.close(timeout=600)
        record = Path(record_dir)
        for name in (C.ADAPTER_DIR, C.MODEL_DIR, C.MERGED_DIR, C.RESULT_FILE, C.SPEC_FILE):
            if (run.path / name).exists():
                _link_tree(run.path / name, record / name)
        run.succeed()
        for name in (C.STATUS_FILE, C.EVENTS_FILE, C.DONE_FILE):  # copies: the run directory keeps its own
            shutil.copy2(run.path / name, record / name)


# --- the run directory and failures -----------------------------------------------------------
def _open_run(run_dir: str) -> RunDir:
    from ...quiet import disable_library_progress_bars, quiet_library_notices

    quiet_library_notices()  # a stage's output is a log, like the worker's
    disable_library_progress_bars()
    if run_dir:
        run = RunDir(run_dir, echo=os.environ.get(C.ENV_EVENT_STDOUT) == "1")
    else:  # on a server: a scratch run directory, events echoed to the pod log
        run = RunDir(tempfile.mkdtemp(prefix="kubetune-run-"), echo=True)
    run.init()
    return run


def _stage(run: RunDir | None, stage: str, message: str) -> None:
    if run is not None:
        run.stage(stage, message, say=True)
    else:
        print(f"[kubetune] {message}", flush=True)


@contextlib.contextmanager
def _stage_failures(run: RunDir | None) -> Iterator[None]:
    """Record a failing stage in the run directory (error event, failed state) and end the task with its code.

    A user's mistake (KubetuneError) exits 2 with one message; a bug keeps its traceback and exits 1.
    """
    try:
        yield
    except KubetuneError as e:
        _record_failure(run, str(e), 2)
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except Exception as e:
        traceback.print_exc()
        _record_failure(run, f"{type(e).__name__}: {e}", 1)
        raise SystemExit(1) from None


def _record_failure(run: RunDir | None, reason: str, code: int) -> None:
    if run is None:
        return
    run.fail(reason, code)


# --- files between artifacts ------------------------------------------------------------------
def _place_model(src: Path, dest: Path) -> None:
    """A model directory, or a model tarball unpacked (seed 000's ``*.tar.gz``), into ``dest``."""
    from ...storage.uri import archive_kind

    if src.is_file() and archive_kind(src.name):
        from ... import storage

        with tempfile.TemporaryDirectory(prefix="kubetune-unpack-", dir=dest.parent) as tmp:
            root = storage.fetch(str(src), Path(tmp) / "model")  # safe unpacking; one top folder is returned itself
            _link_tree(root, dest)
        return
    _link_tree(src, dest)


def _place_data(src: Path, dest: Path) -> None:
    """A dataset file (keeping its name, whose suffix tells its type) or folder into ``dest``."""
    if src.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        _link_tree(src, dest / src.name)
    else:
        _link_tree(src, dest)


def _data_source(folder: Path) -> Path:
    """The dataset a data artifact holds: its one file, or the folder."""
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []
    return entries[0] if len(entries) == 1 and entries[0].is_file() else folder


def _link_tree(src: Path, dest: Path) -> None:
    """Hard-link ``src`` (a file or folder) to ``dest``, copying where links are impossible (other file systems)."""
    if src.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
        return
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            _link_tree(path, target)
    dest.mkdir(parents=True, exist_ok=True)


# --- several processes: the train stage under torchrun ----------------------------------------
def _train_torchrun(job: TuneJob, spec_text: str, run_dir: str, **dirs: str) -> dict:
    env = dict(os.environ)
    if C.ENV_OMP_NUM_THREADS not in env:  # torchrun's OMP_NUM_THREADS=1 is not the user's: the ranks choose (kubetune.cpu)
        env[C.ENV_THREADS_AUTO] = "1"
    if not run_dir:  # on a server: one scratch directory for every rank, events echoed to the pod log
        run_dir, env[C.ENV_EVENT_STDOUT] = tempfile.mkdtemp(prefix="kubetune-run-"), "1"
    with tempfile.TemporaryDirectory(prefix="kubetune-train-") as tmp:
        spec_file, metrics_file = Path(tmp) / "spec.yaml", Path(tmp) / "metrics.json"
        spec_file.write_text(spec_text, encoding="utf-8")
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={job.resources.processes_per_node}", "--max-restarts=0",
            "-m", "kubetune.backends.kfp.stages", "train", "--spec", str(spec_file), "--run-dir", run_dir,
            "--metrics-out", str(metrics_file), *[f"--{k.replace('_', '-')}={v}" for k, v in dirs.items()],
        ]
        code = subprocess.call(cmd, env=env)
        if code != 0:
            raise SystemExit(code)  # the ranks recorded the failure
        return json.loads(metrics_file.read_text(encoding="utf-8"))


# --- an entrypoint job: the user's function ------------------------------------------------------
def custom_stage(spec_text: str, run_dir: str, *, entrypoint_code: str, record_dir: str) -> dict:
    """Run the user's function (``spec.entrypoint``) on ``resources.processes_per_node`` processes (kubetune's launcher
    when more than one, which names the rank that failed first), then copy the run record into ``record_dir``.

    Each rank runs :func:`kubetune.worker.run_custom`, as the worker does on the other backends. The function's code
    (``entrypoint_code``, a JSON string) is written to a file of this task's own, which the spec's ``entrypoint.file`` names.

    Raises:
        SystemExit: the function failed (recorded in the run directory first).
    """
    job = load_spec(parse_spec_text(spec_text, "the pipeline's spec parameter")[0])
    env = dict(os.environ)
    if not run_dir:  # on a server: a scratch run directory, events echoed to the pod log
        run_dir, env[C.ENV_EVENT_STDOUT] = tempfile.mkdtemp(prefix="kubetune-run-"), "1"
    with tempfile.TemporaryDirectory(prefix="kubetune-custom-") as tmp:
        if job.entrypoint.module is None:
            code_file = Path(tmp) / (Path(job.entrypoint.file or C.K8S_ENTRYPOINT_KEY).name or C.K8S_ENTRYPOINT_KEY)  # the name, never a path
            code_file.write_text(json.loads(entrypoint_code), encoding="utf-8")  # a JSON string (pipeline.pipeline_arguments)
            job = job.with_overrides({"entrypoint.file": str(code_file)})
        spec_file = Path(tmp) / C.SPEC_FILE
        spec_file.write_text(json.dumps(job.model_dump(mode="json")), encoding="utf-8")
        rank_cmd = ["-m", "kubetune.backends.kfp.stages", "custom", "--spec", str(spec_file), "--run-dir", run_dir]
        n = job.resources.processes_per_node
        if n > 1:
            if C.ENV_OMP_NUM_THREADS not in env:  # torchrun's OMP_NUM_THREADS=1 is not the user's (kubetune.cpu)
                env[C.ENV_THREADS_AUTO] = "1"
            cmd = [sys.executable, "-m", "kubetune.launch", "--standalone", f"--nproc-per-node={n}", "--max-restarts=0", *rank_cmd]
        else:
            cmd = [sys.executable, *rank_cmd]
        code = subprocess.call(cmd, env=env)
    run = RunDir(run_dir)
    record = Path(record_dir)
    record.mkdir(parents=True, exist_ok=True)
    for name in (C.SPEC_FILE, C.RESULT_FILE, C.STATUS_FILE, C.EVENTS_FILE, C.DONE_FILE):
        if (run.path / name).is_file():
            shutil.copy2(run.path / name, record / name)
    if code != 0:
        raise SystemExit(code)  # the ranks (or the launcher) recorded the failure
    return run.read_result() or {}


def _custom_rank(spec_file: str, run_dir: str) -> int:
    """One rank of :func:`custom_stage`: the function, with failures recorded as the worker records them."""
    from ...training import distributed
    from ...worker import check_device, run_custom

    is_main = ranks.is_main_process()
    run = _open_run(run_dir)
    try:
        job = load_spec(spec_file)
        if is_main:  # the launcher's pid in the status: it records the first failing rank's error as the job's reason
            if not run.spec_file.is_file():  # on a server; locally the submitter wrote the spec as submitted
                run.spec_file.write_text(dump_spec(job), encoding="utf-8")
            run.start(worker_pid=os.getpid(), **distributed.state_extra())
        check_device(job, run, is_main)  # a task without the accelerators it asked for fails now, as in the worker
        return run_custom(job, run, is_main=is_main, started=time.time())
    except KubetuneError as e:
        reason, code = str(e), 2
        print(f"error: {e}", file=sys.stderr, flush=True)
    except Exception as e:
        traceback.print_exc()
        reason, code = f"{type(e).__name__}: {e}", 1
    if is_main:  # under kubetune's launcher, the launcher records the first failing rank's error as the state
        run.fail(reason, code, state=not distributed.launcher_records_state())
    distributed.record_error(reason)
    return code


def main(argv: list[str] | None = None) -> int:
    """``python -m kubetune.backends.kfp.stages (train|custom) ...``: one rank of a multi-process train stage, or one
    process of an entrypoint job's task."""
    p = argparse.ArgumentParser(prog="kubetune-kfp-stage")
    p.add_argument("stage", choices=["train", "custom"])
    p.add_argument("--spec", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--metrics-out")
    for name in ("model-dir", "dataset-dir", "eval-dir", "trained-dir"):
        p.add_argument(f"--{name}")
    a = p.parse_args(argv)
    if a.stage == "custom":
        return _custom_rank(a.spec, a.run_dir)
    metrics = train_stage(Path(a.spec).read_text(encoding="utf-8"), a.run_dir, model_dir=a.model_dir,
                          dataset_dir=a.dataset_dir, eval_dir=a.eval_dir, trained_dir=a.trained_dir)
    if ranks.is_main_process():
        Path(a.metrics_out).write_text(json.dumps(metrics, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
