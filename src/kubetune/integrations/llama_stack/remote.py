"""``remote::kubetune``: llama-stack's post-training API forwarded to a kubetune server (docs/server.md).

The server speaks llama-stack's post-training routes itself (:mod:`kubetune.server.post_training`); what it cannot
see is llama-stack's datasets. So a ``supervised_fine_tune`` first reads the dataset's rows through llama-stack's
``datasetio`` API and registers them on the server under a name of its own (``<job_uuid>-train``), then forwards the
request with that name. Every other call is forwarded as it is. The server's error message becomes a
``ValueError`` (llama-stack answers it with 400).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from .config import KubetuneRemoteConfig
from .mapping import plain

__all__ = ["get_adapter_impl", "KubetuneRemotePostTraining"]

log = logging.getLogger("kubetune.llama_stack")


async def get_adapter_impl(config: KubetuneRemoteConfig, deps: dict) -> "KubetuneRemotePostTraining":
    """llama-stack's entry point for a remote provider."""
    from llama_stack.distribution.datatypes import Api

    impl = KubetuneRemotePostTraining(config, deps[Api.datasetio])
    await impl.initialize()
    return impl


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


class KubetuneRemotePostTraining:
    """llama-stack's ``PostTraining`` protocol over a kubetune server's ``/v1/post-training`` routes."""

    def __init__(self, config: KubetuneRemoteConfig, datasetio_api: Any) -> None:
        self.config = config
        self.datasetio_api = datasetio_api
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._http = httpx.AsyncClient(base_url=config.url.rstrip("/"), headers=headers, timeout=config.timeout_seconds)

    async def initialize(self) -> None:
        """Nothing to do: the server is asked on the first call (it may start after llama-stack)."""

    async def shutdown(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = await self._http.request(method, f"/v1{path}", **kwargs)
        except httpx.HTTPError as e:
            raise ValueError(f"kubetune server {self.config.url}: unreachable ({type(e).__name__}: {e})") from None
        if r.status_code >= 400:
            try:
                message = (r.json().get("error") or {}).get("message") or r.text
            except ValueError:
                message = r.text
            if r.status_code in (401, 403):
                message += " (check the provider's api_key)"
            raise ValueError(f"kubetune server: {message}")
        return r.json() if r.content else None

    async def _upload(self, dataset_id: str, name: str) -> str:
        try:
            page = await self.datasetio_api.iterrows(dataset_id=dataset_id, limit=-1)
        except Exception as e:  # a llama-stack error of any kind: an unknown dataset, an unreadable source
            raise ValueError(f"dataset {dataset_id!r}: cannot read its rows through datasetio: {e}") from None
        # v == v: not NaN (pandas' filler for a missing cell); plain: numpy values as JSON
        rows = json.loads(json.dumps([{k: v for k, v in row.items() if v is not None and v == v} for row in page.data], default=plain))
        await self._call("POST", "/datasets", json={"dataset_id": name, "purpose": "post-training/messages", "source": {"type": "rows", "rows": rows}})
        return name

    async def _with_server_datasets(self, job_uuid: str, training_config: Any) -> dict:
        tc = _dump(training_config) or {}
        data = dict(tc.get("data_config") or {})
        if data.get("dataset_id"):
            data["dataset_id"] = await self._upload(data["dataset_id"], f"{job_uuid}-train")
        if data.get("validation_dataset_id"):
            data["validation_dataset_id"] = await self._upload(data["validation_dataset_id"], f"{job_uuid}-valid")
        return {**tc, "data_config": data or None}

    async def supervised_fine_tune(self, job_uuid: str, training_config: Any, hyperparam_search_config: dict[str, Any],
                                   logger_config: dict[str, Any], model: str | None = None, checkpoint_dir: str | None = None,
                                   algorithm_config: Any = None) -> Any:
        """Upload the rows, then start the job on the server (``checkpoint_dir`` is the server's to choose)."""
        from llama_stack.apis.post_training import PostTrainingJob

        if checkpoint_dir:
            log.warning("%s: checkpoint_dir %s: not applied, the kubetune server keeps each job's run in its data directory", job_uuid, checkpoint_dir)
        body = {"job_uuid": job_uuid, "model": model, "training_config": await self._with_server_datasets(job_uuid, training_config),
                "algorithm_config": _dump(algorithm_config), "hyperparam_search_config": hyperparam_search_config, "logger_config": logger_config}
        return PostTrainingJob(**await self._call("POST", "/post-training/supervised-fine-tune", json=body))

    async def preference_optimize(self, job_uuid: str, finetuned_model: str, algorithm_config: Any, training_config: Any,
                                  hyperparam_search_config: dict[str, Any], logger_config: dict[str, Any]) -> Any:
        """Upload the preference rows, then start the DPO job on the server."""
        from llama_stack.apis.post_training import PostTrainingJob

        body = {"job_uuid": job_uuid, "finetuned_model": finetuned_model, "training_config": await self._with_server_datasets(job_uuid, training_config),
                "algorithm_config": _dump(algorithm_config), "hyperparam_search_config": hyperparam_search_config, "logger_config": logger_config}
        return PostTrainingJob(**await self._call("POST", "/post-training/preference-optimize", json=body))

    async def get_training_jobs(self) -> Any:
        """The server's llama-stack jobs of this key's project."""
        from llama_stack.apis.post_training import ListPostTrainingJobsResponse

        return ListPostTrainingJobsResponse(**await self._call("GET", "/post-training/jobs"))

    async def get_training_job_status(self, job_uuid: str) -> Any:
        """The server's answer, as llama-stack's type."""
        from llama_stack.apis.post_training import PostTrainingJobStatusResponse

        return PostTrainingJobStatusResponse(**await self._call("GET", "/post-training/job/status", params={"job_uuid": job_uuid}))

    async def cancel_training_job(self, job_uuid: str) -> None:
        """Cancel on the server."""
        await self._call("POST", "/post-training/job/cancel", json={"job_uuid": job_uuid})

    async def get_training_job_artifacts(self, job_uuid: str) -> Any:
        """The job's checkpoints, from the server."""
        from llama_stack.apis.post_training import PostTrainingJobArtifactsResponse

        return PostTrainingJobArtifactsResponse(**await self._call("GET", "/post-training/job/artifacts", params={"job_uuid": job_uuid}))
