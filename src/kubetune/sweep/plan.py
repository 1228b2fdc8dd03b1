"""Planning a sweep, without side effects: which trials, their names, their specs, how many at once.

Everything here is a pure function of the job spec (and the machine's cores and devices passed in), so
the same spec always plans the same trials: that is what lets a rerun find the trials it ran before.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
import statistics
from pathlib import Path
from typing import Any

from .. import constants as C
from ..errors import BackendError, SpecError
from ..spec import SweepParamSpec, SweepSpec, TuneJob

__all__ = [
    "plan_values",
    "sweep_id_for",
    "sweep_dir_for",
    "trial_name",
    "trial_spec",
    "check_sweep",
    "local_slots",
    "median_stop",
    "values_text",
    "DURING_TRAINING",
]

_NAME_MAX = 40  # job names: lowercase letters, digits and '-', at most 40 characters (spec.TuneJob.name)
_HASH_LEN = 8
# Short names of common fields in trial names (method.lora.r=8 -> "r8", training.learning_rate=3e-4 -> "lr3e-4").
_ABBREV = {
    "learning_rate": "lr", "batch_size": "bs", "global_batch_size": "gbs", "gradient_accumulation_steps": "ga",
    "max_steps": "steps", "epochs": "ep", "weight_decay": "wd", "warmup_ratio": "wr", "warmup_steps": "ws",
    "max_seq_length": "len", "lr_scheduler": "", "dropout": "drop", "type": "", "optimizer": "", "seed": "seed",
}
# Metrics whose values during training are logged under another name (the early-stopping rule reads those).
DURING_TRAINING = {"train_loss": "loss"}


# --- which trials ----------------------------------------------------------------------------
def plan_values(spec: SweepSpec) -> list[dict[str, Any]]:
    """The values of every trial, in order: the grid's combinations, or ``spec.trials`` random draws.

    Random search is deterministic for a seed, and drawing more trials keeps the earlier ones. Draws that
    repeat an earlier trial are drawn again; a discrete space smaller than ``trials`` yields every point once.
    """
    keys = list(spec.grid)
    if spec.trials is None:
        return [dict(zip(keys, combo)) for combo in itertools.product(*(spec.grid[k] for k in keys))]
    rng = random.Random(spec.seed)
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for _ in range(spec.trials * 50):
        values = {k: rng.choice(spec.grid[k]) for k in keys}
        values.update({k: _draw(d, rng) for k, d in spec.random.items()})
        key = json.dumps(values, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(values)
            if len(out) == spec.trials:
                break
    return out


def _draw(d: SweepParamSpec, rng: random.Random) -> Any:
    if d.type == "choice":
        return rng.choice(d.values or [])
    assert d.low is not None and d.high is not None
    if d.type == "uniform":
        x = rng.uniform(d.low, d.high)
    else:
        x = math.exp(rng.uniform(math.log(d.low), math.log(d.high)))
    if d.integer:
        return int(min(max(round(x), math.ceil(d.low)), math.floor(d.high)))
    return float(f"{x:.4g}")  # readable values and trial names; 4 digits is finer than any sweep resolves


def check_sweep(job: TuneJob, spec: SweepSpec) -> None:
    """Refuse a sweep that cannot rank its trials (no parameters; an objective the job never measures).

    Raises:
        SpecError: naming the field to set.
    """
    if not spec.grid and not spec.random and spec.search == C.SWEEP_SAMPLER_TPE:
        raise SpecError(
            "TPE needs a search space, and the sweep has no parameters",
            hint="give --dist KEY=TYPE:ARGS (e.g. --dist training.learning_rate=log-uniform:1e-5,1e-3) or --grid KEY=V1,V2",
        )
    if not spec.grid and not spec.random:
        raise SpecError("the sweep has no parameters", hint="give --grid KEY=V1,V2 (e.g. --grid method.lora.r=4,8,16) or a sweep: section with grid or random")
    swept = set(spec.grid) | set(spec.random)
    has_eval = job.dataset.eval_split > 0 or job.dataset.eval_source is not None or any(k.startswith(("dataset.eval_split", "dataset.eval_source")) for k in swept)
    if spec.objective in ("eval_loss", "perplexity") and not has_eval:
        raise SpecError(
            f"sweep.objective {spec.objective} needs evaluation data, and the job has none",
            hint="set dataset.eval_split (e.g. 0.1) or dataset.eval_source, or rank by sweep.objective: train_loss",
        )
    if spec.early_stopping is not None and spec.objective not in DURING_TRAINING and not (job.training.eval_steps or "training.eval_steps" in swept):
        raise SpecError(
            f"sweep.early_stopping compares {spec.objective} during training, which is only measured at the end",
            hint="set training.eval_steps (e.g. 10) so that trials report it while they train, or rank by train_loss",
        )


# --- names and specs -------------------------------------------------------------------------
def sweep_id_for(job: TuneJob, run_id: str | None = None) -> str:
    """``<job name>-<run id>`` (or the job name), shortened with a hash to stay a valid job name."""
    base = job.name if not run_id else f"{job.name}-{_slug(str(run_id))}"
    return _fit(base, base)


def sweep_dir_for(job: TuneJob, sweep_id: str) -> Path:
    """The sweep directory: ``sweep.dir`` with ``{id}`` replaced, absolute."""
    template = (job.sweep or SweepSpec()).dir
    return Path(template.replace("{id}", sweep_id)).expanduser().absolute()


def trial_name(sweep_id: str, values: dict[str, Any]) -> str:
    """``<sweep id>-<values>``, e.g. ``tiny-alpha-r8-lr3e-4``; a hash replaces the tail when the name
    would pass 40 characters or the values do not read back exactly from it."""
    parts, exact = [], True
    for key, value in values.items():
        last = key.rsplit(".", 1)[-1]
        text, ok = _value_slug(value)
        exact = exact and ok
        parts.append(f"{_ABBREV.get(last, last.replace('_', ''))}{text}")
    name = re.sub(r"-+", "-", f"{sweep_id}-{'-'.join(parts)}").strip("-")
    return _fit(name, json.dumps([sweep_id, values], sort_keys=True, default=str), force=not exact)


def trial_spec(job: TuneJob, sweep_id: str, values: dict[str, Any], directory: Path, *, name: str | None = None) -> TuneJob:
    """The trial's job: ``job`` with ``values`` applied, its own name (``name``, else from the values), run
    directory and output URI.

    The values go through :meth:`TuneJob.with_overrides`, so a swept ``method.type`` brings its own
    preset for every field the base spec did not set.

    Raises:
        SpecError: the values make an invalid job (the message names the trial and the field).
    """
    name = name or trial_name(sweep_id, values)
    own: dict[str, Any] = {"sweep": None, "name": name, "output.dir": str(directory / C.SWEEP_TRIALS_DIR / name)}
    if job.output.uri:
        own["output.uri"] = _trial_uri(job.output.uri, name)
    try:
        return job.with_overrides({**own, **values})
    except SpecError as e:
        raise SpecError(f"trial {name} ({values_text(values)}): {e.message}", hint=e.hint, problems=e.problems) from None


def _trial_uri(uri: str, name: str) -> str:
    """Each trial publishes under its own name: s3://b/p -> s3://b/p/<trial>; oci://r/repo:tag -> oci://r/repo:tag-<trial>."""
    if uri.startswith("oci://"):
        repo, _, tag = uri[len("oci://") :].rpartition(":") if ":" in uri.split("/")[-1] else (uri[len("oci://") :], "", "")
        return f"oci://{repo}:{f'{tag}-' if tag else ''}{name}"
    return f"{uri.rstrip('/')}/{name}"


