"""kubetune: fine-tune open LLMs from one declarative job spec, locally, on Kubernetes or on KFP.

The public API is small and explicit; heavy libraries (torch, transformers) load only when a job
actually trains, so importing kubetune is instant.
"""

from __future__ import annotations

from .client import Client, JobRef, train
from .errors import KubetuneError, SpecError
from .spec import TuneJob, load_spec

from ._version import __version__

__all__ = [
    "Client",
    "JobRef",
    "KubetuneError",
    "SpecError",
    "TuneJob",
    "load_spec",
    "train",
    "__version__",
]
