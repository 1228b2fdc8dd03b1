"""The configs of kubetune's two llama-stack post-training providers (the ``config:`` block of a llama-stack
run config's ``post_training`` provider). Plain pydantic models: llama-stack validates them when it starts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["KubetuneInlineConfig", "KubetuneRemoteConfig"]


class KubetuneInlineConfig(BaseModel):
    """``inline::kubetune``: the provider runs kubetune jobs itself, through :class:`kubetune.Client`."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "kubernetes", "kfp"] = Field("local", description="Where jobs run (kubetune's --backend).")
    mode: Literal["local", "remote"] = Field("local", description="kfp backend: a local pipeline run (KFP's SubprocessRunner) or a KFP server.")
    kfp_host: str | None = Field(None, description="kfp backend, mode remote: the KFP API endpoint (kfp.host).")
    namespace: str | None = Field(None, description="kubernetes / kfp backends: the namespace (kubernetes.namespace, kfp.namespace).")
    staging_uri: str | None = Field(
        None, description="kubernetes / kfp remote: where the dataset rows go for the cluster to fetch (s3://...; kubernetes.staging_uri).")
    output_uri: str | None = Field(None, description="Where each job publishes its adapter or model too (output.uri; s3://, oci://, a folder).")
    models: dict[str, str] = Field(
        default_factory=dict,
        description="llama-stack model names -> kubetune model sources (hf://..., s3://..., a folder, builtin://tiny-chat). "
        "A name not listed here is used as a source when it has a scheme (hf://, s3://, ...), else as hf://NAME.")
    default_model: str | None = Field(None, description="The model a request without one trains.")
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="A base kubetune spec for every job (e.g. training.max_seq_length, resources, kubernetes); "
        "the request's values win.")
    state_dir: str | None = Field(
        None, description="Where the provider keeps its job records, rows and run directories (default: kubetune's state "
        "directory: ~/.local/state/kubetune/llama-stack, or $KUBETUNE_HOME/llama-stack).")

    @classmethod
    def sample_run_config(cls, __distro_dir__: str = "", **_kwargs: Any) -> dict[str, Any]:
        """What ``llama stack build`` templates write for this provider."""
        return {"backend": "local", "models": {"tiny-chat": "builtin://tiny-chat"}}


class KubetuneRemoteConfig(BaseModel):
    """``remote::kubetune``: the provider forwards to a kubetune server (``kubetune server``, docs/server.md)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., description="The kubetune server's base URL, e.g. http://127.0.0.1:8000")
    api_key: str | None = Field(None, description="A key of the server (`kubetune server keys create`); ${env.KUBETUNE_API_KEY} in a run config.")
    timeout_seconds: float = Field(120.0, gt=0, description="HTTP timeout of one call (uploading the rows is one call).")

    @classmethod
    def sample_run_config(cls, __distro_dir__: str = "", **_kwargs: Any) -> dict[str, Any]:
        """What ``llama stack build`` templates write for this provider."""
        return {"url": "${env.KUBETUNE_URL:http://127.0.0.1:8000}", "api_key": "${env.KUBETUNE_API_KEY:}"}
