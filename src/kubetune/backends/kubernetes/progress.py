"""Progress to Kubeflow Trainer: the worker's status, posted to the TrainJob's status endpoint (KEP-2779).

When the cluster runs Kubeflow Trainer with the TrainJobStatus feature gate, the trainer pods get
``KUBEFLOW_TRAINER_STATUS_URL`` (plus a CA file and a token file); what they post there appears as the
TrainJob's ``status.trainerStatus`` (``kubectl get trainjob`` shows the progress). Elsewhere nothing is
sent. Reporting never fails the job: an unreachable endpoint is logged once and skipped.

The worker calls :meth:`TrainerStatusReporter.report` with its current status (rank 0 only):

    reporter = TrainerStatusReporter.from_env()   # None off Kubeflow Trainer
    if reporter: reporter.report(status)
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import time
import urllib.request
from datetime import datetime, timezone

from ... import constants as C
from ...events import JobStatus

__all__ = ["TrainerStatusReporter", "trainer_status_payload"]

log = logging.getLogger("kubetune.progress")

_MIN_INTERVAL = 10.0  # seconds between posts while running (the endpoint is rate-limited per job)
_METRICS = ("loss", "eval_loss", "learning_rate", "tokens_per_second", "epoch")


def trainer_status_payload(status: JobStatus, *, now: datetime | None = None) -> dict:
    """The endpoint's body for ``status``: progress %, remaining seconds, metrics as strings."""
    ts: dict = {}
    if status.state == C.STATE_SUCCEEDED:
        ts["progressPercentage"] = 100
    elif status.total_steps:
        ts["progressPercentage"] = max(0, min(100, int(100 * status.step / status.total_steps)))
    if status.eta_seconds is not None and math.isfinite(status.eta_seconds):
        ts["estimatedRemainingSeconds"] = max(0, int(round(status.eta_seconds)))
    metrics = []
    for name in _METRICS:
        value = getattr(status, name)
        if value is not None and math.isfinite(float(value)):
            metrics.append({"name": name, "value": f"{float(value):.6g}"})
    if status.total_steps:
        metrics += [{"name": "currentStep", "value": str(status.step)}, {"name": "totalSteps", "value": str(status.total_steps)}]
    if metrics:
        ts["metrics"] = metrics
    ts["lastUpdatedTime"] = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"trainerStatus": ts}


class TrainerStatusReporter:
    """Posts a worker's status to Kubeflow Trainer's endpoint, at most every ``min_interval`` seconds.

    Args:
        url: the endpoint (``KUBEFLOW_TRAINER_STATUS_URL``).
        ca_file: CA bundle for its TLS certificate (``KUBEFLOW_TRAINER_STATUS_CA_CERT``).
        token_file: projected service-account token sent as the bearer (``KUBEFLOW_TRAINER_STATUS_TOKEN``),
            read at each post because the kubelet rotates it.
    """

    def __init__(self, url: str, *, ca_file: str | None = None, token_file: str | None = None, min_interval: float = _MIN_INTERVAL) -> None:
        self.url = url
        self.ca_file = ca_file
        self.token_file = token_file
        self.min_interval = min_interval
        self._last = -math.inf
        self._warned = False

    @classmethod
    def from_env(cls) -> "TrainerStatusReporter | None":
        """A reporter when the pod runs under Kubeflow Trainer with status reporting enabled, else None."""
        url = os.environ.get(C.ENV_KUBEFLOW_STATUS_URL)
        if not url:
            return None
        return cls(url, ca_file=os.environ.get(C.ENV_KUBEFLOW_STATUS_CA), token_file=os.environ.get(C.ENV_KUBEFLOW_STATUS_TOKEN))

    def report(self, status: JobStatus, *, force: bool = False) -> bool:
        """Post ``status`` unless one was posted less than ``min_interval`` ago (terminal states always go).

        Returns:
            True when the endpoint accepted it.
        """
        now = time.monotonic()
        if not (force or status.terminal) and now - self._last < self.min_interval:
            return False
        self._last = now
        body = json.dumps(trainer_status_payload(status)).encode()
        headers = {"Content-Type": "application/json"}
        try:
            if self.token_file:
                with open(self.token_file, encoding="utf-8") as f:
                    headers["Authorization"] = f"Bearer {f.read().strip()}"
            context = ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https://") else None
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=5, context=context) as resp:
                return 200 <= resp.status < 300
        except (OSError, ValueError, ssl.SSLError) as e:  # never fail training over a progress report
            if not self._warned:
                log.warning("cannot report progress to Kubeflow Trainer at %s: %s (further failures are silent)", self.url, e)
                self._warned = True
            return False
