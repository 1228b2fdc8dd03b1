"""Prometheus metrics of the server (``GET /metrics``): requests, tokens, latency, batch sizes.

Each app gets its own registry, so several servers in one process (tests, benchmarks) never share counters.
"""

from __future__ import annotations

from typing import Callable

from .. import constants as C

__all__ = ["ServeMetrics"]

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServeMetrics:
    """The server's metrics, named ``kubetune_serve_*`` (counters get prometheus' ``_total`` suffix)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        p = C.SERVE_METRIC_PREFIX
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{p}_requests", "HTTP requests by endpoint, model and status code.", ["endpoint", "model", "status"], registry=r)
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r)
        self.completion_tokens = Counter(f"{p}_completion_tokens", "Completion tokens generated.", ["model"], registry=r)
        self.latency = Histogram(f"{p}_request_latency_seconds", "Time from request to last token.", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram(f"{p}_time_to_first_token_seconds", "Time from request to the first streamed token.", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram(f"{p}_batch_size", "Requests in each forward pass of the engine.", buckets=_BATCH_BUCKETS, registry=r)
        self.running = Gauge(f"{p}_requests_running", "Requests being generated now.", registry=r)
        self.waiting = Gauge(f"{p}_requests_waiting", "Requests waiting for a place in the batch.", registry=r)
        self.admitted_tokens = Gauge(f"{p}_admitted_tokens", "Tokens held by admitted requests (prompt + max_tokens of each sequence).", registry=r)
        self.preemptions = Counter(f"{p}_preemptions", "Rows taken out of the batch to give another request its share.", registry=r)

    def bind(self, *, running: Callable[[], float], waiting: Callable[[], float], admitted: Callable[[], float] | None = None) -> None:
        """Read the running/waiting gauges from the engine, and the admitted tokens from the admission control."""
        self.running.set_function(running)
        self.waiting.set_function(waiting)
        if admitted is not None:
            self.admitted_tokens.set_function(admitted)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def observe_request(self, endpoint: str, model: str, status: int) -> None:
        """Count one finished HTTP request by endpoint, model and status code."""
        self.requests.labels(endpoint=endpoint, model=model, status=str(status)).inc()

    def observe_tokens(self, model: str, prompt: int, completion: int) -> None:
        """Add one request's prompt and completion tokens to the model's counters."""
        self.prompt_tokens.labels(model=model).inc(prompt)
        self.completion_tokens.labels(model=model).inc(completion)

    def on_step(self, rows: int) -> None:
        """Record the number of rows in one forward pass of the engine (the batch-size histogram)."""
        self.batch_rows.observe(rows)
