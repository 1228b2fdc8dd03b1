"""A user's own training function (``spec.entrypoint``, ``kubetune.train(func=...)``): how it is loaded and run on
every rank, and the small API it reports through.

The worker calls :func:`run_entrypoint` in each process torchrun starts (one process: no torchrun). The function
gets its ``entrypoint.args`` as keyword arguments and reads where it stands from :func:`context` (rank, world size,
run directory, the checkpoint to resume from). It reports with :func:`report` and :func:`report_checkpoint`: on
rank 0 these become ``metrics`` and ``checkpoint`` events in the run directory (and, on clusters, event lines on
stdout), on the other ranks they do nothing, so every rank may call them. What the function returns on rank 0
goes into result.json. A function that raises fails the job: its traceback goes to the log, one line to the status.

The function is the user's code and runs with the job's privileges. kubetune itself never imports a dotted path from
a spec for its own machinery; this is the one place it runs code a spec names, because the user asked it to.
"""

from __future__ import annotations

import builtins
import dis
import importlib
import importlib.util
import inspect
import json
import linecache
import math
import os
import sys
import textwrap
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import constants as C
from .. import ranks
from ..errors import SpecError, TrainError
from ..events import EventType, RunDir, make_event

__all__ = ["RunContext", "context", "report", "report_checkpoint", "run_entrypoint", "load_function", "function_source"]


