"""Hyperparameter sweeps: grid, random and TPE search, each trial an ordinary job on any backend.

:func:`run_sweep` is the story: plan the trials from the job's ``sweep:`` section, take the sweep
directory's lock, skip the trials that already succeeded, submit the others (at most ``parallel`` at once)
through :class:`kubetune.client.Client`, follow them, stop clearly bad ones (median rule), and write the
reports. The sweep directory holds ``sweep.json`` (written atomically, only by the process holding the
lock) and ``trials/<trial>/``, one run directory per trial. A rerun therefore finds every trial where the
last run left it: succeeded trials are skipped, interrupted ones are submitted again into the same run
directory and continue from their newest complete checkpoint (``training.resume: auto``). A new run id
names new trials and starts fresh.

With ``sampler: tpe`` the plan grows as the sweep runs: :class:`kubetune.sweep.optuna_search.OptunaSearch`
chooses each next trial when a slot frees, from the Optuna study kept in ``optuna.db`` in the sweep directory,
and is told every result; with ``early_stopping.rule: hyperband`` or ``successive_halving`` its pruner decides
which running trials to stop.

Trials share what the worker caches under the kubetune home (builtin and fetched models; the fetch cache
locks an entry so parallel trials download it once), since every trial is a plain job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import constants as C
from ..errors import BackendError, JobNotFound, KubetuneError, SpecError
from ..events import EventType, RunDir
from ..spec import SweepSpec, TuneJob, redacted_spec_dict
from .plan import (
    DURING_TRAINING,
    check_sweep,
    local_slots,
    median_stop,
    plan_values,
    sweep_dir_for,
    sweep_id_for,
    trial_name,
    trial_spec,
    values_text,
)
from .state import SWEEP_DONE, Sweep, Trial, list_sweeps, load_sweep, register, sweep_lock

__all__ = [
    "Sweep",
    "Trial",
    "run_sweep",
    "plan_values",
    "trial_name",
    "trial_spec",
    "sweep_id_for",
    "sweep_dir_for",
    "load_sweep",
    "list_sweeps",
    "refresh_sweep",
    "cancel_sweep",
    "trial_curves",
    "local_slots",
    "median_stop",
]


# --- the sweep -------------------------------------------------------------------------------
def run_sweep(
    job: TuneJob,
    *,
    backend: str = "local",
    run_id: str | None = None,
    backend_options: dict | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> Sweep:
    """Run (or continue) the sweep described by ``job.sweep`` and return its final state.

    Every trial is ``job`` with the trial's values applied, named ``<sweep id>-<values>``, with its own
    run directory under ``<sweep dir>/trials/``. Trials that succeeded in an earlier run are skipped; the
    others are submitted again and resume from their checkpoints. SIGTERM or Ctrl-C cancels the running
    trials (they resume on the next run) and raises KeyboardInterrupt.

    Args:
        job: the base job; its ``sweep`` section says what to vary, the objective and the parallelism.
        backend: where trials run: local, kubernetes or kfp.
        run_id: names this sweep (``<job name>-<run id>``); a new run id starts a fresh sweep.
        backend_options: passed to the backend (e.g. ``namespace`` for kubernetes).
        log: receives one line per thing that happens (submitted, finished, skipped, stopped).

    Returns:
        The sweep with every trial's state and objective; reports are in its directory.

    Raises:
        SpecError: the sweep section or a trial's spec is invalid, or the base spec changed since the sweep began.
        BackendError: the sweep is already running elsewhere, or the backend failed.
    """
    spec = job.sweep or SweepSpec()
    check_sweep(job, spec)
    if spec.uses_optuna:
        from .optuna_search import require_optuna

        require_optuna()  # before anything is written
    sweep_id = sweep_id_for(job, run_id)
    directory = sweep_dir_for(job, sweep_id)
    tpe = spec.search == C.SWEEP_SAMPLER_TPE  # TPE asks for its trials one at a time (kubetune.sweep.optuna_search)
    plan = [] if tpe else [(values, trial_spec(job, sweep_id, values, directory)) for values in plan_values(spec)]
    from ..client import Client

    client = Client(backend, **(backend_options or {}))  # an unknown backend fails here, before anything is written
    with sweep_lock(directory) as lock_ok:
        if not lock_ok:
            other = _try_load(directory)
            raise BackendError(
                f"sweep {sweep_id} is already running" + (f" (pid {other.pid})" if other and other.pid else ""),
                hint=f"follow it with kubetune sweep status {sweep_id}, or stop it with kubetune sweep cancel {sweep_id}",
            )
        search = None
        if spec.uses_optuna:
            from .optuna_search import OptunaSearch

            search = OptunaSearch(job, spec, sweep_id, directory)
            plan = search.plan() if tpe else plan
        sweep = _open_sweep(directory, sweep_id, job, spec, backend, plan)
        register(sweep)
        with _terminate_as_interrupt():
            try:
                _drive(sweep, client, job, spec, plan, log, search)
            except KeyboardInterrupt:
                _interrupt(sweep, client, log)
                raise
            finally:
                sweep.save()
    from .report import write_reports

    for note in write_reports(sweep, trial_curves(sweep, client)):
        log(note)
    return sweep


def _drive(sweep: Sweep, client: Any, job: TuneJob, spec: SweepSpec, plan: list, log: Callable[[str], None], search: Any = None) -> None:
    """Submit and follow the plan's trials until each has ended; record everything in ``sweep``.

    With ``search`` (an :class:`~kubetune.sweep.optuna_search.OptunaSearch`), TPE adds trials to the plan as
    slots free, Optuna's pruner may stop running trials, and the study is told how each trial ended.
    """
    specs = {tj.name: tj for _, tj in plan}
    queue: list[Trial] = []
    active: dict[str, Trial] = {}
    for values, tj in plan:
        trial = sweep.trial(tj.name)
        _refresh(trial, client, sweep.objective)
        if _never_started(trial):  # an earlier sweep process died while submitting it: submit it now
            trial.state, trial.reason = C.STATE_PENDING, None
            queue.append(trial)
        elif trial.state in SWEEP_DONE and _still_there(trial):
            log(f"{trial.name}: skipped ({trial.state} earlier" + (f", {sweep.objective}={trial.objective:.4g})" if trial.objective is not None else ")"))
            if search is not None:  # it may have ended while no sweep process listened
                search.finish(trial.name, trial.state, trial.objective)
        elif trial.state == C.STATE_RUNNING:
            active[trial.name] = trial  # still running from an earlier sweep process: follow it
            log(f"{trial.name}: still running from an earlier run, following it")
        elif search is not None and search.final(trial.name):
            log(f"{trial.name}: skipped ({trial.state} earlier; the Optuna study closed it as failed)")
        else:
            queue.append(trial)
    slots, notes = _slots(sweep.backend, job, spec, len(queue) + len(active) + (search.remaining() if search else 0))
    for note in notes:
        log(note)
    free = list(range(len(slots)))[len(active):]
    held: dict[str, int | None] = {name: (i if i < len(slots) else None) for i, name in enumerate(active)}
    sweep.state, sweep.pid = C.STATE_RUNNING, os.getpid()
    sweep.save()
    log(f"sweep {sweep.id}: {len(plan) + (search.remaining() if search else 0)} trials, {len(queue)} to run, {len(active)} running, {len(slots)} at once -> {sweep.dir}")
    while queue or active or (search and search.remaining()):
        while free and (queue or (search and search.remaining())):
            if not queue:  # TPE: the next trial, chosen from every result so far
                values, tj = search.ask()
                plan.append((values, tj))
                specs[tj.name] = tj
                sweep.trials.append(Trial(name=tj.name, values=values, run_dir=str(tj.output_dir)))
                queue.append(sweep.trials[-1])
            trial, slot = queue.pop(0), free.pop(0)
            if search is not None:
                trial.optuna = search.attach(trial.name)
            try:
                _submit(trial, specs[trial.name], client, slots[slot])
            except KubetuneError as e:  # this trial cannot start; the others still can
                trial.state, trial.reason, trial.finished_at = C.STATE_FAILED, f"could not be submitted: {e}", time.time()
                free.append(slot)
                log(f"{trial.name}: {trial.reason}")
                continue
            active[trial.name], held[trial.name] = trial, slot
            log(f"{trial.name}: submitted {values_text(trial.values)}" + (f" (attempt {trial.attempts})" if trial.attempts > 1 else ""))
            sweep.save()
        time.sleep(C.SWEEP_POLL_SECONDS)
        for name, trial in active.items():
            try:
                _refresh(trial, client, sweep.objective)
            except KubetuneError as e:  # a transient API error must not end the sweep
                log(f"{name}: could not read its status, trying again ({_short(str(e))})")
        if spec.early_stopping is not None:
            _early_stop(sweep, client, spec, active, search)
        for name, trial in list(active.items()):
            if trial.terminal:
                del active[name]
                slot = held.pop(name)
                if slot is not None:
                    free.append(slot)
                if _never_started(trial):
                    log(f"{name}: {trial.reason}; submitting it again")
                    trial.state, trial.reason = C.STATE_PENDING, None
                    queue.append(trial)
                    continue
                if search is not None:  # report its last steps too (they count for the pruners' rungs), then its result
                    search.should_stop(name, _history(trial, client, DURING_TRAINING.get(sweep.objective, sweep.objective)))
                    search.finish(name, trial.state, trial.objective)
                log(f"{name}: {trial.state}" + (f", {sweep.objective}={trial.objective:.4g}" if trial.objective is not None else "")
                    + (f" ({_short(trial.reason)})" if trial.reason and trial.state != C.STATE_SUCCEEDED else ""))
        sweep.save()
    planned = [sweep.trial(tj.name) for _, tj in plan]
    sweep.state = C.STATE_SUCCEEDED if all(t.state in SWEEP_DONE for t in planned) else C.STATE_FAILED
    sweep.pid = None
    best = sweep.best()
    log(f"sweep {sweep.id} {sweep.state}" + (f"; best {best.name} {values_text(best.values)} {sweep.objective}={best.objective:.4g}" if best else ""))


def _interrupt(sweep: Sweep, client: Any, log: Callable[[str], None]) -> None:
    """Cancel the trials still running; they resume from their checkpoints on the next run.

    Asks each unfinished trial's job rather than trusting ``sweep.json``: the interrupt may have come
    between a submission and its record.
    """
    for trial in sweep.trials:
        ref = trial.job or _ref_from_run_dir(trial)
        if trial.state in SWEEP_DONE or ref is None:
            continue
        try:
            if client.status(_ref(ref)).terminal:
                continue
            client.cancel(_ref(ref))
        except KubetuneError:
            continue
        trial.job = ref
        trial.state, trial.reason, trial.finished_at = C.TRIAL_INTERRUPTED, "the sweep was interrupted", time.time()
        log(f"{trial.name}: interrupted (rerun the sweep to resume it)")
    sweep.state, sweep.pid = C.TRIAL_INTERRUPTED, None


def _open_sweep(directory: Path, sweep_id: str, job: TuneJob, spec: SweepSpec, backend: str, plan: list) -> Sweep:
    """Load the sweep's state (checking the base spec is unchanged) or start it, and add the plan's new trials."""
    base = redacted_spec_dict(job)  # sweep.json is a record: no credential in it (nor in what it compares)
    base.pop("sweep", None)
    sweep = _try_load(directory)
    if sweep is None:
        sweep = Sweep(id=sweep_id, dir=str(directory), backend=backend, created_at=time.time(), base_spec=base)
    elif sweep.base_spec != base:
        changed = _changed_keys(sweep.base_spec, base)
        raise SpecError(
            f"sweep {sweep_id} was started with a different job spec (changed: {', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''}); "
            "its finished trials would not be comparable",
            hint="pass a new --run-id to start a fresh sweep, or restore the spec to continue this one",
        )
    elif sweep.backend != backend:
        raise SpecError(f"sweep {sweep_id} runs on the {sweep.backend} backend, not {backend}", hint=f"pass --backend {sweep.backend}, or a new --run-id")
    sweep.objective, sweep.direction = spec.objective, spec.direction
    sweep.sweep_spec = spec.model_dump(mode="json")
    sweep.params = list(dict.fromkeys([*sweep.params, *spec.grid, *spec.random]))
    for values, tj in plan:
        if sweep.trial(tj.name) is None:
            sweep.trials.append(Trial(name=tj.name, values=values, run_dir=str(tj.output_dir)))
    return sweep


# --- following trials ------------------------------------------------------------------------
def _submit(trial: Trial, job: TuneJob, client: Any, env: dict[str, str]) -> None:
    resumable = bool(job.training.resume == "auto" and trial.attempts and _has_checkpoint(trial))
    with _environ(env):
        ref = client.submit(job)
    trial.job = _ref_dict(ref)
    trial.state, trial.reason, trial.finished_at = C.STATE_RUNNING, None, None
    trial.attempts += 1
    trial.resumed += int(resumable)
    trial.started_at = time.time()
    trial.run_dir = ref.run_dir or trial.run_dir


def _refresh(trial: Trial, client: Any, objective: str) -> None:
    """Bring ``trial`` up to date from its job (state, progress, metrics, objective)."""
    if trial.job is None:
        trial.job = _ref_from_run_dir(trial)
        if trial.job is None:
            return
    if trial.state in (C.TRIAL_PRUNED,) or (trial.state == C.STATE_SUCCEEDED and trial.objective is not None and not _local_run(trial)):
        return  # decided by the sweep / already recorded (a cluster may have deleted the finished job)
    try:
        st = client.status(_ref(trial.job))
    except JobNotFound:
        if trial.state == C.STATE_RUNNING:
            trial.state, trial.reason = C.STATE_FAILED, "its job disappeared"
        return
    trial.step, trial.total_steps = st.step, st.total_steps or trial.total_steps
    if st.terminal:
        if not (trial.state == C.TRIAL_INTERRUPTED and st.state == C.STATE_CANCELLED):  # keep saying why it stopped
            trial.state = st.state
            trial.reason = st.reason
        trial.finished_at = st.finished_at or trial.finished_at or time.time()
    else:
        trial.state = C.STATE_RUNNING
    metrics = _metrics(trial, client)
    if metrics:
        trial.metrics = metrics
        value = metrics.get(objective)
        trial.objective = float(value) if isinstance(value, (int, float)) else None


def _metrics(trial: Trial, client: Any) -> dict[str, Any]:
    """Final metrics from result.json where the run directory is local; else the latest values the events report."""
    if trial.run_dir and trial.state == C.STATE_SUCCEEDED:
        result = RunDir(trial.run_dir).read_result()
        if result:
            return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out: dict[str, Any] = {}
    for ev in _events(trial, client):
        if ev.get("type") == EventType.METRICS:
            for k, v in (ev.get("data") or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = v
    if "loss" in out and trial.state == C.STATE_SUCCEEDED:
        out.setdefault("train_loss", out["loss"])
    return out


def trial_curves(sweep: Sweep, client: Any = None) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Per trial, ``{"loss": [(step, value), ...], "eval_loss": [...]}`` from its events.

    A resumed trial logged some steps twice; the later value of a step wins.
    """
    curves = {}
    for trial in sweep.trials:
        series: dict[str, dict[int, float]] = {"loss": {}, "eval_loss": {}}
        for ev in _events(trial, client):
            data = ev.get("data") or {}
            if ev.get("type") != EventType.METRICS or data.get("step") is None:
                continue
            for metric, points in series.items():
                if isinstance(data.get(metric), (int, float)):
                    points[int(data["step"])] = float(data[metric])
        curves[trial.name] = {m: sorted(p.items()) for m, p in series.items()}
    return curves


