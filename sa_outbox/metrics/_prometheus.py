"""Prometheus metrics: worker counters and histograms, gauges read from `queue_status`.

``prometheus_client`` is imported here only, and only if installed
(``pip install "sa-outbox[prometheus]"``); without it, asking for metrics raises
`MetricsUnavailable`, which names the extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine

from .._exceptions import InvalidArgument, SaOutboxError
from .._pooler import prepare_for_pooler
from ..queue import ClaimedEvent, ClaimedJob, queue_status
from ..relay import PublishOutcome, RelayMetrics, RelayReport
from ..worker import JobOutcome, WorkerMetrics

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - exercised by the test without the extra
    prometheus_client = None  # type: ignore[assignment]
    Collector = object  # type: ignore[assignment,misc]

__all__ = [
    "MetricsUnavailable",
    "PrometheusMetrics",
    "PrometheusRelayMetrics",
    "QueueStatusCollector",
    "serve_metrics",
]

#: Buckets (seconds) of the handler duration and claim→start delay histograms.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Buckets (events) of the relay's batch size histogram.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


class MetricsUnavailable(SaOutboxError, ImportError):
    """Metrics were asked for but ``prometheus_client`` is not installed.

    Examples:
        >>> str(MetricsUnavailable())
        'Prometheus metrics need prometheus_client: pip install "sa-outbox[prometheus]"'
    """

    def __init__(self) -> None:
        super().__init__(
            'Prometheus metrics need prometheus_client: pip install "sa-outbox[prometheus]"'
        )


def _require() -> Any:
    if prometheus_client is None:
        raise MetricsUnavailable()
    return prometheus_client


class PrometheusMetrics(WorkerMetrics):
    """`WorkerMetrics` that count into Prometheus metrics (docs/metrics.md lists them).

    Pass it as ``Worker(..., metrics=PrometheusMetrics())``; ``registry`` defaults to
    ``prometheus_client.REGISTRY``. One instance per registry (the names are fixed).

    Examples:
        >>> from prometheus_client import CollectorRegistry, generate_latest
        >>> registry = CollectorRegistry()
        >>> metrics = PrometheusMetrics(registry)
        >>> metrics.reclaimed(2, 1)
        >>> b"sa_outbox_jobs_reclaimed_total 2.0" in generate_latest(registry)
        True
    """

    def __init__(self, registry: Any = None) -> None:
        prom = _require()
        registry = prom.REGISTRY if registry is None else registry
        labels = ["queue", "kind", "outcome"]
        self.jobs = prom.Counter(
            "sa_outbox_jobs", "Jobs a worker settled, by outcome", labels, registry=registry
        )
        self.duration = prom.Histogram(
            "sa_outbox_job_duration_seconds",
            "Run time of job handlers",
            labels,
            buckets=BUCKETS,
            registry=registry,
        )
        self.claimed = prom.Counter(
            "sa_outbox_jobs_claimed",
            "Jobs a worker claimed",
            ["queue", "kind"],
            registry=registry,
        )
        self.start_delay = prom.Histogram(
            "sa_outbox_job_start_delay_seconds",
            "Time from a job's claim to its handler's start",
            ["queue", "kind"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.heartbeat_lost = prom.Counter(
            "sa_outbox_heartbeat_leases_lost",
            "Leases a heartbeat found lost (reclaimed or cancelled)",
            registry=registry,
        )
        self.reclaimed_jobs = prom.Counter(
            "sa_outbox_jobs_reclaimed",
            "Expired leases the reclaimer sent back to pending",
            registry=registry,
        )
        self.reclaimed_failed = prom.Counter(
            "sa_outbox_jobs_reclaimed_failed",
            "Expired leases the reclaimer failed (max_attempts reached)",
            registry=registry,
        )
        self.database_errors = prom.Counter(
            "sa_outbox_database_errors",
            "Database operations of a worker that failed",
            ["operation"],
            registry=registry,
        )

    def job_started(self, job: ClaimedJob, delay: float) -> None:
        self.claimed.labels(job.queue, job.kind).inc()
        self.start_delay.labels(job.queue, job.kind).observe(delay)

    def job_settled(self, job: ClaimedJob, outcome: JobOutcome, seconds: float) -> None:
        self.jobs.labels(job.queue, job.kind, outcome.value).inc()
        self.duration.labels(job.queue, job.kind, outcome.value).observe(seconds)

    def heartbeat(self, renewed: int, lost: int, seconds: float) -> None:
        if lost:
            self.heartbeat_lost.inc(lost)

    def reclaimed(self, returned: int, failed: int) -> None:
        self.reclaimed_jobs.inc(returned)
        self.reclaimed_failed.inc(failed)

    def database_error(self, operation: str, error: BaseException) -> None:
        self.database_errors.labels(operation).inc()


class PrometheusRelayMetrics(RelayMetrics):
    """`RelayMetrics` that count into Prometheus metrics (docs/metrics.md lists them).

    Pass it as ``Relay(..., metrics=PrometheusRelayMetrics())`` (or `AsyncRelay`);
    ``registry`` defaults to ``prometheus_client.REGISTRY``. One instance per registry.
    Events are labelled by ``event_type``: an outbox's event types are a fixed set of the
    application's, so the label stays bounded.

    Examples:
        >>> from prometheus_client import CollectorRegistry, generate_latest
        >>> registry = CollectorRegistry()
        >>> metrics = PrometheusRelayMetrics(registry)
        >>> metrics.batch_claimed(20, 0.003)
        >>> b"sa_outbox_relay_batch_size_sum 20.0" in generate_latest(registry)
        True
    """

    def __init__(self, registry: Any = None) -> None:
        prom = _require()
        registry = prom.REGISTRY if registry is None else registry
        self.published = prom.Counter(
            "sa_outbox_events_published",
            "Outbox events the broker took",
            ["event_type"],
            registry=registry,
        )
        self.failures = prom.Counter(
            "sa_outbox_event_publish_failures",
            "Outbox events the broker refused (each retried with backoff, or parked)",
            ["event_type"],
            registry=registry,
        )
        self.parked = prom.Counter(
            "sa_outbox_events_parked",
            "Outbox events parked after max_attempts refusals",
            ["event_type"],
            registry=registry,
        )
        self.publish_duration = prom.Histogram(
            "sa_outbox_relay_publish_duration_seconds",
            "Time of one call of the publisher (a wave of events), by how it ended",
            ["outcome"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.lag = prom.Histogram(
            "sa_outbox_relay_claim_to_publish_seconds",
            "Time from an event's claim by the relay to the broker's confirmation",
            ["event_type"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.batch_size = prom.Histogram(
            "sa_outbox_relay_batch_size",
            "Events a relay claim took (empty claims are not counted)",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.released = prom.Counter(
            "sa_outbox_relay_events_released",
            "Claimed events given back untried or while the broker was unreachable",
            registry=registry,
        )
        self.lost = prom.Counter(
            "sa_outbox_relay_events_lost",
            "Claimed events whose lease passed to another relay before their outcome was written",
            registry=registry,
        )

    def batch_claimed(self, claimed: int, seconds: float) -> None:
        self.batch_size.observe(claimed)

    def publish_finished(self, events: int, outcome: PublishOutcome, seconds: float) -> None:
        self.publish_duration.labels(outcome.value).observe(seconds)

    def event_published(self, event: ClaimedEvent, lag: float) -> None:
        self.published.labels(event.event_type).inc()
        self.lag.labels(event.event_type).observe(lag)

    def event_rejected(self, event: ClaimedEvent, parked: bool) -> None:
        self.failures.labels(event.event_type).inc()
        if parked:
            self.parked.labels(event.event_type).inc()

    def cycle_finished(self, report: RelayReport, seconds: float) -> None:
        if report.released:
            self.released.inc(report.released)
        if report.lost:
            self.lost.inc(report.lost)


class QueueStatusCollector(Collector):
    """Gauges read by `queue_status` at each scrape, so any process can expose them.

    ``jobs``, ``outbox`` and ``dependencies`` are the models `queue_status` takes. Given
    ``dependencies`` (with ``jobs``): the jobs waiting for others and the workflows with one
    (read through the waiting rows' index); ``workflow_states=True`` adds the workflows by
    state, which reads the whole dependencies table at each scrape. Register it:
    ``QueueStatusCollector(engine, jobs=Job).register()``.

    Examples:
        >>> QueueStatusCollector(None, jobs="jobs").describe()
        []
    """

    def __init__(
        self,
        engine: Engine | None,
        *,
        jobs: object | None = None,
        outbox: object | None = None,
        dependencies: object | None = None,
        workflow_states: bool = False,
    ) -> None:
        _require()
        if dependencies is not None and jobs is None:
            raise InvalidArgument("QueueStatusCollector(dependencies=) needs jobs= too")
        self.engine = engine
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
        self.jobs = jobs
        self.outbox = outbox
        self.dependencies = dependencies
        self.workflow_states = workflow_states

    def register(self, registry: Any = None) -> QueueStatusCollector:
        """Register with ``registry`` (default ``prometheus_client.REGISTRY``); returns self.

        Examples:
            QueueStatusCollector(engine, jobs=Job, outbox=OutboxEvent).register()
        """
        prom = _require()
        (prom.REGISTRY if registry is None else registry).register(self)
        return self

    def describe(self) -> list[Any]:
        # Nothing at registration: the registry must not query the database then.
        return []

    def collect(self) -> Iterator[Any]:
        assert self.engine is not None, "QueueStatusCollector needs an engine to collect"
        with self.engine.connect() as conn:
            status = queue_status(
                conn,
                jobs=self.jobs,
                outbox=self.outbox,
                dependencies=self.dependencies,
                workflow_states=self.workflow_states,
            )
        if status.jobs is not None:
            jobs = GaugeMetricFamily(
                "sa_outbox_jobs_in_status",
                "Jobs in the table, by queue, kind and status",
                labels=["queue", "kind", "status"],
            )
            for count in status.jobs.counts:
                jobs.add_metric([count.queue, count.kind, count.status], count.jobs)
            yield jobs
            age = status.jobs.oldest_ready_age
            yield GaugeMetricFamily(
                "sa_outbox_oldest_ready_job_age_seconds",
                "Age of the oldest job ready to run (0 when none is)",
                value=0.0 if age is None else age.total_seconds(),
            )
            yield GaugeMetricFamily(
                "sa_outbox_expired_leases",
                "Running jobs whose lease expired",
                value=status.jobs.expired_leases,
            )
        if status.workflows is not None:
            yield GaugeMetricFamily(
                "sa_outbox_jobs_waiting_for_jobs",
                "Jobs waiting for others (after=), not yet in the job table",
                value=status.workflows.waiting,
            )
            yield GaugeMetricFamily(
                "sa_outbox_workflows_waiting",
                "Workflows with at least one job waiting for others",
                value=status.workflows.waiting_workflows,
            )
            if status.workflows.by_state:
                flows = GaugeMetricFamily(
                    "sa_outbox_workflows", "Workflows by state", labels=["state"]
                )
                for state, n in status.workflows.by_state.items():
                    flows.add_metric([state], n)
                yield flows
        if status.outbox is not None:
            yield GaugeMetricFamily(
                "sa_outbox_relay_backlog",
                "Outbox events not yet published (parked ones excluded)",
                value=status.outbox.backlog,
            )
            yield GaugeMetricFamily(
                "sa_outbox_outbox_parked",
                "Outbox events parked after max_attempts",
                value=status.outbox.parked,
            )


def serve_metrics(port: int, addr: str = "0.0.0.0", registry: Any = None) -> Callable[[], None]:
    """Serve ``registry`` (default ``prometheus_client.REGISTRY``) at
    ``http://addr:port/metrics`` from a daemon thread; returns a function that stops it.

    Examples:
        stop = serve_metrics(9464)
        ...
        stop()
    """
    prom = _require()
    registry = prom.REGISTRY if registry is None else registry
    server, thread = prom.start_http_server(port, addr=addr, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop
