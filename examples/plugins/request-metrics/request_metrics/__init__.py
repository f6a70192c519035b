"""Custom metrics: the requests each scheduler finished and the tokens they generated, on the
server's ``/metrics``.

An ``AFTER`` hook on ``Scheduler.process_batch_result`` sees each step's batch once its results
are sent: a request of ``batch.reqs`` whose ``finished()`` is true finished in that step. The
metrics are ordinary ``prometheus_client`` metrics of the scheduler process; sglang-launch lists
every replica's on ``/metrics``, each sample labelled with its ``dp_rank``::

    request_metrics_finished_requests_total{dp_rank="0",kind="generation"} 12.0
    request_metrics_output_tokens_total{dp_rank="0"} 384.0
    request_metrics_output_tokens_bucket{dp_rank="0",le="64.0"} 9.0
"""

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

TARGET = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
_metrics = None


def metrics():
    """The metrics, made on first use (in the scheduler process: the launcher never needs them)."""
    global _metrics
    if _metrics is None:
        from prometheus_client import Counter, Histogram

        _metrics = (
            Counter("request_metrics_finished_requests", "Requests finished.", ["kind"]),
            Counter("request_metrics_output_tokens", "Tokens the finished requests generated."),
            Histogram(
                "request_metrics_output_length",
                "Tokens each finished generation request generated.",
                buckets=(1, 4, 16, 64, 256, 1024, 4096),
            ),
        )
    return _metrics


def count_finished(result, self, batch, step_result):
    finished, tokens, lengths = metrics()
    for req in batch.reqs:
        if req.finished():
            n = len(req.output_ids)
            finished.labels("generation" if n else "embedding").inc()
            if n:
                tokens.inc(n)
                lengths.observe(n)


def register():
    HookRegistry.register(TARGET, count_finished, HookType.AFTER)
