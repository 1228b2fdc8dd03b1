"""The Kubernetes backend: render a job as a batch/v1 Job, a Kubeflow PyTorchJob or a Kubeflow Trainer
TrainJob, submit it with the official ``kubernetes`` client, and follow it through labels and pod logs.

Importing this package is cheap: the ``kubernetes`` client loads on the first call that talks to a cluster.
"""

from __future__ import annotations

from .render import FLAVORS, WORKLOAD_KINDS, cluster_spec, render, render_text
from .staging import staged_uri
from .uploads import stage_inputs

__all__ = [
    "FLAVORS",
    "WORKLOAD_KINDS",
    "KubernetesBackend",
    "cluster_spec",
    "render",
    "render_text",
    "stage_inputs",
    "staged_uri",
]


def __getattr__(name: str):
    if name == "KubernetesBackend":
        from .backend import KubernetesBackend

        return KubernetesBackend
    raise AttributeError(name)
