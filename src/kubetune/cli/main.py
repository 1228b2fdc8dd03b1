"""The ``kubetune`` command line: parse -> spec -> one call into the modules below.

Kept light at import: torch, transformers and cluster clients load only inside the commands that
need them, so ``kubetune --help``, ``validate`` and ``render`` start instantly.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from .. import constants as C
from ..errors import KubetuneError
from ._follow import _Terminated, _follow, _print_success, _stop_as_preempted, _termination_raises
from ._output import PlainHelpCommand, check_output_format, closed_stdout_ends_quietly, console as _output_console, print_data


class _Commands(TyperGroup):
    """kubetune's commands. One whose stdout reader went away (``kubetune chat ... | head``, ``kubetune logs -f |
    grep -m1 ...``) ends quietly with exit code 141, as a shell reports SIGPIPE; click alone would exit 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            raise typer.Exit(C.EXIT_BROKEN_PIPE) from None


app = typer.Typer(
    cls=_Commands,
    name="kubetune",
    help="Fine-tune open LLMs from one job spec: locally, on Kubernetes, or as a Kubeflow Pipelines run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_SET_HELP = "Override a spec field, e.g. --set training.learning_rate=1e-4 (repeatable)."
_BACKEND_HELP = "Where the job runs: local, kubernetes or kfp."
_SERVER_HELP = "Send this to a kubetune server (http://HOST:8000, docs/server.md) instead of a backend; its key: $KUBETUNE_API_KEY."
_JOB_HELP = "Job id, name (its newest job) or run directory (the newest job there)."
_NAMESPACE_HELP = "Kubernetes namespace (--backend kubernetes; default: the spec's kubernetes.namespace, else the kubeconfig context's)."
_CONTEXT_HELP = "kubeconfig context (--backend kubernetes; default: the current one)."


def _client(server: Optional[str], backend: str, namespace: Optional[str] = None, context: Optional[str] = None):
    """The Client the options name: a server, else the backend (``-n``/``--context`` reach the kubernetes backend,
    as kubectl's do)."""
    from ..client import Client
    from ._output import cluster_options

    return Client(server or backend, **cluster_options(server, backend, namespace, context))


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    from ..redact import install

    install()  # no credential in any log record (httpx, urllib3, botocore, kubetune's own)
    if debug:
        os.environ[C.ENV_DEBUG] = "1"


def _warn_spec(job) -> None:
    """Print the spec's warnings (:func:`kubetune.spec.spec_warnings`) to stderr."""
    from ..spec import spec_warnings

    for message in spec_warnings(job):
        typer.echo(f"warning: {message}", err=True)


def _console(stderr: bool = False):
    """A rich Console for this command's output; outside a terminal it never wraps or truncates a line."""

    def gone() -> None:  # rich would exit 1 at once; kubetune's commands end as for any closed stdout
        _stdout_gone()
        raise BrokenPipeError(32, "stdout was closed by its reader")

    return _output_console(stderr, on_broken_pipe=gone)


# --- spec ------------------------------------------------------------------------------------
@app.command(cls=PlainHelpCommand)
def validate(
    spec: Path = typer.Argument(..., metavar="SPEC", help="Job spec YAML."),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=_SET_HELP),
    output: str = typer.Option("yaml", "-o", "--output", metavar="FORMAT", help="yaml or json"),
    sources: bool = typer.Option(True, "--sources/--no-sources", help="Note after each YAML value where it came from (spec, preset NAME, default)."),
    check_local_: bool = typer.Option(
        True, "--check-local/--no-check-local",
        help="Also check the job against this machine: local sources exist, output.dir can be written, max_seq_length fits "
        "a builtin or local model (--no-check-local for a spec meant for a cluster).",
    ),
) -> None:
    """Check a spec and print it resolved: every effective value, and where it came from."""
    from ..preflight import check_local
    from ..spec import dump_spec, explain_spec, load_spec, redacted_spec_dict

    job = load_spec(spec, set_)
    _warn_spec(job)
    if check_local_:
        check_local(job)
    if output == "json":
        typer.echo(json.dumps(redacted_spec_dict(job), indent=2))
    else:
        typer.echo(explain_spec(job) if sources else dump_spec(job), nl=False)
    t = job.training
    steps = f"{t.max_steps} (training.max_steps)" if t.max_steps else f"{t.epochs:g} epochs x ceil(samples / {job.global_batch}), known once the data is prepared"
    typer.echo(
        f"# valid: {job.resources.world_size} process(es), global batch {job.global_batch} "
        f"(batch_size {t.batch_size} x {job.resources.world_size} x accumulation {job.accumulation_steps}); total steps: {steps}",
        err=True,
    )


@app.command(cls=PlainHelpCommand)
def schema() -> None:
    """Print the JSON Schema of the job spec (for editor completion)."""
    from ..spec import TuneJob

    typer.echo(json.dumps(TuneJob.model_json_schema(), indent=2))


# --- running and following jobs ----------------------------------------------------------------
@app.command(cls=PlainHelpCommand)
def run(
    spec: Path = typer.Argument(..., metavar="SPEC", help="Job spec YAML."),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", help=_SET_HELP),
    backend: str = typer.Option("local", "--backend", "-b", metavar="BACKEND", help=_BACKEND_HELP),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", metavar="NAMESPACE", help=_NAMESPACE_HELP),
    context: Optional[str] = typer.Option(None, "--context", metavar="CONTEXT", help=_CONTEXT_HELP),
    detach: bool = typer.Option(False, "--detach", "-d", help="Print the job id and return at once; the job runs on (kubetune status/logs/cancel JOB)."),
    mode: Optional[str] = typer.Option(None, "--mode", metavar="MODE", help="kfp backend: local (KFP local runner) or remote (a KFP server); sets kfp.mode."),
    restart: bool = typer.Option(False, "--restart", help="Start over in output.dir: remove its checkpoints and replace a finished run there (sets training.resume=never)."),
) -> None:
    """Run a job and follow it until it ends (exit code 0 on success, 2 for a mistake in the spec or data, 1 otherwise).

    Rerunning a spec resumes: when output.dir holds checkpoints, training continues from the newest complete one. When it holds a finished run of the same spec there is nothing to do (exit 0); a finished run of another spec is refused (exit 2). --restart starts over from step 0.

    Ctrl-C cancels the job (state cancelled, exit 130): the worker stops at once without saving, so a rerun resumes from the last checkpoint saved every training.save_steps. SIGTERM or SIGHUP (a closed terminal) stop it as a preemption instead: it saves a checkpoint first (state preempted). After --detach, Ctrl-C no longer reaches the job: kubetune cancel JOB stops it.

    In a terminal progress is a live bar; in a pipe or CI it is a line every few seconds or every tenth of the steps.
    """
    from ..spec import load_spec

    if mode is not None:  # a shorthand for --set kfp.mode=...; docs/kfp.md
        if backend != "kfp":
            raise typer.BadParameter("--mode applies to --backend kfp", param_hint="--mode")
        set_ = [*set_, f"kfp.mode={mode}"]
    if restart:
        set_ = [*set_, "training.resume=never"]
    job = load_spec(spec, set_)
    _warn_spec(job)
    client = _client(server, backend, namespace, context)
    ref = client.submit(job)
    out = _console()
    if (ref.extra or {}).get("already_complete"):
        out.print(f"{ref.run_dir} already holds a finished run of this spec ({ref.id}): nothing to do; "
                  "--restart trains again from scratch", soft_wrap=True)
        if detach:
            typer.echo(ref.id)
            return
        _print_success(ref, out)
        return
    if detach:
        typer.echo(ref.id)
        return
    out.print(f"[bold]{ref.id}[/] on {server or backend}" + (f" -> {ref.run_dir}" if ref.run_dir else ""))
    try:
        with _termination_raises():
            st = _follow(client, ref, out)
    except KeyboardInterrupt:  # Ctrl-C: the user's cancel
        out.print("[yellow]interrupted: cancelling the job[/]")
        client.cancel(ref)
        raise typer.Exit(130)
    except _Terminated as e:  # SIGTERM/SIGHUP (killed, terminal closed): the job is preempted, not left running
        _stop_as_preempted(client, ref, out, e.signum)
        raise typer.Exit(128 + e.signum)
    except BrokenPipeError:  # stdout's reader went away (`| head`): only the following stops (exit 141)
        with contextlib.suppress(Exception):
            typer.echo(f"stdout was closed: stopped following {ref.id}, which goes on (kubetune status/logs/cancel {ref.id})", err=True)
        raise
    if st.state == C.STATE_SUCCEEDED:
        _print_success(ref, out)
        return
    out.print(f"[red]{st.state}[/]: {st.reason or 'no reason recorded'}")
    raise typer.Exit(int(st.extra.get("exit_code", 1)) if st.extra else 1)


