"""The server's configuration: where it listens, which backend runs jobs, the database, model names and
per-method defaults, and the limits. Read from ``--config FILE`` (YAML), then the command line's options win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import SpecError
from ..paths import state_path

__all__ = ["ServerConfig", "load_config", "is_loopback"]

# What the OpenAI API's "auto" hyperparameters become (reported back resolved, as OpenAI does).
AUTO_HYPERPARAMETERS = {"n_epochs": 3, "batch_size": 8, "learning_rate_multiplier": 1.0}


class ServerConfig(BaseModel):
    """Everything ``kubetune server`` is configured with (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Address to bind; anything but loopback needs API keys.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0: any free port).")
    backend: str = Field("local", description="Where jobs run: local, kubernetes or kfp.")
    backend_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the backend, as kubetune.Client(backend, **options) takes them: kubernetes: namespace, context, "
        "kubeconfig, flavor; kfp: poll_seconds. What a job needs on the cluster (kubernetes.staging_uri, secrets, output.uri) "
        "goes in method_defaults or the job's spec.",
    )
    db: str | None = Field(None, description="SQLAlchemy URL: sqlite:///PATH or postgresql://... (default: SQLite under the kubetune home).")
    data_dir: Path | None = Field(None, description="Uploaded files and jobs' run directories (default: the state directory's server/: ~/.local/state/kubetune/server, or $KUBETUNE_HOME/server).")
    models: dict[str, str] = Field(
        default_factory=lambda: {"tiny-chat": "builtin://tiny-chat"},
        description="Model names clients send -> model sources (any kubetune model URI).",
    )
    method_defaults: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {
            "supervised": {
                "method": {"type": "lora"},
                "training": {"learning_rate": 2e-4, "max_seq_length": 512},
            }
        },
        description="Per OpenAI method (supervised): a kubetune spec fragment every job of that method starts from.",
    )
    max_upload_bytes: int = Field(512 * 1024 * 1024, ge=1, description="Largest file upload (more: 413).")
    max_running_jobs: int = Field(2, ge=1, description="Jobs running at once per project; the rest wait, queued, in order.")
    rate_limit_per_minute: int = Field(0, ge=0, description="Requests per minute per API key (0: no limit; more: 429).")
    poll_seconds: float = Field(1.0, gt=0, le=30, description="How often the runner copies jobs' progress into the database.")

    def data_path(self) -> Path:
        """The data directory, created."""
        p = Path(self.data_dir).expanduser() if self.data_dir else state_path("server")
        p.mkdir(parents=True, exist_ok=True)
        return p


def load_config(path: str | Path | None = None, **overrides: Any) -> ServerConfig:
    """The configuration from ``path`` (YAML) with ``overrides`` (None values ignored) on top.

    Raises:
        SpecError: the file cannot be read or holds an unknown key or a bad value.
    """
    from ..spec.reader import parse_spec_text

    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"--config {path}: cannot read it ({e})") from None
        # the spec's bounded YAML reader: file:line in errors, duplicate keys and alias bombs refused
        data = parse_spec_text(text, str(path))[0] or {}
        if not isinstance(data, dict):
            raise SpecError(f"--config {path}: expected a mapping of settings")
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        cfg = ServerConfig(**data)
    except ValidationError as e:
        problems = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise SpecError(f"server config{f' {path}' if path else ''}: " + "; ".join(problems), problems=problems) from None
    _check_backend_options(cfg, path)
    return cfg


def _check_backend_options(cfg: ServerConfig, path: str | Path | None) -> None:
    """Unknown ``backend_options`` are refused when the server starts, not when its first job is submitted (building
    a backend is cheap: none connects to anything before its first call)."""
    import re

    from ..backends import BACKENDS, get_backend

    if cfg.backend not in BACKENDS:
        return  # the CLI names the valid backends
    try:
        get_backend(cfg.backend, **cfg.backend_options)
    except TypeError as e:
        bad = re.search(r"argument '(\w+)'", str(e))
        raise SpecError(
            f"server config{f' {path}' if path else ''}: backend_options.{bad.group(1) if bad else ''}: not an option of the {cfg.backend} backend",
            hint="kubernetes takes namespace, context, kubeconfig, flavor; kfp takes poll_seconds; local takes none (docs/server.md)",
        ) from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    return host in ("localhost", "::1") or host.startswith("127.")
