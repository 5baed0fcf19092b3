"""``sa-sync``: sa-outbox's `JobQueue`, `Worker` (threads) and `Relay` on a sync engine."""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks.core import (
    BATCH,
    CONCURRENCY,
    PRODUCERS,
    RATE,
    BenchmarkError,
    Context,
    Sample,
    SystemSpec,
    WorkloadSpec,
    latency_metrics,
    pace,
    percentiles_ms,
    rss_mb,
    throughput,
)
from benchmarks.raw import run_threads, split
from benchmarks.sa_models import (
    check_backlog,
    check_jobs,
    count_jobs,
    install_sa_schema,
    make_engine,
    models_for,
    pre_enqueue,
    versions,
)

__all__ = ["SYSTEM", "Acknowledged"]

#: Units of work written per transaction when W8 pre-writes its backlog (not timed).
EVENTS_PER_UNIT = 100
#: W1 alternates its two kinds of unit of work in blocks of this many.
W1_BLOCK = 250


class Acknowledged:
    """Worker metrics hook: notes when the ``n``-th acknowledgement committed, then stops.

    ``batch_written`` runs after the worker's write transaction committed, so the time it
    notes is the time the ``n``-th completion became durable.
    """

    def __init__(self, n: int) -> None:
        from sa_outbox.worker import WorkerMetrics

        outer = self

        class Hook(WorkerMetrics):
            def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
                outer.acknowledged += acknowledged
                if outer.acknowledged >= outer.n and outer.done_at is None:
                    outer.done_at = time.perf_counter()
                    outer.done = outer.acknowledged
                    outer.stop()

        self.n = n
        #: Set to the worker's ``stop`` once the worker exists.
        self.stop: Any = None
        self.acknowledged = 0
        #: Acknowledgements committed when ``done_at`` was noted (``n``, or a batch more).
        self.done = 0
        self.done_at: float | None = None
        self.metrics = Hook()


def _app(ctx: Context, handler: Any = None) -> Any:
    from sa_outbox import JobApp

    app = JobApp(models_for(ctx.schema).job)
    app.register("noop", handler if handler is not None else (lambda job: None))
    return app


def _enqueue_one_at_a_time(ctx: Context) -> Sample:
    """W1, as the README writes it (defaults throughout, ``create_engine(url)``).

    ``throughput``: ``JobQueue.enqueue(engine, …)``, one autocommit INSERT per job. Then, in
    the same run, units of work of one ORM Session transaction each: inserting one small row
    (``unit_of_work``), and the same plus ``sa_outbox.enqueue(session, …)`` (``unit_of_work_job``),
    alternated in blocks so that both see the same machine; ``job_overhead`` is how much
    longer the second takes, in percent.
    """
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    import sa_outbox
    from sa_outbox import JobQueue

    m = models_for(ctx.schema)
    engine = create_engine(ctx.db.sqlalchemy_url())
    queue = JobQueue(m.job)
    session_factory = sessionmaker(engine)
    sa_outbox.install(session_factory, job_model=m.job)

    def plain() -> None:
        with session_factory() as session, session.begin():
            session.add(m.order(total_cents=1200))

    def with_job() -> None:
        with session_factory() as session, session.begin():
            session.add(m.order(total_cents=1200))
            sa_outbox.enqueue(session, "noop", {})

    try:
        queue.enqueue(engine, "warm-up", {})  # the pool's first connection, not measured
        plain()
        with_job()
        started = time.perf_counter()
        for _ in range(ctx.n):
            queue.enqueue(engine, "noop", {})
        elapsed = time.perf_counter() - started
        spent = {plain: 0.0, with_job: 0.0}
        for start in range(0, ctx.n, W1_BLOCK):
            for unit in (plain, with_job) if start % (2 * W1_BLOCK) == 0 else (with_job, plain):
                began = time.perf_counter()
                for _ in range(min(W1_BLOCK, ctx.n - start)):
                    unit()
                spent[unit] += time.perf_counter() - began
    finally:
        engine.dispose()
    check_jobs(ctx, "pending", 2 * ctx.n + 2)
    return {
        "throughput": throughput(ctx.n, elapsed),
        "unit_of_work": throughput(ctx.n, spent[plain]),
        "unit_of_work_job": throughput(ctx.n, spent[with_job]),
        "job_overhead": 100.0 * (spent[with_job] / spent[plain] - 1.0),
    }