def _value_slug(value: Any) -> tuple[str, bool]:
    """A value as part of a name, and whether it reads back exactly."""
    if isinstance(value, bool):
        return str(value).lower(), True
    if isinstance(value, int):
        return (f"m{-value}" if value < 0 else str(value)), True
    if isinstance(value, float):
        general = f"{value:.4g}"
        mantissa, _, exp = f"{value:.3e}".partition("e")
        sci = f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"
        text = min(general, sci, key=len)
        shown = ("m" + text[1:] if text.startswith("-") else text).replace(".", "p")
        return shown, float(text) == value
    if isinstance(value, str):
        slug = _slug(value)
        return slug, slug == value
    return _slug(json.dumps(value, default=str)), False


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")


def _fit(name: str, identity: str, *, force: bool = False) -> str:
    """``name`` if it is a valid job name, else its first characters plus a hash of ``identity``."""
    if not force and len(name) <= _NAME_MAX and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        return name
    digest = hashlib.sha256(identity.encode()).hexdigest()[:_HASH_LEN]
    head = _slug(name)[: _NAME_MAX - _HASH_LEN - 1].rstrip("-")
    if not head or not head[0].isalpha():
        head = ("s-" + head)[: _NAME_MAX - _HASH_LEN - 1].rstrip("-")
    return f"{head}-{digest}"


