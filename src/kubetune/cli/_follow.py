"""Following a job from ``kubetune run``: the live view or plain lines, the success summary, and stopping a
followed job as a preemption when the terminal goes away (SIGTERM/SIGHUP)."""

from __future__ import annotations

import contextlib
import time

from .. import constants as C
from ..events import EventType
from ._output import PlainProgress, duration, event_text, eval_text


def _print_success(ref, out) -> None:
    result = _read_result(ref)
    summary = ""
    if result:
        bits = [f"train_loss={result['train_loss']:.4f}" if isinstance(result.get("train_loss"), (int, float)) else ""]
        if isinstance(result.get("eval_loss"), (int, float)):
            bits.append(f"eval_loss={result['eval_loss']:.4f}")
        for key in ("eval_reward_accuracy", "eval_reward_margin"):  # DPO / ORPO on held-out pairs
            if isinstance(result.get(key), (int, float)):
                bits.append(f"{key}={result[key]:.3f}")
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
    """Show the job's progress until it ends (a live bar in a terminal, lines otherwise); returns the final status."""
    events = client.events(ref)
    starts = [i for i, ev in enumerate(events) if ev.get("type") == EventType.STATE and (ev.get("data") or {}).get("state") == C.STATE_PENDING]
    seen = starts[-1] if starts else 0  # earlier submissions' events stay in the file as history
    if not out.is_terminal:
        return _follow_plain(client, ref, out, seen)
    from rich.live import Live

    st = client.status(ref)
    with Live(_progress_view(st), console=out, refresh_per_second=4, transient=True) as live:
        while True:
            events = client.events(ref)
            for ev in events[seen:]:
                line = eval_text(ev) if (ev.get("data") or {}).get("eval_loss") is not None else event_text(ev)
                if line:
                    live.console.print(line)
            seen = len(events)
            st = client.status(ref)
            live.update(_progress_view(st))
            if st.terminal:
                return st
            time.sleep(0.5)


def _follow_plain(client, ref, out, seen: int):
    """Outside a terminal: stages, evaluations, checkpoints and warnings, and a progress line every few seconds or
    every tenth of the steps (:class:`kubetune.cli._output.PlainProgress`), each printed whole on one line."""
    progress = PlainProgress()
    while True:
        events = client.events(ref)
        for ev in events[seen:]:
            for line in progress.lines(ev):
                out.print(line)
        seen = len(events)
        st = client.status(ref)
        if st.terminal:
            for ev in client.events(ref)[seen:]:  # what was written between the last read and the end
                for line in progress.lines(ev):
                    out.print(line)
            for line in progress.end():
                out.print(line)
            return st
        time.sleep(0.5)


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
    for key, label in (("reward_accuracy", "reward acc"), ("reward_margin", "margin")):  # DPO / ORPO
        if isinstance((st.extra or {}).get(key), (int, float)):
            parts.append(f"{label} {st.extra[key]:.3f}")
    if st.tokens_per_second:
        parts.append(f"{st.tokens_per_second:.0f} tok/s")
    if st.eta_seconds is not None:
        parts.append(f"ETA {duration(st.eta_seconds)}")
    devices = [d for d in (st.extra or {}).get("devices") or [] if isinstance(d, dict)]
    if devices:  # the newest telemetry sample (training/telemetry.py)
        from ..training.telemetry import device_text

        parts.append(", ".join(device_text(d) for d in devices))
    g.add_row(bar, "  ".join(parts))
    return g
