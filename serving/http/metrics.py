"""Prometheus metrics of the HTTP child, kept by ``prometheus_client`` in a registry of their own.

``sglang_requests_total`` and ``sglang_request_latency_seconds`` are labelled by route and
status / route; ``sglang_batch_size`` records, for every finished request, how many requests
(embeddings: texts) shared its batch; ``sglang_queue_depth`` is the number of requests sent to a
scheduler replica and not yet answered; ``sglang_prompt_tokens_total`` and
``sglang_completion_tokens_total`` count tokens; ``sglang_launch_replica_restarts_total`` counts,
by ``dp``, the restarts of scheduler replicas the supervisor announced. The page is Prometheus'
text format.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

# The page lists the metrics named above and no *_created series beside them.
prometheus_client.disable_created_metrics()


class Metrics:
    """The HTTP child's metrics; safe to update from any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "sglang_requests",
            "HTTP requests answered, by route and status.",
            ("route", "status"),
            registry=r,
        )
        self.latency = Histogram(
            "sglang_request_latency_seconds",
            "Time from request to response, by route.",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "sglang_batch_size",
            "Requests (embeddings: texts) in the batch each result ran in.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "sglang_queue_depth",
            "Requests sent to a scheduler replica and not answered yet.",
            ("dp_rank",),
            registry=r,
        )
        self.prompt_tokens = Counter("sglang_prompt_tokens", "Prompt tokens processed.", registry=r)
        self.completion_tokens = Counter(
            "sglang_completion_tokens", "Tokens generated.", registry=r
        )
        self.replica_restarts = Counter(
            "sglang_launch_replica_restarts",
            "Restarts of a scheduler replica by the supervisor (--restart-policy on-failure).",
            ("dp",),
            registry=r,
        )

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request of ``route`` and its latency."""
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_result(
        self, batch_size: int, prompt_tokens: int, completion_tokens: int = 0
    ) -> None:
        """Record one finished request: the size of its batch and its tokens."""
        self.batch_size.observe(batch_size)
        self.prompt_tokens.inc(prompt_tokens)
        if completion_tokens:
            self.completion_tokens.inc(completion_tokens)

    def set_queue_depth(self, dp_rank: int, depth: int) -> None:
        """Requests now outstanding at replica ``dp_rank``."""
        self.queue_depth.labels(str(dp_rank)).set(depth)

    def count_restart(self, dp_rank: int) -> None:
        """Replica ``dp_rank`` is being restarted."""
        self.replica_restarts.labels(str(dp_rank)).inc()

    def render(self) -> tuple[bytes, str]:
        """The metrics page and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE
