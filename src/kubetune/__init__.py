"""kubetune: fine-tune open LLMs from one declarative job spec, locally, on Kubernetes or on KFP.

The public API is small and explicit; heavy libraries (torch, transformers) load only when a job
actually trains, so importing kubetune is instant.
"""

from __future__ import annotations

from .client import Client, JobRef, train
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
from .spec import TuneJob, load_spec

from ._version import __version__

__all__ = [
    # running jobs
    "Client",
    "JobRef",
    "train",
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