@dataclass(frozen=True)
class RunContext:
    """Where the running function stands (:func:`context`).

    Attributes:
        rank: this process's global rank (0 .. world_size-1).
        local_rank: its rank on this node (its accelerator index).
        world_size: processes in the whole job.
        run_dir: the job's run directory (None outside a kubetune job).
        checkpoint_dir: where to save checkpoints (``run_dir/checkpoints``; None outside a job).
        resume_from: the newest checkpoint an earlier run of this job reported and that still exists, or the path
            ``training.resume`` names; None for a fresh start (and with ``training.resume: never``).
        job_name: the job's name.
    """

    rank: int
    local_rank: int
    world_size: int
    run_dir: Path | None
    checkpoint_dir: Path | None
    resume_from: Path | None
    job_name: str | None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process whose reports are recorded."""
        return self.rank == 0


_active: dict[str, Any] = {"run": None, "context": None, "last": {}}
# Progress fields a metrics event carries that status.json and `kubetune status` show (events.JobStatus.apply).
_PROGRESS_FIELDS = ("total_steps", "epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_second")


# --- the API a training function calls ----------------------------------------------------------
def context() -> RunContext:
    """Where the running function stands: rank, world size, run directory, the checkpoint to resume from.

    Outside a kubetune job (the function called directly, e.g. in a unit test) the ranks come from the environment
    (rank 0 of 1 when unset) and the directories are None.
    """
    ctx = _active["context"]
    if ctx is not None:
        return ctx
    return RunContext(ranks.rank(), ranks.local_rank(), ranks.world_size(), None, None, None, None)


def report(
    step: int | None = None,
    *,
    loss: float | None = None,
    metrics: Mapping[str, float] | None = None,
    **progress: float,
) -> None:
    """Record progress: a ``metrics`` event in the run directory, shown by ``kubetune status`` and folded into result.json.

    Only rank 0's reports are recorded; on other ranks (and outside a kubetune job) this does nothing, so every rank
    may call it.

    Args:
        step: the training step this report is about (status shows step/total_steps).
        loss: the training loss.
        metrics: any other numbers by name, e.g. ``{"accuracy": 0.93}``.
        **progress: fields status.json knows: ``total_steps``, ``epoch``, ``eval_loss``, ``learning_rate``,
            ``grad_norm``, ``tokens_per_second``.

    Raises:
        TypeError: a value is not a finite number, or an unknown keyword was given.
    """
    unknown = sorted(set(progress) - set(_PROGRESS_FIELDS))
    if unknown:
        raise TypeError(f"kubetune.report() got unknown field(s) {', '.join(unknown)}: put them in metrics={{...}}; "
                        f"known fields: step, loss, {', '.join(_PROGRESS_FIELDS)}")
    data: dict[str, Any] = {}
    if step is not None:
        data["step"] = _number("step", step, integer=True)
    if loss is not None:
        data["loss"] = _number("loss", loss)
    for key, value in progress.items():
        if value is not None:
            data[key] = _number(key, value, integer=key == "total_steps")
    if metrics:
        data["metrics"] = {str(k): _number(f"metrics[{k!r}]", v) for k, v in metrics.items()}
    run: RunDir | None = _active["run"]
    if run is None or not data:
        return
    last = _active["last"]
    last.update({k: v for k, v in data.items() if k != "metrics"})
    last.setdefault("metrics", {}).update(data.get("metrics", {}))
    shown = ", ".join(f"{k} {v:g}" for k, v in [*((k, v) for k, v in data.items() if k != "metrics"), *data.get("metrics", {}).items()])
    run.emit(make_event(EventType.METRICS, shown, **data))


def report_checkpoint(path: str | os.PathLike, *, step: int | None = None) -> Path:
    """Record a complete checkpoint the function saved: a rerun of the job finds it as ``context().resume_from``.

    Call it after the checkpoint is fully written (rank 0's call is recorded; other ranks' calls do nothing).

    Args:
        path: the checkpoint file or directory (relative paths are taken from the current directory).
        step: the step it holds.

    Returns:
        The checkpoint's absolute path.

    Raises:
        FileNotFoundError: rank 0 reports a path that does not exist.
    """
    p = Path(path).expanduser().absolute()
    run: RunDir | None = _active["run"]
    if run is None:
        return p
    if not p.exists():
        raise FileNotFoundError(f"kubetune.report_checkpoint(): {p} does not exist; report a checkpoint after saving it")
    data: dict[str, Any] = {"path": str(p)}
    if step is not None:
        data["step"] = _number("step", step, integer=True)
        _active["last"]["step"] = data["step"]
    _active["last"]["checkpoint"] = str(p)
    run.emit(make_event(EventType.CHECKPOINT, f"saved {p.name}", **data))
    return p


def _number(name: str, value: Any, *, integer: bool = False) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"kubetune.report(): {name} must be a number, got {type(value).__name__}")
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # a 0-d tensor or numpy scalar
        value = value.item()
    number = int(value) if integer else float(value)
    if not math.isfinite(number):
        raise TypeError(f"kubetune.report(): {name} must be finite, got {number}")
    return number


# --- running the function in the worker --------------------------------------------------------
def run_entrypoint(job: Any, run: RunDir, *, is_main: bool) -> dict:
    """Load ``job.entrypoint``'s function, call it with its args in this process, and return what result.json holds.

    Args:
        job: the validated job (``job.entrypoint`` set).
        run: the run directory (every rank reads it; only rank 0 writes).
        is_main: this is rank 0.

    Returns:
        ``function``, the last reported ``step``/``loss``/progress and ``metrics``, the last ``checkpoint``, and
        ``returned``: the function's return value when it is JSON data.

    Raises:
        SpecError: the file, module or function cannot be found (naming the field).
        TrainError: loading or running the function raised (its traceback is printed to the log first).
    """
    spec = job.entrypoint
    os.environ.update(spec.env)
    func = load_function(spec)
    ctx = RunContext(
        rank=ranks.rank(), local_rank=ranks.local_rank(), world_size=ranks.world_size(), run_dir=run.path,
        checkpoint_dir=run.path / C.CHECKPOINTS_DIR, resume_from=_resume_from(job, run), job_name=job.name,
    )
    if is_main:
        ctx.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if ctx.resume_from is not None:
            run.emit(make_event(EventType.CHECKPOINT, f"resuming from {ctx.resume_from}", path=str(ctx.resume_from), resume=True))
    _active.update(run=run if is_main else None, context=ctx, last={})
    try:
        returned = _call(func, spec)
        last = dict(_active["last"])
    finally:
        _active.update(run=None, context=None, last={})
    _wait_for_every_rank(job)
    result: dict[str, Any] = {"function": spec.describe(), **last}
    if returned is not None:
        try:
            json.dumps(returned, allow_nan=False)
            result["returned"] = returned
        except (TypeError, ValueError):
            result["returned"] = repr(returned)[:1000]  # not JSON data: its text, so the record still says what it was
    return result


def _call(func: Callable, spec: Any) -> Any:
    """The function's return value; whatever it raises becomes one TrainError line after its traceback is printed."""
    try:
        return func(**spec.args)
    except SystemExit as e:  # sys.exit() inside the function: 0/None is a normal end
        if e.code in (0, None):
            return None
        raise TrainError(f"the training function {spec.describe()} exited with {e.code}") from None
    except Exception as e:
        traceback.print_exc()
        sys.stderr.flush()
        raise TrainError(f"the training function {spec.describe()} raised {_one_line(e)} (traceback in the job's log)") from None


def _wait_for_every_rank(job: Any) -> None:
    """With several processes, rank 0 publishes only once every rank's function returned: a rank that fails instead
    ends the job (torchrun stops the others, and kubetune's launcher names that rank), never after a success was recorded.

    The barrier is a counter in torchrun's own key-value store (the agent's, which every rank reaches at
    MASTER_ADDR:MASTER_PORT), not a process group: the function may have used NCCL, destroyed its group, or never made
    one, and a second default group on the same store is not safe. Without the agent's store (torchrun older than 2.0,
    or not torchrun) there is no barrier.
    """
    if ranks.world_size() <= 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    from datetime import timedelta

    from torch.distributed import TCPStore

    timeout = timedelta(seconds=job.resources.collective_timeout_seconds)
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    key = f"kubetune/entrypoint-returned/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if store.add(f"{key}/count", 1) == ranks.world_size():
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"], timeout)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _resume_from(job: Any, run: RunDir) -> Path | None:
    """``training.resume``: never -> None; a path -> it (it must exist); auto -> the newest reported checkpoint still on disk."""
    how = job.training.resume
    if how == "never":
        return None
    if how != "auto":
        p = Path(how).expanduser()
        if not p.exists():
            raise SpecError(f"training.resume: {how} does not exist", hint="name a checkpoint the function saved, or use auto or never")
        return p.absolute()
    newest = None
    for ev in run.iter_events():
        data = ev.get("data") or {}
        if ev.get("type") == EventType.CHECKPOINT and data.get("path") and not data.get("removed") and not data.get("resume"):
            newest = data["path"]
    if newest is None or not Path(newest).exists():
        return None
    return Path(newest)


