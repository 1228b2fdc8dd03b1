"""``kubetune sweep``: run a hyperparameter sweep, follow it, report it, stop it.

``kubetune sweep SPEC --grid KEY=V1,V2 ...`` runs (or continues) a sweep; ``kubetune sweep status ID``
shows its trials best first and exports them; ``list`` and ``cancel`` do what they say. Kept light at
import: the sweep modules (and through them nothing heavier than pydantic) load inside the commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import typer
from typer.core import TyperGroup

from .. import constants as C
from ..errors import SpecError

__all__ = ["register"]

_SERVER_HELP = "The kubetune server that runs the sweep (http://HOST:8000, docs/server.md); its key: $KUBETUNE_API_KEY."

_DIST_TYPES = {  # --dist TYPE -> (distribution type, integer)
    "choice": ("choice", False),
    "uniform": ("uniform", False),
    "log-uniform": ("log_uniform", False),
    "log_uniform": ("log_uniform", False),
    "int-uniform": ("uniform", True),
    "int-log-uniform": ("log_uniform", True),
}
_PRUNE_RULES = {"median": C.SWEEP_RULE_MEDIAN, "hyperband": C.SWEEP_RULE_HYPERBAND, "successive-halving": C.SWEEP_RULE_HALVING,
                "successive_halving": C.SWEEP_RULE_HALVING}  # --prune RULE -> sweep.early_stopping.rule


class _RunByDefault(TyperGroup):
    """``kubetune sweep SPEC ...`` means ``kubetune sweep run SPEC ...``; subcommands keep their names."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` command group to the kubetune CLI."""
    sweep_app = typer.Typer(
        cls=_RunByDefault,
        name="sweep",
        help="Hyperparameter sweeps: kubetune sweep SPEC --grid method.lora.r=4,8,16 [--random N | --tpe N] [--parallel K]; "
        "kubetune sweep status ID.",
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    sweep_app.command("run")(run)
    sweep_app.command("status")(status)
    sweep_app.command("list")(list_)
    sweep_app.command("cancel")(cancel)
    app.add_typer(sweep_app, name="sweep")


# --- commands --------------------------------------------------------------------------------
def run(
    spec: Path = typer.Argument(..., help="Job spec YAML (its sweep: section, if any, is the starting point)."),
    grid: List[str] = typer.Option([], "--grid", "-g", help="KEY=V1,V2,... e.g. --grid method.lora.r=4,8,16 (repeatable; every combination runs)."),
    dist: List[str] = typer.Option(
        [], "--dist", help="KEY=TYPE:ARGS for random search, TYPE one of choice, uniform, log-uniform, int-uniform, int-log-uniform, "
        "e.g. --dist training.learning_rate=log-uniform:1e-5,1e-3 (repeatable)."
    ),
    random_trials: Optional[int] = typer.Option(None, "--random", min=1, help="Random search: draw N trials from the grid values and distributions."),
    tpe_trials: Optional[int] = typer.Option(
        None, "--tpe", min=1, help="Bayesian search: N trials chosen one at a time by Optuna's TPE from the results so far; grid values and "
        "--dist distributions are the search space (needs kubetune[sweep])."
    ),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help="Seed of random search and of TPE."),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-p", min=1, help="Trials at once (default: local, one per 4 cores or per set of accelerators; clusters, 4)."),
    objective: Optional[str] = typer.Option(None, "--objective", help="Metric that ranks trials (default eval_loss)."),
    direction: Optional[str] = typer.Option(None, "--direction", help="minimize or maximize."),
    early_stop: bool = typer.Option(False, "--early-stop", help="Stop clearly bad trials early (median rule)."),
    prune: Optional[str] = typer.Option(
        None, "--prune", metavar="RULE", help="Stop clearly bad trials early by RULE: median (as --early-stop), hyperband or successive-halving "
        "(Optuna's pruners; need kubetune[sweep])."
    ),
    backend: str = typer.Option("local", "--backend", "-b", help="Where trials run: local, kubernetes or kfp."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Kubernetes namespace (kubernetes backend)."),
    context: Optional[str] = typer.Option(None, "--context", help="kubeconfig context (kubernetes backend; default: the current one)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Names the sweep <job name>-<run id>; a new run id starts a fresh sweep."),
    sweep_dir: Optional[str] = typer.Option(None, "--dir", help="Sweep directory (default: sweep.dir, runs/sweeps/{id})."),
    set_: List[str] = typer.Option([], "--set", help="Override a base spec field, e.g. --set training.max_steps=100 (repeatable)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Run the sweep in the background; print its id and return."),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
) -> None:
    """Run a sweep, or continue one: succeeded trials are skipped, interrupted ones resume from checkpoints."""
    from ..sweep.run import run_sweep, sweep_dir_for, sweep_id_for
    from ._output import cluster_options

    job = _job_from_options(spec, set_, grid, dist, random_trials, seed, parallel, objective, direction, early_stop, sweep_dir, tpe=tpe_trials, prune=prune)
    options = cluster_options(server, backend, namespace, context)
    if server and job.sweep is not None and job.sweep.uses_optuna:
        raise SpecError("--tpe and --prune hyperband / successive-halving run the sweep here, not on a kubetune server",
                        hint="leave out --server (trials still run on any --backend), or use --grid / --random")
    if server:
        _run_on_server(job, server, detach=detach, parallel=parallel)
        return
    if detach:
        _detach(sys.argv, sweep_dir_for(job, sweep_id_for(job, run_id)), sweep_id_for(job, run_id))
        return
    out = _console()
    try:
        sweep = run_sweep(job, backend=backend, run_id=run_id, backend_options=options, log=lambda m: out.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {m}"))
    except KeyboardInterrupt:
        out.print("[yellow]interrupted[/]: running trials were cancelled; run the same command again to resume them")
        raise typer.Exit(130)
    out.print(_table(sweep))
    if sweep.state != C.STATE_SUCCEEDED:
        raise typer.Exit(1)


def status(
    sweep_key: str = typer.Argument(..., metavar="SWEEP", help="Sweep id or sweep directory."),
    output: str = typer.Option("table", "-o", "--output", help="table, wide (also attempts, job id, run directory, reason), json, yaml or csv (to stdout)."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Also write the ranked trials as CSV to this file."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the sweep and ranked trials as JSON to this file."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Also write a PNG of all trials' loss curves to this file."),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report (table + plot) to this file."),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
) -> None:
    """Show a sweep's trials (values, state, objective), best first."""
    from ..sweep import report as R
    from ..sweep.run import load_sweep, refresh_sweep, trial_curves
    from ._output import check_output_format, print_data

    output = check_output_format(output, ("table", "wide", "json", "yaml", "csv"))
    if server:
        for name, given in (("--csv", csv_path), ("--json", json_path), ("--plot", plot_path), ("--html", html_path)):
            if given:
                raise SpecError(f"{name}: not available for a sweep on a server", hint="use -o json (or -o csv) and redirect it to a file")
        _status_on_server(sweep_key, server, output)
        return
    sweep = refresh_sweep(load_sweep(sweep_key))
    curves = trial_curves(sweep) if (plot_path or html_path) else {}
    written = []
    if csv_path:
        written.append(R.write_csv(sweep, csv_path))
    if json_path:
        written.append(R.write_json(sweep, json_path))
    plot = None
    if plot_path or html_path:
        plot = R.plot_losses(sweep, curves, plot_path or Path(sweep.dir) / C.SWEEP_PLOT)
        if plot is None:
            typer.echo("no plot: matplotlib is not installed (pip install 'kubetune[sweep]')", err=True)
        elif plot_path:
            written.append(plot)
    if html_path:
        written.append(R.write_html(sweep, html_path, plot=plot))
    if output in ("json", "yaml"):
        print_data({"sweep": sweep.id, "state": sweep.state, "objective": sweep.objective, "direction": sweep.direction, "trials": R.rows(sweep)}, output)
    elif output == "csv":
        tmp = Path(sweep.dir) / f".status.{os.getpid()}.csv"
        R.write_csv(sweep, tmp)
        typer.echo(tmp.read_text(encoding="utf-8"), nl=False)
        tmp.unlink()
    else:
        _console(wide=output == "wide").print(_table(sweep, wide=output == "wide"))
    for path in written:
        typer.echo(f"wrote {path}", err=True)


def list_(server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP)) -> None:
    """List sweeps started on this machine (or on a server), newest first."""
    from rich.table import Table

    from ..sweep.run import list_sweeps

    if server:
        table = Table("SWEEP", "NAME", "STATE", "TRIALS", "BEST", "OBJECTIVE", box=None)
        for sw in sorted(_remote(server).list_sweeps(), key=lambda d: d["created_at"], reverse=True):
            best = sw.get("best") or {}
            done = (sw.get("counts") or {}).get("succeeded", 0)
            table.add_row(sw["id"], sw["name"], sw["status"], f"{done}/{len(sw['trials'])}", best.get("name") or "",
                          f"{sw['objective']}={best['objective']:.4g}" if best.get("objective") is not None else "")
        _console().print(table)
        return
    table = Table("SWEEP", "STATE", "TRIALS", "BEST", "OBJECTIVE", "DIR", box=None)
    for sweep in list_sweeps():
        best = sweep.best()
        done = sum(t.state == C.STATE_SUCCEEDED for t in sweep.trials)
        table.add_row(sweep.id, sweep.state, f"{done}/{len(sweep.trials)}", best.name if best else "",
                      f"{sweep.objective}={best.objective:.4g}" if best and best.objective is not None else "", sweep.dir)
    _console().print(table)


def cancel(
    sweep_key: str = typer.Argument(..., metavar="SWEEP", help="Sweep id or sweep directory."),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
) -> None:
    """Stop a sweep and its running trials (rerunning it resumes them from their checkpoints)."""
    from ..sweep.run import cancel_sweep, load_sweep

    if server:
        _console().print(_server_table(_remote(server).cancel_sweep(sweep_key)))
        return
    sweep = cancel_sweep(load_sweep(sweep_key))
    _console().print(_table(sweep))


# --- sweeps on a kubetune server (docs/server.md): the server plans the trials and queues each as a job ------
def _remote(server: str):
    from ..backends.remote import RemoteBackend

    return RemoteBackend(server)


def _run_on_server(job, server: str, *, detach: bool, parallel: int | None) -> None:
    """Submit the sweep; unless ``detach``, follow it (one line per trial state change) and print its table."""
    remote = _remote(server)
    out = _console()
    sw = remote.submit_sweep(job)
    note = "--parallel is not used on a server: its max_running_jobs per project decides how many trials run at once"
    if detach:  # stdout: the id alone, for scripts
        typer.echo(sw["id"])
        typer.echo(f"{len(sw['trials'])} trials submitted to {remote.url}; follow them with: kubetune sweep status {sw['id']} --server {remote.url}", err=True)
        if parallel is not None:
            typer.echo(note, err=True)
        return
    say = lambda m: out.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {m}")  # noqa: E731
    say(f"sweep {sw['id']} ({len(sw['trials'])} trials) submitted to {remote.url}")
    if parallel is not None:
        say(note)
    seen: dict[str, str] = {}
    try:
        while True:
            for t in sw["trials"]:
                if seen.get(t["id"]) != t["status"]:
                    seen[t["id"]] = t["status"]
                    detail = f" {sw['objective']}={t['objective']:.4g}" if t.get("objective") is not None else ""
                    reason = f": {t['error']['message']}" if t["status"] == "failed" and t.get("error") else ""
                    say(f"trial {t['name']} ({_values(t['values'])}) {t['status']}{detail}{reason}")
            if sw["status"] != "running":
                break
            time.sleep(2)
            sw = remote.sweep(sw["id"])
    except KeyboardInterrupt:
        out.print(f"[yellow]interrupted[/]: the sweep runs on at the server; follow it with kubetune sweep status {sw['id']} --server "
                  f"{remote.url}, stop it with kubetune sweep cancel {sw['id']} --server {remote.url}")
        raise typer.Exit(130)
    out.print(_server_table(sw))
    if sw["status"] != "succeeded":
        raise typer.Exit(1)


def _status_on_server(sweep_id: str, server: str, output: str) -> None:
    from ._output import print_data

    sw = _remote(server).sweep(sweep_id)
    if output in ("json", "yaml"):
        print_data(sw, output)
    elif output == "csv":
        import csv
        import io

        params = list(dict.fromkeys(k for t in sw["trials"] for k in t["values"]))
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["rank", "id", "name", *params, "status", sw["objective"]])
        for rank, t in enumerate(_ranked(sw), start=1):
            w.writerow([rank, t["id"], t["name"], *(t["values"].get(k, "") for k in params), t["status"], "" if t["objective"] is None else t["objective"]])
        typer.echo(buf.getvalue(), nl=False)
    else:
        _console(wide=output == "wide").print(_server_table(sw, wide=output == "wide"))


def _ranked(sw: dict) -> list[dict]:
    """Finished trials best first, then the rest in the order they were created."""
    done = [t for t in sw["trials"] if t["status"] == "succeeded" and t.get("objective") is not None]
    done.sort(key=lambda t: t["objective"], reverse=sw["direction"] == "maximize")
    return done + [t for t in sw["trials"] if t not in done]


def _server_table(sw: dict, wide: bool = False):
    from rich.table import Table

    params = list(dict.fromkeys(k for t in sw["trials"] for k in t["values"]))
    short = [k.rsplit(".", 1)[-1] for k in params]
    names = [s if short.count(s) == 1 else k for s, k in zip(short, params)]
    best_id = (sw.get("best") or {}).get("id")
    table = Table(title=f"sweep {sw['id']} ({sw['status']}, {sw['objective']} {sw['direction']})", box=None, title_justify="left")
    extra = ["MODEL", "REASON"] if wide else []
    for col in ["#", "TRIAL", *names, "STATE", sw["objective"].upper(), "JOB", *extra]:
        table.add_column(col, justify="right" if col == "#" else "left", no_wrap=wide)
    for rank, t in enumerate(_ranked(sw), start=1):
        is_best = t["id"] == best_id
        err = t.get("error")
        more = [t.get("fine_tuned_model") or "", (err.get("message") if isinstance(err, dict) else err) or ""] if wide else []
        table.add_row(f"{rank}{' *' if is_best else ''}", t["name"], *(_fmt(t["values"].get(k)) for k in params), t["status"], _fmt(t["objective"]), t["id"], *map(str, more),
                      style="bold green" if is_best else ("dim" if t["status"] not in ("succeeded", "running") else None))
    if sw.get("best"):
        table.caption = f"best: {sw['best']['name']}  {_values(sw['best']['values'])}  ->  job {sw['best']['id']} (kubetune status {sw['best']['id']} --server URL)"
        table.caption_justify = "left"
    return table


def _values(values: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


# --- helpers ---------------------------------------------------------------------------------
def _console(wide: bool = False):
    from rich.console import Console

    # Piped output (logs, CI) gets room for whole trial names instead of rich's 80 columns; -o wide piped: every
    # value whole however long (run directories), one trial a line.
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else (100_000 if wide else 240))


def _job_from_options(spec, set_, grid, dist, random_trials, seed, parallel, objective, direction, early_stop, sweep_dir, *, tpe=None, prune=None):
    """The base spec with its sweep section updated from the command line (the command line wins per key)."""
    from ..spec import load_spec

    if tpe is not None and random_trials is not None:
        raise SpecError(f"--tpe {tpe} and --random {random_trials} both say how to choose the trials; give one of them")
    rule = _PRUNE_RULES.get((prune or "").strip().lower()) if prune is not None else None
    if prune is not None and rule is None:
        raise SpecError(f"--prune '{prune}': expected one of median, hyperband, successive-halving")

    job = load_spec(spec, set_)
    sweep: dict[str, Any] = job.sweep.model_dump(mode="json", exclude_unset=True) if job.sweep else {}
    grid_d, random_d = dict(sweep.get("grid") or {}), dict(sweep.get("random") or {})
    for item in grid:
        key, values = _parse_grid(item)
        grid_d[key] = values
        random_d.pop(key, None)
    for item in dist:
        key, distribution = _parse_dist(item)
        random_d[key] = distribution
        grid_d.pop(key, None)
    sweep.update(grid=grid_d, random=random_d)
    given = {"trials": random_trials if tpe is None else tpe, "seed": seed, "parallel": parallel, "objective": objective, "direction": direction, "dir": sweep_dir}
    sweep.update({k: v for k, v in given.items() if v is not None})
    if tpe is not None:
        sweep["sampler"] = C.SWEEP_SAMPLER_TPE
    elif random_trials is not None and sweep.get("sampler"):  # --random overrides the spec's sampler
        sweep["sampler"] = C.SWEEP_SAMPLER_RANDOM
    if early_stop and not sweep.get("early_stopping"):
        sweep["early_stopping"] = {}
    if rule is not None:
        sweep["early_stopping"] = {**(sweep.get("early_stopping") or {}), "rule": rule}
    return job.with_overrides({"sweep": sweep})  # the job keeps which fields its spec set: presets still follow method.type


def _parse_grid(item: str) -> tuple[str, list]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip() or not raw.strip():
        raise SpecError(f"--grid '{item}': expected KEY=V1,V2,..., e.g. --grid method.lora.r=4,8,16")
    return key.strip(), [_scalar(v) for v in _split(raw)]


def _parse_dist(item: str) -> tuple[str, dict]:
    key, sep, raw = item.partition("=")
    kind, colon, args = raw.partition(":")
    if not sep or not colon or kind.strip() not in _DIST_TYPES:
        raise SpecError(
            f"--dist '{item}': expected KEY=TYPE:ARGS with TYPE one of {', '.join(_DIST_TYPES)}, "
            "e.g. --dist training.learning_rate=log-uniform:1e-5,1e-3 or --dist method.lora.r=choice:4,8,16"
        )
    dtype, integer = _DIST_TYPES[kind.strip()]
    values = [_scalar(v) for v in _split(args)]
    if dtype == "choice":
        return key.strip(), {"type": dtype, "values": values}
    if len(values) != 2:
        raise SpecError(f"--dist '{item}': {kind} takes two numbers, LOW,HIGH")
    return key.strip(), {"type": dtype, "low": values[0], "high": values[1], "integer": integer}


def _split(text: str) -> list[str]:
    """Split on commas outside brackets and quotes: 'a,[b,c],"d,e"' -> ['a', '[b,c]', '"d,e"']."""
    parts, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p != ""]


