"""``inline::kubetune``: llama-stack's post-training API, run by kubetune inside the llama-stack server.

llama-stack imports this module (``module:`` in ``providers.d/inline/post_training/kubetune.yaml``) and calls
:func:`get_provider_impl`. A ``supervised_fine_tune`` reads the dataset's rows through llama-stack's ``datasetio``
API (so any dataset registered with llama-stack trains), writes them as JSONL, maps the request to a kubetune
spec (:mod:`.mapping`) and submits it through :class:`kubetune.Client` on the configured backend: local, kubernetes
(any flavour) or kfp (local pipeline or a KFP server). A job's record (its uuid, the backend's reference, the notes)
is a JSON file in the state directory, so jobs outlive a restart of the llama-stack server.

llama-stack answers a ``ValueError`` with 400 and its message; every user mistake here is one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from ...errors import KubetuneError
from .config import KubetuneInlineConfig
from ...spec.validate import merge_specs
from .mapping import checkpoints, dpo_spec, job_status, normalize_rows, sft_spec, write_jsonl

__all__ = ["get_provider_impl", "KubetunePostTraining"]

log = logging.getLogger("kubetune.llama_stack")

_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_RECORD = "job.json"


async def get_provider_impl(config: KubetuneInlineConfig, deps: dict) -> "KubetunePostTraining":
    """llama-stack's entry point for an inline provider."""
    from llama_stack.distribution.datatypes import Api

    impl = KubetunePostTraining(config, deps[Api.datasetio])
    await impl.initialize()
    return impl


def _dump(obj: Any) -> Any:
    """A llama-stack pydantic object (or a plain dict, from a test) as JSON data."""
    if obj is None:
        return None
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    return json.loads(json.dumps(obj, default=str))


def _resolve_model(config: KubetuneInlineConfig, model: str | None) -> str:
    name = model or config.default_model
    if not name:
        raise ValueError("model: the request names no model and the provider's config has no default_model")
    if name in config.models:
        return config.models[name]
    if "://" in name or name.startswith(("/", "./", "~")):
        return name
    return f"hf://{name}"