def _events(trial: Trial, client: Any) -> list[dict]:
    if _local_run(trial):
        return RunDir(trial.run_dir or "").read_events()
    if client is None or not trial.job:
        return []
    try:
        return client.events(_ref(trial.job))
    except KubetuneError:
        return []


# --- early stopping and local slots ----------------------------------------------------------
def _early_stop(sweep: Sweep, client: Any, spec: SweepSpec, active: dict[str, Trial], search: Any = None) -> None:
    """Cancel the running trials the median rule (or Optuna's pruner) condemns; they become ``pruned`` (and are not rerun)."""
    rule = spec.early_stopping
    assert rule is not None
    metric = DURING_TRAINING.get(sweep.objective, sweep.objective)
    if rule.rule != C.SWEEP_RULE_MEDIAN:
        for name, trial in active.items():
            verdict = None if trial.terminal else search.should_stop(name, _history(trial, client, metric))
            if verdict is not None:
                _stop(trial, client, f"stopped early at step {verdict[0]} by Optuna's {rule.rule} pruner ({metric} {verdict[1]:.4g})", verdict[1])
        return
    histories = {t.name: _history(t, client, metric) for t in sweep.trials if t.state != C.STATE_PENDING}
    for name, trial in active.items():
        if trial.terminal:
            continue
        others = [h for n, h in histories.items() if n != name]
        verdict = median_stop(histories.get(name, []), others, direction=sweep.direction, min_trials=rule.min_trials, grace_steps=rule.grace_steps)
        if verdict is None:
            continue
        best, median, step = verdict
        _stop(trial, client, f"stopped early at step {step}: best {metric} {best:.4g} is worse than the median {median:.4g} of other trials", best)


