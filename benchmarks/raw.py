"""``raw``: psycopg 3 running the article's SQL directly, the ceiling for a Python client.

The schema is the article's (section 4) plus a statement-level NOTIFY trigger for W6. A worker
claims 20 jobs with ``FOR UPDATE SKIP LOCKED`` (one statement, its own commit), runs them,
and completes the batch with one ``UPDATE … FROM unnest(ids, tokens)`` (its own commit).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
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
    throughput,
)
from benchmarks.database import Database

__all__ = ["CLAIM_SQL", "COMPLETE_SQL", "DDL", "SYSTEM", "install_raw_schema"]

DDL = """
CREATE TYPE job_status AS ENUM ('pending', 'running', 'succeeded', 'failed');
CREATE TABLE jobs (
  id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  kind              text NOT NULL,
  payload           jsonb NOT NULL,
  status            job_status NOT NULL DEFAULT 'pending',
  priority          integer NOT NULL DEFAULT 0,
  run_at            timestamptz NOT NULL DEFAULT now(),
  attempts          integer NOT NULL DEFAULT 0,
  max_attempts      integer NOT NULL DEFAULT 8,
  lease_until       timestamptz,
  lease_token       uuid,
  worker_id         text,
  deduplication_key text,
  last_error        text,
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX jobs_dedup_idx ON jobs (kind, deduplication_key)
  WHERE deduplication_key IS NOT NULL;
CREATE INDEX jobs_ready_idx ON jobs (priority DESC, run_at, id) WHERE status = 'pending';
CREATE INDEX jobs_expired_lease_idx ON jobs (lease_until) WHERE status = 'running';
CREATE INDEX jobs_retention_idx ON jobs (status, updated_at);
CREATE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(current_schema() || '_jobs', '');
  RETURN NULL;
END $$;
CREATE TRIGGER jobs_notify AFTER INSERT ON jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify();
"""

CLAIM_SQL = """
WITH claimed AS (
  SELECT id FROM jobs
  WHERE status = 'pending' AND run_at <= now()
  ORDER BY priority DESC, run_at, id
  LIMIT %s
  FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'running', attempts = j.attempts + 1,
    lease_until = now() + interval '30 seconds',
    lease_token = gen_random_uuid(), worker_id = %s, updated_at = now()
FROM claimed
WHERE j.id = claimed.id
RETURNING j.id, j.kind, j.payload, j.attempts, j.lease_token
"""

COMPLETE_SQL = """
UPDATE jobs AS j
SET status = 'succeeded', lease_until = NULL, lease_token = NULL, worker_id = NULL,
    updated_at = now()
FROM unnest(%s::uuid[], %s::uuid[]) AS done(id, token)
WHERE j.id = done.id AND j.status = 'running' AND j.lease_token = done.token
"""

INSERT_SQL = "INSERT INTO jobs (kind, payload) VALUES (%s, %s)"
UNNEST_SQL = "INSERT INTO jobs (kind, payload) SELECT * FROM unnest(%s::text[], %s::jsonb[])"
CLAIM_BATCH = 20


def _connect(ctx: Context, *, autocommit: bool = True) -> Any:
    import psycopg

    return psycopg.connect(ctx.conninfo, autocommit=autocommit)


def install_raw_schema(db: Database, schema: str) -> None:
    """The article's job table in ``schema`` (also used by the pgbench system)."""
    import psycopg

    with psycopg.connect(db.conninfo(schema), autocommit=True) as conn:
        conn.execute(DDL)


def copy_jobs(conn: Any, count: int, payload: str = "{}") -> None:
    """Insert ``count`` no-op jobs with COPY, in batches of `BATCH`, one transaction each."""
    for start in range(0, count, BATCH):
        size = min(BATCH, count - start)
        with (
            conn.transaction(),
            conn.cursor() as cur,
            cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy,
        ):
            for _ in range(size):
                copy.write_row(("noop", payload))


def count_status(ctx: Context, status: str) -> int:
    """How many jobs of this system's table are in ``status``."""
    return int(ctx.db.scalar(ctx.schema, f"SELECT count(*) FROM jobs WHERE status = '{status}'"))


#: W1's small row of the application's own, for its units of work.
ORDERS_DDL = "CREATE TABLE orders (id bigserial PRIMARY KEY, total_cents integer NOT NULL)"
ORDER_SQL = "INSERT INTO orders (total_cents) VALUES (%s) RETURNING id"
#: W1 alternates its two kinds of unit of work in blocks of this many.
W1_BLOCK = 250


def _enqueue_one_at_a_time(ctx: Context) -> Sample:
    """W1: ``throughput``, one autocommit INSERT per job; then, as sa-sync measures its
    Session, transactions inserting one order (``unit_of_work``) and one order and one job
    (``unit_of_work_job``), alternated in blocks: the floor of what a job adds
    (``job_overhead``)."""
    with _connect(ctx) as conn:
        conn.execute(ORDERS_DDL)
        started = time.perf_counter()
        for _ in range(ctx.n):
            conn.execute(INSERT_SQL, ("noop", "{}"))
        elapsed = time.perf_counter() - started

        def plain() -> None:
            with conn.transaction():
                conn.execute(ORDER_SQL, (1200,)).fetchone()

        def with_job() -> None:
            with conn.transaction():
                conn.execute(ORDER_SQL, (1200,)).fetchone()
                conn.execute(INSERT_SQL, ("noop", "{}"))

        spent = {plain: 0.0, with_job: 0.0}
        for start in range(0, ctx.n, W1_BLOCK):
            for unit in (plain, with_job) if start % (2 * W1_BLOCK) == 0 else (with_job, plain):
                began = time.perf_counter()
                for _ in range(min(W1_BLOCK, ctx.n - start)):
                    unit()
                spent[unit] += time.perf_counter() - began
    found = count_status(ctx, "pending")
    if found != 2 * ctx.n:
        raise BenchmarkError(f"raw: {found} pending jobs, expected {2 * ctx.n}")
    return {
        "throughput": throughput(ctx.n, elapsed),
        "unit_of_work": throughput(ctx.n, spent[plain]),
        "unit_of_work_job": throughput(ctx.n, spent[with_job]),
        "job_overhead": 100.0 * (spent[with_job] / spent[plain] - 1.0),
    }


def split(total: int, parts: int) -> list[int]:
    """``total`` jobs shared as evenly as possible between ``parts`` producers."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_threads(targets: list[Callable[[], None]]) -> tuple[float, float]:
    """Start ``targets`` together (a barrier), wait for all; (release, end) perf_counter times.

    An exception in any thread is re-raised here.
    """
    barrier = threading.Barrier(len(targets) + 1)
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                barrier.wait()
                target()
            except BaseException as exc:
                errors.append(exc)

        return body

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    ended = time.perf_counter()
    if errors:
        raise errors[0]
    return started, ended


def _concurrent_producers(ctx: Context) -> Sample:
    conns = [_connect(ctx) for _ in range(PRODUCERS)]
    try:

        def producer(conn: Any, count: int) -> Callable[[], None]:
            def body() -> None:
                for _ in range(count):
                    conn.execute(INSERT_SQL, ("noop", "{}"))

            return body

        started, ended = run_threads(
            [producer(c, k) for c, k in zip(conns, split(ctx.n, PRODUCERS), strict=True)]
        )
    finally:
        for conn in conns:
            conn.close()
    _check_pending(ctx)
    return {"throughput": throughput(ctx.n, ended - started)}


def _bulk(ctx: Context) -> Sample:
    sample: Sample = {}
    with _connect(ctx) as conn:
        started = time.perf_counter()
        copy_jobs(conn, ctx.n)
        sample["throughput"] = throughput(ctx.n, time.perf_counter() - started)
        _check_pending(ctx)
        conn.execute("TRUNCATE jobs")

        started = time.perf_counter()
        for start in range(0, ctx.n, BATCH):
            size = min(BATCH, ctx.n - start)
            with conn.transaction():
                conn.execute(UNNEST_SQL, (["noop"] * size, ["{}"] * size))
        sample["throughput_unnest"] = throughput(ctx.n, time.perf_counter() - started)
        _check_pending(ctx)
        conn.execute("TRUNCATE jobs")

        started = time.perf_counter()
        for start in range(0, ctx.n, BATCH):
            size = min(BATCH, ctx.n - start)
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(INSERT_SQL, [("noop", "{}")] * size)
        sample["throughput_executemany"] = throughput(ctx.n, time.perf_counter() - started)
        _check_pending(ctx)
    return sample


def _check_pending(ctx: Context) -> None:
    pending = count_status(ctx, "pending")
    if pending != ctx.n:
        raise BenchmarkError(f"raw: {pending} pending jobs, expected {ctx.n}")


class Quota:
    """How many jobs the claimers of one run still have to complete (shared by threads)."""

    def __init__(self, jobs: int) -> None:
        self._left = jobs
        self._lock = threading.Lock()

    def take(self, done: int) -> bool:
        """Count ``done`` more completions; true once the quota is used up."""
        with self._lock:
            self._left -= done
            return self._left <= 0


def work(
    conn: Any,
    worker_id: str,
    on_job: Callable[[Any], None] | None = None,
    quota: Quota | None = None,
) -> float:
    """Claim and complete until a claim finds nothing (or ``quota`` is used up); returns
    when the last completion committed."""
    last = time.perf_counter()
    while True:
        rows = conn.execute(CLAIM_SQL, (CLAIM_BATCH, worker_id)).fetchall()
        if not rows:
            return last
        ids: list[uuid.UUID] = []
        tokens: list[uuid.UUID] = []
        for row in rows:
            if on_job is not None:
                on_job(row)
            ids.append(row[0])
            tokens.append(row[4])
        done = conn.execute(COMPLETE_SQL, (ids, tokens)).rowcount
        if done != len(rows):
            raise BenchmarkError(f"raw: completed {done} of {len(rows)} claimed jobs")
        last = time.perf_counter()
        if quota is not None and quota.take(done):
            return last


def _process(ctx: Context, workers: int) -> Sample:
    with _connect(ctx) as conn:
        copy_jobs(conn, ctx.n + ctx.backlog)
        if ctx.backlog:
            conn.execute("VACUUM ANALYZE jobs")  # as autovacuum would after a bulk load
    conns = [_connect(ctx) for _ in range(workers)]
    finished: list[float] = []
    quota = Quota(ctx.n) if ctx.backlog else None
    try:

        def worker(conn: Any, index: int) -> Callable[[], None]:
            return lambda: finished.append(work(conn, f"raw-{index}", quota=quota))

        started, _ = run_threads([worker(c, i) for i, c in enumerate(conns)])
    finally:
        for conn in conns:
            conn.close()
    succeeded = count_status(ctx, "succeeded")
    pending = count_status(ctx, "pending")
    if succeeded < ctx.n or succeeded + pending != ctx.n + ctx.backlog:
        raise BenchmarkError(
            f"raw: {succeeded} jobs succeeded and {pending} pending, expected {ctx.n} and "
            f"{ctx.backlog} of {ctx.n + ctx.backlog}"
        )
    # Past the quota, the claimers finish the batches they hold: count every job done.
    return {"throughput": throughput(succeeded, max(finished) - started)}


def _latency(ctx: Context) -> Sample:
    import psycopg

    latencies: list[float] = []
    stop = threading.Event()
    ready = threading.Event()
    errors: list[BaseException] = []

    def on_job(row: Any) -> None:
        latencies.append(time.time() - row[2]["t"])

    def worker() -> None:
        try:
            with psycopg.connect(ctx.conninfo, autocommit=True) as conn:
                conn.execute(f'LISTEN "{ctx.schema}_jobs"')
                ready.set()
                while not stop.is_set():
                    work(conn, "raw-latency", on_job)
                    for _ in conn.notifies(timeout=0.1, stop_after=1):
                        pass
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    ready.wait(30)
    with _connect(ctx) as conn:
        started = time.perf_counter()
        for i in range(ctx.n):
            pace(started, i, RATE)
            conn.execute(INSERT_SQL, ("noop", json.dumps({"t": time.time()})))
    deadline = time.monotonic() + 30
    while len(latencies) < ctx.n and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    stop.set()
    thread.join(10)
    if errors:
        raise errors[0]
    return latency_metrics(latencies, ctx.n)


def _versions() -> dict[str, str]:
    import psycopg

    return {"psycopg": psycopg.__version__}


SYSTEM = SystemSpec(
    name="raw",
    install=install_raw_schema,
    versions=_versions,
    workloads={
        "W1": WorkloadSpec(
            _enqueue_one_at_a_time,
            "one autocommit connection, one INSERT per job (psycopg 3); unit_of_work: one "
            "transaction inserting one order row; unit_of_work_job: the same plus the job's "
            "INSERT; job_overhead: how much longer that one takes (%), the two alternated in "
            f"blocks of {W1_BLOCK}",
        ),
        "W2": WorkloadSpec(
            _concurrent_producers,
            f"{PRODUCERS} threads, one autocommit connection each, one INSERT per job",
        ),
        "W3": WorkloadSpec(
            _bulk,
            f"batches of {BATCH}, one transaction each: COPY (throughput), "
            "INSERT … SELECT unnest(…) (throughput_unnest), executemany (throughput_executemany)",
        ),
        "W4": WorkloadSpec(
            lambda ctx: _process(ctx, 1),
            f"1 thread, 1 connection: claim {CLAIM_BATCH} (SKIP LOCKED) + 1 batched completion "
            "(UPDATE … FROM unnest), one commit each",
        ),
        "W5": WorkloadSpec(
            lambda ctx: _process(ctx, CONCURRENCY),
            f"{CONCURRENCY} threads in one process, one connection each, each claiming "
            f"{CLAIM_BATCH} + 1 batched completion",
        ),
        "W4B": WorkloadSpec(
            lambda ctx: _process(ctx, 1),
            "as W4, behind the backlog (VACUUM ANALYZE after loading it, as autovacuum would)",
        ),
        "W5B": WorkloadSpec(
            lambda ctx: _process(ctx, CONCURRENCY),
            "as W5, behind the backlog (VACUUM ANALYZE after loading it, as autovacuum would)",
        ),
        "W6": WorkloadSpec(
            _latency,
            f"1 producer at {RATE:g} jobs/s (INSERT, autocommit); 1 worker thread: LISTEN on a "
            "statement-level NOTIFY trigger, claim 20, complete; when a claim finds nothing, waits "
            "for a NOTIFY (100 ms at most)",
        ),
    },
)