def _concurrent_producers(ctx: Context) -> Sample:
    from sa_outbox import JobQueue

    engine = make_engine(ctx, pool_size=PRODUCERS)
    queue = JobQueue(models_for(ctx.schema).job)
    try:
        conns = [engine.connect() for _ in range(PRODUCERS)]
        for conn in conns:
            conn.close()  # PRODUCERS connections now wait in the pool

        def producer(count: int) -> Any:
            def body() -> None:
                for _ in range(count):
                    with engine.begin() as conn:
                        queue.enqueue(conn, "noop", {})

            return body

        started, ended = run_threads([producer(k) for k in split(ctx.n, PRODUCERS)])
    finally:
        engine.dispose()
    check_jobs(ctx, "pending", ctx.n)
    return {"throughput": throughput(ctx.n, ended - started)}


def _bulk(ctx: Context) -> Sample:
    from sqlalchemy import delete

    from sa_outbox import JobQueue, NewJob

    job = models_for(ctx.schema).job
    engine = make_engine(ctx, pool_size=1)
    queue = JobQueue(job)
    sample: Sample = {}
    try:
        with engine.connect():
            pass
        for metric, enqueue in (
            ("throughput", queue.enqueue_copy),
            ("throughput_unnest", queue.enqueue_many),
        ):
            with engine.begin() as conn:
                conn.execute(delete(job))
            started = time.perf_counter()
            for start in range(0, ctx.n, BATCH):
                size = min(BATCH, ctx.n - start)
                with engine.begin() as conn:
                    enqueue(conn, [NewJob("noop", {}) for _ in range(size)])
            sample[metric] = throughput(ctx.n, time.perf_counter() - started)
            check_jobs(ctx, "pending", ctx.n)
    finally:
        engine.dispose()
    return sample


def _process(ctx: Context, concurrency: int, *, rss: bool) -> Sample:
    from sa_outbox import Worker

    pre_enqueue(ctx, ctx.n + ctx.backlog)
    engine = make_engine(ctx, pool_size=4)
    done = Acknowledged(ctx.n)
    worker = Worker(
        _app(ctx),
        engine,
        concurrency=concurrency,
        metrics=done.metrics,
        install_signal_handlers=False,
    )
    done.stop = worker.stop
    watchdog = threading.Timer(ctx.deadline(), lambda: worker.stop(now=True))
    watchdog.daemon = True
    sample: Sample = {}
    try:
        with engine.connect():
            pass
        if rss:
            sample["rss_start"] = rss_mb()
        watchdog.start()
        started = time.perf_counter()
        worker.run()
        if rss:
            sample["rss_end"] = rss_mb()
    finally:
        watchdog.cancel()
        engine.dispose()
    if done.done_at is None:
        raise BenchmarkError(f"sa-sync: {done.acknowledged} of {ctx.n} jobs acknowledged in time")
    check_backlog(ctx)
    sample["throughput"] = throughput(done.done, done.done_at - started)
    return sample


#: W5P: worker processes under one `Supervisor`, and handler threads in each.
PROCESSES = 2
PROCESS_CONCURRENCY = CONCURRENCY // PROCESSES


def _supervised(ctx: Context) -> Sample:
    """W5P: the children start and listen, then ``n`` jobs arrive in one transaction; timed
    from its commit until the database holds ``n`` succeeded jobs (polled every 20 ms)."""
    import os

    from benchmarks.supervised_app import ENV_SCHEMA
    from sa_outbox import JobQueue, NewJob, Supervisor

    os.environ[ENV_SCHEMA] = ctx.schema  # the children's app reads it (spawned: a copy)
    url = ctx.db.sqlalchemy_url().render_as_string(hide_password=False)
    supervisor = Supervisor(
        "benchmarks.supervised_app:app",
        url,
        processes=PROCESSES,
        worker_options={"concurrency": PROCESS_CONCURRENCY},
        install_signal_handlers=False,
        log_level="WARNING",
    )
    runner = threading.Thread(target=supervisor.run, daemon=True)
    listening = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
    )
    engine = make_engine(ctx, pool_size=1)
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while int(ctx.db.scalar(ctx.schema, listening) or 0) < PROCESSES:
            if time.monotonic() > deadline:
                raise BenchmarkError("sa-sync: the supervisor's children did not start listening")
            time.sleep(0.05)
        jobs = [NewJob("noop", {}) for _ in range(ctx.n)]
        with engine.begin() as conn:
            JobQueue(models_for(ctx.schema).job).enqueue_copy(conn, jobs)
        started = time.perf_counter()
        deadline = time.monotonic() + ctx.deadline()
        while count_jobs(ctx, "succeeded") < ctx.n:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"sa-sync: {count_jobs(ctx, 'succeeded')} of {ctx.n} done")
            time.sleep(0.02)
        done_at = time.perf_counter()
    finally:
        supervisor.stop()
        runner.join(60)
        engine.dispose()
    check_jobs(ctx, "succeeded", ctx.n)
    return {"throughput": throughput(ctx.n, done_at - started)}


