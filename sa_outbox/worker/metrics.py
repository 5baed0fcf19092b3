"""Metrics hooks: what a worker reports, by kind and outcome, for an exporter to count.

Subclass `WorkerMetrics` and override what you need (each method is a no-op here), or use
`CountingMetrics`, which keeps counts and total durations in memory. The hooks are called
from the worker's own threads (or its event loop, for `AsyncWorker`): keep them fast, and
thread-safe for `Worker`. An exception a hook raises is logged and otherwise ignored.

Examples:
    >>> metrics = CountingMetrics()
    >>> metrics.job_finished("send-email", JobOutcome.SUCCEEDED, 0.25)
    >>> metrics.job_finished("send-email", JobOutcome.SUCCEEDED, 0.75)
    >>> metrics.counts[("send-email", JobOutcome.SUCCEEDED)], metrics.seconds["send-email"]
    (2, 1.0)
"""

from __future__ import annotations

import collections
import enum
import threading

from ..queue import ClaimedJob

__all__ = ["CountingMetrics", "JobOutcome", "WorkerMetrics"]


class JobOutcome(enum.StrEnum):
    """What became of a job a worker ran (or tried to run).

    Examples:
        >>> [str(o) for o in JobOutcome]
        ['succeeded', 'retried', 'failed', 'released', 'lost', 'snoozed', 'cancelled']
    """

    #: Completed: the fenced write committed.
    SUCCEEDED = "succeeded"
    #: A transient error (or a timeout): back to ``pending`` after its backoff.
    RETRIED = "retried"
    #: A permanent error, or a transient one at ``max_attempts``: ``failed``.
    FAILED = "failed"
    #: Given back to ``pending`` without counting the attempt (shutdown, cancelled).
    RELEASED = "released"
    #: The lease was lost: the fenced write matched no row and changed nothing.
    LOST = "lost"
    #: The handler snoozed it (`Snooze`): back to ``pending`` later, no attempt counted.
    SNOOZED = "snoozed"
    #: Cancelled while it ran (`JobQueue.cancel`): it ended ``cancelled``.
    CANCELLED = "cancelled"


class WorkerMetrics:
    """The hooks a worker calls; every method does nothing unless overridden.

    Examples:
        class PrometheusMetrics(WorkerMetrics):
            def job_finished(self, kind, outcome, seconds):
                JOBS.labels(kind, outcome).inc()
                DURATION.labels(kind, outcome).observe(seconds)
    """

    def job_finished(self, kind: str, outcome: JobOutcome, seconds: float) -> None:
        """A job's fate was written (or found lost); ``seconds`` is its handler's run time."""

    def job_started(self, job: ClaimedJob, delay: float) -> None:
        """A handler starts on ``job``, ``delay`` seconds after this worker claimed it."""

    def job_settled(self, job: ClaimedJob, outcome: JobOutcome, seconds: float) -> None:
        """Like `job_finished`, with the whole job (its ``queue``, ``attempts``, ids)."""

    def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
        """One transaction acknowledged ``acknowledged`` jobs and claimed ``claimed`` more."""

    def heartbeat(self, renewed: int, lost: int, seconds: float) -> None:
        """One heartbeat renewed ``renewed`` leases and found ``lost`` lost."""

    def reclaimed(self, returned: int, failed: int) -> None:
        """The reclaimer sent expired leases back: ``returned`` to pending, ``failed``."""

    def database_error(self, operation: str, error: BaseException) -> None:
        """A database operation failed (it is retried with backoff if transient)."""


class CountingMetrics(WorkerMetrics):
    """`WorkerMetrics` that count in memory: ``counts[(kind, outcome)]``, ``seconds[kind]``,
    ``totals[name]`` for the other hooks.

    Examples:
        >>> m = CountingMetrics()
        >>> m.batch_written(20, 20, 0.004)
        >>> m.totals["acknowledged"], m.totals["claimed"]
        (20, 20)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, JobOutcome]] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.totals: collections.Counter[str] = collections.Counter()
        self.errors: list[tuple[str, str]] = []

    def job_finished(self, kind: str, outcome: JobOutcome, seconds: float) -> None:
        with self._lock:
            self.counts[(kind, outcome)] += 1
            self.seconds[kind] += seconds

    def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
        with self._lock:
            self.totals["acknowledged"] += acknowledged
            self.totals["claimed"] += claimed
            self.totals["transactions"] += 1

    def heartbeat(self, renewed: int, lost: int, seconds: float) -> None:
        with self._lock:
            self.totals["renewed"] += renewed
            self.totals["heartbeat_lost"] += lost

    def reclaimed(self, returned: int, failed: int) -> None:
        with self._lock:
            self.totals["reclaimed"] += returned
            self.totals["reclaimed_failed"] += failed

    def database_error(self, operation: str, error: BaseException) -> None:
        with self._lock:
            self.errors.append((operation, type(error).__name__))

    def outcomes(self, kind: str | None = None) -> dict[JobOutcome, int]:
        """Counts by outcome, for one kind or all of them.

        Examples:
            >>> m = CountingMetrics()
            >>> m.job_finished("a", JobOutcome.FAILED, 0.1)
            >>> m.outcomes()[JobOutcome.FAILED]
            1
        """
        with self._lock:
            found = collections.Counter[JobOutcome]()
            for (k, outcome), n in self.counts.items():
                if kind is None or k == kind:
                    found[outcome] += n
        return {outcome: found[outcome] for outcome in JobOutcome}