_LIST_OUTPUT_HELP = "table (default), wide (also name, backend, created and finished times, tokens/s), json or yaml (every status field, raw times)."


@app.command("list", cls=PlainHelpCommand)
def list_(
    backend: str = typer.Option("local", "--backend", "-b", metavar="BACKEND", help=_BACKEND_HELP),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", metavar="NAMESPACE", help=_NAMESPACE_HELP),
    context: Optional[str] = typer.Option(None, "--context", metavar="CONTEXT", help=_CONTEXT_HELP),
    output: str = typer.Option("table", "-o", "--output", metavar="FORMAT", help=_LIST_OUTPUT_HELP),
) -> None:
    """List jobs, newest first (in a pipe: every value whole, one job a line)."""
    from rich.markup import escape
    from rich.table import Column, Table

    from ..redact import redact_data
    from ._output import timestamp

    fmt = check_output_format(output, ("table", "wide", "json", "yaml"))
    client = _client(server, backend, namespace, context)
    rows, records = [], []
    for ref in client.list():
        try:
            st = client.status(ref)
        except KubetuneError:
            continue
        except Exception as e:  # one damaged run directory must not hide the others
            rows.append((ref.id, "unknown", "", "", "", "", "", "", "", "", f"{ref.run_dir or ''} (unreadable: {type(e).__name__}: {e})"))
            records.append({"job_id": ref.id, "state": "unknown", "run_dir": ref.run_dir, "reason": f"unreadable: {type(e).__name__}: {e}"})
            continue
        data = redact_data(st.to_dict())
        records.append({"job_id": ref.id, **{k: v for k, v in data.items() if k != "job_id"}, "run_dir": data.get("run_dir", ref.run_dir)})
        when = lambda t: timestamp(t).replace(" ", "T", 1) if isinstance(t, (int, float)) else ""  # noqa: E731  one word per cell
        rows.append((ref.id, st.name or "", st.backend or backend, st.state, st.stage or "", f"{st.step}/{st.total_steps or '?'}",
                     f"{st.loss:.4f}" if st.loss is not None else "", f"{st.tokens_per_second:.0f}" if st.tokens_per_second else "",
                     when(st.created_at), when(st.finished_at), ref.run_dir or ""))
    if fmt in ("json", "yaml"):
        print_data(records, fmt)
        return
    wide = fmt == "wide"
    # a job id is never cut: the run directory folds onto more lines instead when the terminal is narrow
    id_width = max([len("JOB"), *(len(r[0]) for r in rows)])
    columns = [Column("JOB", no_wrap=True, min_width=id_width)]
    if wide:
        columns += [Column("NAME", no_wrap=True), Column("BACKEND", no_wrap=True)]
    columns += [Column("STATE", no_wrap=True), Column("STAGE"), Column("STEP"), Column("LOSS")]
    if wide:
        columns += [Column("TOKENS/S"), Column("CREATED", no_wrap=True), Column("FINISHED", no_wrap=True)]
    columns.append(Column("RUN DIR", overflow="fold"))
    table = Table(*columns, box=None)
    for row in rows:
        picked = row if wide else (row[0], *row[3:7], row[10])
        table.add_row(*(escape(v) for v in picked))
    _console().print(table)


