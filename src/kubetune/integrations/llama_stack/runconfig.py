"""The llama-stack run config that ``kubetune llama-stack config`` prints: ``post_training`` = kubetune (inline or
remote), ``datasetio`` = llama-stack's ``localfs``, and ``external_providers_dir`` = this package's ``providers.d``
(the provider specs llama-stack loads). ``llama stack run FILE --port N`` serves it in the same environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import KubetuneInlineConfig, KubetuneRemoteConfig

__all__ = ["PROVIDERS_DIR", "run_config", "LLAMA_STACK_VERSIONS"]

# The provider specs shipped with the package (inline/post_training/kubetune.yaml, remote/post_training/kubetune.yaml).
PROVIDERS_DIR = Path(__file__).resolve().parent / "providers.d"
# The llama-stack releases the provider is tested with (the kubetune[llama-stack] extra pins them).
LLAMA_STACK_VERSIONS = "0.2.12"
_DEFAULT_PORT = 8321  # llama-stack's own default


def run_config(*, provider: str = "inline", store_dir: str | Path, inline: KubetuneInlineConfig | None = None,
               remote: KubetuneRemoteConfig | None = None, host: str = "127.0.0.1", port: int = _DEFAULT_PORT,
               image_name: str = "kubetune") -> dict[str, Any]:
    """A llama-stack (0.2.x) run config as a dict.

    Args:
        provider: "inline" (kubetune runs the jobs) or "remote" (a kubetune server runs them).
        store_dir: where llama-stack keeps its registry and the localfs datasets' records.
        inline / remote: the provider's config (defaults: the local backend / a server on 127.0.0.1:8000).
        host: the address llama-stack listens on (loopback unless you mean otherwise).
    """
    store = Path(store_dir).expanduser()
    if provider == "inline":
        post_training = {"provider_id": "kubetune", "provider_type": "inline::kubetune",
                         "config": (inline or KubetuneInlineConfig()).model_dump(mode="json", exclude_none=True)}
    elif provider == "remote":
        cfg = remote or KubetuneRemoteConfig(url="http://127.0.0.1:8000", api_key="${env.KUBETUNE_API_KEY:}")
        post_training = {"provider_id": "kubetune", "provider_type": "remote::kubetune", "config": cfg.model_dump(mode="json", exclude_none=True)}
    else:
        raise ValueError(f"provider: {provider!r} is not inline or remote")
    return {
        "version": "2",
        "image_name": image_name,
        "apis": ["datasetio", "post_training"],
        "providers": {
            "datasetio": [{"provider_id": "localfs", "provider_type": "inline::localfs",
                           "config": {"kvstore": {"type": "sqlite", "db_path": str(store / "localfs_datasetio.db")}}}],
            "post_training": [post_training],
        },
        "metadata_store": {"type": "sqlite", "db_path": str(store / "registry.db")},
        "models": [], "shields": [], "vector_dbs": [], "datasets": [], "scoring_fns": [], "benchmarks": [], "tool_groups": [],
        "server": {"port": port, "host": host},
        "external_providers_dir": str(PROVIDERS_DIR),
    }
