"""What every system module shares: the run context, samples, rows and their statistics."""

from __future__ import annotations

import dataclasses
import importlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.database import Database

__all__ = [
    "BACKLOG",
    "QUICK_BACKLOG",
    "BenchmarkError",
    "Context",
    "Runner",
    "Sample",
    "SystemSpec",
    "WorkloadSpec",
    "latency_metrics",
    "make_row",
    "percentiles_ms",
    "throughput",
]

#: One run's measurements: metric name → value (the unit comes from `UNITS`).
Sample = dict[str, float]

#: The unit of each metric a runner may report.
UNITS: dict[str, str] = {
    "throughput": "jobs/s",
    "throughput_unnest": "jobs/s",
    "throughput_fresh": "jobs/s",
    "after_vs_fresh": "x",
    "throughput_executemany": "jobs/s",
    "unit_of_work": "transactions/s",
    "unit_of_work_job": "transactions/s",
    "job_overhead": "%",
    "events_throughput": "events/s",
    "p50": "ms",
    "p95": "ms",
    "p99": "ms",
    "rss_start": "MB",
    "rss_end": "MB",
    "rss_max": "MB",
}

#: Bulk batches (W3) and pre-enqueueing use batches of this size.
BATCH = 1000
#: Producers in W2.
PRODUCERS = 16
#: Concurrency in W5.
CONCURRENCY = 8
#: Jobs (events) per second in the latency workloads (W6, W8).
RATE = 100.0
#: Pending jobs behind the ``n`` a backlog workload (W4B, W5B) processes; --quick: the small one.
BACKLOG = 1_000_000
QUICK_BACKLOG = 20_000


class BenchmarkError(RuntimeError):
    """A run did not do what it must (jobs missing, a worker that never finished)."""


@dataclasses.dataclass(frozen=True)
class Context:
    """One run of one workload on one system: where, and how many jobs."""

    db: Database
    schema: str
    workload: str
    system: str
    n: int
    quick: bool
    #: Pending jobs enqueued before the run besides its ``n`` (W4B, W5B); the run stops
    #: once ``n`` are done, and checks that the rest are still there.
    backlog: int = 0

    @property
    def conninfo(self) -> str:
        """libpq connection string whose ``search_path`` is this system's schema."""
        return self.db.conninfo(self.schema)

    def deadline(self, rate_floor: float = 20.0) -> float:
        """A generous time limit for ``n`` jobs (a run that hangs must fail, not hang)."""
        return 60.0 + self.n / rate_floor


Runner = Callable[[Context], Sample]


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """How one system runs one workload, and the setup to print next to the numbers."""

    runner: Runner
    setup: str


@dataclasses.dataclass(frozen=True)
class SystemSpec:
    """A system under test: its schema objects and the workloads it runs."""

    name: str
    install: Callable[[Database, str], None]
    workloads: dict[str, WorkloadSpec]
    versions: Callable[[], dict[str, str]] = dict


def throughput(count: int, seconds: float) -> float:
    """Jobs per second, refusing a zero or negative duration."""
    if seconds <= 0:
        raise BenchmarkError(f"non-positive duration {seconds!r} for {count} jobs")
    return count / seconds


def percentiles_ms(latencies_s: Sequence[float]) -> Sample:
    """p50 / p95 / p99 of latencies given in seconds, in milliseconds."""
    if len(latencies_s) < 2:
        raise BenchmarkError(f"need at least 2 latencies, got {len(latencies_s)}")
    cuts = statistics.quantiles([x * 1000.0 for x in latencies_s], n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "p99": cuts[98]}


def latency_metrics(latencies_s: Sequence[float], expected: int) -> Sample:
    """Percentiles, after checking that every job (event) was seen exactly once."""
    if len(latencies_s) != expected:
        raise BenchmarkError(f"saw {len(latencies_s)} handler starts, expected {expected}")
    return percentiles_ms(latencies_s)


def make_row(
    workload: str, system: str, metric: str, values: Sequence[float], setup: str
) -> dict[str, Any]:
    """A result row: the format results.json holds (and W7's module returns)."""
    unit = UNITS.get(metric, "")
    if workload == "W8" and metric == "throughput":
        unit = "events/s"
    return {
        "workload": workload,
        "system": system,
        "metric": metric,
        "unit": unit,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": [round(v, 3) for v in values],
        "setup": setup,
    }


def pace(start: float, index: int, rate: float) -> None:
    """Sleep until job ``index`` is due at ``rate`` per second after ``start`` (perf_counter)."""
    delay = start + index / rate - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def rss_mb() -> float:
    """This process's resident set size, in MB (psutil)."""
    psutil: Any = importlib.import_module("psutil")  # a bench extra, without type stubs
    return float(psutil.Process().memory_info().rss) / (1024 * 1024)
