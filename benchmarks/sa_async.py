"""``sa-async``: sa-outbox's `AsyncJobQueue`, `AsyncWorker` and `AsyncRelay` (asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
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
    percentiles_ms,
    rss_mb,
    throughput,
)
from benchmarks.raw import split
from benchmarks.sa_models import (
    check_jobs,
    install_sa_schema,
    make_async_engine,
    models_for,
    pre_enqueue,
    versions,
)
from benchmarks.sa_sync import EVENTS_PER_UNIT, Acknowledged, check_published

__all__ = ["SYSTEM"]


def _run(
    body: Callable[[Context], Coroutine[Any, Any, Sample]],
) -> Callable[[Context], Sample]:
    return lambda ctx: asyncio.run(body(ctx))


async def apace(start: float, index: int, rate: float) -> None:
    """Await until job ``index`` is due at ``rate`` per second after ``start``."""
    delay = start + index / rate - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def _warm(engine: Any, connections: int = 1) -> None:
    conns = [await engine.connect() for _ in range(connections)]
    for conn in conns:
        await conn.close()


def _app(ctx: Context, handler: Any = None) -> Any:
    from sa_outbox import JobApp

    async def noop(job: Any) -> None:
        return None

    app = JobApp(models_for(ctx.schema).job)
    app.register("noop", handler if handler is not None else noop)
    return app


async def _enqueue_one_at_a_time(ctx: Context) -> Sample:
    from sqlalchemy.ext.asyncio import create_async_engine

    from sa_outbox import AsyncJobQueue

    engine = create_async_engine(ctx.db.sqlalchemy_url())  # the defaults, as the README's
    queue = AsyncJobQueue(models_for(ctx.schema).job)
    try:
        await _warm(engine)
        started = time.perf_counter()
        for _ in range(ctx.n):
            await queue.enqueue(engine, "noop", {})
        elapsed = time.perf_counter() - started
    finally:
        await engine.dispose()
    check_jobs(ctx, "pending", ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _concurrent_producers(ctx: Context) -> Sample:
    from sa_outbox import AsyncJobQueue

    engine = make_async_engine(ctx, pool_size=PRODUCERS)
    queue = AsyncJobQueue(models_for(ctx.schema).job)

    async def producer(count: int) -> None:
        for _ in range(count):
            async with engine.begin() as conn:
                await queue.enqueue(conn, "noop", {})

    try:
        await _warm(engine, PRODUCERS)
        started = time.perf_counter()
        await asyncio.gather(*(producer(k) for k in split(ctx.n, PRODUCERS)))
        elapsed = time.perf_counter() - started
    finally:
        await engine.dispose()
    check_jobs(ctx, "pending", ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _bulk(ctx: Context) -> Sample:
    from sqlalchemy import delete

    from sa_outbox import AsyncJobQueue, NewJob

    job = models_for(ctx.schema).job
    engine = make_async_engine(ctx, pool_size=1)
    queue = AsyncJobQueue(job)
    sample: Sample = {}
    try:
        await _warm(engine)
        for metric, enqueue in (
            ("throughput", queue.enqueue_copy),
            ("throughput_unnest", queue.enqueue_many),
        ):
            async with engine.begin() as conn:
                await conn.execute(delete(job))
            started = time.perf_counter()
            for start in range(0, ctx.n, BATCH):
                size = min(BATCH, ctx.n - start)
                async with engine.begin() as conn:
                    await enqueue(conn, [NewJob("noop", {}) for _ in range(size)])
            sample[metric] = throughput(ctx.n, time.perf_counter() - started)
            check_jobs(ctx, "pending", ctx.n)
    finally:
        await engine.dispose()
    return sample


async def _process(ctx: Context, concurrency: int, *, rss: bool) -> Sample:
    from sa_outbox import AsyncWorker

    pre_enqueue(ctx)
    engine = make_async_engine(ctx, pool_size=4)
    done = Acknowledged(ctx.n)
    worker = AsyncWorker(
        _app(ctx),
        engine,
        concurrency=concurrency,
        metrics=done.metrics,
        install_signal_handlers=False,
    )
    done.stop = worker.stop
    sample: Sample = {}
    watchdog = asyncio.get_running_loop().call_later(ctx.deadline(), lambda: worker.stop(now=True))
    try:
        await _warm(engine)
        if rss:
            sample["rss_start"] = rss_mb()
        started = time.perf_counter()
        await worker.run()
        if rss:
            sample["rss_end"] = rss_mb()
    finally:
        watchdog.cancel()
        await engine.dispose()
    if done.done_at is None:
        raise BenchmarkError(f"sa-async: {done.acknowledged} of {ctx.n} jobs acknowledged in time")
    check_jobs(ctx, "succeeded", ctx.n)
    sample["throughput"] = throughput(ctx.n, done.done_at - started)
    return sample


async def _latency(ctx: Context) -> Sample:
    from sa_outbox import AsyncJobQueue, AsyncWorker

    latencies: list[float] = []
    all_seen = asyncio.Event()

    async def handler(job: Any) -> None:
        latencies.append(time.time() - job.payload["t"])
        if len(latencies) >= ctx.n:
            all_seen.set()

    engine = make_async_engine(ctx, pool_size=4)
    worker = AsyncWorker(_app(ctx, handler), engine, concurrency=1, install_signal_handlers=False)
    queue = AsyncJobQueue(models_for(ctx.schema).job)
    producer = engine.execution_options(isolation_level="AUTOCOMMIT")  # as sa_sync's W6
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.listening.wait(), 30)
        started = time.perf_counter()
        for i in range(ctx.n):
            await apace(started, i, RATE)
            async with producer.connect() as conn:
                await queue.enqueue(conn, "noop", {"t": time.time()})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_seen.wait(), 30)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await engine.dispose()
    return latency_metrics(latencies, ctx.n)


async def _outbox(ctx: Context) -> Sample:
    """W8 with `AsyncRelay` and an `async_sessionmaker` (see sa_sync's W8)."""
    from sqlalchemy.ext.asyncio import async_sessionmaker

    import sa_outbox
    from sa_outbox import AsyncRelay
    from sa_outbox.publishers.callable import CallablePublisher

    m = models_for(ctx.schema)
    engine = make_async_engine(ctx, pool_size=4)
    session_factory = async_sessionmaker(engine)
    sa_outbox.install(session_factory)
    sample: Sample = {}
    try:
        for start in range(0, ctx.n, EVENTS_PER_UNIT):
            async with session_factory() as session, session.begin():
                for _ in range(min(EVENTS_PER_UNIT, ctx.n - start)):
                    order = m.order(total_cents=1)
                    session.add(order)
                    session.add(m.order_placed(order=order, total_cents=1))
        published: list[str] = []

        async def collect(event: Any) -> None:
            published.append(event.message_id)

        async with AsyncRelay(engine, m.outbox, CallablePublisher(collect), listen=False) as relay:
            started = time.perf_counter()
            total = 0
            while total < ctx.n:
                report = await relay.run_once()
                if report.idle:
                    raise BenchmarkError(f"sa-async relay idle after {total} of {ctx.n} events")
                total += report.published
            sample["throughput"] = throughput(ctx.n, time.perf_counter() - started)
        check_published(ctx, ctx.n)

        committed: dict[str, float] = {}
        published_at: dict[str, float] = {}
        count = min(ctx.n, 1000 if not ctx.quick else ctx.n)

        async def record(event: Any) -> None:
            published_at[event.aggregate_id] = time.time()

        async with AsyncRelay(engine, m.outbox, CallablePublisher(record)) as relay:
            task = asyncio.create_task(relay.run())
            try:
                await asyncio.sleep(0.5)  # let the relay reach its LISTEN
                started = time.perf_counter()
                for i in range(count):
                    await apace(started, i, RATE)
                    async with session_factory() as session:
                        async with session.begin():
                            order = m.order(total_cents=1)
                            session.add(order)
                            session.add(m.order_placed(order=order, total_cents=1))
                            await session.flush()
                            key = str(order.id)
                        committed[key] = time.time()
                deadline = time.monotonic() + 30
                while len(published_at) < count and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                relay.stop()
                await asyncio.wait_for(task, 30)
        if len(published_at) != count:
            raise BenchmarkError(f"sa-async relay published {len(published_at)} of {count}")
        sample.update(percentiles_ms([published_at[k] - committed[k] for k in committed]))
    finally:
        await engine.dispose()
    return sample


async def _memory(ctx: Context) -> Sample:
    """MEM on `AsyncWorker` (concurrency 8): RSS at start, end and the sampled peak."""
    from sa_outbox import AsyncWorker

    pre_enqueue(ctx)
    engine = make_async_engine(ctx, pool_size=4)
    done = Acknowledged(ctx.n)
    worker = AsyncWorker(
        _app(ctx),
        engine,
        concurrency=CONCURRENCY,
        metrics=done.metrics,
        install_signal_handlers=False,
    )
    done.stop = worker.stop
    peak = [rss_mb()]

    async def sample_rss() -> None:
        while True:
            await asyncio.sleep(1.0)
            peak[0] = max(peak[0], rss_mb())

    try:
        await _warm(engine)
        start_rss = rss_mb()
        sampler = asyncio.create_task(sample_rss())
        started = time.perf_counter()
        await worker.run()
        end_rss = rss_mb()
        sampler.cancel()
    finally:
        await engine.dispose()
    if done.done_at is None:
        raise BenchmarkError(f"sa-async: {done.acknowledged} of {ctx.n} jobs acknowledged")
    check_jobs(ctx, "succeeded", ctx.n)
    return {
        "throughput": throughput(ctx.n, done.done_at - started),
        "rss_start": start_rss,
        "rss_end": end_rss,
        "rss_max": max(peak[0], end_rss),
    }


SYSTEM = SystemSpec(
    name="sa-async",
    install=install_sa_schema,
    versions=versions,
    workloads={
        "W1": WorkloadSpec(
            _run(_enqueue_one_at_a_time),
            "AsyncJobQueue.enqueue(engine, …) on create_async_engine(url), one autocommit "
            "INSERT per job",
        ),
        "W2": WorkloadSpec(
            _run(_concurrent_producers),
            f"{PRODUCERS} asyncio tasks sharing one AsyncEngine (pool {PRODUCERS}), "
            "AsyncJobQueue.enqueue, one transaction per job",
        ),
        "W3": WorkloadSpec(
            _run(_bulk),
            f"{BATCH} NewJob per call, one transaction each: AsyncJobQueue.enqueue_copy (COPY, "
            "throughput), then AsyncJobQueue.enqueue_many (INSERT … SELECT unnest, "
            "throughput_unnest)",
        ),
        "W4": WorkloadSpec(
            _run(lambda ctx: _process(ctx, 1, rss=True)),
            "AsyncWorker(concurrency=1), defaults otherwise (no queue named: the kinds it "
            "handles), an async no-op handler; RSS of the process at start and end",
        ),
        "W5": WorkloadSpec(
            _run(lambda ctx: _process(ctx, CONCURRENCY, rss=False)),
            f"one AsyncWorker(concurrency={CONCURRENCY}): up to {CONCURRENCY} handler tasks on "
            "one event loop, in one process",
        ),
        "W6": WorkloadSpec(
            _run(_latency),
            f"AsyncWorker(concurrency=1) listening (NOTIFY trigger); 1 producer task at {RATE:g} "
            "jobs/s, AsyncJobQueue.enqueue on an autocommit connection (one INSERT per job, as "
            "raw), same event loop",
        ),
        "W8": WorkloadSpec(
            _run(_outbox),
            "as sa-sync's W8 with async_sessionmaker + sa_outbox.install and AsyncRelay "
            "(batch 100, CallablePublisher with an async target)",
        ),
        "MEM": WorkloadSpec(
            _run(_memory),
            f"one AsyncWorker(concurrency={CONCURRENCY}) on n pre-enqueued jobs; RSS at start, "
            "end, and the peak sampled every second",
        ),
    },
)
