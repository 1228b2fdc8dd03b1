"""CLI commands of the Kubernetes backend: ``kubetune render`` and ``kubetune download``.

``render`` is pure and instant: it imports neither torch nor the ``kubernetes`` client.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

__all__ = ["register"]

_RENDER_BACKENDS = ("kubernetes", "kfp")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main ``kubetune`` app."""
    app.command("render")(render)
    app.command("download")(download)


def render(
    spec: Path = typer.Argument(..., help="Job spec YAML."),
    backend: str = typer.Option("kubernetes", "--backend", "-b", help="Render for this backend: kubernetes (objects) or kfp (compiled pipeline IR)."),
    flavor: Optional[str] = typer.Option(None, "--flavor", "-f", help="job, pytorchjob, trainjob or kaito (default: kubernetes.flavor)."),
    output: str = typer.Option("yaml", "-o", "--output", help="yaml or json"),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Namespace of the objects (default: kubernetes.namespace)."),
    set_: List[str] = typer.Option([], "--set", help="Override a spec field, e.g. --set resources.nodes=2 (repeatable)."),
    serve: bool = typer.Option(False, "--serve", help="Print the vLLM Deployment and Service that serve the job's result instead (more options: kubetune render-serve)."),
) -> None:
    """Print the cluster objects a job runs as, like `helm template` (pure: talks to no cluster)."""
    from ..backends.kubernetes import render as render_objects
    from ..backends.kubernetes import render_text
    from ..errors import BackendError
    from ..spec import load_spec, spec_warnings

    if backend not in _RENDER_BACKENDS:
        raise BackendError(f"render supports --backend {', '.join(_RENDER_BACKENDS)}, not '{backend}'")
    job = load_spec(spec, set_)
    for message in spec_warnings(job):  # stderr: stdout stays the objects alone, ready for kubectl apply -f -
        typer.echo(f"warning: {message}", err=True)
    if serve:  # docs/serving.md
        from ..serve.deploy import render_serve

        if backend != "kubernetes":
            raise BackendError(f"render --serve prints Kubernetes objects; leave out --backend {backend}")
        typer.echo(render_text(render_serve(job, namespace=namespace), output), nl=False)
        return
    if backend == "kfp":  # the compiled pipeline IR YAML (docs/kfp.md)
        from ..backends.kfp import render_pipeline

        typer.echo(render_pipeline(job), nl=False)
        return
    typer.echo(render_text(render_objects(job, flavor, namespace=namespace), output), nl=False)


def download(
    job: str = typer.Argument(..., help="Job name on the cluster."),
    dest: Path = typer.Argument(..., help="Local directory for the job's outputs."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Namespace (default: the kubeconfig context's)."),
    context: Optional[str] = typer.Option(None, "--context", help="kubeconfig context."),
) -> None:
    """Bring a finished cluster job's outputs back: from its output.uri, or from its PVC through a short-lived pod."""
    from ..backends import get_backend

    backend = get_backend("kubernetes", namespace=namespace, context=context)
    where = backend.download(job, dest)
    typer.echo(str(where))