@app.command(cls=PlainHelpCommand)
def status(
    job: str = typer.Argument(..., metavar="JOB", help=_JOB_HELP),
    backend: str = typer.Option("local", "--backend", "-b", metavar="BACKEND", help=_BACKEND_HELP),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", metavar="NAMESPACE", help=_NAMESPACE_HELP),
    context: Optional[str] = typer.Option(None, "--context", metavar="CONTEXT", help=_CONTEXT_HELP),
    output: str = typer.Option("text", "-o", "--output", metavar="FORMAT", help="text (default: for people, local times), json or yaml (raw values, times as seconds since the epoch)."),
    as_json: bool = typer.Option(False, "--json", help="The same as -o json."),
) -> None:
    """Show a job's state, stage, progress and times (an earlier job id: that job's final status)."""
    from rich.markup import escape

    from ..redact import redact_data
    from ._output import status_rows

    fmt = "json" if as_json else check_output_format(output, ("text", "json", "yaml"))
    st = _client(server, backend, namespace, context).status(job)
    data = redact_data(st.to_dict())  # also for runs recorded by an older kubetune, and cluster pods' reasons
    if fmt in ("json", "yaml"):
        print_data(data, fmt)
        return
    out = _console()
    for k, v in status_rows(data, time.time()):
        out.print(f"[bold]{k:>18}[/] {escape(v)}")


@app.command(cls=PlainHelpCommand)
def logs(
    job: str = typer.Argument(..., metavar="JOB", help=_JOB_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    all_runs: bool = typer.Option(False, "--all", help="Also the earlier jobs' logs in the same run directory, each after a header line naming its job id."),
    backend: str = typer.Option("local", "--backend", "-b", metavar="BACKEND", help=_BACKEND_HELP),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", metavar="NAMESPACE", help=_NAMESPACE_HELP),
    context: Optional[str] = typer.Option(None, "--context", metavar="CONTEXT", help=_CONTEXT_HELP),
) -> None:
    """Print a job's worker log: this job's part only, from the header line naming its id (--all: earlier jobs' too)."""
    from ..redact import redact_text

    for line in _client(server, backend, namespace, context).logs(job, follow=follow, all_runs=all_runs):  # cluster pod logs too: mask whatever they hold
        typer.echo(redact_text(line))


@app.command(cls=PlainHelpCommand)
def cancel(
    job: str = typer.Argument(..., metavar="JOB", help=_JOB_HELP),
    backend: str = typer.Option("local", "--backend", "-b", metavar="BACKEND", help=_BACKEND_HELP),
    server: Optional[str] = typer.Option(None, "--server", envvar="KUBETUNE_SERVER", metavar="URL", help=_SERVER_HELP),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", metavar="NAMESPACE", help=_NAMESPACE_HELP),
    context: Optional[str] = typer.Option(None, "--context", metavar="CONTEXT", help=_CONTEXT_HELP),
) -> None:
    """Stop a job and every process it started."""

    client = _client(server, backend, namespace, context)
    client.cancel(job)
    typer.echo(f"{job}: {client.status(job).state}")


# --- results ---------------------------------------------------------------------------------
@app.command(cls=PlainHelpCommand)
def chat(
    source: Optional[str] = typer.Argument(
        None, metavar="[SOURCE]", show_default=False,
        help="A server URL (OpenAI API, e.g. kubetune serve), or a run directory, model directory or model URI to load in "
        f"this process. Default: $OPENAI_BASE_URL when set, else http://{C.SERVE_HOST}:{C.SERVE_PORT} (kubetune serve's address).",
    ),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="Ask once and exit (otherwise interactive)."),
    system: Optional[str] = typer.Option(None, "--system", help="System message."),
    max_new_tokens: int = typer.Option(128, help="Longest reply in tokens."),
    temperature: float = typer.Option(0.0, help="0 for greedy decoding."),
    model_id: Optional[str] = typer.Option(None, "--model", "-m", help="Server only: the model id (default: the first the server lists)."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar=[C.ENV_SERVE_API_KEY, "OPENAI_API_KEY"], show_envvar=False,
        help=f"Server only: bearer key (or set {C.ENV_SERVE_API_KEY}, else OPENAI_API_KEY).",
    ),
) -> None:
    """Chat with a trained model: through a server URL, or loaded in this process."""
    from ..serve.chat import RemoteChat, is_url

    source = source or os.environ.get("OPENAI_BASE_URL") or f"http://{C.SERVE_HOST}:{C.SERVE_PORT}"  # the openai client's convention

    if is_url(source):
        model = RemoteChat(source, model=model_id, api_key=api_key)
        source = model.source
    else:
        from ..serve.loading import load_chat_model, set_inference_threads
        from ..redact import redact_uri

        set_inference_threads()  # on a CPU: the free cores, not all of them (kubetune.cpu); quietly
        model = load_chat_model(source)
        source = redact_uri(source)  # shown below
    history: list[dict] = [{"role": "system", "content": system}] if system else []

    def ask(text: str) -> None:
        history.append({"role": "user", "content": text})
        reply, held = "", ""  # whitespace is held back until visible text follows: a blank reply is named, not printed
        with contextlib.closing(model.stream(history, max_new_tokens=max_new_tokens, temperature=temperature)) as pieces:
            for piece in pieces:  # closed on any exit (a closed stdout too): the generation stops with the reader
                reply += piece
                held += piece
                if held.strip():
                    typer.echo(held, nl=False)
                    held = ""
        typer.echo(held if reply.strip() else _blank_reply(reply))
        history.append({"role": "assistant", "content": reply})

    if prompt is not None:
        typer.echo(f"> {prompt}")
        ask(prompt)
        return
    typer.echo("Chatting with " + source + " (empty line or Ctrl-D to quit, /reset to clear history)")
    while True:
        try:
            text = input("> ")
        except (EOFError, KeyboardInterrupt):
            typer.echo("")
            return
        if not text.strip():
            return
        if text.strip() == "/reset":
            del history[1 if system else 0 :]
            continue
        ask(text)