def _latency(ctx: Context) -> Sample:
    from sa_outbox import JobQueue, Worker

    latencies: list[float] = []
    all_seen = threading.Event()

    def handler(job: Any) -> None:
        latencies.append(time.time() - job.payload["t"])
        if len(latencies) >= ctx.n:
            all_seen.set()

    engine = make_engine(ctx, pool_size=4)
    worker = Worker(_app(ctx, handler), engine, concurrency=1, install_signal_handlers=False)
    queue = JobQueue(models_for(ctx.schema).job)
    # One autocommit INSERT per job, as raw's producer: a transaction around it would add
    # its BEGIN and COMMIT round trips to the latency of the producer, not of the queue.
    producer = engine.execution_options(isolation_level="AUTOCOMMIT")
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        thread.start()
        if not worker.listening.wait(30):
            raise BenchmarkError("sa-sync: the worker did not start listening within 30 s")
        started = time.perf_counter()
        for i in range(ctx.n):
            pace(started, i, RATE)
            with producer.connect() as conn:
                queue.enqueue(conn, "noop", {"t": time.time()})
        all_seen.wait(30)
    finally:
        worker.stop()
        thread.join(30)
        engine.dispose()
    return latency_metrics(latencies, ctx.n)


def write_events(ctx: Context, engine: Any, count: int) -> None:
    """Pre-write ``count`` orders with their OrderPlaced event, `EVENTS_PER_UNIT` per commit."""
    from sqlalchemy.orm import sessionmaker

    import sa_outbox

    m = models_for(ctx.schema)
    session_factory = sessionmaker(engine)
    sa_outbox.install(session_factory)
    for start in range(0, count, EVENTS_PER_UNIT):
        with session_factory() as session, session.begin():
            for _ in range(min(EVENTS_PER_UNIT, count - start)):
                order = m.order(total_cents=1)
                session.add(order)
                session.add(m.order_placed(order=order, total_cents=1))


