"""How the CLI prints: for people in a terminal, and for pipes, files and CI (``not sys.stdout.isatty()``).

Outside a terminal nothing is wrapped or cut (lines are read by grep, scripts and CI logs), and ``kubetune
run`` prints a progress line every few seconds or every tenth of the steps instead of one per step. Help
pages show plain metavars (SPEC, KEY=VALUE) instead of typer's type labels (``<list[str]>``, ``{spec}``).
"""

from __future__ import annotations

import json
import math
from datetime import datetime

from typer import echo

from typer.core import TyperArgument, TyperCommand, TyperOption

from ..constants import EXIT_BROKEN_PIPE
from ..errors import KubetuneError

# Outside a terminal a line is never wrapped and a table cell never cut: lines are for grep and scripts.
PLAIN_WIDTH = 100_000
# Outside a terminal `kubetune run` prints a progress line at most this often, or every tenth of the steps,
# whichever comes first (and always the first and the last step).
PROGRESS_INTERVAL_S = 5.0
PROGRESS_FRACTION = 0.1


def console(stderr: bool = False, on_broken_pipe=None):
    """A rich Console; outside a terminal one that neither wraps nor truncates. ``on_broken_pipe`` replaces rich's
    own handling of a closed stdout (which exits 1 at once)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            if on_broken_pipe is None:
                return super().on_broken_pipe()
            self.quiet = True
            on_broken_pipe()

    out = _Console(stderr=stderr, highlight=False)
    if not out.is_terminal:
        out.soft_wrap = True
        out.width = PLAIN_WIDTH
    return out


def duration(seconds: float) -> str:
    """``45s``, ``1m05s``, ``2h03m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def timestamp(seconds: float) -> str:
    """An epoch time as local ISO 8601 to the second: ``2026-11-24 21:30:15+01:00``."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat(sep=" ", timespec="seconds")


_TIMES = ("created_at", "started_at", "updated_at", "finished_at")


def status_rows(data: dict, now: float) -> list[tuple[str, str]]:
    """``kubetune status``'s lines for people: times as local ISO 8601 with how long things took, the ETA as a
    duration (``--json`` keeps the raw numbers)."""
    rows = []
    terminal = data.get("finished_at") is not None
    for key, value in data.items():
        if key == "extra":
            continue
        text = str(value)
        if key in _TIMES and isinstance(value, (int, float)):
            text = timestamp(value)
            if key == "finished_at":
                began = data.get("started_at", data.get("created_at"))
                if isinstance(began, (int, float)):
                    text += f" (took {duration(value - began)})"
            elif key == "updated_at" and not terminal:
                text += f" ({duration(now - value)} ago)"
        elif key == "eta_seconds" and isinstance(value, (int, float)):
            text = duration(value)
        rows.append((key, text))
    from ..constants import PREFERENCE_STATUS_KEYS

    extra = data.get("extra") or {}
    rows += [(k, f"{extra[k]:.4g}") for k in PREFERENCE_STATUS_KEYS if isinstance(extra.get(k), (int, float))]  # DPO / ORPO
    if isinstance(extra.get("output_image"), str):  # Kaito pushes the adapter as an image
        rows.append(("output_image", extra["output_image"]))
    if isinstance(extra.get("output_volume"), str):  # ... or writes it to a PersistentVolumeClaim
        rows.append(("output_volume", extra["output_volume"]))
    if isinstance(extra.get("device"), str):
        rows.append(("device", extra["device"]))
    rows += device_rows(extra.get("devices"))
    return rows


def device_rows(devices) -> list[tuple[str, str]]:
    """``devices[0]  NVIDIA H200 87% 20.1/139.0 GiB 412 W``: the newest telemetry sample of each device."""
    from ..training.telemetry import device_text

    if not isinstance(devices, list):
        return []
    return [(f"devices[{d.get('index', i)}]", device_text(d)) for i, d in enumerate(devices) if isinstance(d, dict)]


class PlainProgress:
    """What ``kubetune run`` prints for a job's events outside a terminal.

    Stages, evaluations, checkpoints, warnings and other progress notes (the plan): always. Training steps: the first, then one when
    :data:`PROGRESS_INTERVAL_S` seconds (by the events' times) or a tenth of the steps have passed since the
    last one printed, whichever comes first, and the last step. :meth:`end` gives the last step seen when the
    job ended before its planned last step.
    """

    def __init__(self, interval: float = PROGRESS_INTERVAL_S, fraction: float = PROGRESS_FRACTION) -> None:
        self.interval = interval
        self.fraction = fraction
        self._last: tuple[int, float] | None = None  # (step, time) of the last step printed
        self._held: dict | None = None  # the newest step not printed

    def lines(self, ev: dict) -> list[str]:
        """The lines (rich markup) to print for one event."""
        data = ev.get("data") or {}
        if ev.get("type") == "metrics" and data.get("eval_loss") is not None:
            return [eval_text(ev)]
        if ev.get("type") == "metrics" and data.get("step") is not None and data.get("loss") is not None:
            if self._due(data, ev.get("time")):
                self._last, self._held = (int(data["step"]), float(ev.get("time") or 0)), None
                return [step_text(ev)]
            self._held = ev
            return []
        if ev.get("type") == "metrics":  # the data prepared, the plan (steps, global batch)
            return ["  " + _escape(ev["message"])] if ev.get("message") else []
        line = event_text(ev)
        return [line] if line else []

    def _due(self, data: dict, when: float | None) -> bool:
        if self._last is None:
            return True
        step, total = int(data["step"]), data.get("total_steps")
        last_step, last_time = self._last
        if total and step >= total:
            return True
        every = max(1, math.ceil(total * self.fraction)) if total else None
        return (every is not None and step - last_step >= every) or (when is not None and when - last_time >= self.interval)

    def end(self) -> list[str]:
        """The last step seen, when it was held back (the job ended early)."""
        held, self._held = self._held, None
        return [step_text(held)] if held else []


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def step_text(ev: dict) -> str:
    """``  step 68/680 loss=2.3456 1234 tok/s eta 1m05s``: one training step's progress."""
    d = ev.get("data") or {}
    text = ev.get("message") or f"step {d.get('step')}/{d.get('total_steps') or '?'} loss={d.get('loss')}"
    if d.get("tokens_per_second"):
        text += f" {d['tokens_per_second']:.0f} tok/s"
    if d.get("eta_seconds") is not None:
        text += f" eta {duration(d['eta_seconds'])}"
    devices = [x for x in d.get("devices") or [] if isinstance(x, dict)]
    if devices:
        from ..training.telemetry import device_text

        text += " | " + ", ".join(device_text(x) for x in devices)
    return "  " + _escape(text)


def eval_text(ev: dict) -> str:
    """``  eval at step 68/680: eval_loss=0.6123 perplexity=1.84``."""
    d = ev.get("data") or {}
    where = f"{d.get('step')}/{d['total_steps']}" if d.get("total_steps") else f"{d.get('step')}"
    return f"  [magenta]eval[/] at step {where}: " + _escape(ev.get("message", ""))


def event_text(ev: dict) -> str | None:
    """The line for a stage, checkpoint or warning event (None for others)."""
    t, msg = ev.get("type"), _escape(ev.get("message", ""))
    if t == "stage":
        return f"[cyan]stage[/] {msg}"
    if t == "checkpoint":
        return f"[blue]checkpoint[/] {msg}"
    if t == "warning":
        return f"[yellow]warning[/] {msg}"
    return None


# --- help pages ----------------------------------------------------------------------------------------
_PLAIN_TYPES = {"<str>": "TEXT", "<int>": "INTEGER", "<float>": "FLOAT", "<path>": "PATH", "<list[str]>": "TEXT"}


class _PlainArgument(TyperArgument):
    def display_type_rich(self, ctx):  # the name column already shows the metavar
        return None

    def get_usage_pieces(self, ctx):
        name = self.metavar or (self.name or "").upper()
        return [name if self.required else f"[{name}]"]


class _PlainOption(TyperOption):
    def display_type_rich(self, ctx):
        if self.is_flag:
            return None
        if self.metavar is not None:
            return self.metavar
        label = super().display_type_rich(ctx)
        return _PLAIN_TYPES.get(label, label.strip("<>").upper()) if label else label


class PlainHelpCommand(TyperCommand):
    """A command whose help shows plain metavars: ``SPEC``, ``--set KEY=VALUE``, nothing after a flag."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx):
        """click's ``--help`` option, shown plainly like the others."""
        return _plain(super().get_help_option(ctx))


def _plain(param):
    """The same parameter, shown plainly in help pages (its class swapped for a subclass that only displays)."""
    if type(param) is TyperArgument:
        param.__class__ = _PlainArgument
    elif type(param) is TyperOption:
        param.__class__ = _PlainOption
    return param


def print_data(data, fmt: str) -> None:
    """Print ``data`` as JSON or YAML (``-o json|yaml``), the same values either way."""
    if fmt == "json":
        echo(json.dumps(data, indent=2, default=str))
    else:
        import yaml

        echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n"))


def cluster_options(server: str | None, backend: str, namespace: str | None, context: str | None) -> dict:
    """kubectl's ``-n``/``--context`` as backend options: ``{"namespace": ..., "context": ...}`` (the ones given).

    Raises:
        SpecError: given without ``--backend kubernetes`` (or with ``--server``), where they would be ignored.
    """
    from ..errors import SpecError

    options = {k: v for k, v in (("namespace", namespace), ("context", context)) if v}
    if options and (server or backend != "kubernetes"):
        flag = "-n/--namespace" if namespace else "--context"
        raise SpecError(f"{flag} applies to --backend kubernetes, not to " + ("--server" if server else backend),
                        hint="add --backend kubernetes, or drop the option")
    return options


def check_output_format(fmt: str, allowed: tuple[str, ...]) -> str:
    """``fmt`` (an ``-o`` value) in lower case, or one error naming the formats ``allowed``."""
    fmt = fmt.lower()
    if fmt not in allowed:
        raise KubetuneError(f"-o/--output: {fmt!r} is not one of {', '.join(allowed)}", hint=f"use -o {allowed[-1]}, for example")
    return fmt


def closed_stdout_ends_quietly(stdout_gone) -> None:
    """Every rich console in the process (typer's help pages, ``data inspect``, ``presets``, the sweep tables)
    ends like kubetune's own when its reader goes away (``kubetune --help | head``): exit 141, as a shell
    reports SIGPIPE, instead of rich's exit 1."""
    from rich.console import Console

    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdout_gone()
        raise SystemExit(EXIT_BROKEN_PIPE)

    Console.on_broken_pipe = on_broken_pipe  # type: ignore[method-assign]
