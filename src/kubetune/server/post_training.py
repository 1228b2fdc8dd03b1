"""llama-stack's post-training API on kubetune server, so a ``llama-stack-client`` drives kubetune with no
llama-stack server in between (docs/llama-stack.md).

Routes, under ``/v1`` (llama-stack 0.2.x) and ``/v1alpha`` (0.3-0.6, where the API moved before 0.7 removed it):

* ``POST /post-training/supervised-fine-tune``, ``POST /post-training/preference-optimize``: the request becomes a
  kubetune spec (:mod:`kubetune.integrations.llama_stack.mapping`, the same mapping as the llama-stack provider),
  queued as a server job whose id is the request's ``job_uuid`` (kind ``llama_stack``; the native ``/v1/jobs`` routes
  and ``kubetune status --server`` see it too);
* ``GET /post-training/jobs``, ``GET /post-training/job/status``, ``POST /post-training/job/cancel``,
  ``GET /post-training/job/artifacts``;
* the datasets a request names: ``POST/GET /v1/datasets``, ``GET/DELETE /v1/datasets/{id}`` and
  ``GET /v1/datasetio/iterrows/{id}``, rows kept per project as JSONL in the data directory. A dataset comes as
  ``rows`` or a ``data:`` URL (JSON lines or CSV); the server fetches no other URI for a client.

Models are the server's catalog (``models`` in its config), as for OpenAI's routes.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request

from ..errors import KubetuneError
from ..integrations.llama_stack.mapping import checkpoints, dpo_spec, job_status, normalize_rows, sft_spec, write_jsonl
from ..serve.protocol import APIError
from .config import ServerConfig
from .objects import fine_tuned_name
from .runner import Runner
from .store import Store

__all__ = ["register", "PREFIXES"]

PREFIXES = ("/v1", "/v1alpha")  # llama-stack 0.2.x, and 0.3-0.6
_KIND = "llama_stack"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_PURPOSES = ("post-training/messages", "eval/question-answer", "eval/messages-answer")
# server job statuses -> llama-stack JobStatus (a paused job runs again once resumed)
_STATUS = {"queued": "scheduled", "validating_files": "scheduled", "paused": "scheduled", "running": "in_progress",
           "succeeded": "completed", "failed": "failed", "cancelled": "cancelled"}
_PROVIDER_ID = "kubetune"


def register(app: FastAPI, store: Store, runner: Runner, config: ServerConfig, project: Any) -> None:
    """Add the llama-stack routes to ``app`` (``project``: the auth dependency)."""
    datasets = _Datasets(config)

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        if len(raw) > config.max_upload_bytes:
            raise APIError(413, f"the request is larger than this server accepts ({config.max_upload_bytes} bytes, max_upload_bytes)",
                           code="request_too_large")
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            raise APIError(400, f"the body is not JSON: {e.msg} (line {e.lineno})", code="invalid_json") from None
        if not isinstance(body, dict):
            raise APIError(400, "the body is not a JSON object", code="invalid_json")
        return body

    def job_of(p: dict, job_uuid: str | None) -> dict:
        job = store.get_job(p["id"], job_uuid or "")
        if job is None:
            raise APIError(404, f"No such training job: '{job_uuid}'", param="job_uuid", code="job_not_found")
        return job

    # -- datasets -------------------------------------------------------------------------------------------
    @app.post("/v1/datasets")
    async def register_dataset(request: Request, p: dict = project):
        body = await body_of(request)
        return datasets.register(p["id"], body)

    @app.get("/v1/datasets")
    def list_datasets(p: dict = project):
        return {"data": datasets.list(p["id"])}

    @app.get("/v1/datasets/{dataset_id}")
    def get_dataset(dataset_id: str, p: dict = project):
        return datasets.get(p["id"], dataset_id)

    @app.delete("/v1/datasets/{dataset_id}")
    def delete_dataset(dataset_id: str, p: dict = project):
        datasets.delete(p["id"], dataset_id)
        return None

    @app.get("/v1/datasetio/iterrows/{dataset_id}")
    def iterrows(dataset_id: str, start_index: int = 0, limit: int = -1, p: dict = project):
        rows = datasets.rows(p["id"], dataset_id)
        start = max(0, start_index)
        end = len(rows) if limit is None or limit < 0 else start + limit
        return {"data": rows[start:end], "has_more": end < len(rows)}

    # -- post-training ----------------------------------------------------------------------------------------
    def submit(p: dict, body: dict, kind: str) -> dict:
        job_uuid = body.get("job_uuid")
        if not isinstance(job_uuid, str) or not _ID_RE.match(job_uuid):
            raise APIError(400, f"job_uuid: {job_uuid!r} is not 1-64 letters, digits and . _ : -", param="job_uuid")
        if store.get_job(None, job_uuid) is not None:
            raise APIError(409, f"job_uuid: a job '{job_uuid}' exists already; choose another uuid", param="job_uuid", code="job_exists")
        model_key = "model" if kind == "sft" else "finetuned_model"
        name = body.get(model_key)
        source = config.models.get(name) if isinstance(name, str) else None
        if source is None:
            raise APIError(400, f"{model_key}: '{name}' is not a model of this server; available: {', '.join(config.models) or 'none'}",
                           param=model_key, code="model_not_found")
        tc = body.get("training_config")
        if not isinstance(tc, dict):
            raise APIError(400, "training_config: required (an object with n_epochs and data_config)", param="training_config")
        data = tc.get("data_config") or {}
        if not data.get("dataset_id"):
            raise APIError(400, "training_config.data_config.dataset_id: required (a dataset registered with POST /v1/datasets)",
                           param="training_config.data_config.dataset_id")
        folder = config.data_path() / "llama_stack" / p["id"] / "jobs" / job_uuid
        train = datasets.write_job_rows(p["id"], data["dataset_id"], folder / "train.jsonl", "training_config.data_config.dataset_id")
        valid = None
        if data.get("validation_dataset_id"):
            cap = (tc.get("max_validation_steps") or 0) * (data.get("batch_size") or 1) or None
            valid = datasets.write_job_rows(p["id"], data["validation_dataset_id"], folder / "valid.jsonl",
                                            "training_config.data_config.validation_dataset_id", cap)
        build, defaults_key = (sft_spec, "supervised") if kind == "sft" else (dpo_spec, "dpo")
        try:
            spec, notes = build(job_uuid=job_uuid, model_source=source, training_config=tc, algorithm_config=body.get("algorithm_config"),
                                train_file=str(train), eval_file=str(valid) if valid else None,
                                defaults=config.method_defaults.get(defaults_key, {}),
                                hyperparam_search_config=body.get("hyperparam_search_config"), logger_config=body.get("logger_config"))
        except KubetuneError as e:
            raise APIError(400, e.message, code="invalid_request") from None
        spec["output"] = {**(spec.get("output") or {}), "dir": str(config.data_path() / "runs" / job_uuid)}
        from ..spec import load_spec, spec_to_dict

        try:
            resolved = spec_to_dict(load_spec(spec))
        except KubetuneError as e:
            raise APIError(400, f"the job cannot run: {e.message}", code="invalid_job") from None
        store.add_job(id=job_uuid, project_id=p["id"], kind=_KIND, model=name, hyperparameters={}, method={"type": resolved["method"]["type"]},
                      spec=resolved, status="queued", backend=config.backend, fine_tuned_model=fine_tuned_name(name, None, job_uuid),
                      extra_metadata={"llama_stack": kind, "notes": notes} if notes else {"llama_stack": kind})
        events = [{"created_at": time.time(), "level": "info", "type": "message", "message": f"Created llama-stack {kind} job: {job_uuid}", "data": None}]
        events += [{"created_at": time.time(), "level": "warn", "type": "message", "message": note, "data": None} for note in notes]
        store.add_events(job_uuid, events)
        runner.wake()
        return {"job_uuid": job_uuid}

    def status(p: dict, job_uuid: str | None) -> dict:
        job = job_of(p, job_uuid)
        rows, _ = store.list_events(job["id"], limit=100_000, oldest_first=True)
        # the server keeps each kubetune event's own type in data["kubetune_type"]
        events = [{"time": e["created_at"], "type": (e.get("data") or {}).get("kubetune_type"), "data": e.get("data")} for e in rows]
        st = job_status(job["id"], "pending", created_at=job["created_at"], started_at=job.get("started_at"), finished_at=job.get("finished_at"),
                        resources={"backend": job["backend"], **({"device": job["result"].get("device")} if job.get("result") else {})},
                        checkpoint_list=checkpoints(job["id"], events, result=job.get("result"), final_path=_final_path(job),
                                                    finished_at=job.get("finished_at")))
        st["status"] = _STATUS.get(job["status"], "in_progress")
        return st

    for prefix in PREFIXES:
        @app.post(f"{prefix}/post-training/supervised-fine-tune")
        async def supervised_fine_tune(request: Request, p: dict = project):
            return submit(p, await body_of(request), "sft")

        @app.post(f"{prefix}/post-training/preference-optimize")
        async def preference_optimize(request: Request, p: dict = project):
            return submit(p, await body_of(request), "dpo")

        @app.get(f"{prefix}/post-training/jobs")
        def training_jobs(p: dict = project):
            jobs, _ = store.list_jobs(p["id"], kind=_KIND, limit=10_000)
            return {"data": [{"job_uuid": j["id"]} for j in reversed(jobs)]}

        @app.get(f"{prefix}/post-training/job/status")
        def training_job_status(job_uuid: str | None = None, p: dict = project):
            return status(p, job_uuid)

        @app.post(f"{prefix}/post-training/job/cancel")
        async def cancel_training_job(request: Request, job_uuid: str | None = None, p: dict = project):
            uuid = job_uuid or (await body_of(request)).get("job_uuid")
            job = job_of(p, uuid)
            if job["status"] not in ("succeeded", "failed", "cancelled"):
                runner.cancel(job)
            return None

        @app.get(f"{prefix}/post-training/job/artifacts")
        def training_job_artifacts(job_uuid: str | None = None, p: dict = project):
            st = status(p, job_uuid)
            return {"job_uuid": st["job_uuid"], "checkpoints": st["checkpoints"]}


def _final_path(job: dict) -> str | None:
    if job["status"] != "succeeded" or not job.get("run_dir"):
        return None
    root = Path(job["run_dir"])
    return next((str(root / d) for d in ("merged", "adapter", "model") if (root / d).is_dir()), None)


class _Datasets:
    """Datasets registered by llama-stack clients: ``<data>/llama_stack/<project>/datasets/<id>.jsonl`` + ``.json``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    def _dir(self, project_id: str) -> Path:
        d = self.config.data_path() / "llama_stack" / project_id / "datasets"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _paths(self, project_id: str, dataset_id: str) -> tuple[Path, Path]:
        if not _ID_RE.match(dataset_id or ""):
            raise APIError(400, f"dataset_id: {dataset_id!r} is not 1-64 letters, digits and . _ : -", param="dataset_id")
        d = self._dir(project_id)
        return d / f"{dataset_id}.json", d / f"{dataset_id}.jsonl"

    def register(self, project_id: str, body: dict) -> dict:
        purpose = body.get("purpose", "post-training/messages")
        if purpose not in _PURPOSES:
            raise APIError(400, f"purpose: {purpose!r} is not one of {', '.join(_PURPOSES)}", param="purpose")
        source = body.get("source")
        if not isinstance(source, dict):
            raise APIError(400, "source: required ({'type': 'rows', 'rows': [...]} or {'type': 'uri', 'uri': 'data:...'})", param="source")
        rows = _source_rows(source)
        dataset_id = body.get("dataset_id") or f"dataset-{int(time.time() * 1000):x}"
        meta_path, rows_path = self._paths(project_id, dataset_id)
        write_jsonl(rows_path, rows)
        meta = {"identifier": dataset_id, "provider_resource_id": dataset_id, "provider_id": _PROVIDER_ID, "type": "dataset",
                "purpose": purpose, "source": {"type": source.get("type")} | ({"uri": source["uri"][:64] + "..."} if source.get("type") == "uri" else {}),
                "metadata": body.get("metadata") or {}, "rows": len(rows)}
        meta_path.write_text(json.dumps(meta), encoding="utf-8")
        return self._object(meta, rows)

    @staticmethod
    def _object(meta: dict, rows: list[dict] | None = None) -> dict:
        obj = {k: v for k, v in meta.items() if k != "rows"}
        if obj["source"].get("type") == "rows":
            obj["source"] = {"type": "rows", "rows": rows if rows is not None else []}
        return obj

    def list(self, project_id: str) -> list[dict]:
        return [self._object(json.loads(p.read_text(encoding="utf-8"))) for p in sorted(self._dir(project_id).glob("*.json"))]

    def get(self, project_id: str, dataset_id: str) -> dict:
        meta_path, _ = self._paths(project_id, dataset_id)
        if not meta_path.is_file():
            raise APIError(404, f"No such dataset: '{dataset_id}'", param="dataset_id", code="dataset_not_found")
        return self._object(json.loads(meta_path.read_text(encoding="utf-8")))

    def delete(self, project_id: str, dataset_id: str) -> None:
        self.get(project_id, dataset_id)
        for path in self._paths(project_id, dataset_id):
            path.unlink(missing_ok=True)

    def rows(self, project_id: str, dataset_id: str) -> list[dict]:
        self.get(project_id, dataset_id)
        _, rows_path = self._paths(project_id, dataset_id)
        with open(rows_path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def write_job_rows(self, project_id: str, dataset_id: str, path: Path, field: str, cap: int | None = None) -> Path:
        """The dataset's rows, normalised for kubetune, copied for one job (a later change to the dataset leaves it be)."""
        try:
            rows = self.rows(project_id, dataset_id)
        except APIError as e:
            raise APIError(400, f"{field}: {e.message}", param=field, code=e.code) from None
        try:
            rows = normalize_rows(rows)[:cap] if cap else normalize_rows(rows)
        except KubetuneError as e:
            raise APIError(400, f"{field} '{dataset_id}': {e.message}", param=field) from None
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_jsonl(path, rows)


def _source_rows(source: dict) -> list[dict]:
    """The rows of a dataset source: ``rows``, or a ``data:`` URL holding JSON lines, a JSON array or CSV."""
    kind = source.get("type")
    if kind == "rows":
        rows = source.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise APIError(400, "source.rows: expected a list of objects", param="source.rows")
        return rows
    if kind != "uri":
        raise APIError(400, f"source.type: {kind!r} is not rows or uri", param="source.type")
    uri = str(source.get("uri", ""))
    if not uri.startswith("data:") or "," not in uri:
        raise APIError(400, f"source.uri: {uri[:80]!r}: this server reads rows or data: URLs only (it fetches no URI for a client); "
                       "send the rows, or upload the file and train it with POST /v1/fine_tuning/jobs", param="source.uri")
    header, payload = uri[5:].split(",", 1)
    text = base64.b64decode(payload).decode("utf-8") if header.endswith(";base64") else unquote(payload)
    mime = header.split(";")[0]
    try:
        if "csv" in mime:
            return [dict(r) for r in csv.DictReader(io.StringIO(text))]
        stripped = text.lstrip()
        if stripped.startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (json.JSONDecodeError, csv.Error, UnicodeDecodeError) as e:
        raise APIError(400, f"source.uri: the data: URL holds no JSON lines, JSON array or CSV ({e})", param="source.uri") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise APIError(400, "source.uri: expected rows (JSON objects)", param="source.uri")
    return rows
