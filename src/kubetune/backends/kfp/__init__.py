"""The Kubeflow Pipelines backend: the job as a pipeline (fetch -> train -> [merge ->] publish).

``kfp.mode: local`` runs it with the KFP local runner on this machine; ``remote`` submits it to a KFP
server. See docs/kfp.md. Importing this package is cheap: the kfp SDK loads inside the functions that
build, compile or submit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .backend import KfpBackend

if TYPE_CHECKING:
    from ...spec import TuneJob

__all__ = ["KfpBackend", "render_pipeline"]


def render_pipeline(job: "TuneJob") -> str:
    """The job's compiled pipeline (KFP IR YAML) for a KFP server; pure, talks to no server.

    Raises:
        SpecError: a setting KFP cannot express.
        BackendError: the kfp SDK is not installed.
    """
    try:
        from .pipeline import render_pipeline as _render
    except ImportError as e:
        from ...errors import BackendError

        raise BackendError("the kfp backend needs the kfp package", hint="pip install 'kubetune[kfp]'") from e
    return _render(job)
