"""Request latency: one histogram with an ``op`` label, observed by the daemon's dispatcher.

The children are resolved once per operation at start, so observing costs one lock and one bucket search
(about a microsecond) instead of a label lookup per request.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics

from ..protocol.wire import Op
from .definitions import metric


class RequestLatency:
    def __init__(self, registry: CollectorRegistry) -> None:
        disable_created_metrics()  # no *_created series: they are not in the definitions and rarely useful
        d = metric("request_duration_seconds")
        self.histogram = Histogram(d.name, d.help, d.labels, registry=registry, buckets=d.buckets)
        self._children = {op: self.histogram.labels(op=op_label(op)) for op in Op}

    def observe(self, op: Op, seconds: float) -> None:
        self._children[op].observe(seconds)


def op_label(op: Op) -> str:
    return op.name.lower()