def _scalar(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _detach(argv: list[str], directory: Path, sweep_id: str) -> None:
    """Start this same sweep as a background process that outlives the terminal."""
    args = [a for a in argv[1:] if a not in ("-d", "--detach")]
    if "sweep" not in args:
        raise SpecError("--detach works from the kubetune command line only", hint="call kubetune.sweep.run.run_sweep in a thread or process of your own")
    directory.mkdir(parents=True, exist_ok=True)
    log = open(directory / C.SWEEP_LOG, "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kubetune.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()
    typer.echo(sweep_id)
    typer.echo(f"running in the background (pid {proc.pid}); follow it with: kubetune sweep status {sweep_id}  (log: {directory / C.SWEEP_LOG})", err=True)


def _table(sweep, wide: bool = False):
    from rich.table import Table

    best = sweep.best()
    short = [k.rsplit(".", 1)[-1] for k in sweep.params]
    names = [s if short.count(s) == 1 else k for s, k in zip(short, sweep.params)]
    table = Table(title=f"sweep {sweep.id} ({sweep.state}, {sweep.objective} {sweep.direction})", box=None, title_justify="left")
    from ..sweep.report import preference_columns

    preference = preference_columns(sweep)  # DPO / ORPO trials: reward accuracy and margin
    for col in ["#", "TRIAL", *names, "STATE", sweep.objective.upper(), "TRAIN_LOSS" if sweep.objective != "train_loss" else "EVAL_LOSS",
                *(m.upper() for m in preference), "STEP", "TIME", *(["ATTEMPTS", "JOB", "RUN_DIR", "REASON"] if wide else [])]:
        table.add_column(col, justify="right" if col in ("#", "STEP", "TIME", "ATTEMPTS") else "left", no_wrap=wide)
    other = "train_loss" if sweep.objective != "train_loss" else "eval_loss"
    for rank, t in enumerate(sweep.ranked(), start=1):
        is_best = best is not None and t.name == best.name
        seconds = f"{t.finished_at - t.started_at:.0f}s" if t.finished_at and t.started_at else ""
        cells = [
            f"{rank}{' *' if is_best else ''}", t.name, *(_fmt(t.values.get(k)) for k in sweep.params), t.state,
            _fmt(t.objective), _fmt(t.metrics.get(other)), *(_fmt(t.metrics.get(m)) for m in preference), f"{t.step}/{t.total_steps or '?'}", seconds,
        ]
        if wide:
            cells += [str(t.attempts), str((t.job or {}).get("id") or ""), str(t.run_dir or ""), t.reason or ""]
        table.add_row(*cells, style="bold green" if is_best else ("dim" if t.state not in (C.STATE_SUCCEEDED, C.STATE_RUNNING) else None))
    if best is not None:
        table.caption = f"best: {best.name}  {' '.join(f'{k}={v}' for k, v in best.values.items())}  ->  {best.run_dir}"
        table.caption_justify = "left"
    return table


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
