"""A sweep's results for people and tools: table rows, CSV, JSON, a PNG of loss curves, an HTML report.

Rows are ranked best first (succeeded trials by objective). The plot needs matplotlib (the ``sweep``
extra); without it every other report is still written and the HTML page says how to get the plot.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from .. import constants as C
from .state import Sweep, Trial

__all__ = ["rows", "write_csv", "write_json", "plot_losses", "write_html", "write_reports", "Curves", "preference_columns"]

# trial name -> metric ("loss", "eval_loss") -> [(step, value), ...]
Curves = dict[str, dict[str, list[tuple[int, float]]]]
_EXTRA_METRICS = ("train_loss", "eval_loss", "perplexity", "tokens_per_second")


def preference_columns(sweep: Sweep) -> list[str]:
    """The preference metrics (DPO, ORPO: reward accuracy and margin) some trial reports, the objective left out."""
    return [m for m in C.PREFERENCE_STATUS_KEYS if m != sweep.objective and any(m in t.metrics for t in sweep.trials)]


def rows(sweep: Sweep) -> list[dict[str, Any]]:
    """One flat dict per trial, best first: rank, trial, each swept value, state, objective, metrics, paths."""
    best = sweep.best()
    out = []
    for rank, t in enumerate(sweep.ranked(), start=1):
        row: dict[str, Any] = {"rank": rank, "trial": t.name, "best": best is not None and t.name == best.name}
        row.update({key: t.values.get(key) for key in sweep.params})
        row.update(state=t.state, objective=t.objective)
        row.update({m: t.metrics.get(m) for m in _EXTRA_METRICS if m != sweep.objective})
        row.update({m: t.metrics.get(m) for m in preference_columns(sweep)})
        row.update(
            step=t.step, total_steps=t.total_steps, attempts=t.attempts, resumed=t.resumed,
            seconds=round(t.finished_at - t.started_at, 1) if t.finished_at and t.started_at else None,
            run_dir=t.run_dir, job_id=(t.job or {}).get("id"), reason=t.reason,
        )
        out.append(row)
    return out


def write_csv(sweep: Sweep, path: str | Path) -> Path:
    """The ranked trials as CSV (the objective column is named after the metric)."""
    table = rows(sweep)
    path = Path(path)
    fields = list(table[0]) if table else ["rank", "trial", "state", "objective"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[sweep.objective if f == "objective" else f for f in fields], lineterminator="\n")
    writer.writeheader()
    for row in table:
        writer.writerow({(sweep.objective if k == "objective" else k): ("" if v is None else v) for k, v in row.items()})
    _write(path, buf.getvalue())
    return path


def write_json(sweep: Sweep, path: str | Path) -> Path:
    """The sweep (id, objective, direction, state, best trial) and its ranked trials as JSON."""
    best = sweep.best()
    data = {
        "sweep": sweep.id, "dir": sweep.dir, "backend": sweep.backend, "state": sweep.state,
        "objective": sweep.objective, "direction": sweep.direction, "params": sweep.params,
        "best": {"trial": best.name, "values": best.values, "objective": best.objective, "run_dir": best.run_dir} if best else None,
        "trials": rows(sweep),
    }
    _write(Path(path), json.dumps(data, indent=2, default=str) + "\n")
    return Path(path)


def plot_losses(sweep: Sweep, curves: Curves, path: str | Path) -> Path | None:
    """Training (and evaluation) loss against step for every trial, the best one drawn bold.

    Returns:
        The PNG's path, or None when matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    best = sweep.best()
    has_eval = any(c.get("eval_loss") for c in curves.values())
    fig = Figure(figsize=(11 if has_eval else 7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if has_eval else 1, squeeze=False)[0]
    for t in sweep.ranked():
        c = curves.get(t.name) or {}
        label = _label(t, sweep)
        width = 2.6 if best is not None and t.name == best.name else 1.2
        style = "--" if t.state not in (C.STATE_SUCCEEDED, C.STATE_RUNNING) else "-"
        if c.get("loss"):
            (line,) = axes[0].plot(*zip(*c["loss"]), style, linewidth=width, label=label)
            if has_eval and c.get("eval_loss"):
                axes[1].plot(*zip(*c["eval_loss"]), "o" + style, linewidth=width, color=line.get_color(), label=label)
    axes[0].set(title="training loss", xlabel="step", ylabel="loss")
    if has_eval:
        axes[1].set(title="evaluation loss", xlabel="step", ylabel="eval_loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[-1].legend(handles, labels, fontsize=7, loc="upper right")
    fig.suptitle(f"sweep {sweep.id}: {sweep.objective} ({sweep.direction})" + (f", best {best.name}" if best else ""), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    path = Path(path)
    _write(path, buf.getvalue())
    return path


def write_html(sweep: Sweep, path: str | Path, *, plot: Path | None = None) -> Path:
    """One self-contained page: summary, the ranked table, the loss plot (embedded), how to rerun the best."""
    best = sweep.best()
    table = rows(sweep)
    cols = ["rank", "trial", *sweep.params, "state", "objective", *(m for m in _EXTRA_METRICS if m != sweep.objective), "step", "attempts", "seconds"]
    e = html.escape
    head = "".join(f"<th>{e(sweep.objective if c == 'objective' else c)}</th>" for c in cols)
    body = []
    for row in table:
        cells = "".join(f"<td>{e(_fmt(row.get(c)))}</td>" for c in cols)
        reason = f' title="{e(row["reason"])}"' if row.get("reason") else ""
        body.append(f'<tr class="{e(str(row["state"]))}{" best" if row["best"] else ""}"{reason}>{cells}</tr>')
    if plot is not None and plot.is_file():
        img = f'<img alt="loss curves" src="data:image/png;base64,{base64.b64encode(plot.read_bytes()).decode()}">'
    else:
        img = "<p><em>No plot: install matplotlib (pip install 'kubetune[sweep]') and run kubetune sweep status --html again.</em></p>"
    summary = (
        f"<p>Best: <b>{e(best.name)}</b> ({e(' '.join(f'{k}={v}' for k, v in best.values.items()))}), "
        f"{e(sweep.objective)} = {e(_fmt(best.objective))}. Its results: <code>{e(best.run_dir or '')}</code>; rerun it with "
        f"<code>kubetune run {e(str(Path(best.run_dir or '.') / C.SPEC_FILE))}</code>.</p>"
        if best else "<p>No trial has succeeded yet.</p>"
    )
    counts = ", ".join(f"{n} {s}" for s, n in sorted(_counts(sweep).items()))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>sweep {e(sweep.id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; }}
tr.best {{ background: #e6f6e6; font-weight: bold; }}
tr.failed td, tr.pruned td, tr.cancelled td, tr.interrupted td {{ color: #888; }}
img {{ max-width: 100%; margin-top: 1em; }}
</style></head><body>
<h1>Sweep {e(sweep.id)}</h1>
<p>{e(sweep.state)} on {e(sweep.backend)}: {len(sweep.trials)} trials ({e(counts)}); objective <b>{e(sweep.objective)}</b>, {e(sweep.direction)}.
Directory <code>{e(sweep.dir)}</code>. Written {e(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>
{summary}
<table><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(body)}
</tbody></table>
{img}
</body></html>
"""
    _write(Path(path), page)
    return Path(path)


def write_reports(sweep: Sweep, curves: Curves, directory: str | Path | None = None) -> list[str]:
    """Write results.csv, results.json, loss.png and report.html into the sweep directory.

    Returns:
        Lines saying what was written (and what could not be).
    """
    d = Path(directory or sweep.dir)
    write_csv(sweep, d / C.SWEEP_RESULTS_CSV)
    write_json(sweep, d / C.SWEEP_RESULTS_JSON)
    plot = plot_losses(sweep, curves, d / C.SWEEP_PLOT)
    write_html(sweep, d / C.SWEEP_REPORT, plot=plot)
    notes = [f"reports: {d / C.SWEEP_REPORT} ({C.SWEEP_RESULTS_CSV}, {C.SWEEP_RESULTS_JSON}" + (f", {C.SWEEP_PLOT})" if plot else ")")]
    if plot is None:
        notes.append("no loss plot: matplotlib is not installed (pip install 'kubetune[sweep]')")
    return notes


def _label(t: Trial, sweep: Sweep) -> str:
    values = " ".join(f"{k.rsplit('.', 1)[-1]}={_fmt(v)}" for k, v in t.values.items())
    return values + (f" ({t.state})" if t.state != C.STATE_SUCCEEDED else "")


def _counts(sweep: Sweep) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in sweep.trials:
        out[t.state] = out.get(t.state, 0) + 1
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _write(path: Path, data: str | bytes) -> None:
    """Atomic: a reader sees the old report or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)
