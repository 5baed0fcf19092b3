"""sa-outbox's adapter for the portable job-queue benchmark harness.

The harness is hardbyte/postgresql-job-queue-benchmarking; its CONTRIBUTING_ADAPTERS.md
defines the contract this process implements. An adapter is one long-running process: the
harness sets its configuration in the environment, may write ``ENQUEUE <n>`` lines (pacing
tokens) on its stdin, reads JSON Lines telemetry from its stdout and SIGTERMs it at the end;
stderr is for logs.

What this adapter runs is what a user of sa-outbox gets:

- the schema: a job table on a declarative base of its own, in the schema
  ``sa_outbox_harness`` (``SA_OUTBOX_HARNESS_SCHEMA``), made by ``Base.metadata.create_all``
  (table, indexes, enum, NOTIFY trigger);
- producers: the documented bulk enqueue, ``JobQueue(Job).enqueue_many`` (one ``INSERT``
  for the batch; ``SA_OUTBOX_HARNESS_ENQUEUE=copy`` uses ``enqueue_copy``), one transaction per
  batch of at most ``PRODUCER_BATCH_MAX`` jobs;
- consumers: ``Worker(app, engine, concurrency=WORKER_COUNT).run()`` in the main thread,
  every other setting at its default (LISTEN/NOTIFY, adaptive prefetch, batched acks, its
  own SIGTERM handling and grace period);
- pickup latency: from the job's ``created_at`` (the database's ``now()`` of the enqueuing
  transaction) to the start of its handler, into a rolling 30 s log-bucket histogram of
  bounded size (relative error 0.1 %, about three significant figures).

Environment (set by the harness; defaults as in the harness's launcher): ``DATABASE_URL``
(``postgres://…`` or ``postgresql+psycopg://…``), ``SCENARIO`` (``long_horizon``; also
``migrate_only``), ``PRODUCER_MODE`` (``fixed`` | ``depth-target``), ``PRODUCER_PACING``
(``harness``: enqueue what the ``ENQUEUE <n>`` tokens on stdin ask for; ``adapter``: pace on
wall-clock time here, re-reading ``PRODUCER_RATE_CONTROL_FILE``), ``PRODUCER_RATE``,
``PRODUCER_BATCH_MAX`` (128), ``PRODUCER_BATCH_MS`` (25), ``TARGET_DEPTH``, ``WORKER_COUNT``,
``JOB_PAYLOAD_BYTES`` (256), ``JOB_WORK_MS`` (1), ``SAMPLE_EVERY_S`` (5),
``BENCH_INSTANCE_ID`` (0; only instance 0 reports the global observations, queue depth and
target rate).

Run it alone (it paces itself with ``PRODUCER_PACING=adapter``)::

    DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
    PRODUCER_PACING=adapter PRODUCER_RATE=100 WORKER_COUNT=8 SAMPLE_EVERY_S=2 \\
        /work/venv/bin/python benchmarks/harness_adapter.py

or under the harness's own orchestrator, on a local PostgreSQL and without Docker, with
``benchmarks/harness_local.py`` (see there, and benchmarks/results/harness-notes.md).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

SYSTEM = "sa-outbox"
DEFAULT_SCHEMA = "sa_outbox_harness"
JOB_KIND = "bench"
LATENCY_WINDOW_S = 30
#: Metrics that describe the whole queue, not one replica: only instance 0 emits them.
OBSERVER_METRICS = frozenset({"queue_depth", "producer_target_rate"})


# -- configuration ---------------------------------------------------------------------------


def env_int(name: str, default: int) -> int:
    """An integer from the environment (a float string is truncated), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    return int(float(raw))


