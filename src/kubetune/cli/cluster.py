"""``kubetune cluster init``: set a team namespace up for kubetune; ``kubetune cluster check``: what the cluster
has installed and which flavours and features that enables (docs/cluster-setup.md).

``--render`` is pure (no cluster, no ``kubernetes`` client); without it the objects are created through the
same API client code as the Kubernetes backend's.
"""

from __future__ import annotations

from typing import List, Optional

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``cluster`` command group to the main ``kubetune`` app."""
    from ._output import PlainHelpCommand

    group = typer.Typer(
        help="Set a cluster namespace up for kubetune (cluster init), or see what a cluster offers it (cluster check).",
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    group.command("init")(init)
    group.command("check", cls=PlainHelpCommand)(check)
    app.add_typer(group, name="cluster")


def init(
    namespace: str = typer.Option(..., "--namespace", "-n", help="The team's namespace (created when missing)."),
    queue: Optional[str] = typer.Option(None, "--queue", metavar="CLUSTERQUEUE", help="Also create a Kueue LocalQueue that points at this ClusterQueue."),
    queue_name: str = typer.Option("kubetune", "--queue-name", help="Name of the LocalQueue (what specs set as kubernetes.queue)."),
    service_account: str = typer.Option("kubetune", "--service-account", help="ServiceAccount to create and bind to kubetune's Role."),
    secret: List[str] = typer.Option(
        [], "--secret", "--secret-from-env", metavar="NAME=ENVVAR[,ENVVAR...]",
        help="Create Secret NAME with one key per environment variable, named as it (KEY:ENVVAR names it otherwise); the values "
        "are read from the environment and never printed (repeatable).",
    ),
    secret_file: List[str] = typer.Option(
        [], "--secret-file", metavar="NAME=PATH[,PATH...]",
        help="Create Secret NAME with one key per file, named as the file (KEY:PATH names it otherwise) (repeatable).",
    ),
    render: bool = typer.Option(False, "--render", help="Print the objects instead of creating them (Secrets as `kubectl create secret` commands on stderr: no value is printed)."),
    output: str = typer.Option("yaml", "-o", "--output", help="With --render: yaml or json."),
    context: Optional[str] = typer.Option(None, "--context", help="kubeconfig context (default: the current one)."),
) -> None:
    """Create what a team namespace needs: Namespace, ServiceAccount, Role and RoleBinding, a Kueue LocalQueue, Secrets.

    Objects that exist are left alone (reported `unchanged`), never overwritten. Exit code 2 for a mistake in the
    options, for missing permissions (401/403) and for an unreachable cluster.
    """
    from ..backends.kubernetes.cluster import parse_secret, plan, renderable
    from ..backends.kubernetes.render import render_text
    from ..errors import SpecError
    from ._output import check_output_format

    sources = [parse_secret(s) for s in secret] + [parse_secret(s, from_files=True) for s in secret_file]
    p = plan(namespace, service_account=service_account, cluster_queue=queue, queue=queue_name, secrets=sources)
    if render:
        check_output_format(output, ("yaml", "json"))
        typer.echo(render_text(renderable(p), output), nl=False)
        if sources:  # stderr: stdout stays the objects alone, ready for kubectl apply -f -
            typer.echo("# Secrets are not rendered (their values never are); create them with:", err=True)
            for s in sources:
                typer.echo(s.kubectl_hint(namespace), err=True)
        typer.echo("# job specs then use:\n" + _indent(p.spec_hint()), err=True)
        return
    if output != "yaml":
        raise SpecError("-o/--output applies to --render", hint="add --render to print the objects, or drop -o")
    from ..backends.kubernetes.api import connect
    from ..backends.kubernetes.cluster import apply

    cluster = connect(context=context)
    apply(cluster, p, typer.echo)
    typer.echo("job specs now use:\n" + _indent(p.spec_hint()))


def check(
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="The namespace to check (default: the kubeconfig context's)."),
    context: Optional[str] = typer.Option(None, "--context", help="kubeconfig context (default: the current one)."),
    output: str = typer.Option("table", "-o", "--output", help="table, json or yaml."),
) -> None:
    """List which of Kubeflow Trainer, the training-operator, Kaito, Kueue and Kubeflow Pipelines the cluster has, which kubetune flavours and features that enables, and whether you may create what each flavour needs in the namespace.

    Reads only (API discovery, the KFP Service, the namespace's LocalQueues, SelfSubjectAccessReviews). Exit code 2 for 401 or an unreachable cluster.
    """
    from ._output import check_output_format, print_data

    fmt = check_output_format(output, ("table", "json", "yaml"))
    from ..backends.kubernetes.api import connect
    from ..backends.kubernetes.check import check as run_check

    cluster = connect(context=context)
    report = run_check(cluster, namespace or cluster.namespace)
    if fmt != "table":
        print_data(report, fmt)
        return
    _print_check(report)


def _mark(value) -> str:
    return {True: "yes", False: "no", None: "unknown"}[value]


def _print_check(report: dict) -> None:
    from rich.table import Table

    from ._output import console

    out = console()
    out.print(f"cluster {report['cluster']}, namespace {report['namespace']}")
    t = Table("component", "installed", "api", "enables", box=None, pad_edge=False)
    for c in report["components"]:
        t.add_row(c["name"], _mark(c["installed"]), c["api"] or c.get("note") or "-", c["enables"])
    out.print(t)
    t = Table("flavour", "available", "you may create it", "note", box=None, pad_edge=False)
    for f in report["flavours"]:
        may = _mark(f["allowed"]) if f["available"] else "-"
        if f["missing"]:
            may += " (missing: " + ", ".join(f["missing"]) + ")"
        t.add_row(f["flavour"], _mark(f["available"]) + ("" if f["available"] or "needs" not in f else f" (needs {f['needs']})"), may,
                  f.get("note") or "")
    out.print(t)
    t = Table("feature", "available", "note", box=None, pad_edge=False)
    for f in report["features"]:
        t.add_row(f["feature"], _mark(f["available"]), f.get("note") or "")
    out.print(t)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
