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

from .. import constants as C
from ..errors import KubetuneError
from ..events import EventType

app = typer.Typer(
    name="kubetune",
    help="Fine-tune open LLMs from one job spec: locally, on Kubernetes, or as a Kubeflow Pipelines run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_SET_HELP = "Override a spec field, e.g. --set training.learning_rate=1e-4 (repeatable)."
_BACKEND_HELP = "Where the job runs: local, kubernetes or kfp."


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
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# --- spec ------------------------------------------------------------------------------------
@app.command()
def validate(
    spec: Path = typer.Argument(..., help="Job spec YAML."),
    set_: List[str] = typer.Option([], "--set", help=_SET_HELP),
    output: str = typer.Option("yaml", "-o", "--output", help="yaml or json"),
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


@app.command()
def schema() -> None:
    """Print the JSON Schema of the job spec (for editor completion)."""
    from ..spec import TuneJob

    typer.echo(json.dumps(TuneJob.model_json_schema(), indent=2))


# --- running and following jobs ----------------------------------------------------------------
@app.command()
def run(
    spec: Path = typer.Argument(..., help="Job spec YAML."),
    set_: List[str] = typer.Option([], "--set", help=_SET_HELP),
    backend: str = typer.Option("local", "--backend", "-b", help=_BACKEND_HELP),
    detach: bool = typer.Option(False, "--detach", "-d", help="Print the job id and return at once."),
    mode: Optional[str] = typer.Option(None, "--mode", help="kfp backend: local (KFP local runner) or remote (a KFP server); sets kfp.mode."),
    restart: bool = typer.Option(False, "--restart", help="Start over in output.dir: ignore its checkpoints and replace a finished run there (sets training.resume=never)."),
) -> None:
    """Run a job and follow it until it ends (exit code 0 on success).

    A run directory with checkpoints resumes from the newest; one that holds a finished run of the same spec has nothing to do (exit 0); a finished run of another spec is refused (exit 2) unless --restart.
    """
    from ..client import Client
    from ..spec import load_spec

    if mode is not None:  # a shorthand for --set kfp.mode=...; docs/kfp.md
        if backend != "kfp":
            raise typer.BadParameter("--mode applies to --backend kfp", param_hint="--mode")
        set_ = [*set_, f"kfp.mode={mode}"]
    if restart:
        set_ = [*set_, "training.resume=never"]
    job = load_spec(spec, set_)
    _warn_spec(job)
    client = Client(backend)
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
    out.print(f"[bold]{ref.id}[/] on {backend}" + (f" -> {ref.run_dir}" if ref.run_dir else ""))
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
    if st.state == C.STATE_SUCCEEDED:
        _print_success(ref, out)
        return
    out.print(f"[red]{st.state}[/]: {st.reason or 'no reason recorded'}")
    raise typer.Exit(int(st.extra.get("exit_code", 1)) if st.extra else 1)


def _print_success(ref, out) -> None:
    result = _read_result(ref)
    summary = ""
    if result:
        bits = [f"train_loss={result['train_loss']:.4f}" if isinstance(result.get("train_loss"), (int, float)) else ""]
        if isinstance(result.get("eval_loss"), (int, float)):
            bits.append(f"eval_loss={result['eval_loss']:.4f}")
        if isinstance(result.get("tokens_per_second"), (int, float)) and result["tokens_per_second"]:
            bits.append(f"{result['tokens_per_second']:.0f} tokens/s")
        seconds = result.get("total_seconds", result.get("runtime_seconds", 0))
        if isinstance(seconds, (int, float)):
            bits.append(f"{seconds:.0f}s")
        summary = " (" + ", ".join(b for b in bits if b) + ")"
    out.print(f"[green]succeeded[/]{summary}")
    if ref.run_dir:
        out.print(f"results in {ref.run_dir}")


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# Signals that end `kubetune run` in the foreground without the user asking for a cancel.
_TERMINATION_SIGNALS = ("SIGTERM", "SIGHUP")


@contextlib.contextmanager
def _termination_raises():
    """While following a job, SIGTERM and SIGHUP raise _Terminated (their default would orphan the worker)."""
    import signal

    def raise_terminated(signum, frame):
        raise _Terminated(signum)

    sigs = [getattr(signal, n) for n in _TERMINATION_SIGNALS if hasattr(signal, n)]
    previous = {s: signal.signal(s, raise_terminated) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_as_preempted(client, ref, out, signum: int) -> None:
    """Stop a followed job as a preemption: a checkpoint at the next step boundary, then ``preempted``."""
    import signal

    from ..errors import BackendError

    def say(text: str) -> None:
        try:
            out.print(text)
        except Exception:  # the terminal may be gone (SIGHUP): stopping the job matters more
            pass

    name = signal.Signals(signum).name
    say(f"[yellow]received {name}: stopping the job once it has saved a checkpoint (rerun the spec to resume)[/]")
    try:
        st = client.preempt(ref)
    except BackendError:
        say(f"[yellow]the job goes on ({ref.id}): kubetune status / cancel follow it[/]")
        return
    if st is not None:
        say(f"{st.state}: {st.reason or ''}")


def _read_result(ref) -> dict | None:
    if not ref.run_dir:
        return None
    from ..events import RunDir

    return RunDir(ref.run_dir).read_result()


def _follow(client, ref, out):
    """Show live progress until the job ends; returns the final status."""
    from rich.live import Live

    events = client.events(ref)
    starts = [i for i, ev in enumerate(events) if ev.get("type") == EventType.STATE and (ev.get("data") or {}).get("state") == C.STATE_PENDING]
    seen = starts[-1] if starts else 0  # earlier submissions' events stay in the file as history
    interactive = out.is_terminal
    st = client.status(ref)
    with Live(_progress_view(st), console=out, refresh_per_second=4, transient=True, auto_refresh=interactive) as live:
        while True:
            events = client.events(ref)
            for ev in events[seen:]:
                line = _event_text(ev, verbose=not interactive)
                if line:
                    live.console.print(line)
            seen = len(events)
            st = client.status(ref)
            live.update(_progress_view(st))
            if st.terminal:
                return st
            time.sleep(0.5)


def _event_text(ev: dict, verbose: bool) -> str | None:
    t, msg = ev.get("type"), ev.get("message", "")
    if t == "stage":
        return f"[cyan]stage[/] {msg}"
    if t in ("checkpoint",):
        return f"[blue]checkpoint[/] {msg}"
    if t == "warning":
        return f"[yellow]warning[/] {msg}"
    if t == "metrics" and verbose and msg:
        d = ev.get("data") or {}
        extra = ""
        if d.get("tokens_per_second"):
            extra += f" {d['tokens_per_second']:.0f} tok/s"
        if d.get("eta_seconds") is not None:
            extra += f" eta {d['eta_seconds']:.0f}s"
        return f"  {msg}{extra}"
    return None


def _progress_view(st):
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    g = Table.grid(padding=(0, 1))
    total = st.total_steps or 0
    bar = ProgressBar(total=max(total, 1), completed=min(st.step, total) if total else 0, width=30)
    parts = [f"{st.state}", f"stage={st.stage or '-'}", f"step {st.step}/{total or '?'}"]
    if st.loss is not None:
        parts.append(f"loss {st.loss:.4f}")
    if st.eval_loss is not None:
        parts.append(f"eval {st.eval_loss:.4f}")
    if st.tokens_per_second:
        parts.append(f"{st.tokens_per_second:.0f} tok/s")
    if st.eta_seconds is not None:
        parts.append(f"ETA {st.eta_seconds:.0f}s")
    g.add_row(bar, "  ".join(parts))
    return g


@app.command("list")
def list_(backend: str = typer.Option("local", "--backend", "-b", help=_BACKEND_HELP)) -> None:
    """List jobs, newest first."""
    from rich.table import Table

    from ..client import Client

    client = Client(backend)
    table = Table("JOB", "STATE", "STAGE", "STEP", "LOSS", "RUN DIR", box=None)
    for ref in client.list():
        try:
            st = client.status(ref)
        except KubetuneError:
            continue
        except Exception as e:  # one damaged run directory must not hide the others
            table.add_row(ref.id, "unknown", "", "", "", f"{ref.run_dir or ''} (unreadable: {type(e).__name__}: {e})")
            continue
        table.add_row(ref.id, st.state, st.stage or "", f"{st.step}/{st.total_steps or '?'}", f"{st.loss:.4f}" if st.loss is not None else "", ref.run_dir or "")
    _console().print(table)


@app.command()
def status(
    job: str = typer.Argument(..., help="Job id, name or run directory."),
    backend: str = typer.Option("local", "--backend", "-b", help=_BACKEND_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print status.json as JSON."),
) -> None:
    """Show a job's state, stage and progress."""
    from ..client import Client
    from ..redact import redact_data

    st = Client(backend).status(job)
    data = redact_data(st.to_dict())  # also for runs recorded by an older kubetune, and cluster pods' reasons
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    out = _console()
    for k, v in data.items():
        if k in ("extra",):
            continue
        out.print(f"[bold]{k:>18}[/] {v}")


@app.command()
def logs(
    job: str = typer.Argument(..., help="Job id, name or run directory."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
    backend: str = typer.Option("local", "--backend", "-b", help=_BACKEND_HELP),
) -> None:
    """Print a job's worker log."""
    from ..client import Client
    from ..redact import redact_text

    for line in Client(backend).logs(job, follow=follow):  # cluster pod logs too: mask whatever they hold
        typer.echo(redact_text(line))


@app.command()
def cancel(
    job: str = typer.Argument(..., help="Job id, name or run directory."),
    backend: str = typer.Option("local", "--backend", "-b", help=_BACKEND_HELP),
) -> None:
    """Stop a job and every process it started."""
    from ..client import Client

    client = Client(backend)
    client.cancel(job)
    typer.echo(f"{job}: {client.status(job).state}")


# --- results ---------------------------------------------------------------------------------
@app.command()
def chat(
    source: str = typer.Argument(
        f"http://{C.SERVE_HOST}:{C.SERVE_PORT}", help="A server URL (OpenAI API, e.g. kubetune serve), or a run directory, model directory or model URI to load in this process."
    ),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="Ask once and exit (otherwise interactive)."),
    system: Optional[str] = typer.Option(None, "--system", help="System message."),
    max_new_tokens: int = typer.Option(128, help="Longest reply in tokens."),
    temperature: float = typer.Option(0.0, help="0 for greedy decoding."),
    model_id: Optional[str] = typer.Option(None, "--model", "-m", help="Server only: the model id (default: the first the server lists)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar=C.ENV_SERVE_API_KEY, help="Server only: bearer key."),
) -> None:
    """Chat with a trained model: through a server URL, or loaded in this process."""
    from ..serve.chat import RemoteChat, is_url

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
        reply = ""
        for piece in model.stream(history, max_new_tokens=max_new_tokens, temperature=temperature):
            reply += piece
            typer.echo(piece, nl=False)
        typer.echo("")
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


@app.command()
def merge(
    run_dir: Path = typer.Argument(..., help="Run directory of a LoRA/QLoRA/DoRA job."),
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
for _mod in ("storage", "kubernetes", "serve", "data", "presets", "sweep"):  # one module per command group
    importlib.import_module(f"{__package__}.{_mod}").register(app)


def _quiet_library_notices() -> None:
    """Hide library notices that say nothing actionable to a kubetune user (``--debug`` keeps them)."""
    import logging
    import warnings

    # bitsandbytes' CPU backend logs at import that the optional `kernels` package (kernels fetched from the Hub)
    # is missing; it falls back to its own kernels, and peft imports bitsandbytes even for plain LoRA.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # transformers deprecations triggered inside peft/trl, not by anything in the user's spec
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)


def main() -> None:
    """Console entry point: user errors print one message and exit 2; --debug shows tracebacks."""
    from ..redact import install

    install()
    debug = "--debug" in sys.argv or os.environ.get(C.ENV_DEBUG) == "1"
    if not debug:
        _quiet_library_notices()
    try:
        app()
    except KubetuneError as e:
        if debug:
            raise
        from rich.text import Text

        _console(stderr=True).print(Text.assemble(("error: ", "bold red"), str(e)), soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
