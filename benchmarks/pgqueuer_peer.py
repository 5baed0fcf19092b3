"""``pgqueuer``: PGQueuer through its public API (`Queries`, `QueueManager`) on psycopg 3.

Its schema is installed with ``Queries.install()`` (what ``pgq install`` runs) in the
system's schema, reached through the connection's ``search_path``. Recommended settings:
``QueueManager.run`` defaults (batch_size 10), one psycopg ``AsyncConnection`` (autocommit)
per queue manager, as its docs show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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

ENTRYPOINT = "noop"
BATCH_SIZE = 10  # QueueManager.run's default


async def _connect(conninfo: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)


def _install(db: Database, schema: str) -> None:
    async def install() -> None:
        from pgqueuer import Queries

        conn = await _connect(db.conninfo(schema))
        try:
            await Queries.from_psycopg_connection(conn).install()
        finally:
            await conn.close()

    asyncio.run(install())


def _run(
    body: Callable[[Context], Coroutine[Any, Any, Sample]],
) -> Callable[[Context], Sample]:
    return lambda ctx: asyncio.run(body(ctx))


def _queued(ctx: Context) -> int:
    return int(ctx.db.scalar(ctx.schema, "SELECT count(*) FROM pgqueuer"))


def _check_queued(ctx: Context, expected: int) -> None:
    found = _queued(ctx)
    if found != expected:
        raise BenchmarkError(f"pgqueuer: {found} jobs in its queue table, expected {expected}")


def _check_at_least_queued(ctx: Context, expected: int) -> None:
    found = _queued(ctx)
    if found < expected:
        raise BenchmarkError(f"pgqueuer: {found} jobs in its queue table, expected {expected}")


async def _enqueue_one_at_a_time(ctx: Context) -> Sample:
    from pgqueuer import Queries

    conn = await _connect(ctx.conninfo)
    try:
        queries = Queries.from_psycopg_connection(conn)
        started = time.perf_counter()
        for _ in range(ctx.n):
            await queries.enqueue(ENTRYPOINT, None)
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
    _check_queued(ctx, ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _concurrent_producers(ctx: Context) -> Sample:
    from pgqueuer import Queries

    conns = [await _connect(ctx.conninfo) for _ in range(PRODUCERS)]

    async def producer(conn: Any, count: int) -> None:
        queries = Queries.from_psycopg_connection(conn)
        for _ in range(count):
            await queries.enqueue(ENTRYPOINT, None)

    try:
        started = time.perf_counter()
        await asyncio.gather(
            *(producer(c, k) for c, k in zip(conns, split(ctx.n, PRODUCERS), strict=True))
        )
        elapsed = time.perf_counter() - started
    finally:
        for conn in conns:
            await conn.close()
    _check_queued(ctx, ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _enqueue_batches(ctx: Context, count: int | None = None) -> float:
    from pgqueuer import Queries

    total = ctx.n if count is None else count
    conn = await _connect(ctx.conninfo)
    try:
        queries = Queries.from_psycopg_connection(conn)
        started = time.perf_counter()
        for start in range(0, total, BATCH):
            size = min(BATCH, total - start)
            await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def _bulk(ctx: Context) -> Sample:
    elapsed = await _enqueue_batches(ctx)
    _check_queued(ctx, ctx.n)
    return {"throughput": throughput(ctx.n, elapsed)}


async def _process(ctx: Context, managers: int) -> Sample:
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.models import Job

    await _enqueue_batches(ctx, ctx.n + ctx.backlog)
    if ctx.backlog:  # as autovacuum would after a bulk load (this CI server has it off)
        ctx.db.execute(ctx.schema, "VACUUM ANALYZE pgqueuer")
    handled = 0
    all_handled = asyncio.Event()
    done_at = 0.0

    async def noop(job: Job) -> None:
        nonlocal handled, done_at
        handled += 1
        if handled == ctx.n:
            done_at = time.perf_counter()
            all_handled.set()

    conns = [await _connect(ctx.conninfo) for _ in range(managers)]
    qms = []
    for conn in conns:
        qm = QueueManager(Queries(PsycopgDriver(conn)))
        qm.entrypoint(ENTRYPOINT)(noop)
        qms.append(qm)
    try:
        started = time.perf_counter()
        tasks = [asyncio.create_task(qm.run(batch_size=BATCH_SIZE)) for qm in qms]
        try:
            await asyncio.wait_for(all_handled.wait(), ctx.deadline())
        finally:
            for qm in qms:
                qm.shutdown.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        for conn in conns:
            await conn.close()
    if handled < ctx.n or (not ctx.backlog and handled != ctx.n):
        raise BenchmarkError(f"pgqueuer: handled {handled} jobs, expected {ctx.n}")
    if ctx.backlog:  # those picked but not run at shutdown go back to the queue
        _check_at_least_queued(ctx, ctx.n + ctx.backlog - handled)
    else:
        _check_queued(ctx, 0)  # PGQueuer deletes a finished job from its queue table
    return {"throughput": throughput(ctx.n, done_at - started)}


async def _latency(ctx: Context) -> Sample:
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.models import Job

    latencies: list[float] = []
    all_seen = asyncio.Event()

    async def stamp(job: Job) -> None:
        assert job.payload is not None
        latencies.append(time.time() - json.loads(job.payload)["t"])
        if len(latencies) >= ctx.n:
            all_seen.set()

    worker_conn = await _connect(ctx.conninfo)
    producer_conn = await _connect(ctx.conninfo)
    qm = QueueManager(Queries(PsycopgDriver(worker_conn)))
    qm.entrypoint(ENTRYPOINT)(stamp)
    task = asyncio.create_task(qm.run(batch_size=BATCH_SIZE))
    try:
        await asyncio.sleep(0.5)  # let the queue manager reach its LISTEN
        if task.done():
            await task
        queries = Queries.from_psycopg_connection(producer_conn)
        started = time.perf_counter()
        for i in range(ctx.n):
            await apace(started, i, RATE)
            await queries.enqueue(ENTRYPOINT, json.dumps({"t": time.time()}).encode())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_seen.wait(), 30)
    finally:
        qm.shutdown.set()
        await asyncio.wait_for(task, 30)
        await worker_conn.close()
        await producer_conn.close()
    return latency_metrics(latencies, ctx.n)


def _versions() -> dict[str, str]:
    import importlib.metadata

    return {"pgqueuer": importlib.metadata.version("pgqueuer")}


SYSTEM = SystemSpec(
    name="pgqueuer",
    install=_install,
    versions=_versions,
    workloads={
        "W1": WorkloadSpec(
            _run(_enqueue_one_at_a_time),
            "Queries.enqueue(entrypoint, None), one autocommit psycopg AsyncConnection",
        ),
        "W2": WorkloadSpec(
            _run(_concurrent_producers),
            f"{PRODUCERS} asyncio tasks, one connection each, Queries.enqueue one job per call",
        ),
        "W3": WorkloadSpec(
            _run(_bulk), f"Queries.enqueue with lists of {BATCH} (one statement per batch)"
        ),
        "W4": WorkloadSpec(
            _run(lambda ctx: _process(ctx, 1)),
            f"one QueueManager, run(batch_size={BATCH_SIZE}) (continuous mode, LISTEN), async "
            "no-op entrypoint (a batch's jobs run as tasks; no per-entrypoint limit); timed to "
            "the N-th handler call (PGQueuer logs completions through a buffer, flushed at "
            "shutdown; the queue table is checked empty after)",
        ),
        "W5": WorkloadSpec(
            _run(lambda ctx: _process(ctx, CONCURRENCY)),
            f"{CONCURRENCY} QueueManagers (one connection each) as asyncio tasks in one "
            f"process, run(batch_size={BATCH_SIZE}); timed as W4",
        ),
        "W4B": WorkloadSpec(
            _run(lambda ctx: _process(ctx, 1)),
            "as W4, behind the backlog (VACUUM ANALYZE after loading it, as autovacuum would)",
        ),
        "W5B": WorkloadSpec(
            _run(lambda ctx: _process(ctx, CONCURRENCY)),
            "as W5, behind the backlog (VACUUM ANALYZE after loading it, as autovacuum would)",
        ),
        "W6": WorkloadSpec(
            _run(_latency),
            f"one QueueManager (LISTEN/NOTIFY built in), batch_size={BATCH_SIZE}; 1 producer "
            f"at {RATE:g} jobs/s on its own connection, same event loop",
        ),
    },
)
