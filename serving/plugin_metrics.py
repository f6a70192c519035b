"""Metrics a plugin defines in a scheduler process, exported through the HTTP child's ``/metrics``.

A plugin that counts what the scheduler does (a hook on ``Scheduler.process_batch_result``, say)
defines its metrics with ``prometheus_client`` as anywhere else, in its default registry::

    from prometheus_client import Counter

    FINISHED = Counter("my_plugin_finished_requests", "Requests finished.", ["reason"])

Each scheduler's answer to a ping carries its process's page of them
(``wire.SchedulerStats.plugin_metrics``, Prometheus' text format), and the HTTP child's
``/metrics`` lists every replica's, each sample labelled with its ``dp_rank``. The registry's
default collectors (the process's CPU, memory and garbage collector figures) stay out. A process
where nothing imported ``prometheus_client`` has none and pays nothing.
"""

from __future__ import annotations

import sys
from typing import Any

# The families of prometheus_client's default collectors, which every process has.
_DEFAULT_FAMILIES = ("process_", "python_")


class _PluginFamilies:
    """The default registry's families less those of its default collectors."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> list[Any]:
        return [
            family
            for family in self.registry.collect()
            if not family.name.startswith(_DEFAULT_FAMILIES)
        ]


def plugin_metrics_page() -> str:
    """This process's plugin metrics in Prometheus' text format ("" when there are none)."""
    client = sys.modules.get("prometheus_client")
    if client is None:
        return ""
    from prometheus_client.exposition import generate_latest

    view = _PluginFamilies(client.REGISTRY)
    if not view.collect():
        return ""
    page: bytes = generate_latest(view)
    return page.decode("utf-8")
