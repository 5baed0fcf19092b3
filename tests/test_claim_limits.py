"""Concurrency and rate limits in the claim itself (issue 13).

Real PostgreSQL. The claim statement counts the running jobs (per payload key, per queue)
and the rate log, and takes no more than the limits allow; `lock_claim_limits` makes each
claim count what the one before it committed. Time comes from a `FakeClock`. Every test
counts the jobs at the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.operations.ops import CreateIndexOp, CreateTableOp, ModifyTableOps
from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import (
    ClaimLimits,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobQueue,
    Limit,
    NewJob,
    RateLimitLogMixin,
)
from sa_outbox.schema import JobMixin
from sa_outbox.statements import claim_jobs, lock_claim_limits

from .conftest import TEST_SCHEMA, Job
from .helpers import (
    autogenerate_in,
    database_clock,
    jobs_by_status,
    unfinished_jobs,
    wait_until,
    waits_on_advisory_lock,
)
from .test_pause import ControlBase, PausedQueue

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


class LogBase(DeclarativeBase):
    pass


class RateLog(RateLimitLogMixin, LogBase):
    __tablename__ = "job_rate_log"
    __table_schema__ = TEST_SCHEMA


@pytest.fixture
def rate_log(engine: Engine) -> Iterator[type[RateLog]]:
    LogBase.metadata.create_all(engine)
    yield RateLog
    LogBase.metadata.drop_all(engine)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def queue(clock: FakeClock) -> JobQueue:
    return JobQueue(Job, clock=clock)


def enqueue(engine: Engine, queue: JobQueue, jobs: list[NewJob]) -> None:
    with engine.begin() as conn:
        queue.enqueue_many(conn, jobs)


def claim(
    engine: Engine, queue: JobQueue, limits: ClaimLimits, batch: int = 50, **options: Any
) -> list[Any]:
    with engine.begin() as conn:
        return queue.claim(conn, worker_id="w", batch=batch, limits=limits, **options)


def running(engine: Engine) -> dict[tuple[str, str | None], int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT kind, payload->>'acct', count(*) FROM {TEST_SCHEMA}.jobs "
                "WHERE status = 'running' GROUP BY 1, 2"
            )
        ).all()
    return {(kind, acct): n for kind, acct, n in rows}


def test_a_kind_runs_at_most_its_limit_and_other_kinds_are_not_held_back(
    engine: Engine, queue: JobQueue
) -> None:
    enqueue(engine, queue, [NewJob("call-api", {}) for _ in range(10)])
    enqueue(engine, queue, [NewJob("send-email", {}) for _ in range(10)])
    limits = ClaimLimits((Limit(kind="call-api", running=3),))
    taken = claim(engine, queue, limits, kinds=["call-api", "send-email"])
    assert sorted(job.kind for job in taken).count("call-api") == 3
    assert [job.kind for job in taken].count("send-email") == 10
    assert claim(engine, queue, limits, kinds=["call-api", "send-email"]) == []
    first = next(job for job in taken if job.kind == "call-api")
    with engine.begin() as conn:
        queue.complete(conn, first.id, first.lease_token)
    again = claim(engine, queue, limits, kinds=["call-api", "send-email"])
    assert [job.kind for job in again] == ["call-api"]
    assert jobs_by_status(engine) == {"running": 13, "succeeded": 1, "pending": 6}


def test_a_limit_per_payload_key(engine: Engine, queue: JobQueue) -> None:
    jobs = [NewJob("sync-account", {"acct": str(n % 3)}) for n in range(12)]
    jobs += [NewJob("sync-account", {}) for _ in range(3)]  # no key: they share one
    enqueue(engine, queue, jobs)
    limits = ClaimLimits((Limit(kind="sync-account", running=2, by="acct"),))
    taken = claim(engine, queue, limits, kinds="sync-account")
    assert len(taken) == 8
    assert running(engine) == {
        ("sync-account", "0"): 2,
        ("sync-account", "1"): 2,
        ("sync-account", "2"): 2,
        ("sync-account", None): 2,
    }
    assert claim(engine, queue, limits, kinds="sync-account") == []
    done = next(job for job in taken if job.payload.get("acct") == "1")
    with engine.begin() as conn:
        queue.complete(conn, done.id, done.lease_token)
    again = claim(engine, queue, limits, kinds="sync-account")
    assert [job.payload for job in again] == [{"acct": "1"}]
    assert jobs_by_status(engine) == {"running": 8, "succeeded": 1, "pending": 6}


def test_a_queue_limit_counts_every_kind_of_the_queue(engine: Engine, queue: JobQueue) -> None:
    enqueue(engine, queue, [NewJob("a", {}, queue="imports") for _ in range(5)])
    enqueue(engine, queue, [NewJob("b", {}, queue="imports") for _ in range(5)])
    enqueue(engine, queue, [NewJob("a", {}) for _ in range(5)])
    limits = ClaimLimits((Limit(queue="imports", running=4),))
    taken = claim(engine, queue, limits, kinds=["a", "b"])
    assert sum(job.queue == "imports" for job in taken) == 4
    assert sum(job.queue == "default" for job in taken) == 5
    assert claim(engine, queue, limits, kinds=["a", "b"]) == []
    # A worker of other queues only is not limited by it.
    assert claim(engine, queue, limits, queues="default") == []
    assert jobs_by_status(engine) == {"running": 9, "pending": 6}


def test_a_rate_limit_holds_over_its_window(
    engine: Engine, queue: JobQueue, clock: FakeClock, rate_log: type[RateLog]
) -> None:
    enqueue(engine, queue, [NewJob("call-api", {}) for _ in range(20)])
    limits = ClaimLimits((Limit(kind="call-api", rate=5, per=60),), log=rate_log)
    starts: list[dt.datetime] = []
    for _ in range(12):  # a claim every 15 s for three minutes, each finishing its jobs
        taken = claim(engine, queue, limits, kinds="call-api")
        starts += [clock.now()] * len(taken)
        if taken:
            with engine.begin() as conn:
                queue.complete_many(conn, [(job.id, job.lease_token) for job in taken])
        clock.advance(15)
    assert len(starts) == 15  # 5 at 0 s, 5 at 60 s, 5 at 120 s: the rest wait
    window = dt.timedelta(seconds=60)
    assert max(sum(s <= t < s + window for t in starts) for s in starts) == 5
    with engine.connect() as conn:  # the log keeps one window of claims, no more
        kept = conn.execute(text(f"SELECT count(*) FROM {TEST_SCHEMA}.job_rate_log")).scalar()
    assert kept == 5
    assert jobs_by_status(engine) == {"succeeded": 15, "pending": 5}


def test_retries_count_against_the_rate(
    engine: Engine, queue: JobQueue, clock: FakeClock, rate_log: type[RateLog]
) -> None:
    enqueue(engine, queue, [NewJob("call-api", {}) for _ in range(2)])
    limits = ClaimLimits((Limit(kind="call-api", rate=3, per=60),), log=rate_log)
    first = claim(engine, queue, limits, kinds="call-api")
    assert len(first) == 2
    with engine.begin() as conn:
        queue.retry(conn, first[0].id, first[0].lease_token, error="503", delay=0)
    assert len(claim(engine, queue, limits, kinds="call-api")) == 1  # the retry: 3 starts
    with engine.begin() as conn:
        queue.retry(conn, first[1].id, first[1].lease_token, error="503", delay=0)
    assert claim(engine, queue, limits, kinds="call-api") == []  # a 4th start must wait
    assert jobs_by_status(engine) == {"running": 1, "pending": 1}


def test_a_paused_queue_is_not_claimed_by_a_limited_kind(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    ControlBase.metadata.create_all(engine)
    try:
        enqueue(engine, queue, [NewJob("a", {}, queue="held") for _ in range(3)])
        enqueue(engine, queue, [NewJob("a", {}, queue="open") for _ in range(3)])
        with engine.begin() as conn:
            conn.execute(PausedQueue.__table__.insert().values(queue="held"))
        limits = ClaimLimits((Limit(kind="a", running=2),))
        with engine.begin() as conn:
            conn.execute(lock_claim_limits(Job, limits))
            stmt = claim_jobs(
                Job,
                worker_id="w",
                batch=5,
                kinds="a",
                limits=limits,
                paused=PausedQueue,
                clock=clock,
            )
            assert [row.queue for row in conn.execute(stmt)] == ["open", "open"]
    finally:
        ControlBase.metadata.drop_all(engine)
    assert jobs_by_status(engine) == {"pending": 4, "running": 2}


def test_a_claim_touching_no_limited_kind_is_the_plain_claim() -> None:
    limits = ClaimLimits((Limit(kind="call-api", running=1),))
    for options in (
        {"kinds": ("send-email",)},
        {"kinds": ("a", "b")},
        {"queues": "q", "kinds": "x"},
    ):
        plain = claim_jobs(Job, worker_id="w", batch=10, **options)
        limited = claim_jobs(Job, worker_id="w", batch=10, limits=limits, **options)
        dialect = postgresql.dialect()
        assert str(limited.compile(dialect=dialect)) == str(plain.compile(dialect=dialect))
    # With no kinds named, every limited kind may be claimed: the claim is limited.
    limited = claim_jobs(Job, worker_id="w", batch=10, limits=limits)
    assert "rank_in_kind" in str(limited.compile(dialect=postgresql.dialect()))


def test_without_the_lock_two_concurrent_claims_exceed_the_limit_and_with_it_they_do_not(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    # Why the claim takes a lock first: a statement counts the running jobs committed
    # before it began. Claim A holds its transaction open; claim B counts without A's job.
    enqueue(engine, queue, [NewJob("a", {}) for _ in range(4)])
    limits = ClaimLimits((Limit(kind="a", running=1),))
    stmt = claim_jobs(Job, worker_id="w", batch=5, kinds="a", limits=limits, clock=clock)
    with engine.connect() as a, engine.connect() as b, a.begin():
        assert len(a.execute(stmt).all()) == 1
        with b.begin():
            assert len(b.execute(stmt).all()) == 1  # over the limit: 2 running
    assert running(engine) == {("a", None): 2}

    # Reset, then the same with the lock: B waits for A's commit and then sees its job.
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {TEST_SCHEMA}.jobs SET status = 'pending'"))
    lock = lock_claim_limits(Job, limits)
    results: list[int] = []
    with engine.connect() as a, engine.connect() as b:
        a.begin()
        a.execute(lock)
        assert len(a.execute(stmt).all()) == 1
        b_pid = b.execute(text("SELECT pg_backend_pid()")).scalar()
        b.commit()

        def claim_b() -> None:
            with b.begin():
                b.execute(lock)
                results.append(len(b.execute(stmt).all()))

        thread = threading.Thread(target=claim_b)
        thread.start()
        try:
            wait_until(
                lambda: waits_on_advisory_lock(engine, b_pid), "claim B to wait for the lock", 30
            )
            assert results == []
            a.commit()
        finally:
            thread.join(30)
    assert results == [0]
    assert running(engine) == {("a", None): 1}
    assert jobs_by_status(engine) == {"running": 1, "pending": 3}


CLAIMERS = 8


def test_a_limit_is_never_exceeded_by_eight_concurrent_claimers(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    # Eight claimers on their own connections claim, hold and complete jobs of a kind
    # limited to 3 at once (and 1 per account for another kind). Each writes a ledger entry
    # when its claim has committed and before its completion begins: the job's running span
    # as the claimer saw it, inside the span the database had it running. At no instant may
    # more spans overlap than the limit allows.
    jobs = [NewJob("call-api", {"n": n}) for n in range(60)]
    jobs += [NewJob("sync-account", {"acct": str(n % 4)}) for n in range(60)]
    enqueue(engine, queue, jobs)
    limits = ClaimLimits(
        (Limit(kind="call-api", running=3), Limit(kind="sync-account", running=1, by="acct"))
    )
    ledger: list[tuple[float, float, str, str | None]] = []
    guard = threading.Lock()
    errors: list[BaseException] = []

    deadline = time.monotonic() + 120

    def claimer(n: int) -> None:
        try:
            own = JobQueue(Job, clock=clock)
            while time.monotonic() < deadline:
                with engine.begin() as conn:
                    taken = own.claim(
                        conn,
                        worker_id=f"c{n}",
                        batch=1 + n % 3,
                        kinds=["call-api", "sync-account"],
                        limits=limits,
                    )
                started = database_clock(engine)
                if not taken:
                    if unfinished_jobs(engine) == 0:
                        return
                    continue
                time.sleep(0.005)  # the jobs' work: other claimers take their turns meanwhile
                ended = database_clock(engine)
                with engine.begin() as conn:
                    own.complete_many(conn, [(job.id, job.lease_token) for job in taken])
                with guard:
                    ledger.extend(
                        (started, ended, job.kind, job.payload.get("acct")) for job in taken
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert len(ledger) == 120
    assert jobs_by_status(engine) == {"succeeded": 120}
    assert max_overlap(ledger, lambda e: e[2] == "call-api") <= 3
    for acct in "0123":
        assert max_overlap(ledger, lambda e, a=acct: e[3] == a) <= 1  # type: ignore[misc]
    # The claimers did overlap: the limits, not turn-taking, kept them under.
    assert max_overlap(ledger, lambda e: True) >= 3


def max_overlap(ledger: list[tuple[float, float, str, str | None]], chosen: Any) -> int:
    events = sorted(
        [(start, 1) for start, _, *rest in ledger if chosen((start, _, *rest))]
        + [(end, -1) for _, end, *rest in ledger if chosen((_, end, *rest))],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_bad_limits_are_refused_with_what_was_wrong(rate_log: type[RateLog]) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "exactly one of kind= or queue="),
        ({"kind": "a", "queue": "q", "running": 1}, "exactly one of kind= or queue="),
        ({"kind": "a"}, "sets neither running= nor rate="),
        ({"kind": "a", "running": 0}, "running of the limit of kind 'a' must be between 1"),
        ({"kind": "a", "running": 1, "by": "a b"}, "must be a payload field name"),
        ({"queue": "q", "running": 1, "by": "acct"}, "groups a kind's running= limit only"),
        ({"queue": "q", "rate": 1, "per": 1}, "rate limits are per kind"),
        ({"kind": "a", "rate": 5}, "needs both rate= and per="),
        ({"kind": "a", "rate": 5, "per": 0}, "per of the limit of kind 'a' must be more than zero"),
        ({"kind": "", "running": 1}, "must not be empty"),
    ]
    for options, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            Limit(**options)
    with pytest.raises(InvalidArgumentType):
        Limit(kind="a", running="3")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="give a RateLimitLogMixin table"):
        ClaimLimits((Limit(kind="a", rate=1, per=1),))
    with pytest.raises(InvalidArgumentType, match="limits must be a ClaimLimits"):
        claim_jobs(Job, worker_id="w", limits=[Limit(kind="a", running=1)])  # type: ignore[arg-type]
    app = JobApp(Job)
    app.limit(kind="a", running=1)
    with pytest.raises(InvalidArgument, match="kind:a is limited already"):
        app.limit(kind="a", rate=1, per=1)
    with pytest.raises(InvalidArgument, match="give JobApp a rate_log= table"):
        app.limit(kind="b", rate=1, per=1)
    rated = JobApp(Job, rate_log=rate_log)
    rated.limit(kind="b", rate=1, per=1)
    assert rated.limits is not None and rated.limits.log is rate_log.__table__


def test_workers_together_run_no_more_than_the_limit(
    engine: Engine, queue: JobQueue, make_worker: Any
) -> None:
    # Two workers with four handlers each; the kind may run twice at once across both.
    enqueue(engine, queue, [NewJob("render", {"n": n}) for n in range(6)])
    enqueue(engine, queue, [NewJob("ping", {}) for _ in range(4)])
    gate = threading.Event()
    app = JobApp(Job)
    app.register("render", lambda job: gate.wait(60))
    app.register("ping", lambda job: None)
    app.limit(kind="render", running=2)
    first, second = make_worker(app, concurrency=4), make_worker(app, concurrency=4)
    try:
        assert first.claim() + second.claim() == 6  # two renders and the four pings
        first.wait_for_handlers(0)
        second.wait_for_handlers(0)
        # Free handlers on both, pending renders: the claim still takes none.
        assert first.claim() == 0 and second.claim() == 0
        assert running(engine) == {("render", None): 2}
    finally:
        gate.set()
    for worker in (first, second):
        worker.wait_for_handlers(30)
        worker.flush()
    assert first.drain(30) + second.drain(30) == 4
    assert jobs_by_status(engine) == {"succeeded": 10}


def test_a_worker_obeys_a_rate_limit_as_its_clock_moves(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Any, rate_log: type[RateLog]
) -> None:
    enqueue(engine, queue, [NewJob("call-api", {}) for _ in range(7)])
    app = JobApp(Job, rate_log=rate_log)
    app.register("call-api", lambda job: None)
    app.limit(kind="call-api", rate=3, per=60)
    worker = make_worker(app, concurrency=8)
    assert worker.drain(30) == 3
    clock.advance(59)
    assert worker.drain(30) == 0
    clock.advance(1)
    assert worker.drain(30) == 3
    clock.advance(60)
    assert worker.drain(30) == 1
    assert jobs_by_status(engine) == {"succeeded": 7}


def test_autogenerate_adds_the_rate_log_to_an_existing_install(database_url: str) -> None:
    """An install with its jobs table only: autogenerate creates the log and its index,
    then finds nothing more."""
    schema = f"rate_upgrade_{uuid.uuid4().hex[:8]}"

    class Old(DeclarativeBase):
        pass

    class OldJob(JobMixin, Old):
        __tablename__ = "jobs"
        __table_schema__ = schema

    class New(DeclarativeBase):
        metadata = MetaData()

    class NewJobs(JobMixin, New):
        __tablename__ = "jobs"
        __table_schema__ = schema

    class NewLog(RateLimitLogMixin, New):
        __tablename__ = "job_rate_log"
        __table_schema__ = schema

    def changes(connection: Any) -> Any:
        return autogenerate_in(connection, New.metadata, schema)

    pg = create_engine(database_url)
    try:
        with pg.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        Old.metadata.create_all(pg)
        with pg.begin() as conn:
            found = changes(conn).ops
            # The table, then its index (Alembic groups an index under the table's ops).
            assert [type(op) for op in found] == [CreateTableOp, ModifyTableOps], found
            assert found[0].table_name == "job_rate_log"
            assert [type(op) for op in found[1].ops] == [CreateIndexOp]
            assert found[1].ops[0].index_name == "job_rate_log_scope_idx"
            operations = Operations(MigrationContext.configure(conn))
            operations.invoke(found[0])
            for op in found[1].ops:
                operations.invoke(op)
        with pg.begin() as conn:
            assert changes(conn).ops == []
            limits = ClaimLimits((Limit(kind="a", rate=1, per=60),), log=NewLog)
            conn.execute(NewJobs.__table__.insert().values(kind="a", payload={}))
            conn.execute(lock_claim_limits(NewJobs, limits))
            taken = conn.execute(claim_jobs(NewJobs, worker_id="w", kinds="a", limits=limits))
            assert len(taken.all()) == 1
            assert conn.execute(text(f"SELECT count(*) FROM {schema}.job_rate_log")).scalar() == 1
    finally:
        with pg.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        pg.dispose()


async def test_an_async_worker_obeys_the_limits(
    engine: Engine,
    queue: JobQueue,
    clock: FakeClock,
    make_async_worker: Any,
    rate_log: type[RateLog],
) -> None:
    enqueue(engine, queue, [NewJob("sync", {"acct": a}) for a in "aaab"])
    enqueue(engine, queue, [NewJob("call-api", {}) for _ in range(4)])
    app = JobApp(Job, rate_log=rate_log)
    active: dict[str, int] = {}
    most: dict[str, int] = {}

    async def sync(job: Any) -> None:
        acct = job.payload["acct"]
        active[acct] = active.get(acct, 0) + 1
        most[acct] = max(most.get(acct, 0), active[acct])
        await asyncio.sleep(0.01)  # the work: other handlers run meanwhile
        active[acct] -= 1

    async def call(job: Any) -> None:
        pass

    app.register("sync", sync)
    app.register("call-api", call)
    app.limit(kind="sync", running=1, by="acct")
    app.limit(kind="call-api", rate=3, per=60)
    worker = make_async_worker(app, concurrency=8)
    assert await worker.drain() == 7  # every sync, and three calls in the minute
    assert most == {"a": 1, "b": 1}
    with engine.connect() as conn:
        pending = conn.execute(
            text(f"SELECT kind FROM {TEST_SCHEMA}.jobs WHERE status = 'pending'")
        ).scalars()
        assert list(pending) == ["call-api"]
    clock.advance(60)
    assert await worker.drain() == 1
    assert jobs_by_status(engine) == {"succeeded": 8}