class KubetunePostTraining:
    """llama-stack's ``PostTraining`` protocol over :class:`kubetune.Client`."""

    def __init__(self, config: KubetuneInlineConfig, datasetio_api: Any) -> None:
        from ...paths import state_path

        self.config = config
        self.datasetio_api = datasetio_api
        self.root = Path(config.state_dir).expanduser() if config.state_dir else state_path("llama-stack")
        self._client: Any = None

    async def initialize(self) -> None:
        """Create the state directory (jobs of an earlier server process are read from it)."""
        (self.root / "jobs").mkdir(parents=True, exist_ok=True)

    async def shutdown(self) -> None:
        """Nothing to stop: jobs run on (a local job is its own process) and a restarted server finds them again."""

    # -- the API ---------------------------------------------------------------------------------------------

    async def supervised_fine_tune(self, job_uuid: str, training_config: Any, hyperparam_search_config: dict[str, Any],
                                   logger_config: dict[str, Any], model: str | None = None, checkpoint_dir: str | None = None,
                                   algorithm_config: Any = None) -> Any:
        """Map the request to a kubetune spec and submit it; returns at once with the job."""
        return await self._submit("supervised-fine-tune", sft_spec, job_uuid, _resolve_model(self.config, model), training_config,
                                  algorithm_config, hyperparam_search_config, logger_config, checkpoint_dir)

    async def preference_optimize(self, job_uuid: str, finetuned_model: str, algorithm_config: Any, training_config: Any,
                                  hyperparam_search_config: dict[str, Any], logger_config: dict[str, Any]) -> Any:
        """DPO (TRL's DPOTrainer, LoRA) on the preference rows of ``data_config.dataset_id``."""
        return await self._submit("preference-optimize", dpo_spec, job_uuid, _resolve_model(self.config, finetuned_model), training_config,
                                  algorithm_config, hyperparam_search_config, logger_config, None)

    async def get_training_jobs(self) -> Any:
        """Every job this provider has submitted, oldest first."""
        from llama_stack.apis.post_training import ListPostTrainingJobsResponse, PostTrainingJob

        records = sorted((self._read(p.parent.name) for p in (self.root / "jobs").glob(f"*/{_RECORD}")), key=lambda r: r["created_at"])
        return ListPostTrainingJobsResponse(data=[PostTrainingJob(job_uuid=r["job_uuid"]) for r in records])

    async def get_training_job_status(self, job_uuid: str) -> Any:
        """State, times, resources and checkpoints of one job."""
        from llama_stack.apis.post_training import PostTrainingJobStatusResponse

        return PostTrainingJobStatusResponse(**await asyncio.to_thread(self._status, job_uuid))

    async def cancel_training_job(self, job_uuid: str) -> None:
        """Stop the job (its worker, pods or pipeline); a finished job stays as it ended."""
        record = self._read(job_uuid)
        try:
            await asyncio.to_thread(self.client().cancel, self._ref(record))
        except KubetuneError as e:
            raise ValueError(f"cancel {job_uuid}: {e}") from None

    async def get_training_job_artifacts(self, job_uuid: str) -> Any:
        """The job's checkpoints, and its final adapter or model once it has succeeded."""
        from llama_stack.apis.post_training import PostTrainingJobArtifactsResponse

        status = await asyncio.to_thread(self._status, job_uuid)
        return PostTrainingJobArtifactsResponse(job_uuid=job_uuid, checkpoints=status["checkpoints"])

    # -- helpers ---------------------------------------------------------------------------------------------

    def client(self) -> Any:
        """One :class:`kubetune.Client` on the configured backend (made on first use)."""
        if self._client is None:
            from ...client import Client

            self._client = Client(self.config.backend)
        return self._client

    async def _submit(self, kind: str, build: Any, job_uuid: str, model_source: str, training_config: Any, algorithm_config: Any,
                      hyperparam_search_config: Any, logger_config: Any, checkpoint_dir: str | None) -> Any:
        from llama_stack.apis.post_training import PostTrainingJob

        if not isinstance(job_uuid, str) or not _UUID_RE.match(job_uuid):
            raise ValueError(f"job_uuid: {job_uuid!r} is not 1-128 letters, digits and . _ : -")
        folder = self.root / "jobs" / job_uuid
        if (folder / _RECORD).exists():
            raise ValueError(f"job_uuid: a job {job_uuid!r} exists already; choose another uuid")
        tc = _dump(training_config) or {}
        data = tc.get("data_config") or {}
        if not data.get("dataset_id"):
            raise ValueError("training_config.data_config.dataset_id: required (a dataset registered with llama-stack)")
        folder.mkdir(parents=True, exist_ok=True)
        train = await self._rows(data["dataset_id"], folder / "train.jsonl", "training_config.data_config.dataset_id")
        valid = None
        if data.get("validation_dataset_id"):
            cap = (tc.get("max_validation_steps") or 0) * (data.get("batch_size") or 1) or None  # torchtune: validation batches
            valid = await self._rows(data["validation_dataset_id"], folder / "valid.jsonl", "training_config.data_config.validation_dataset_id", cap)
        try:
            spec, notes = build(job_uuid=job_uuid, model_source=model_source, training_config=tc, algorithm_config=_dump(algorithm_config),
                                train_file=str(train), eval_file=str(valid) if valid else None, defaults=self._defaults(),
                                hyperparam_search_config=hyperparam_search_config, logger_config=logger_config)
        except KubetuneError as e:
            raise ValueError(e.message) from None
        spec.setdefault("output", {})["dir"] = str(Path(checkpoint_dir).expanduser() / spec["name"]) if checkpoint_dir else str(folder / "run")
        for note in notes:
            log.warning("%s: %s", job_uuid, note)
        try:
            ref = await asyncio.to_thread(self.client().submit, spec)
        except KubetuneError as e:
            raise ValueError(f"{job_uuid}: {e.message}" + (f" ({e.hint})" if getattr(e, "hint", None) else "")) from None
        record = {"job_uuid": job_uuid, "kind": kind, "created_at": time.time(), "model": model_source, "notes": notes,
                  "ref": dataclasses.asdict(ref)}
        tmp = folder / f".{_RECORD}.tmp"
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, folder / _RECORD)  # a record is whole or absent
        return PostTrainingJob(job_uuid=job_uuid)

    def _defaults(self) -> dict:
        c = self.config
        base: dict[str, Any] = {}
        if c.backend == "kubernetes":
            base["kubernetes"] = {k: v for k, v in (("namespace", c.namespace), ("staging_uri", c.staging_uri)) if v}
        if c.backend == "kfp":
            base["kfp"] = {"mode": c.mode, **{k: v for k, v in (("host", c.kfp_host), ("namespace", c.namespace)) if v}}
            if c.staging_uri:
                base["kubernetes"] = {"staging_uri": c.staging_uri}
        if c.output_uri:
            base["output"] = {"uri": c.output_uri}
        return merge_specs(c.defaults, base)

    async def _rows(self, dataset_id: str, path: Path, field: str, cap: int | None = None) -> Path:
        try:
            page = await self.datasetio_api.iterrows(dataset_id=dataset_id, limit=-1)
        except Exception as e:  # a llama-stack error of any kind: an unknown dataset, an unreadable source
            raise ValueError(f"{field}: cannot read the rows of dataset {dataset_id!r} through datasetio: {e}") from None
        try:
            rows = normalize_rows(page.data if hasattr(page, "data") else page["data"])
        except KubetuneError as e:
            raise ValueError(f"{field} {dataset_id!r}: {e.message}") from None
        rows = rows[:cap] if cap else rows
        return write_jsonl(path, rows)

    def _read(self, job_uuid: str) -> dict:
        path = self.root / "jobs" / job_uuid / _RECORD if _UUID_RE.match(job_uuid or "") else None
        if path is None or not path.is_file():
            raise ValueError(f"job_uuid: no training job {job_uuid!r}")
        return json.loads(path.read_text(encoding="utf-8"))

    @staticmethod
    def _ref(record: dict) -> Any:
        from ...backends.base import JobRef

        return JobRef(**record["ref"])

    def _status(self, job_uuid: str) -> dict:
        record = self._read(job_uuid)
        ref, client = self._ref(record), self.client()
        try:
            st = client.status(ref)
            events = client.events(ref)
        except KubetuneError as e:
            raise ValueError(f"{job_uuid}: {e.message}") from None
        result, final = None, None
        run_dir = Path(st.run_dir or ref.run_dir) if (st.run_dir or ref.run_dir) else None
        if st.state == "succeeded" and run_dir and (run_dir / "result.json").is_file():
            result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
            final = next((str(run_dir / d) for d in ("merged", "adapter", "model") if (run_dir / d).is_dir()), None)
        resources = {k: v for k, v in {"backend": ref.backend, "job_id": ref.id, "run_dir": str(run_dir) if run_dir else None,
                                        "device": (result or {}).get("device") or (st.extra or {}).get("device"),
                                        "peak_memory_mb": st.peak_memory_mb, "step": st.step, "total_steps": st.total_steps,
                                        "reason": st.reason}.items() if v is not None}
        return job_status(job_uuid, st.state, created_at=record["created_at"], started_at=st.started_at, finished_at=st.finished_at,
                          resources=resources, checkpoint_list=checkpoints(job_uuid, events, result=result, final_path=final,
                                                                           finished_at=st.finished_at))
