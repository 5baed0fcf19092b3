"""Prometheus metrics and structured (JSON) logs.

``prometheus_client`` is needed only here (``pip install "sa-outbox[prometheus]"``). The
package imports without it; `PrometheusMetrics`, `PrometheusRelayMetrics`,
`QueueStatusCollector` and `serve_metrics` then raise `MetricsUnavailable`. docs/metrics.md
lists every metric and log field.

Examples:
    >>> from sa_outbox.metrics import JsonFormatter, MetricsUnavailable
    >>> issubclass(MetricsUnavailable, ImportError)
    True
"""

from ._logs import JsonFormatter
from ._prometheus import (
    MetricsUnavailable,
    PrometheusMetrics,
    PrometheusRelayMetrics,
    QueueStatusCollector,
    serve_metrics,
)

__all__ = [
    "JsonFormatter",
    "MetricsUnavailable",
    "PrometheusMetrics",
    "PrometheusRelayMetrics",
    "QueueStatusCollector",
    "serve_metrics",
]
