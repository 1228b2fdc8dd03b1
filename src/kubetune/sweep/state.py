"""A sweep's record: ``sweep.json`` (trials, their jobs and results), its lock, and where sweeps live.

``sweep.json`` is written atomically and only by the process holding the sweep directory's lock (the one
running the sweep); anyone may read it. The kubetune home remembers the directory of every sweep id, so
``kubetune sweep status ID`` works from anywhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .. import constants as C
from ..errors import JobNotFound, KubetuneError
from ..spec import SweepSpec

__all__ = ["Trial", "Sweep", "load_sweep", "list_sweeps", "sweep_lock", "register", "SWEEP_DONE"]

SWEEP_DONE = (C.STATE_SUCCEEDED, C.TRIAL_PRUNED)  # trial states a rerun does not run again


@dataclass
class Trial:
    """One point of the sweep and what became of it (a row of ``sweep.json``)."""

    name: str
    values: dict[str, Any]
    state: str = C.STATE_PENDING
    objective: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    total_steps: int | None = None
    run_dir: str | None = None
    job: dict | None = None  # the JobRef of its latest submission (id, backend, name, run_dir, extra)
    attempts: int = 0
    resumed: int = 0  # submissions that continued from a checkpoint
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    optuna: int | None = None  # its trial number in the sweep's Optuna study (tpe sweeps, Optuna's pruners)

    @property
    def terminal(self) -> bool:
        """Whether the trial has ended."""
        return self.state in C.TERMINAL_STATES or self.state in (C.TRIAL_PRUNED, C.TRIAL_INTERRUPTED)


@dataclass
class Sweep:
    """A sweep's state, as ``sweep.json`` in its directory records it."""

    id: str
    dir: str
    backend: str = "local"
    objective: str = "eval_loss"
    direction: str = "minimize"
    params: list[str] = field(default_factory=list)
    state: str = C.STATE_PENDING
    pid: int | None = None
    created_at: float | None = None
    updated_at: float | None = None
    base_spec: dict = field(default_factory=dict)
    sweep_spec: dict = field(default_factory=dict)
    trials: list[Trial] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The sweep directory."""
        return Path(self.dir)

    def trial(self, name: str) -> Trial | None:
        """The trial called ``name`` (None when there is none)."""
        return next((t for t in self.trials if t.name == name), None)

    def ranked(self) -> list[Trial]:
        """Trials best first: succeeded ones by objective, then others with an objective, then the rest."""
        sign = 1.0 if self.direction == "minimize" else -1.0

        def key(t: Trial) -> tuple:
            if t.objective is None or math.isnan(t.objective):
                return (2, 0.0)
            return (0 if t.state == C.STATE_SUCCEEDED else 1, sign * t.objective)

        return sorted(self.trials, key=key)

    def best(self) -> Trial | None:
        """The succeeded trial with the best objective, or None."""
        first = next(iter(self.ranked()), None)
        return first if first is not None and first.state == C.STATE_SUCCEEDED and first.objective is not None else None

    def save(self) -> None:
        """Write ``sweep.json`` atomically (a reader never sees half a file)."""
        self.updated_at = time.time()
        self.path.mkdir(parents=True, exist_ok=True)
        _write_json(self.path / C.SWEEP_FILE, asdict(self))

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Sweep":
        """Read ``sweep.json`` from ``directory``.

        Raises:
            JobNotFound: there is no sweep there.
        """
        f = Path(directory) / C.SWEEP_FILE
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError) as e:
            raise JobNotFound(f"no sweep in {directory} ({f.name}: {type(e).__name__})") from None
        trials = [Trial(**{k: v for k, v in t.items() if k in Trial.__dataclass_fields__}) for t in data.pop("trials", [])]
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["dir"] = str(Path(directory).absolute())  # where it is now, should it have moved
        return cls(**known, trials=trials)


def load_sweep(key: str | os.PathLike) -> Sweep:
    """A sweep by directory or by id (the kubetune home remembers where each sweep id lives).

    Raises:
        JobNotFound: no such sweep.
    """
    p = Path(key).expanduser()
    if (p / C.SWEEP_FILE).is_file():
        return Sweep.load(p)
    entry = _registry() / f"{key}.json"
    if entry.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):
            return Sweep.load(json.loads(entry.read_text(encoding="utf-8"))["dir"])
    default = Path(SweepSpec().dir.replace("{id}", str(key))).absolute()
    if (default / C.SWEEP_FILE).is_file():
        return Sweep.load(default)
    raise JobNotFound(f"no sweep '{key}'", hint="kubetune sweep list shows sweep ids; a sweep directory works too")


def list_sweeps() -> list[Sweep]:
    """Sweeps this machine started, newest first."""
    out = []
    for f in sorted(_registry().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        with contextlib.suppress(OSError, ValueError, KeyError, KubetuneError):
            out.append(Sweep.load(json.loads(f.read_text(encoding="utf-8"))["dir"]))
    return out


@contextlib.contextmanager
def sweep_lock(directory: Path) -> Iterator[bool]:
    """Hold the sweep directory's lock while the body runs; yields False when another process holds it.

    The lock is an ``flock``: the kernel drops it when its holder dies, however it dies.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / C.SWEEP_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _registry() -> Path:
    from ..paths import state_path

    return state_path(C.SWEEP_REGISTRY_DIR)


def register(sweep: Sweep) -> None:
    """Record the sweep in the kubetune home's registry (``kubetune sweep list``)."""
    _write_json(_registry() / f"{sweep.id}.json", {"id": sweep.id, "dir": sweep.dir, "backend": sweep.backend})


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)
