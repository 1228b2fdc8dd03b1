"""``kubetune server``: the jobs service (OpenAI's fine-tuning API, persistence, API keys), and
``kubetune server keys create|list|revoke``.

Kept light at import: SQLAlchemy, FastAPI and torch load inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

__all__ = ["register"]

_DB_HELP = "Database URL: sqlite:///PATH or postgresql://USER@HOST/DB (default: SQLite under the kubetune home)."
_CONFIG_HELP = "Server configuration (YAML): models, method defaults, limits (docs/server.md)."


def register(app: typer.Typer) -> None:
    """Add the ``server`` command group to the kubetune CLI."""
    server_app = typer.Typer(name="server", help="The kubetune jobs service: OpenAI's fine-tuning API, persistence, API keys (docs/server.md).",
                             invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
    server_app.callback(invoke_without_command=True)(server)
    keys_app = typer.Typer(name="keys", help="API keys: each names a project; only a digest is stored.", no_args_is_help=True)
    keys_app.command("create")(keys_create)
    keys_app.command("list")(keys_list)
    keys_app.command("revoke")(keys_revoke)
    keys_app.command("import")(keys_import)
    server_app.add_typer(keys_app, name="keys")
    app.add_typer(server_app, name="server")


def server(
    ctx: typer.Context,
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default 127.0.0.1; anything else needs API keys)."),
    port: Optional[int] = typer.Option(None, "--port", "-p", help="TCP port (default 8000)."),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Where jobs run: local (default), kubernetes or kfp."),
    db: Optional[str] = typer.Option(None, "--db", envvar="KUBETUNE_SERVER_DB", help=_DB_HELP),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
) -> None:
    """Run the jobs service until interrupted (a subcommand instead: manage its keys)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"db": db, "config": config}
        return
    from ..errors import SpecError
    from ..extras import require

    require("server", "kubetune server", also=("serve",))
    from ..server.config import is_loopback, load_config
    from ..server.store import Store

    cfg = load_config(config, host=host, port=port, backend=backend, db=db)
    from ..backends import BACKENDS

    if cfg.backend not in BACKENDS or cfg.backend == "fake":
        raise SpecError(f"--backend {cfg.backend}: use local, kubernetes or kfp")
    store = Store(cfg.db)
    if not is_loopback(cfg.host) and not store.has_keys():
        raise SpecError(
            f"refusing to serve on {cfg.host} without API keys: anyone who can reach it could run jobs",
            hint="create a key first (kubetune server keys create --project NAME), or bind 127.0.0.1",
        )
    from ..server.app import run_server

    run_server(cfg, store)


def _store(ctx: typer.Context, db: Optional[str], config: Optional[Path]):
    from ..extras import require

    require("server", "kubetune server keys")
    from ..server.config import load_config
    from ..server.store import Store

    parent = ctx.obj if isinstance(ctx.obj, dict) else {}  # `kubetune server --db URL keys ...`: the group's options
    cfg = load_config(config or parent.get("config"), db=db or parent.get("db"))
    return Store(cfg.db)


def keys_create(
    ctx: typer.Context,
    project: str = typer.Option(..., "--project", help="The project the key belongs to (created when new)."),
    db: Optional[str] = typer.Option(None, "--db", envvar="KUBETUNE_SERVER_DB", help=_DB_HELP),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
) -> None:
    """Create an API key for PROJECT and print it (shown this once; only its digest is stored)."""
    from ..errors import SpecError

    if not project.strip() or len(project) > 128:
        raise SpecError("--project: give a name of 1-128 characters")
    key, rec = _store(ctx, db, config).create_key(project.strip())
    typer.echo(key)
    typer.echo(f"key {rec['prefix']}... for project {rec['project']}: keep it now, it cannot be shown again", err=True)


def keys_import(
    ctx: typer.Context,
    directory: Path = typer.Option(..., "--dir", help="A folder with one file per project, named as the project, holding its key "
                                   "(a mounted Kubernetes Secret: the Helm chart's apiKeys.existingSecret)."),
    db: Optional[str] = typer.Option(None, "--db", envvar="KUBETUNE_SERVER_DB", help=_DB_HELP),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
) -> None:
    """Register the keys in DIR (one file per project) so that they authenticate; a key already known is left as is.
    Only digests are stored; the keys are never printed."""
    from ..errors import SpecError

    if not directory.is_dir():
        raise SpecError(f"--dir {directory}: not a folder", hint="mount the Secret with the keys there (one file per project)")
    files = sorted(f for f in directory.iterdir() if f.is_file() and not f.name.startswith("."))  # ..data links of a mounted Secret
    if not files:
        raise SpecError(f"--dir {directory}: no key files", hint="one file per project, named as the project, holding its key")
    store = _store(ctx, db, config)
    for f in files:
        try:
            key = f.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError(f"{f}: cannot read a key from it ({e})", hint="one text file per project, holding its key") from None
        if len(key) < 32 or any(c.isspace() for c in key):
            raise SpecError(f"{f}: a key must be at least 32 characters without spaces (this one: {len(key)})",
                            hint="make one with: kubetune server keys create, or openssl rand -hex 24")
        added, _ = store.import_key(f.name, key)
        typer.echo(f"key {f.name}: {'added' if added else 'already known'} (project {f.name})")


def keys_list(
    ctx: typer.Context,
    db: Optional[str] = typer.Option(None, "--db", envvar="KUBETUNE_SERVER_DB", help=_DB_HELP),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
) -> None:
    """List the keys (prefix, project, state, created: local ISO 8601), never the keys themselves."""
    from ._output import timestamp

    for k in _store(ctx, db, config).list_keys():
        state = "revoked" if k["revoked"] else "active"
        typer.echo(f"{k['prefix']}...  {k['project']:<24} {state:<8} {timestamp(k['created_at'])}  {k['id']}")


def keys_revoke(
    ctx: typer.Context,
    key: str = typer.Argument(..., help="The key's id or prefix (kubetune server keys list)."),
    db: Optional[str] = typer.Option(None, "--db", envvar="KUBETUNE_SERVER_DB", help=_DB_HELP),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
) -> None:
    """Revoke a key: requests with it are answered 401 from then on."""
    from ..errors import SpecError

    if not _store(ctx, db, config).revoke_key(key):
        raise SpecError(f"no key with id or prefix '{key}'", hint="kubetune server keys list shows them")
    typer.echo(f"revoked {key}")