def load_function(spec: Any) -> Callable:
    """The callable ``spec`` (an EntrypointSpec) names: loaded from its file, its module or its source.

    A file's folder goes first on ``sys.path``, so the file may import its neighbours.

    Raises:
        SpecError: no such file or module, a syntax error in the source, or no such function in it.
        TrainError: importing the code raised (its traceback is printed first).
    """
    if spec.module is not None:
        module = _import_module(spec.module)
    elif spec.file is not None:
        module = _load_file(Path(spec.file).expanduser(), spec)
    else:
        module = _load_source(spec.source, spec)
    func = getattr(module, spec.function, None)
    if func is None:
        where = spec.module or spec.file or "entrypoint.source"
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__)
        raise SpecError(f"entrypoint.function: {where} defines no '{spec.function}'",
                        hint=f"functions there: {', '.join(defined)}" if defined else "define it at the module's top level")
    if not callable(func):
        raise SpecError(f"entrypoint.function: '{spec.function}' in {spec.describe()} is not a function")
    return func


def _import_module(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise SpecError(f"entrypoint.module: no module named {name} here",
                            hint="install it into the image (or this environment), or ship a file with entrypoint.file") from None
        raise _load_failed(f"entrypoint.module {name}", e) from None
    except Exception as e:
        raise _load_failed(f"entrypoint.module {name}", e) from None


def _load_file(path: Path, spec: Any) -> types.ModuleType:
    if not path.is_file():
        raise SpecError(f"entrypoint.file: no such file: {path}", hint="relative paths resolve against the current directory, then the spec file's")
    loader_spec = importlib.util.spec_from_file_location(C.ENTRYPOINT_MODULE_NAME, path)
    if loader_spec is None or loader_spec.loader is None:
        raise SpecError(f"entrypoint.file: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[C.ENTRYPOINT_MODULE_NAME] = module  # pickling (multiprocessing, torch.save) finds the function's module
    sys.path.insert(0, str(path.parent.absolute()))
    try:
        loader_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise SpecError(f"entrypoint.file: {path}:{e.lineno}: {e.msg}") from None
    except Exception as e:
        raise _load_failed(f"entrypoint.file {path.name}", e) from None
    return module


def _load_source(source: str, spec: Any) -> types.ModuleType:
    filename = C.ENTRYPOINT_SOURCE_FILENAME.format(function=spec.function)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show its lines
    module = types.ModuleType(C.ENTRYPOINT_MODULE_NAME)
    module.__file__ = filename
    sys.modules[C.ENTRYPOINT_MODULE_NAME] = module
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        raise SpecError(f"entrypoint.source: line {e.lineno}: {e.msg}") from None
    try:
        exec(code, module.__dict__)
    except Exception as e:
        raise _load_failed("entrypoint.source", e) from None
    return module


def _load_failed(what: str, e: Exception) -> TrainError:
    traceback.print_exc()
    sys.stderr.flush()
    hint = " (add it to entrypoint.packages, or install it into the image)" if isinstance(e, ImportError) else ""
    return TrainError(f"loading {what} raised {_one_line(e)}{hint} (traceback in the job's log)")


# --- the SDK: a function object into entrypoint.source ------------------------------------------
def function_source(func: Callable) -> str:
    """The source of ``func`` to ship as ``entrypoint.source``: a plain, self-contained function.

    Raises:
        SpecError: ``func`` is not a plain function (a lambda, a method, a closure, a builtin), its source cannot be
            read (defined at an interactive prompt), or it uses names of its module, which are not shipped with it.
    """
    if not inspect.isfunction(func) or func.__name__ == "<lambda>":
        raise SpecError(f"func: {func!r} is not a plain function", hint="pass a function defined with def")
    if func.__code__.co_freevars:
        raise SpecError(f"func: {func.__name__} uses variables of the function around it ({', '.join(func.__code__.co_freevars)})",
                        hint="define it at module level and pass values with func_args")
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise SpecError(f"func: the source of {func.__name__} cannot be read ({e})",
                        hint="define it in a file (not at an interactive prompt), or use entrypoint: {file: ..., function: ...}") from None
    outside = sorted(_global_names(func.__code__) - set(vars(builtins)) - {func.__name__})
    if outside:
        raise SpecError(
            f"func: {func.__name__} uses {', '.join(outside)} from its module, which is not shipped with it",
            hint="only the function's own source travels: import modules inside it (def main(): import torch, kubetune ...) "
            "and pass values with func_args",
        )
    return source


def _global_names(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return {n for n in names if isinstance(n, str)}