def _stop(trial: Trial, client: Any, reason: str, value: float) -> None:
    """Cancel a running trial and mark it ``pruned`` (its objective: ``value`` unless it had one)."""
    with contextlib.suppress(KubetuneError):
        client.cancel(_ref(trial.job or {}))
    trial.state, trial.finished_at, trial.reason = C.TRIAL_PRUNED, time.time(), reason
    trial.objective = trial.objective if trial.objective is not None else value


def _history(trial: Trial, client: Any, metric: str) -> list[tuple[int, float]]:
    points: dict[int, float] = {}
    for ev in _events(trial, client):
        data = ev.get("data") or {}
        if ev.get("type") == EventType.METRICS and data.get("step") is not None and isinstance(data.get(metric), (int, float)):
            points[int(data["step"])] = float(data[metric])
    return sorted(points.items())


def _slots(backend: str, job: TuneJob, spec: SweepSpec, trials: int) -> tuple[list[dict[str, str]], list[str]]:
    if backend != "local":
        return [{} for _ in range(spec.parallel or min(max(trials, 1), C.SWEEP_CLUSTER_PARALLEL))], []
    r = job.resources
    devices = _local_devices() if r.accelerators else []
    slots, notes = local_slots(spec.parallel, trials, cores=_cores(), devices=devices, accelerators=r.accelerators, processes=r.processes_per_node)
    if C.ENV_OMP_NUM_THREADS in os.environ:  # the user chose the threads per trial
        slots = [{k: v for k, v in s.items() if k not in (C.ENV_OMP_NUM_THREADS, C.ENV_MKL_NUM_THREADS)} for s in slots]
    return slots, notes


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _local_devices() -> list[str]:
    visible = os.environ.get(C.ENV_CUDA_VISIBLE_DEVICES)
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch  # only when trials ask for accelerators

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` while a trial is submitted: the local backend hands its environment to the worker."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- status and cancel -----------------------------------------------------------------------
def refresh_sweep(sweep: Sweep, client: Any = None) -> Sweep:
    """Bring every trial of ``sweep`` up to date from its job, and the sweep's own state from its lock.

    Saves ``sweep.json`` only when no sweep process is running (that process owns the file).
    """
    if client is None:
        from ..client import Client

        client = Client(sweep.backend)
    with sweep_lock(sweep.path) as free:
        running = not free  # released at once: a status must never keep a rerun from starting
    for trial in sweep.trials:
        if trial.state not in SWEEP_DONE or _local_run(trial):
            with contextlib.suppress(KubetuneError):
                _refresh(trial, client, sweep.objective)
    if running:
        sweep.state = C.STATE_RUNNING
        return sweep
    if sweep.state == C.STATE_RUNNING:
        sweep.state, sweep.pid = C.TRIAL_INTERRUPTED, None
    with sweep_lock(sweep.path) as free:
        if free:
            sweep.save()
    return sweep


def cancel_sweep(sweep: Sweep, client: Any = None, *, timeout: float = 60.0) -> Sweep:
    """Stop a running sweep: its process cancels its running trials (they resume on the next run)."""
    pid = sweep.pid
    if pid and _alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with sweep_lock(sweep.path) as free:
                if free:
                    break
            time.sleep(0.2)
    fresh = Sweep.load(sweep.path)
    if client is None:
        from ..client import Client

        client = Client(fresh.backend)
    with sweep_lock(fresh.path) as free:
        if free:  # no sweep process (or it died): cancel leftovers ourselves
            _interrupt(fresh, client, lambda m: None)
            fresh.save()
    return fresh


# --- helpers ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (kubetune sweep cancel, a pod being stopped) ends the sweep like Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the trials' cancellation short
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _try_load(directory: Path) -> Sweep | None:
    try:
        return Sweep.load(directory)
    except JobNotFound:
        return None


def _ref(d: dict):
    from ..backends.base import JobRef

    return JobRef(id=d["id"], backend=d.get("backend", "local"), name=d.get("name", ""), run_dir=d.get("run_dir"), extra=d.get("extra") or {})


def _ref_dict(ref: Any) -> dict:
    return {"id": ref.id, "backend": ref.backend, "name": ref.name, "run_dir": ref.run_dir, "extra": dict(ref.extra or {})}


def _ref_from_run_dir(trial: Trial) -> dict | None:
    """A job recorded only in its local run directory (the sweep stopped between submit and save)."""
    if not trial.run_dir:
        return None
    st = RunDir(trial.run_dir).read_status()
    if st is None or not st.job_id:
        return None
    return {"id": st.job_id, "backend": st.backend or "local", "name": st.name or trial.name, "run_dir": trial.run_dir, "extra": {}}


def _local_run(trial: Trial) -> bool:
    return bool(trial.run_dir) and (trial.job or {}).get("backend", "local") == "local" and RunDir(trial.run_dir or "").exists()


def _still_there(trial: Trial) -> bool:
    """A succeeded local trial whose run directory was deleted is run again."""
    if trial.state != C.STATE_SUCCEEDED or (trial.job or {}).get("backend", "local") != "local":
        return True
    return bool(trial.run_dir) and RunDir(trial.run_dir or "").is_done()


def _never_started(trial: Trial) -> bool:
    return trial.state == C.STATE_FAILED and trial.reason == C.REASON_NEVER_STARTED


def _has_checkpoint(trial: Trial) -> bool:
    ckpts = Path(trial.run_dir or "") / C.CHECKPOINTS_DIR
    return ckpts.is_dir() and any((p / C.CHECKPOINT_COMPLETE).is_file() for p in ckpts.iterdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _short(text: str | None, n: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if text and text.strip() else ""
    return line if len(line) <= n else line[: n - 1] + "…"


def _changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            out += _changed_keys(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".") or "(spec)"]