def check_published(ctx: Context, expected: int) -> None:
    """Raise unless exactly ``expected`` outbox events are marked published."""
    found = int(
        ctx.db.scalar(ctx.schema, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
    )
    if found != expected:
        raise BenchmarkError(f"{ctx.system}: {found} events published, expected {expected}")


def _outbox(ctx: Context) -> Sample:
    """W8: a backlog drained by the relay (events/s), then commit → publish latency."""
    from sqlalchemy.orm import sessionmaker

    import sa_outbox
    from sa_outbox import Relay
    from sa_outbox.publishers.callable import CallablePublisher

    m = models_for(ctx.schema)
    engine = make_engine(ctx, pool_size=4)
    sample: Sample = {}
    try:
        # Throughput: the relay's cycle (claim → publish → mark, one commit) on a backlog.
        write_events(ctx, engine, ctx.n)
        published: list[Any] = []
        relay = Relay(engine, m.outbox, CallablePublisher(published.append), listen=False)
        try:
            started = time.perf_counter()
            total = 0
            while total < ctx.n:
                report = relay.run_once()
                if report.idle:
                    raise BenchmarkError(f"sa-sync relay idle after {total} of {ctx.n} events")
                total += report.published
            sample["throughput"] = throughput(ctx.n, time.perf_counter() - started)
        finally:
            relay.close()
        check_published(ctx, ctx.n)

        # Latency: one order and its event per unit of work at RATE per second, relay running.
        session_factory = sessionmaker(engine)
        sa_outbox.install(session_factory)
        committed: dict[str, float] = {}
        published_at: dict[str, float] = {}
        count = min(ctx.n, 1000 if not ctx.quick else ctx.n)

        def record(event: Any) -> None:
            published_at[event.aggregate_id] = time.time()

        relay = Relay(engine, m.outbox, CallablePublisher(record))
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        try:
            time.sleep(0.5)  # let the relay reach its LISTEN (no correctness depends on it)
            started = time.perf_counter()
            for i in range(count):
                pace(started, i, RATE)
                with session_factory() as session:
                    with session.begin():
                        order = m.order(total_cents=1)
                        session.add(order)
                        session.add(m.order_placed(order=order, total_cents=1))
                        session.flush()
                        key = str(order.id)
                    committed[key] = time.time()
            deadline = time.monotonic() + 30
            while len(published_at) < count and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            relay.stop()
            thread.join(30)
            relay.close()
        if len(published_at) != count:
            raise BenchmarkError(f"sa-sync relay published {len(published_at)} of {count}")
        sample.update(percentiles_ms([published_at[k] - committed[k] for k in committed]))
    finally:
        engine.dispose()
    return sample


def _memory(ctx: Context) -> Sample:
    """MEM: RSS while one worker (concurrency 8) processes ``n`` jobs (1,000,000 by default)."""
    from sa_outbox import Worker

    pre_enqueue(ctx)
    engine = make_engine(ctx, pool_size=4)
    done = Acknowledged(ctx.n)
    worker = Worker(
        _app(ctx),
        engine,
        concurrency=CONCURRENCY,
        metrics=done.metrics,
        install_signal_handlers=False,
    )
    done.stop = worker.stop
    peak = [rss_mb()]
    stop_sampling = threading.Event()

    def sample_rss() -> None:
        while not stop_sampling.wait(1.0):
            peak[0] = max(peak[0], rss_mb())

    sampler = threading.Thread(target=sample_rss, daemon=True)
    try:
        with engine.connect():
            pass
        start_rss = rss_mb()
        sampler.start()
        started = time.perf_counter()
        worker.run()
        end_rss = rss_mb()
    finally:
        stop_sampling.set()
        engine.dispose()
    if done.done_at is None:
        raise BenchmarkError(f"sa-sync: {done.acknowledged} of {ctx.n} jobs acknowledged")
    check_jobs(ctx, "succeeded", ctx.n)
    return {
        "throughput": throughput(ctx.n, done.done_at - started),
        "rss_start": start_rss,
        "rss_end": end_rss,
        "rss_max": max(peak[0], end_rss),
    }


SYSTEM = SystemSpec(
    name="sa-sync",
    install=install_sa_schema,
    versions=versions,
    workloads={
        "W1": WorkloadSpec(
            _enqueue_one_at_a_time,
            "defaults as in the README (create_engine(url), sessionmaker, sa_outbox.install); "
            "throughput: JobQueue.enqueue(engine, …), one autocommit INSERT per job; unit: "
            "one Session transaction adding one Order row; unit_of_work_job: the same plus "
            "sa_outbox.enqueue(session, …); job_overhead: how much longer that one takes (%), "
            f"the two alternated in blocks of {W1_BLOCK} in the same run",
        ),
        "W2": WorkloadSpec(
            _concurrent_producers,
            f"{PRODUCERS} threads sharing one engine (pool {PRODUCERS}), JobQueue.enqueue, "
            "one transaction per job",
        ),
        "W3": WorkloadSpec(
            _bulk,
            f"{BATCH} NewJob per call, one transaction each: JobQueue.enqueue_copy (COPY, "
            "throughput), then JobQueue.enqueue_many (INSERT … SELECT unnest, throughput_unnest)",
        ),
        "W4": WorkloadSpec(
            lambda ctx: _process(ctx, 1, rss=True),
            "Worker(concurrency=1), defaults otherwise (no queue named: the kinds it handles; "
            "batch 50, adaptive prefetch, ack_delay 5 ms, LISTEN on); 1 handler thread; RSS of "
            "the process at start and end",
        ),
        "W5": WorkloadSpec(
            lambda ctx: _process(ctx, CONCURRENCY, rss=False),
            f"one Worker(concurrency={CONCURRENCY}): {CONCURRENCY} handler threads in one "
            "process, one loop thread claiming and acknowledging in batches",
        ),
        "W5P": WorkloadSpec(
            _supervised,
            f"Supervisor(processes={PROCESSES}, worker_options={{'concurrency': "
            f"{PROCESS_CONCURRENCY}}}), defaults otherwise: {PROCESSES} processes x "
            f"{PROCESS_CONCURRENCY} handler threads; n jobs enqueued in one transaction once "
            "both listen, timed from its commit to n succeeded (polled every 20 ms)",
        ),
        "W4B": WorkloadSpec(
            lambda ctx: _process(ctx, 1, rss=False),
            "as W4, behind the backlog (VACUUM ANALYZE after loading it, as autovacuum would)",
        ),
        "W5B": WorkloadSpec(
            lambda ctx: _process(ctx, CONCURRENCY, rss=False),
            "as W5, behind the backlog (VACUUM ANALYZE after loading it, as autovacuum would)",
        ),
        "W6": WorkloadSpec(
            _latency,
            f"Worker(concurrency=1) listening (NOTIFY trigger); 1 producer at {RATE:g} jobs/s, "
            "JobQueue.enqueue on an autocommit connection (one INSERT per job, as raw)",
        ),
        "W8": WorkloadSpec(
            _outbox,
            f"Order + OrderPlaced domain event via sa_outbox.install; throughput: Relay.run_once "
            f"(batch 100, CallablePublisher) on a pre-written backlog ({EVENTS_PER_UNIT} units of "
            f"work per commit); latency: one unit of work per commit at {RATE:g}/s with Relay.run "
            "listening, commit returned → publisher called",
        ),
        "MEM": WorkloadSpec(
            _memory,
            f"one Worker(concurrency={CONCURRENCY}) on n pre-enqueued jobs; RSS at start, end, "
            "and the peak sampled every second",
        ),
    },
)
