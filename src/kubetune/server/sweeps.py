"""Sweeps submitted to the server: ``POST /v1/sweeps`` takes a kubetune spec with a ``sweep:`` section, plans its
trials exactly as ``kubetune sweep`` does (:mod:`kubetune.sweep.plan`) and queues each as a job of the project
(the per-project limit decides how many run at once); ``GET /v1/sweeps/{id}`` follows them and ranks the
finished ones by the sweep's objective; ``POST /v1/sweeps/{id}/cancel`` stops the rest."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request

from ..errors import SpecError
from ..serve.protocol import APIError
from .config import ServerConfig
from .native import MAX_SPEC_BYTES, _parse_spec, native_job
from .runner import TERMINAL, Runner
from .store import Store, new_id

__all__ = ["register", "sweep_object"]


def sweep_object(sw: dict, trials: list[dict]) -> dict:
    """The ``kubetune.sweep`` object: its trials (values, status, objective) and the best finished one."""
    objective, maximize = sw["objective"], sw["direction"] == "maximize"
    rows = []
    for t in trials:
        value = (t.get("result") or {}).get(objective)
        rows.append({**native_job(t), "values": t.get("sweep_values") or {}, "objective": value if isinstance(value, (int, float)) else None})
    rows.sort(key=lambda r: r["created_at"])
    done = [r for r in rows if r["objective"] is not None and r["status"] == "succeeded"]
    best = (max if maximize else min)(done, key=lambda r: r["objective"]) if done else None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    status = "running" if any(r["status"] not in TERMINAL for r in rows) else "succeeded" if done else "failed"
    return {"object": "kubetune.sweep", "id": sw["id"], "name": sw["name"], "objective": objective, "direction": sw["direction"],
            "created_at": sw["created_at"], "status": status, "counts": counts, "trials": rows,
            "best": {"id": best["id"], "name": best["name"], "values": best["values"], "objective": best["objective"]} if best else None}


def register(app: FastAPI, store: Store, runner: Runner, config: ServerConfig, project: Any) -> None:
    """Add the sweep routes to ``app`` (``project``: the auth dependency)."""

    def sweep_of(p: dict, sweep_id: str) -> dict:
        sw = store.get_sweep(p["id"], sweep_id)
        if sw is None:
            raise APIError(404, f"No such sweep: '{sweep_id}'", code="sweep_not_found")
        return sw

    def trials(p: dict, sweep_id: str) -> list[dict]:
        return store.list_jobs(p["id"], sweep_id=sweep_id, limit=10_000)[0]

    @app.post("/v1/sweeps")
    async def submit(request: Request, p: dict = project):
        body = await request.body()
        if len(body) > MAX_SPEC_BYTES:
            raise APIError(413, f"the spec is larger than {MAX_SPEC_BYTES} bytes", code="request_too_large")
        spec = _parse_spec(body, request.headers.get("content-type", ""))
        from ..spec import load_spec, spec_to_dict
        from ..sweep.plan import check_sweep, plan_values, trial_spec

        try:
            job = load_spec(spec)
            if job.sweep is None:
                raise SpecError("the spec has no sweep: section", hint="add sweep: {grid: {method.lora.r: [4, 8]}} (docs/sweeps.md)")
            check_sweep(job, job.sweep)
            if job.sweep.uses_optuna:  # trials planned up front here; TPE and Optuna's pruners follow trials as they run
                raise SpecError("a kubetune server runs grid and random sweeps, not Optuna's TPE or pruners",
                                hint="run the sweep with kubetune sweep SPEC on a machine of your own (any --backend)")
            sweep_id = new_id("sweep")
            short = sweep_id.removeprefix("sweep-")[:8]
            planned = [(values, trial_spec(job, f"s{short}", values, config.data_path() / "sweeps" / sweep_id)) for values in plan_values(job.sweep)]
        except SpecError as e:
            raise APIError(400, f"invalid sweep: {e.message}" + (f" ({e.hint})" if e.hint else ""), param="spec", code="invalid_spec") from None
        sw = store.add_sweep(id=sweep_id, project_id=p["id"], name=job.name, objective=job.sweep.objective, direction=job.sweep.direction,
                             spec=spec_to_dict(job))
        for values, trial in planned:
            job_id = new_id("job")
            resolved = spec_to_dict(trial)
            if config.backend == "local":
                resolved["output"]["dir"] = str(config.data_path() / "runs" / job_id)
            store.add_job(id=job_id, project_id=p["id"], kind="native", model=trial.model.source, hyperparameters={}, method={"type": trial.method.type},
                          spec=resolved, status="queued", backend=config.backend, fine_tuned_model=None, sweep_id=sweep_id, sweep_values=values)
            store.add_events(job_id, [{"created_at": time.time(), "level": "info", "type": "message",
                                       "message": f"Created trial {trial.name} of sweep {sweep_id}", "data": {"values": values}}])
        runner.wake()
        return sweep_object(sw, trials(p, sweep_id))

    @app.get("/v1/sweeps")
    def list_sweeps(p: dict = project):
        return {"object": "list", "data": [sweep_object(sw, trials(p, sw["id"])) for sw in store.list_sweeps(p["id"])]}

    @app.get("/v1/sweeps/{sweep_id}")
    def get_sweep(sweep_id: str, p: dict = project):
        return sweep_object(sweep_of(p, sweep_id), trials(p, sweep_id))

    @app.post("/v1/sweeps/{sweep_id}/cancel")
    def cancel(sweep_id: str, p: dict = project):
        sw = sweep_of(p, sweep_id)
        for t in trials(p, sweep_id):
            if t["status"] not in TERMINAL:
                runner.cancel(t)
        return sweep_object(sw, trials(p, sweep_id))
