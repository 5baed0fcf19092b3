"""The worker's hot path: jobs claimed ahead of a free handler (prefetch), and the batched
completion statement built once and run again with new pairs.

Step by step on a `FakeClock` as in tests/test_worker.py: handlers that must stay running
block on an event the test sets, nothing sleeps to synchronise, no test asserts timings, and
every test ends by counting the jobs in the table.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.dialects import postgresql

from sa_outbox import (
    Backoff,
    FakeClock,
    InvalidArgument,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    Worker,
)
from sa_outbox import statements as st
from sa_outbox.worker import CountingMetrics, JobOutcome, Reclaimer

from .conftest import Job
from .helpers import job_row, jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
WAIT = 10.0  # seconds a test waits for an event before it fails (never reached when green)


def enqueue(engine: Engine, kind: str, n: int = 1) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = JobQueue(Job).enqueue_many(conn, [NewJob(kind, {"n": i}) for i in range(n)])
    return [r.id for r in results if r.id is not None]


def test_short_jobs_are_claimed_ahead_once_handlers_have_returned(
    engine: Engine, make_worker: Callable[..., Worker]
) -> None:
    ran: list[int] = []
    app = JobApp(Job, handlers={"short": lambda job: ran.append(job.payload["n"])})
    enqueue(engine, "short", 30)
    metrics = CountingMetrics()
    worker = make_worker(app, concurrency=1, batch=10, metrics=metrics)

    assert worker.claim() == 1  # no handler has returned yet: only the free one
    assert worker.wait_for_handlers(WAIT)
    # The handler took no (fake) time: the next claim fills a batch, 9 of them queued
    # behind the one handler thread, which runs them one after another.
    assert worker.claim() == 10
    assert worker.wait_for_handlers(WAIT)
    assert worker.flush() == 10

    assert sorted(ran) == sorted(set(ran)) and len(ran) == 11
    assert jobs_by_status(engine) == {"succeeded": 11, "pending": 19}
    assert metrics.totals["acknowledged"] == 11
    assert metrics.totals["transactions"] == 3


def test_short_jobs_may_wait_two_batches_deep_so_the_next_claim_does_not_wait(
    engine: Engine, make_worker: Callable[..., Worker]
) -> None:
    gate = threading.Event()
    ran: list[int] = []

    def gated(job: JobContext) -> None:
        ran.append(job.payload["n"])
        if job.payload["n"] >= 1:
            assert gate.wait(WAIT)  # takes no (fake) time, but holds its thread

    app = JobApp(Job, handlers={"gated": gated})
    enqueue(engine, "gated", 40)
    worker = make_worker(app, concurrency=1, batch=10)

    assert worker.claim() == 1  # no handler has returned yet: only the free one
    assert worker.wait_for_handlers(WAIT)
    assert worker.claim() == 10  # one running (held at the gate), nine waiting
    # Another full batch while those ten are unfinished: up to two batches may wait.
    assert worker.claim() == 10
    assert worker.claim() == 1  # room for one more: 1 running, two batches of 10 waiting
    assert worker.claim() == 0
    gate.set()
    assert worker.wait_for_handlers(WAIT)
    assert worker.flush() == 21

    assert sorted(ran) == sorted(set(ran)) and len(ran) == 22
    assert jobs_by_status(engine) == {"succeeded": 22, "pending": 18}


def test_prefetch_zero_claims_only_for_free_handlers(
    engine: Engine, make_worker: Callable[..., Worker]
) -> None:
    app = JobApp(Job, handlers={"short": lambda job: None})
    enqueue(engine, "short", 3)
    worker = make_worker(app, concurrency=1, batch=10, prefetch=0)

    claimed = []
    while claimed_now := worker.run_once(WAIT):
        claimed.append(claimed_now)

    assert claimed == [1, 1, 1]
    assert jobs_by_status(engine) == {"succeeded": 3}


def test_prefetch_is_checked(engine: Engine) -> None:
    app = JobApp(Job, handlers={"short": lambda job: None})
    with pytest.raises(InvalidArgument, match="prefetch must be between 0"):
        Worker(app, engine, prefetch=-1)


def test_long_jobs_are_not_claimed_ahead(
    engine: Engine, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    def slow(job: JobContext) -> None:
        clock.advance(5)  # five (fake) seconds per job: far beyond the prefetch horizon

    app = JobApp(Job, handlers={"slow": slow})
    enqueue(engine, "slow", 4)
    worker = make_worker(app, concurrency=1, batch=10)

    assert worker.run_once(WAIT) == 1
    assert worker.run_once(WAIT) == 1  # 5 s per job: no job waits behind another
    assert jobs_by_status(engine) == {"succeeded": 2, "pending": 2}


def test_stopping_releases_queued_jobs_without_counting_an_attempt(engine: Engine) -> None:
    started = threading.Event()
    ran: list[int] = []

    def polite(job: JobContext) -> None:
        ran.append(job.payload["n"])
        started.set()
        job.cancel.wait(WAIT)  # returns as soon as shutdown is asked

    app = JobApp(Job, handlers={"polite": polite})
    enqueue(engine, "polite", 4)
    worker = Worker(
        app,
        engine,
        concurrency=1,
        batch=4,
        prefetch=3,
        grace=WAIT,
        listen=False,
        install_signal_handlers=False,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(WAIT)
    worker.stop()
    thread.join(WAIT)
    assert not thread.is_alive()

    assert len(ran) == 1  # the queued three never started
    assert jobs_by_status(engine) == {"succeeded": 1, "pending": 3}
    assert all(job_row(engine, i).attempts == 0 for i in _pending_ids(engine))


def _pending_ids(engine: Engine) -> list[uuid.UUID]:
    t = Job.__table__
    with engine.connect() as conn:
        return list(conn.execute(t.select().where(t.c.status == "pending")).scalars())


def test_a_queued_job_whose_lease_was_lost_never_runs(
    engine: Engine, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    release = threading.Event()
    ran: list[int] = []

    def blocking(job: JobContext) -> None:
        ran.append(job.payload["n"])
        job.cancel.wait(WAIT)
        release.wait(WAIT)

    app = JobApp(Job, handlers={"blocking": blocking}, backoff=Backoff(base=1, max=1, jitter=0))
    enqueue(engine, "blocking", 2)
    metrics = CountingMetrics()
    worker = make_worker(app, concurrency=1, batch=2, prefetch=1, metrics=metrics, lease=30)

    assert worker.claim() == 2  # one running, one queued behind it
    clock.advance(31)  # both leases expire; a reclaimer gives the jobs back
    assert len(Reclaimer(app, engine, clock=clock).run_once()) == 2
    beat = worker.heartbeat()
    assert beat is not None and len(beat.lost) == 2
    release.set()
    assert worker.wait_for_handlers(WAIT)
    worker.flush()

    assert ran == [ran[0]]  # the queued job never ran
    assert metrics.outcomes("blocking")[JobOutcome.LOST] == 2
    assert jobs_by_status(engine) == {"pending": 2}
    assert {job_row(engine, i).attempts for i in _pending_ids(engine)} == {1}


def test_the_batched_completion_is_built_once_and_run_again_with_new_pairs(
    engine: Engine,
) -> None:
    queue = JobQueue(Job)  # the database's clock: the statement is reused
    enqueue(engine, "job", 5)
    with engine.begin() as conn:
        jobs = queue.claim(conn, worker_id="w", batch=5)
    first, second = jobs[:2], jobs[2:]
    stale = (second[0].id, uuid.uuid4())
    with engine.begin() as conn:
        done = queue.complete_many(conn, [(j.id, j.lease_token) for j in first])
        assert sorted(done.done) == sorted(j.id for j in first) and done.lost == []
        again = queue.complete_many(conn, [(j.id, j.lease_token) for j in second] + [stale])
        assert sorted(again.done) == sorted(j.id for j in second)
        assert again.lost == [stale[0]]
    with pytest.raises(InvalidArgument, match="at least one"), engine.begin() as conn:
        queue.complete_many(conn, [])
    assert jobs_by_status(engine) == {"succeeded": 5}


def test_the_claim_names_pending_in_its_sql_for_the_partial_index() -> None:
    sql = str(
        st.claim_jobs(Job, worker_id="w", batch=20, queues="default").compile(
            dialect=postgresql.dialect()  # type: ignore[no-untyped-call]
        )
    )
    # A generic plan of the prepared claim can use the ready index (WHERE status =
    # 'pending') only if the predicate is in the text, not a bound parameter.
    assert "jobs.status = 'pending'" in sql


def _pairs(jobs: list[Any]) -> dict[str, list[uuid.UUID]]:
    return {
        st.COMPLETION_IDS: [j.id for j in jobs],
        st.COMPLETION_TOKENS: [j.lease_token for j in jobs],
    }


def test_complete_and_claim_completes_the_held_pairs_and_claims_in_one_statement(
    engine: Engine,
) -> None:
    queue = JobQueue(Job)  # the database's clock: the statement is built once, run twice
    enqueue(engine, "job", 6)
    with engine.begin() as conn:
        held = queue.claim(conn, worker_id="w1", batch=2)
    stale = (uuid.uuid4(), uuid.uuid4())
    stmt = st.complete_and_claim_jobs(
        Job, [(j.id, j.lease_token) for j in held], worker_id="w2", batch=3, queues="default"
    )
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with autocommit.connect() as conn:
        params = _pairs(held)
        params[st.COMPLETION_IDS].append(stale[0])
        params[st.COMPLETION_TOKENS].append(stale[1])
        rows = conn.execute(stmt, params).all()
    acked = {(r.id, r.lease_token) for r in rows if r.acked}
    claimed = [r for r in rows if not r.acked]
    assert acked == {(j.id, j.lease_token) for j in held}  # not the stale pair
    assert len(claimed) == 3 and {r.worker_id for r in claimed} == {"w2"}
    assert all(r.kind == "job" and r.attempts == 1 for r in claimed)
    assert jobs_by_status(engine) == {"succeeded": 2, "running": 3, "pending": 1}

    with autocommit.connect() as conn:  # the same statement, the next pairs
        rows = conn.execute(stmt, _pairs(claimed)).all()
    assert {(r.id, r.lease_token) for r in rows if r.acked} == {
        (r.id, r.lease_token) for r in claimed
    }
    assert len([r for r in rows if not r.acked]) == 1  # the last pending job
    assert jobs_by_status(engine) == {"succeeded": 5, "running": 1}


def test_complete_and_claim_is_fenced_by_status_and_token(engine: Engine) -> None:
    queue = JobQueue(Job)
    enqueue(engine, "job", 2)
    with engine.begin() as conn:
        job = queue.claim(conn, worker_id="w1", batch=1)[0]
        queue.release_many(conn, [(job.id, job.lease_token)])  # pending again, token gone
        again = queue.claim(conn, worker_id="w2", batch=1)[0]  # another run, a new token
    assert again.id == job.id and again.lease_token != job.lease_token
    stmt = st.complete_and_claim_jobs(
        Job, [(job.id, job.lease_token)], worker_id="w1", batch=5, queues="default"
    )
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        rows = conn.execute(stmt).all()
    assert [r for r in rows if r.acked] == []  # the old token completes nothing
    assert [r.worker_id for r in rows if not r.acked] == ["w1"]  # the other job
    row = job_row(engine, job.id)
    assert (row.status, row.lease_token, row.worker_id) == ("running", again.lease_token, "w2")
    assert jobs_by_status(engine) == {"running": 2}


def test_complete_and_claim_checks_its_arguments_before_any_sql() -> None:
    with pytest.raises(InvalidArgument, match="at least one"):
        st.complete_and_claim_jobs(Job, [], worker_id="w")
    with pytest.raises(InvalidArgument, match="batch"):
        st.complete_and_claim_jobs(Job, [(uuid.uuid4(), uuid.uuid4())], worker_id="w", batch=0)


def _capture_statements(engine: Engine) -> tuple[list[str], Callable[[], None]]:
    from sqlalchemy import event

    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    return seen, lambda: event.remove(engine, "before_cursor_execute", before)


def test_a_worker_completes_and_claims_in_one_statement_and_counts_a_lost_lease(
    engine: Engine, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    release = threading.Event()

    def blocking(job: JobContext) -> None:
        if job.payload["n"] == 0:
            release.wait(WAIT)

    app = JobApp(Job, handlers={"job": blocking}, backoff=Backoff(base=1, max=1, jitter=0))
    [first] = enqueue(engine, "job", 1)
    metrics = CountingMetrics()
    worker = make_worker(app, concurrency=1, batch=1, prefetch=0, lease=30, metrics=metrics)
    assert worker.claim() == 1  # job 0 runs, blocked

    # Its lease expires, the reclaimer gives it back, another worker runs it again.
    clock.advance(31)
    assert len(Reclaimer(app, engine, clock=clock).run_once()) == 1
    clock.advance(2)
    with engine.begin() as conn:
        other = JobQueue(Job, clock=clock).claim(conn, worker_id="other", batch=1)
    assert [j.id for j in other] == [first]
    with engine.begin() as conn:
        JobQueue(Job, clock=clock).enqueue(conn, "job", {"n": 1})

    release.set()
    assert worker.wait_for_handlers(WAIT)
    seen, stop_capturing = _capture_statements(engine)
    try:
        assert worker.claim() == 1  # the completion (lost) and the claim of job 1
    finally:
        stop_capturing()
    assert "UNION ALL" in seen[0] and "FOR UPDATE SKIP LOCKED" in seen[0]
    # A pair not completed: one more statement asks whether it was cancelled (it was not).
    # (`finish_cancelled_jobs`: a fenced UPDATE of the pair if its row is 'cancelled').
    assert len(seen) == 2 and "UNION ALL" not in seen[1] and "UPDATE" in seen[1]
    assert metrics.outcomes("job")[JobOutcome.LOST] == 1
    row = job_row(engine, first)
    assert (row.status, row.worker_id, row.lease_token) == (
        "running",
        "other",
        other[0].lease_token,
    )

    assert worker.wait_for_handlers(WAIT)
    assert worker.flush() == 1
    assert metrics.outcomes("job")[JobOutcome.SUCCEEDED] == 1
    assert jobs_by_status(engine) == {"running": 1, "succeeded": 1}


def test_results_with_follow_up_jobs_keep_the_transaction(
    engine: Engine, make_worker: Callable[..., Worker]
) -> None:
    def parent(job: JobContext) -> None:
        job.enqueue("child", {})

    app = JobApp(Job, handlers={"parent": parent, "child": lambda job: None})
    enqueue(engine, "parent", 1)
    worker = make_worker(app, concurrency=1, batch=5, prefetch=0)
    assert worker.claim() == 1
    assert worker.wait_for_handlers(WAIT)
    seen, stop_capturing = _capture_statements(engine)
    try:
        assert worker.claim() == 1  # the child, enqueued earlier in the same transaction
    finally:
        stop_capturing()
    assert not any("UNION ALL" in s for s in seen)  # completion, follow-up, claim: 3 statements
    assert len(seen) == 3
    assert worker.wait_for_handlers(WAIT)
    assert worker.flush() == 1
    assert jobs_by_status(engine) == {"succeeded": 2}


def test_the_reclaim_uses_the_expired_lease_index_under_a_generic_plan(engine: Engine) -> None:
    from sqlalchemy import text

    stmt = st.reclaim_expired_jobs(Job, limit=100)
    compiled = stmt.compile(dialect=engine.dialect)
    sql = str(compiled)
    assert "jobs.status = 'running'" in sql
    raw = engine.raw_connection()
    try:
        cur = raw.driver_connection.cursor()
        cur.execute("SET plan_cache_mode = force_generic_plan")
        cur.execute("SET enable_seqscan = off")  # a tiny table would be scanned otherwise
        # PREPARE it as psycopg prepares a statement on its 5th run, then EXPLAIN an EXECUTE:
        # under force_generic_plan, the plan is the generic one.
        params = compiled.construct_params()
        names = list(params)
        numbered = sql
        for i, name in enumerate(names, 1):
            numbered = numbered.replace(f"%({name})s", f"${i}")
        cur.execute(f"PREPARE reclaim_generic AS {numbered}")
        values = ", ".join("NULL" if params[n] is None else f"'{params[n]}'" for n in names)
        plan = "\n".join(
            r[0] for r in cur.execute(f"EXPLAIN EXECUTE reclaim_generic({values})").fetchall()
        )
        cur.execute("DEALLOCATE reclaim_generic")
        cur.execute("RESET plan_cache_mode")
        cur.execute("RESET enable_seqscan")
    finally:
        raw.close()
    assert "jobs_expired_lease_idx" in plan, plan
    with engine.connect() as conn:  # still a statement that runs
        assert conn.execute(text("SELECT 1")).scalar() == 1
    assert jobs_by_status(engine) == {}