def sqlalchemy_url(url: str) -> str:
    """``postgres://…`` (the harness's form) as a SQLAlchemy psycopg 3 URL."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def database_name(url: str) -> str:
    """The database in ``url``, without its query string."""
    return urlsplit(url).path.lstrip("/") or "postgres"


def now_iso() -> str:
    """UTC now as the harness writes it: ``2026-04-17T09:00:10.000Z``."""
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


# -- bounded-memory latency percentiles -------------------------------------------------------


class LogHistogram:
    """Counts of positive values in logarithmic buckets, sparse (DDSketch-style).

    Bucket ``i`` holds the values in ``(gamma**(i-1), gamma**i]`` with
    ``gamma = (1 + rel_error) / (1 - rel_error)``; a bucket is reported as
    ``2 * gamma**i / (gamma + 1)``, within ``rel_error`` of every value in it. Values at
    or below ``floor`` share one bucket, reported as ``floor``. The number of buckets is
    bounded by ``log(max / floor) / log(gamma)`` whatever the number of values: about
    12,700 from 1 µs to a day at 0.1 %.

    Examples:
        >>> h = LogHistogram()
        >>> for v in range(1, 101):
        ...     h.add(float(v))
        >>> [round(q) for q in h.quantiles((0.5, 0.99))]
        [50, 99]
    """

    __slots__ = ("_counts", "_floor", "_gamma", "_log_gamma", "total")

    def __init__(self, rel_error: float = 0.001, floor: float = 0.001) -> None:
        self._gamma = (1 + rel_error) / (1 - rel_error)
        self._log_gamma = math.log(self._gamma)
        self._floor = floor
        self._counts: dict[int, int] = {}
        self.total = 0

    def _index(self, value: float) -> int:
        if value <= self._floor:
            return -(2**31)
        return math.ceil(math.log(value) / self._log_gamma)

    def _value(self, index: int) -> float:
        if index == -(2**31):
            return self._floor
        return 2 * self._gamma**index / (self._gamma + 1)

    def add(self, value: float, count: int = 1) -> None:
        """Count ``value`` (``count`` times)."""
        index = self._index(value)
        self._counts[index] = self._counts.get(index, 0) + count
        self.total += count

    def merge(self, other: LogHistogram) -> None:
        """Add ``other``'s counts (same ``rel_error`` and ``floor``)."""
        counts = self._counts
        for index, n in other._counts.items():
            counts[index] = counts.get(index, 0) + n
        self.total += other.total

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """The nearest-rank quantiles ``qs`` (ascending, in 0..1); 0.0 when empty."""
        if not self.total:
            return [0.0 for _ in qs]
        ranks = [max(1, math.ceil(q * self.total)) for q in qs]
        out: list[float] = []
        seen = 0
        want = iter(ranks)
        rank = next(want)
        for index in sorted(self._counts):
            seen += self._counts[index]
            while seen >= rank:
                out.append(self._value(index))
                step = next(want, None)
                if step is None:
                    return out
                rank = step
        while len(out) < len(qs):  # not reached: the last rank is at most total
            out.append(self._value(max(self._counts)))
        return out


