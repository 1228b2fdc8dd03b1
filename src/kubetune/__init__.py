"""kubetune: fine-tune open LLMs from one declarative job spec, locally, on Kubernetes or on KFP.

The public API is small and explicit; heavy libraries (torch, transformers) load only when a job
actually trains, so importing kubetune is instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .constants import JobState
from .errors import (
    BackendError,
    DataError,
    JobNotFound,
    KubetuneError,
    RunDirInUse,
    SourceError,
    SpecError,
    TrainError,
)
from .events import EventType, JobStatus

if TYPE_CHECKING:  # loaded on first use: `kubetune --help` and the errors need no pydantic models
    from .client import Client, JobRef, train
    from .spec import TuneJob, load_spec
    from .training.custom import RunContext, context, report, report_checkpoint

_LAZY = {"Client": "client", "JobRef": "client", "train": "client", "TuneJob": "spec", "load_spec": "spec",
         "report": "training.custom", "report_checkpoint": "training.custom", "context": "training.custom", "RunContext": "training.custom"}


def __getattr__(name: str):
    """``kubetune.Client``, ``kubetune.load_spec``, ...: imported on first use (the job spec's models take a moment)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kubetune' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

from ._version import __version__

__all__ = [
    # running jobs
    "Client",
    "JobRef",
    "train",
    # inside a custom training function (docs/custom-training.md)
    "report",
    "report_checkpoint",
    "context",
    "RunContext",
    # the job spec
    "TuneJob",
    "load_spec",
    # what a job reports
    "JobStatus",
    "JobState",
    "EventType",
    # the error tree (kubetune.errors)
    "KubetuneError",
    "SpecError",
    "DataError",
    "SourceError",
    "BackendError",
    "JobNotFound",
    "RunDirInUse",
    "TrainError",
    "__version__",
]
