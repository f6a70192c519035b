"""Prometheus metrics of the HTTP child, kept by ``prometheus_client`` in a registry of their own.

Two families of names share the page:

- SGLang's, labelled ``model_name`` (the served name), so SGLang's dashboards and alerts read
  them: the gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:gen_throughput`` (tokens per second), ``sglang:num_used_tokens``,
  ``sglang:token_usage`` (the KV-cache pool's share in use) and ``sglang:cache_hit_rate`` (of the
  prompt tokens the replicas admitted since they started, the share whose KV came from the
  prefix cache: ``TextStats.cached_tokens_total / prompt_tokens_total``, 0 before any), summed
  over the replicas that answer when the page is asked for (``observe_schedulers``); the histograms
  ``sglang:time_to_first_token_seconds`` and ``sglang:inter_token_latency_seconds`` (streamed
  generations: the HTTP child sees tokens as they come only when they are streamed) and
  ``sglang:e2e_request_latency_seconds`` (every generation); the counters
  ``sglang:prompt_tokens_total`` and ``sglang:generation_tokens_total``.
- the launcher's own, ``sglang_launch_*``: ``requests_total`` and ``request_latency_seconds`` by
  route and status / route, ``batch_size`` (for every finished request, how many requests, for
  embeddings texts, shared its batch), ``queue_depth`` (requests sent to a scheduler replica and
  not answered yet, by ``dp_rank``) and ``replica_restarts_total`` (by ``dp``, the restarts the
  supervisor announced).

Every series labelled only ``model_name`` is on the page from the start, at zero. After them
come the metrics plugins defined in the scheduler processes (``serving.plugin_metrics``), as the
replicas that answered reported them, each sample labelled with its ``dp_rank``. The page is
Prometheus' text format.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from serving import wire

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0, 6.0, 12.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

# The page lists the metrics named above and no *_created series beside them.
prometheus_client.disable_created_metrics()


class Metrics:
    """The HTTP child's metrics for the model served as ``model_name``; safe to update from any
    thread."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        r = self.registry
        # ---- the launcher's own -----------------------------------------------------------
        self.requests = Counter(
            "sglang_launch_requests",
            "HTTP requests answered, by route and status.",
            ("route", "status"),
            registry=r,
        )
        self.latency = Histogram(
            "sglang_launch_request_latency_seconds",
            "Time from request to response, by route.",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "sglang_launch_batch_size",
            "Requests (embeddings: texts) in the batch each result ran in.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "sglang_launch_queue_depth",
            "Requests sent to a scheduler replica and not answered yet.",
            ("dp_rank",),
            registry=r,
        )
        self.replica_restarts = Counter(
            "sglang_launch_replica_restarts",
            "Restarts of a scheduler replica by the supervisor (--restart-policy on-failure).",
            ("dp",),
            registry=r,
        )
        # ---- SGLang's names ----------------------------------------------------------------
        label = ("model_name",)

        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, label, registry=r).labels(model_name)

        def histogram(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, text, label, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("sglang:num_running_reqs", "Sequences decoding now.")
        self.queued = gauge("sglang:num_queue_reqs", "Requests waiting in a scheduler's queue.")
        self.throughput = gauge(
            "sglang:gen_throughput", "Tokens generated per second over the last few seconds."
        )
        self.used_tokens = gauge("sglang:num_used_tokens", "KV-cache tokens in use.")
        self.token_usage = gauge(
            "sglang:token_usage", "Share of the KV-cache token pool in use (0 to 1)."
        )
        self.cache_hit_rate = gauge(
            "sglang:cache_hit_rate",
            "The prefix cache hit rate: the share of the prompt tokens admitted since the "
            "replicas started whose KV came from the prefix cache (0 to 1).",
        )
        self.first_token = histogram(
            "sglang:time_to_first_token_seconds",
            "Time from a streamed generation's request to its first text.",
            FIRST_TOKEN_BUCKETS,
        )
        self.token_gap = histogram(
            "sglang:inter_token_latency_seconds",
            "Time between a streamed generation's tokens.",
            TOKEN_GAP_BUCKETS,
        )
        self.e2e = histogram(
            "sglang:e2e_request_latency_seconds",
            "Time from a generation's request to its last token.",
            REQUEST_BUCKETS,
        )
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Prompt tokens processed.", label, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Tokens generated.", label, registry=r
        ).labels(model_name)
        self.plugins = PluginMetrics()
        r.register(self.plugins)

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
            self.generation_tokens.inc(completion_tokens)

    def generation(self, streamed: bool) -> GenerationTiming:
        """The timing of one generated sequence whose request arrived now."""
        return GenerationTiming(self, streamed)

    def observe_schedulers(self, pongs: Iterable[wire.Pong]) -> None:
        """Set the scheduler gauges from the replicas' answers to a ping (summed over them);
        nothing changes when none answered."""
        answered = list(pongs)
        if not answered:
            return
        running = queued = used = total = prompt = cached = 0
        throughput = 0.0
        self.plugins.pages = {
            p.dp_rank: p.info.plugin_metrics for p in answered if p.info and p.info.plugin_metrics
        }
        for pong in answered:
            info = pong.info
            if isinstance(info, wire.TextStats):
                running += info.running
                queued += info.queued
                used += info.kv_tokens_used
                total += info.kv_tokens_total
                throughput += info.generation_tokens_per_s
                prompt += info.prompt_tokens_total
                cached += info.cached_tokens_total
            else:
                queued += pong.queue_depth
        self.running.set(running)
        self.queued.set(queued)
        self.throughput.set(throughput)
        self.used_tokens.set(used)
        self.token_usage.set(used / total if total else 0.0)
        self.cache_hit_rate.set(cached / prompt if prompt else 0.0)

    def set_queue_depth(self, dp_rank: int, depth: int) -> None:
        """Requests now outstanding at replica ``dp_rank``."""
        self.queue_depth.labels(str(dp_rank)).set(depth)

    def count_restart(self, dp_rank: int) -> None:
        """Replica ``dp_rank`` is being restarted."""
        self.replica_restarts.labels(str(dp_rank)).inc()

    def render(self) -> tuple[bytes, str]:
        """The metrics page and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE


class GenerationTiming:
    """The latencies of one generated sequence, observed from the answers the scheduler sends:
    with ``streamed``, the time to its first text and between its tokens; always the time to
    its end."""

    def __init__(self, metrics: Metrics, streamed: bool) -> None:
        self.metrics = metrics
        self.streamed = streamed
        self.started = time.monotonic()
        self.last: float | None = None
        self.tokens = 0

    def answered(self, reply: wire.Generated) -> None:
        """``reply`` (an increment, or the final answer) arrived now."""
        now = time.monotonic()
        if self.streamed and reply.completion_tokens > self.tokens:
            if self.last is None:
                self.metrics.first_token.observe(now - self.started)
            else:
                new = reply.completion_tokens - self.tokens
                self.metrics.token_gap.observe((now - self.last) / new)
            self.last, self.tokens = now, reply.completion_tokens
        if reply.finished:
            self.metrics.e2e.observe(now - self.started)


class PluginMetrics:
    """A collector of the metrics plugins defined in the schedulers: ``pages`` holds each
    replica's page (by ``dp_rank``), merged into one family per name."""

    def __init__(self) -> None:
        self.pages: dict[int, str] = {}

    def collect(self) -> list[Metric]:
        merged: dict[str, Metric] = {}
        for rank, page in sorted(self.pages.items()):
            try:
                families = list(text_string_to_metric_families(page))
            except ValueError:
                continue  # a page this parser cannot read is left out, not the whole /metrics
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = into
                if into.type != family.type:
                    continue
                for sample in family.samples:
                    labels = {**sample.labels, "dp_rank": str(rank)}
                    into.add_sample(sample.name, labels, sample.value, sample.timestamp)
        return list(merged.values())