class RollingLatency:
    """Latencies of the last ``window_s`` seconds: one `LogHistogram` per second, a ring.

    Thread-safe (the worker's handler threads record, the sampler reads). Memory is
    ``window_s`` histograms, each bounded as `LogHistogram` says.
    """

    def __init__(
        self, window_s: int = LATENCY_WINDOW_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._window = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: list[tuple[int, LogHistogram]] = [(-1, LogHistogram())] * window_s

    def record(self, value_ms: float) -> None:
        """Count one latency, in milliseconds, in the current second."""
        second = int(self._clock())
        slot = second % self._window
        with self._lock:
            stamp, hist = self._slots[slot]
            if stamp != second:
                hist = LogHistogram()
                self._slots[slot] = (second, hist)
            hist.add(value_ms)

    def percentiles(self, qs: tuple[float, ...] = (0.5, 0.95, 0.99)) -> list[float]:
        """The quantiles ``qs`` over the last ``window_s`` seconds (0.0 when none)."""
        oldest = int(self._clock()) - self._window
        merged = LogHistogram()
        with self._lock:
            for stamp, hist in self._slots:
                if stamp > oldest:
                    merged.merge(hist)
        return merged.quantiles(qs)


# -- telemetry --------------------------------------------------------------------------------


class Telemetry:
    """The JSONL records on stdout, one per line, flushed at once, from any thread."""

    def __init__(self, out: TextIO, instance_id: int) -> None:
        self._out = out
        self._lock = threading.Lock()
        self.instance_id = instance_id

    def emit(self, record: dict[str, Any]) -> None:
        record.setdefault("instance_id", self.instance_id)
        line = json.dumps(record)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def metric(self, stamp: str, name: str, value: float, window_s: float) -> None:
        if name in OBSERVER_METRICS and self.instance_id != 0:
            return
        self.emit(
            {
                "t": stamp,
                "system": SYSTEM,
                "kind": "adapter",
                "subject_kind": "adapter",
                "subject": "",
                "metric": name,
                "value": value,
                "window_s": window_s,
            }
        )


def log(message: str) -> None:
    """A line on stderr (the harness's log stream)."""
    print(f"[{SYSTEM}] {message}", file=sys.stderr, flush=True)


# -- the adapter ------------------------------------------------------------------------------


class Counters:
    """Jobs enqueued and completed by this process, and the last queue depth seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.enqueued = 0
        self.completed = 0
        self.queue_depth = 0
        self.target_rate = 0.0

    def add_enqueued(self, n: int) -> None:
        with self._lock:
            self.enqueued += n

    def add_completed(self) -> None:
        with self._lock:
            self.completed += 1


class PacingTokens:
    """The jobs the harness's ``ENQUEUE <n>`` tokens have asked for and not yet enqueued.

    A reader thread adds what each token asks; the producer takes up to a batch at a time.
    Reading stdin without waiting on the database keeps the harness's pacer from blocking
    on a full pipe while an insert is slow: the debt is paid in full batches afterwards.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owed = 0
        self.closed = False

    def add(self, n: int) -> None:
        with self._cond:
            self._owed += n
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def take(self, limit: int, timeout: float) -> int:
        """Up to ``limit`` owed jobs, waiting up to ``timeout`` s for some; 0 when none."""
        with self._cond:
            if not self._owed and not self.closed:
                self._cond.wait(timeout)
            n = min(self._owed, limit)
            self._owed -= n
            return n

    def read(self, stream: TextIO) -> None:
        """Add every ``ENQUEUE <n>`` line of ``stream`` until it ends (runs in a thread)."""
        for line in stream:
            head, _, count = line.strip().partition(" ")
            if head != "ENQUEUE":
                continue
            try:
                n = int(count)
            except ValueError:
                continue
            if n > 0:
                self.add(n)
        self.close()


def read_rate(path: str | None, default: float) -> float:
    """The producer rate in the harness's control file (high-load phases), else ``default``."""
    if not path:
        return default
    try:
        return float(Path(path).read_text().strip())
    except (OSError, ValueError):
        return default


def adapter_paced_batches(
    rate_of: Callable[[], float],
    batch_max: int,
    period_s: float,
    stop: threading.Event,
) -> Iterator[int]:
    """Batch sizes for a fixed rate credited on real elapsed wall-clock time.

    Every ``period_s`` (or later, when the last batch took longer) it credits
    ``rate * elapsed`` jobs and yields them in batches of at most ``batch_max``: a slow
    insert delays jobs, it does not drop them from the offered load.
    """
    credit = 0.0
    last = time.monotonic()
    while not stop.is_set():
        wait = period_s - (time.monotonic() - last)
        if wait > 0 and stop.wait(wait):
            return
        now = time.monotonic()
        rate = rate_of()
        if rate <= 0:
            credit, last = 0.0, now
            continue
        credit += rate * (now - last)
        last = now
        while credit >= 1 and not stop.is_set():
            n = min(batch_max, int(credit))
            credit -= n
            yield n


class Adapter:
    """One replica: schema, producer, depth poller, sampler, and the worker in the main thread."""

    def __init__(self) -> None:
        self.raw_url = os.environ.get("DATABASE_URL", "")
        if not self.raw_url:
            raise SystemExit("DATABASE_URL must be set")
        self.url = sqlalchemy_url(self.raw_url)
        self.schema = os.environ.get("SA_OUTBOX_HARNESS_SCHEMA", DEFAULT_SCHEMA)
        self.scenario = os.environ.get("SCENARIO", "long_horizon")
        self.producer_mode = os.environ.get("PRODUCER_MODE", "fixed")
        self.pacing = os.environ.get("PRODUCER_PACING", "adapter")
        self.rate = float(env_int("PRODUCER_RATE", 800))
        self.batch_max = max(1, env_int("PRODUCER_BATCH_MAX", 128))
        self.batch_ms = max(1, env_int("PRODUCER_BATCH_MS", 25))
        self.target_depth = env_int("TARGET_DEPTH", 1000)
        self.worker_count = max(1, env_int("WORKER_COUNT", 32))
        self.payload_bytes = max(0, env_int("JOB_PAYLOAD_BYTES", 256))
        self.work_s = max(0, env_int("JOB_WORK_MS", 1)) / 1000
        self.sample_every = max(1, env_int("SAMPLE_EVERY_S", 5))
        self.control_file = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
        self.enqueue_path = os.environ.get("SA_OUTBOX_HARNESS_ENQUEUE", "many")
        self.telemetry = Telemetry(sys.stdout, env_int("BENCH_INSTANCE_ID", 0))
        self.counters = Counters()
        self.latency = RollingLatency()
        self.stop = threading.Event()
        self.tokens = PacingTokens()

    # -- schema --------------------------------------------------------------------------------

    def build(self) -> None:
        """The models, the engines, the queue and the app; the schema, created once."""
        from sqlalchemy import MetaData, create_engine, func, select, text
        from sqlalchemy.orm import DeclarativeBase

        from sa_outbox import JobApp, JobContext, JobMixin, JobQueue

        class Base(DeclarativeBase):
            metadata = MetaData(schema=self.schema)

        class Job(JobMixin, Base):
            __tablename__ = "jobs"

        self.job_model: Any = Job
        # The worker gets an engine of its own, as a user's would; the producer and the
        # depth poller share another, so that neither borrows from the worker's pool.
        self.worker_engine = create_engine(self.url)
        self.engine = create_engine(self.url, pool_size=2, max_overflow=2)
        with self.engine.begin() as conn:
            # Replicas (and restarts) start together: one creates, the others wait.
            conn.execute(select(func.pg_advisory_xact_lock(0x5A0B_BE4C)))
            conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))
            Base.metadata.create_all(conn)
        self.queue = JobQueue(Job)
        self.app = JobApp(Job)

        def bench(job: JobContext) -> None:
            started = dt.datetime.now(dt.UTC)
            self.latency.record(max(0.0, (started - job.created_at).total_seconds() * 1000))
            if self.work_s:
                time.sleep(self.work_s)
            self.counters.add_completed()

        self.app.register(JOB_KIND, bench)
        self.pending_count = select(func.count()).select_from(Job).where(Job.status == "pending")

    def descriptor(self) -> dict[str, Any]:
        """The startup record: what runs, on which tables (and indexes), at which version."""
        from sqlalchemy import text

        import sa_outbox

        table = f"{self.schema}.jobs"
        with self.engine.connect() as conn:
            indexes = conn.execute(
                text(
                    "SELECT indexname FROM pg_indexes WHERE schemaname = :s AND tablename = 'jobs'"
                ),
                {"s": self.schema},
            ).scalars()
            event_indexes = sorted(f"{self.schema}.{name}" for name in indexes)
            server = conn.execute(text("SHOW server_version")).scalar()
        return {
            "kind": "descriptor",
            "system": SYSTEM,
            "event_tables": [table],
            "event_indexes": event_indexes,
            "extensions": [],
            "version": f"{sa_outbox.__version__}+{source_revision()}",
            "schema_version": "metadata.create_all",
            "db_name": database_name(self.raw_url),
            "started_at": now_iso(),
            "enqueue": f"JobQueue.enqueue_{self.enqueue_path}",
            "postgres": server,
        }

    # -- producer ------------------------------------------------------------------------------

    def enqueue(self, n: int) -> None:
        """``n`` jobs in one transaction, through the documented bulk path."""
        from sa_outbox import NewJob

        pad = "x" * self.payload_bytes
        jobs = [NewJob(JOB_KIND, {"pad": pad}) for _ in range(n)]
        with self.engine.begin() as conn:
            if self.enqueue_path == "copy":
                self.queue.enqueue_copy(conn, jobs)
            else:
                self.queue.enqueue_many(conn, jobs)
        self.counters.add_enqueued(n)

    def batches(self) -> Iterator[int]:
        """The batch sizes to enqueue, as the producer mode and pacing say."""
        if self.producer_mode == "depth-target":
            self.counters.target_rate = 0.0
            while not self.stop.is_set():
                missing = self.target_depth - self.counters.queue_depth
                if missing <= 0:
                    self.stop.wait(0.05)
                    continue
                n = min(self.batch_max, missing)
                self.counters.queue_depth += n  # until the poller sees them
                yield n
        elif self.pacing == "harness":
            # The harness's pacer is fixed at PRODUCER_RATE (it does not read the
            # control file), so that is the rate in force.
            self.counters.target_rate = self.rate
            while not self.stop.is_set():
                n = self.tokens.take(self.batch_max, timeout=0.5)
                if n:
                    yield n
                elif self.tokens.closed:
                    return
        else:
            last_read = [0.0, self.rate]

            def rate() -> float:
                now = time.monotonic()
                if now - last_read[0] >= 0.25:
                    last_read[:] = [now, read_rate(self.control_file, self.rate)]
                self.counters.target_rate = last_read[1]
                return last_read[1]

            yield from adapter_paced_batches(rate, self.batch_max, self.batch_ms / 1000, self.stop)

    def produce(self) -> None:
        for n in self.batches():
            try:
                self.enqueue(n)
            except Exception as exc:  # the database away (chaos): the batch is not offered
                log(f"enqueue of {n} failed: {type(exc).__name__}: {exc}")
                self.stop.wait(0.2)

    # -- observers -----------------------------------------------------------------------------

    def poll_depth(self) -> None:
        """Pending jobs, every 0.2 s (only instance 0, or a depth-target producer, needs it)."""
        if self.telemetry.instance_id != 0 and self.producer_mode != "depth-target":
            return
        while not self.stop.is_set():
            try:
                with self.engine.connect() as conn:
                    while not self.stop.is_set():
                        self.counters.queue_depth = int(
                            conn.execute(self.pending_count).scalar_one()
                        )
                        conn.commit()
                        self.stop.wait(0.2)
            except Exception as exc:
                log(f"depth poll failed: {type(exc).__name__}: {exc}")
                self.stop.wait(1.0)

    def sample(self) -> None:
        """One record per metric every ``SAMPLE_EVERY_S``, aligned on wall-clock multiples."""
        every = self.sample_every
        last_tick = time.monotonic()
        last_enq, last_done = self.counters.enqueued, self.counters.completed
        while True:
            wait = every - (time.time() % every)
            if self.stop.wait(wait):
                return
            now = time.monotonic()
            elapsed = max(now - last_tick, 1e-3)
            enq, done = self.counters.enqueued, self.counters.completed
            p50, p95, p99 = self.latency.percentiles()
            stamp = now_iso()
            for name, value, window in (
                ("claim_p50_ms", p50, float(LATENCY_WINDOW_S)),
                ("claim_p95_ms", p95, float(LATENCY_WINDOW_S)),
                ("claim_p99_ms", p99, float(LATENCY_WINDOW_S)),
                ("enqueue_rate", (enq - last_enq) / elapsed, float(every)),
                ("completion_rate", (done - last_done) / elapsed, float(every)),
                ("queue_depth", float(self.counters.queue_depth), 0.0),
                ("producer_target_rate", self.counters.target_rate, 0.0),
            ):
                self.telemetry.metric(stamp, name, round(value, 3), window)
            last_tick, last_enq, last_done = now, enq, done

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        from sa_outbox import Worker

        self.build()
        self.telemetry.emit(self.descriptor())
        if self.scenario == "migrate_only":
            log("schema ready")
            return 0
        if self.scenario != "long_horizon":
            log(f"SCENARIO={self.scenario!r} is not supported (long_horizon, migrate_only)")
            return 2
        if self.pacing == "harness" and self.producer_mode == "fixed":
            threading.Thread(
                target=self.tokens.read, args=(sys.stdin,), name="stdin-tokens", daemon=True
            ).start()
        # The production loop with its defaults; it handles SIGTERM/SIGINT itself (stop
        # claiming, let running jobs finish within the grace period) and then returns.
        worker = Worker(self.app, self.worker_engine, concurrency=self.worker_count)

        def produce_once_listening() -> None:
            # Jobs enqueued while the worker starts would measure its start-up, not pickup;
            # the harness's tokens meanwhile add up, and are paid once it listens.
            if not worker.listening.wait(30):
                log("the worker is not listening after 30 s; producing anyway")
            self.produce()

        threads = [
            threading.Thread(target=produce_once_listening, name="producer", daemon=True),
            threading.Thread(target=self.poll_depth, name="depth", daemon=True),
            threading.Thread(target=self.sample, name="sampler", daemon=True),
        ]
        for thread in threads:
            thread.start()
        log(
            f"long_horizon: rate={self.rate:g}/s pacing={self.pacing} mode={self.producer_mode} "
            f"batch<={self.batch_max} concurrency={self.worker_count} schema={self.schema}"
        )
        try:
            worker.run()
        finally:
            self.stop.set()
            self.tokens.close()
            for thread in threads:
                thread.join(timeout=2.0)
            self.worker_engine.dispose()
            self.engine.dispose()
            log("stopped")
        return 0


def source_revision() -> str:
    """The git commit of the sa-outbox checkout this runs from ("unknown" outside one)."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return out.stdout.strip() + (".dirty" if dirty.stdout.strip() else "")


def main() -> int:
    # A SIGTERM before the worker installs its own handler still ends the process cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return Adapter().run()


if __name__ == "__main__":
    raise SystemExit(main())
