"""``kubetune llama-stack config``: a ready llama-stack run config with kubetune as its post-training provider
(docs/llama-stack.md). Kept light: it imports neither llama-stack nor torch."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``llama-stack`` command group to the kubetune CLI."""
    ls_app = typer.Typer(name="llama-stack", help="kubetune as llama-stack's post-training provider (docs/llama-stack.md).",
                         no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
    ls_app.command("config")(config)
    app.add_typer(ls_app, name="llama-stack")


def config(
    provider: str = typer.Option("inline", "--provider", help="inline: kubetune runs the jobs in the llama-stack server's "
                                 "environment; remote: a kubetune server runs them."),
    backend: str = typer.Option("local", "--backend", "-b", help="inline: where jobs run (local, kubernetes, kfp)."),
    mode: str = typer.Option("local", "--mode", help="inline, kfp backend: local (KFP's subprocess runner) or remote (a KFP server)."),
    kfp_host: Optional[str] = typer.Option(None, "--kfp-host", help="inline, kfp remote: the KFP API endpoint."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="inline, kubernetes / kfp: the namespace."),
    staging_uri: Optional[str] = typer.Option(None, "--staging-uri", help="inline, on a cluster: where the rows are staged (s3://...)."),
    output_uri: Optional[str] = typer.Option(None, "--output-uri", help="inline: where every job also publishes its model (output.uri)."),
    model: List[str] = typer.Option([], "--model", "-m", help="NAME=SOURCE: a llama-stack model name and the kubetune source it trains "
                                    "(repeatable; e.g. tiny-chat=builtin://tiny-chat)."),
    default_model: Optional[str] = typer.Option(None, "--default-model", help="inline: the model of a request that names none."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="inline: the provider's job records and runs (default under the kubetune home)."),
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="remote: the kubetune server's URL."),
    api_key_env: str = typer.Option("KUBETUNE_API_KEY", "--api-key-env", help="remote: the environment variable llama-stack reads the key from "
                                    "(the key itself is never written into the file)."),
    store_dir: Path = typer.Option(Path("~/.llama/distributions/kubetune"), "--store-dir", help="llama-stack's own registry and dataset records."),
    host: str = typer.Option("127.0.0.1", "--host", help="The address llama-stack listens on."),
    port: int = typer.Option(8321, "--port", "-p", help="llama-stack's port (llama stack run --port overrides it)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the config here instead of printing it."),
) -> None:
    """Print a llama-stack run config: post_training = kubetune, datasetio = localfs, and the external providers
    directory the provider specs are in. Then: ``llama stack run FILE --port N``."""
    import yaml
    from pydantic import ValidationError

    from ..errors import SpecError
    from ..integrations.llama_stack.config import KubetuneInlineConfig, KubetuneRemoteConfig
    from ..integrations.llama_stack.runconfig import run_config

    models: dict[str, str] = {}
    for item in model:
        name, sep, source = item.partition("=")
        if not sep or not name or not source:
            raise SpecError(f"--model {item!r}: expected NAME=SOURCE, e.g. tiny-chat=builtin://tiny-chat")
        models[name] = source
    if provider not in ("inline", "remote"):
        raise SpecError(f"--provider {provider!r}: expected inline or remote")
    try:
        inline = KubetuneInlineConfig(backend=backend, mode=mode, kfp_host=kfp_host, namespace=namespace, staging_uri=staging_uri,
                                      output_uri=output_uri, models=models, default_model=default_model,
                                      state_dir=str(state_dir) if state_dir else None)
        remote = KubetuneRemoteConfig(url=url, api_key=f"${{env.{api_key_env}:}}")
    except ValidationError as e:
        err = e.errors()[0]
        raise SpecError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    text = yaml.safe_dump(run_config(provider=provider, store_dir=store_dir, inline=inline, remote=remote, host=host, port=port), sort_keys=False)
    if output:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise SpecError(f"--output {output}: cannot write it ({e.strerror or e})") from None
        typer.echo(f"wrote {output}; start it with: llama stack run {output}", err=True)
    else:
        typer.echo(text, nl=False)
