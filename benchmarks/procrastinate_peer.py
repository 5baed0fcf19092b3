"""``procrastinate``: Procrastinate through its public API (`App`, tasks, `run_worker_async`).

Its schema is applied with ``app.schema_manager.apply_schema_async()`` (what
``procrastinate schema --apply`` runs) in the system's schema, through the connection's
``search_path``. Recommended settings: `PsycopgConnector` (a psycopg pool), async tasks,
worker defaults (LISTEN/NOTIFY on) except ``concurrency``.
"""

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
    throughput,
)
from benchmarks.database import Database
from benchmarks.raw import split
from benchmarks.sa_async import apace

__all__ = ["SYSTEM"]


def _make_app(conninfo: str, max_size: int = 10) -> Any:
    import procrastinate

    return procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=conninfo, min_size=1, max_size=max(max_size, 2)
        )
    )


def _install(db: Database, schema: str) -> None:
    async def install() -> None:
        app = _make_app(db.conninfo(schema))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())


def _run(
    body: Callable[[Context], Coroutine[Any, Any, Sample]],
) -> Callable[[Context], Sample]:
    return lambda ctx: asyncio.run(body(ctx))


def _count(ctx: Context, status: str) -> int:
    return int(
        ctx.db.scalar(
            ctx.schema, f"SELECT count(*) FROM procrastinate_jobs WHERE status = '{status}'"
        )
    )


def _check(ctx: Context, status: str, expected: int) -> None:
    found = _count(ctx, status)
    if found != expected:
        raise BenchmarkError(f"procrastinate: {found} {status} jobs, expected {expected}")


def _noop_app(ctx: Context, max_size: int = 10) -> tuple[Any, Any]:
    app = _make_app(ctx.conninfo, max_size)

    async def noop() -> None:
        return None

    return app, app.task(name="noop")(noop)


async def _enqueue_one_at_a_time(ctx: Context) -> Sample:
    app, noop = _noop_app(ctx)
    async with app.open_async():
        started = time.perf_counter()
        for _ in range(ctx.n):
            await noop.defer_async()
        elapsed = time.perf_counter() - started
    _check(ctx, "todo", ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _concurrent_producers(ctx: Context) -> Sample:
    app, noop = _noop_app(ctx, PRODUCERS)

    async def producer(count: int) -> None:
        for _ in range(count):
            await noop.defer_async()

    async with app.open_async():
        started = time.perf_counter()
        await asyncio.gather(*(producer(k) for k in split(ctx.n, PRODUCERS)))
        elapsed = time.perf_counter() - started
    _check(ctx, "todo", ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _defer_batches(ctx: Context, noop: Any) -> float:
    started = time.perf_counter()
    for start in range(0, ctx.n, BATCH):
        await noop.batch_defer_async(*({} for _ in range(min(BATCH, ctx.n - start))))
    return time.perf_counter() - started


async def _bulk(ctx: Context) -> Sample:
    app, noop = _noop_app(ctx)
    async with app.open_async():
        elapsed = await _defer_batches(ctx, noop)
    _check(ctx, "todo", ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _process(ctx: Context, concurrency: int) -> Sample:
    app, noop = _noop_app(ctx, concurrency + 2)
    async with app.open_async():
        await _defer_batches(ctx, noop)
        started = time.perf_counter()
        # wait=False: the worker returns once it has caught up with the queue; every job's
        # status was written (one transaction per job) before it returns.
        await asyncio.wait_for(
            app.run_worker_async(
                concurrency=concurrency, wait=False, install_signal_handlers=False
            ),
            ctx.deadline(5.0),
        )
        elapsed = time.perf_counter() - started
    _check(ctx, "succeeded", ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _latency(ctx: Context) -> Sample:
    app = _make_app(ctx.conninfo)
    latencies: list[float] = []
    all_seen = asyncio.Event()

    async def on_stamp(t: float) -> None:
        latencies.append(time.time() - t)
        if len(latencies) >= ctx.n:
            all_seen.set()

    stamp = app.task(name="stamp")(on_stamp)

    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=1, install_signal_handlers=False)
        )
        try:
            await asyncio.sleep(0.5)  # let the worker reach its LISTEN
            if worker.done():
                await worker
            started = time.perf_counter()
            for i in range(ctx.n):
                await apace(started, i, RATE)
                await stamp.defer_async(t=time.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_seen.wait(), 30)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(worker, 30)
    return latency_metrics(latencies, ctx.n)


def _versions() -> dict[str, str]:
    import importlib.metadata

    return {"procrastinate": importlib.metadata.version("procrastinate")}


SYSTEM = SystemSpec(
    name="procrastinate",
    install=_install,
    versions=_versions,
    workloads={
        "W1": WorkloadSpec(
            _run(_enqueue_one_at_a_time), "task.defer_async(), one job per call (PsycopgConnector)"
        ),
        "W2": WorkloadSpec(
            _run(_concurrent_producers),
            f"{PRODUCERS} asyncio tasks, task.defer_async() (pool of {PRODUCERS} connections)",
        ),
        "W3": WorkloadSpec(_run(_bulk), f"task.batch_defer_async() with {BATCH} jobs per call"),
        "W4": WorkloadSpec(
            _run(lambda ctx: _process(ctx, 1)),
            "app.run_worker_async(concurrency=1, wait=False), async no-op task; returns once "
            "the queue is empty",
        ),
        "W5": WorkloadSpec(
            _run(lambda ctx: _process(ctx, CONCURRENCY)),
            f"one worker, run_worker_async(concurrency={CONCURRENCY}, wait=False): "
            f"{CONCURRENCY} asyncio job slots in one process",
        ),
        "W6": WorkloadSpec(
            _run(_latency),
            f"run_worker_async(concurrency=1) with LISTEN/NOTIFY (default); 1 producer at "
            f"{RATE:g} jobs/s (defer_async), same event loop",
        ),
    },
)