def _blank_reply(reply: str) -> str:
    """What ``kubetune chat`` shows for a reply with no visible text: ``(empty answer)``, or the whitespace as a repr."""
    if not reply:
        return "(empty answer)"
    shown = repr(reply) if len(reply) <= 40 else repr(reply[:40])[:-1] + "...'"
    return f"(blank answer: {len(reply)} whitespace character(s), {shown})"


@app.command(cls=PlainHelpCommand)
def merge(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory of a LoRA/QLoRA/DoRA job."),
    base_model: Optional[str] = typer.Option(
        None, "--base-model", help="The base model (a directory or URI; default: the run's model.source). Needed when that "
        "URI carried credentials, which the run's spec.yaml does not keep."
    ),
) -> None:
    """Merge a run's adapter into its base model (writes merged/)."""
    from ..training.merge import merge_run

    base = None
    if base_model:
        from ..storage import fetch

        base = fetch(base_model)
    typer.echo(str(merge_run(run_dir, base_model=base)))


@app.command(hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context) -> None:
    """Run one job in this process (what every backend starts): --spec FILE [--set k=v] [--run-dir DIR]."""
    from ..worker import main as worker_main

    raise typer.Exit(worker_main(list(ctx.args)))


# --- commands contributed by other modules (kept light: they import lazily) ------------------------
for _mod in ("storage", "deliver", "kubernetes", "cluster", "serve", "data", "presets", "sweep", "server", "llama_stack"):  # one module per command group
    importlib.import_module(f"{__package__}.{_mod}").register(app)


def _stdout_gone() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is buffered cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _interactive() -> bool:
    """stderr (where library progress bars draw) is a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def main() -> None:
    """Console entry point: user errors print one message and exit 2; --debug shows tracebacks."""
    from ..redact import install

    install()
    debug = "--debug" in sys.argv or os.environ.get(C.ENV_DEBUG) == "1"
    if not debug:
        from ..quiet import disable_library_progress_bars, quiet_library_notices

        quiet_library_notices()  # library notices a user cannot act on (kubetune's own warnings stay)
        if not _interactive():
            disable_library_progress_bars()  # piped or logged: tqdm bars would be lines of carriage returns
    closed_stdout_ends_quietly(_stdout_gone)
    try:
        try:
            app()
        except ModuleNotFoundError as e:  # an optional package imported deep inside a command: name the extra
            from ..extras import missing_extra

            raise (missing_extra(e) or e) from e
    except KubetuneError as e:
        if debug:
            raise
        from rich.text import Text

        _console(stderr=True).print(Text.assemble(("error: ", "bold red"), str(e)), soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
