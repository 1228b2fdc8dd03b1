"""``kubetune deliver SRC DEST``: copy a model or dataset from any source kubetune reads to any destination it
writes, verified; here (the default) or as a Job in the cluster (``--backend kubernetes``; docs/storage.md,
docs/cluster-setup.md). Imports stay light: boto3, huggingface_hub and the kubernetes client load only when
the command runs, and ``--render`` needs none of them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``deliver`` to the main ``kubetune`` app."""
    from ._output import PlainHelpCommand

    app.command("deliver", cls=PlainHelpCommand)(deliver)


def deliver(
    src: str = typer.Argument(..., metavar="SRC", help="What to copy: hf://, s3://, http(s)://, oci://, builtin:// or a local path."),
    dest: str = typer.Argument(..., metavar="DEST", help="Where to: s3://BUCKET/PREFIX, oci://REGISTRY/REPO:TAG or a local folder."),
    backend: str = typer.Option("local", "--backend", help="local (in this process) or kubernetes (a Job in the cluster)."),
    namespace: Optional[str] = typer.Option(None, "-n", "--namespace", help="With --backend kubernetes: the namespace (default: the context's)."),
    context: Optional[str] = typer.Option(None, "--context", help="With --backend kubernetes: the kubeconfig context."),
    render: bool = typer.Option(False, "--render", help="With --backend kubernetes: print the Job instead of creating it (no cluster needed)."),
    output: str = typer.Option("yaml", "-o", "--output", help="With --render: yaml or json."),
    secret: List[str] = typer.Option([], "--secret", metavar="SECRET", help="With --backend kubernetes: every key of this Secret as an env var of the pod (envFrom; repeatable)."),
    secret_env: List[str] = typer.Option([], "--secret-env", metavar="VAR=SECRET[:KEY]", help="With --backend kubernetes: VAR from one key of a Secret (repeatable)."),
    env: List[str] = typer.Option([], "--env", metavar="KEY=VALUE", help="With --backend kubernetes: a plain env var, e.g. AWS_ENDPOINT_URL (credentials are refused: use --secret)."),
    image: Optional[str] = typer.Option(None, "--image", help="With --backend kubernetes: the image (default: kubetune's of this version)."),
    name: Optional[str] = typer.Option(None, "--name", help="With --backend kubernetes: the Job's name (default: deliver-<digest>-<random>)."),
    retries: Optional[int] = typer.Option(None, "--retries", help="With --backend kubernetes: pods started again after a failed attempt (backoffLimit, default 3)."),
    service_account: Optional[str] = typer.Option(None, "--service-account", help="With --backend kubernetes: the pod's ServiceAccount."),
    disk: Optional[str] = typer.Option(None, "--disk", metavar="SIZE", help="With --backend kubernetes: ephemeral storage for the copy, e.g. 200Gi."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No byte progress (the step lines stay)."),
) -> None:
    """Copy SRC to DEST and verify it (sizes and checksums); DEST is marked complete only after that.

    DEST is a folder, a prefix or a tag: a single-file SRC lands at DEST/NAME. Exit code 2 for a mistake, an unreachable source or destination, a failed verification, or a failed Job.
    """
    from .. import constants as C
    from ..errors import SpecError

    kube_only = {"-n/--namespace": namespace, "--context": context, "--render": render, "--secret": secret, "--secret-env": secret_env,
                 "--env": env, "--image": image, "--name": name, "--retries": retries, "--service-account": service_account, "--disk": disk}
    if backend not in ("local", "kubernetes"):
        raise SpecError(f"--backend {backend!r}: deliver runs locally or on kubernetes", hint="use --backend local or --backend kubernetes")
    if backend == "local":
        given = [flag for flag, value in kube_only.items() if value]
        if given:
            raise SpecError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --backend kubernetes", hint="add --backend kubernetes, or drop them")
        from ..storage._common import set_progress_display
        from ..storage.deliver import deliver as run_local

        if not _stderr_is_terminal():  # a pod's log, CI, a file: a byte-progress line every few seconds, not a bar drawn once
            set_progress_display(None)
        run_local(src, dest, progress=not quiet, report=typer.echo)
        return

    from ..backends.kubernetes.deliver import DeliverOptions, default_name, render_job
    from ._output import check_output_format

    if output != "yaml" and not render:
        raise SpecError("-o/--output applies to --render", hint="add --render to print the Job, or drop -o")
    opts = DeliverOptions(
        name=name or default_name(src, dest), namespace=namespace or "", image=image or _image(),
        secrets=list(secret), secret_env=list(secret_env), env=list(env),
        retries=C.K8S_DELIVER_RETRIES if retries is None else retries, service_account=service_account, disk=disk,
    )
    if render:
        from ..backends.kubernetes.render import render_text

        fmt = check_output_format(output, ("yaml", "json"))
        typer.echo(render_text([render_job(src, dest, opts)], fmt), nl=False)
        return
    render_job(src, dest, opts)  # mistakes in the options end it before any connection
    from ..backends.kubernetes.api import connect
    from ..backends.kubernetes.deliver import run as run_job

    cluster = connect(context=context)
    opts = replace(opts, namespace=namespace or cluster.namespace)
    job = render_job(src, dest, opts)
    try:
        run_job(cluster, job, typer.echo)
    except KeyboardInterrupt:
        typer.echo(f"stopped following; job/{opts.name} keeps running: kubectl logs -f job/{opts.name} -n {opts.namespace}", err=True)
        raise typer.Exit(130) from None


def _stderr_is_terminal() -> bool:
    import sys

    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _image() -> str:
    from .. import constants as C
    from .._version import __version__

    return f"{C.K8S_IMAGE_REPO}:{__version__}"
