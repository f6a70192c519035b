"""Prometheus metrics of the HTTP child, in the text exposition format (no client library).

Counters and histograms are labelled by route; ``sglang_batch_size`` records, for every finished
request, how many requests (embeddings: texts) shared its batch; ``sglang_queue_depth`` is the
number of requests sent to a scheduler replica and not yet answered.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Histogram:
    def __init__(self, buckets: Iterable[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    body = ",".join(f'{k}="{str(v)}"' for k, v in sorted(pairs.items()))
    return "{" + body + "}"


class Metrics:
    """The HTTP child's counters; safe to update from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, _Histogram] = {}
        self.batch_size = _Histogram(BATCH_BUCKETS)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.queue_depth: dict[int, int] = {}

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(route, status)] += 1
            self.latency.setdefault(route, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def observe_result(self, batch_size: int, prompt_tokens: int, completion_tokens: int = 0) -> None:
        with self._lock:
            self.batch_size.observe(batch_size)
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens

    def set_queue_depth(self, dp_rank: int, depth: int) -> None:
        with self._lock:
            self.queue_depth[dp_rank] = depth

    def render(self) -> str:
        """The metrics page (``text/plain; version=0.0.4``)."""
        out: list[str] = []
        with self._lock:
            out += ["# HELP sglang_requests_total HTTP requests answered, by route and status.",
                    "# TYPE sglang_requests_total counter"]
            for (route, status), n in sorted(self.requests.items()):
                out.append(f"sglang_requests_total{_labels({'route': route, 'status': str(status)})} {n}")
            out += ["# HELP sglang_request_latency_seconds Time from request to response, by route.",
                    "# TYPE sglang_request_latency_seconds histogram"]
            for route, hist in sorted(self.latency.items()):
                out += self._histogram("sglang_request_latency_seconds", hist, {"route": route})
            out += ["# HELP sglang_batch_size Requests (embeddings: texts) in the batch each result ran in.",
                    "# TYPE sglang_batch_size histogram"]
            out += self._histogram("sglang_batch_size", self.batch_size, {})
            out += ["# HELP sglang_queue_depth Requests sent to a scheduler replica and not answered yet.",
                    "# TYPE sglang_queue_depth gauge"]
            for dp, depth in sorted(self.queue_depth.items()):
                out.append(f"sglang_queue_depth{_labels({'dp_rank': str(dp)})} {depth}")
            out += ["# HELP sglang_prompt_tokens_total Prompt tokens processed.",
                    "# TYPE sglang_prompt_tokens_total counter",
                    f"sglang_prompt_tokens_total {self.prompt_tokens}",
                    "# HELP sglang_completion_tokens_total Tokens generated.",
                    "# TYPE sglang_completion_tokens_total counter",
                    f"sglang_completion_tokens_total {self.completion_tokens}"]
        return "\n".join(out) + "\n"

    @staticmethod
    def _histogram(name: str, hist: _Histogram, labels: dict[str, str]) -> list[str]:
        lines = []
        for bound, n in zip(hist.buckets, hist.counts, strict=True):
            lines.append(f"{name}_bucket{_labels({**labels, 'le': str(bound)})} {n}")
        lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {hist.count}")
        lines.append(f"{name}_sum{_labels(labels)} {hist.total}")
        lines.append(f"{name}_count{_labels(labels)} {hist.count}")
        return lines