def values_text(values: dict[str, Any]) -> str:
    """A trial's values as ``a=1, b=2`` (for messages and tables)."""
    return " ".join(f"{k}={v}" for k, v in values.items())


# --- how many at once, and when to stop one -------------------------------------------------
def local_slots(
    requested: int | None, trials: int, *, cores: int, devices: list[str], accelerators: int, processes: int = 1
) -> tuple[list[dict[str, str]], list[str]]:
    """How many trials run at once on this machine, and the environment of each slot.

    With accelerators, each slot owns ``accelerators`` devices (``CUDA_VISIBLE_DEVICES``); on CPU, the
    cores are divided between slots (``OMP_NUM_THREADS``) and no more slots than cores are used.

    Returns:
        One environment dict per slot, and notes to show the user (limits applied).
    """
    notes: list[str] = []
    trials = max(trials, 1)
    if accelerators and devices:
        groups = len(devices) // accelerators
        if groups == 0:
            raise BackendError(
                f"each trial asks for {accelerators} accelerators (resources.accelerators) but this machine has {len(devices)}",
                hint="lower resources.accelerators, or run the sweep on a cluster (--backend kubernetes)",
            )
        n = min(requested or groups, groups, trials)
        if requested and requested > groups:
            notes.append(f"parallel {requested} lowered to {groups}: {len(devices)} accelerators, {accelerators} per trial")
        return [{C.ENV_CUDA_VISIBLE_DEVICES: ",".join(devices[i * accelerators : (i + 1) * accelerators])} for i in range(n)], notes
    if accelerators:
        notes.append(f"resources.accelerators={accelerators} but no accelerator is visible here: trials train on the CPU")
    cores = max(cores, 1)
    n = min(requested or max(1, cores // C.SWEEP_CORES_PER_TRIAL), trials)
    if n > cores:
        notes.append(f"parallel {n} lowered to {cores}: this machine has {cores} cores")
        n = cores
    threads = str(max(1, cores // n // max(processes, 1)))
    return [{C.ENV_OMP_NUM_THREADS: threads, C.ENV_MKL_NUM_THREADS: threads} for _ in range(n)], notes


def median_stop(
    history: list[tuple[int, float]], others: list[list[tuple[int, float]]], *, direction: str, min_trials: int, grace_steps: int = 0
) -> tuple[float, float, int] | None:
    """The median stopping rule: should a trial whose objective so far is ``history`` stop?

    It stops when its best value so far is worse than the median of the running averages (up to the
    same step) of the other trials that have reached that step, and at least ``min_trials`` have.

    Returns:
        ``(best, median, step)`` when it should stop, else None.
    """
    if not history:
        return None
    step = history[-1][0]
    if step < grace_steps:
        return None
    sign = 1.0 if direction == "minimize" else -1.0
    best = min(sign * v for _, v in history)
    averages = [statistics.fmean(sign * v for s, v in o if s <= step) for o in others if o and max(s for s, _ in o) >= step]
    if len(averages) < min_trials:
        return None
    median = statistics.median(averages)
    return (sign * best, sign * median, step) if best > median else None
