"""The job queue's semantics against a real PostgreSQL (article, sections 3, 4, 6, 7, 10)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from sqlalchemy import Engine, text

from sa_outbox import Backoff, FakeClock, JobQueue, JobStatus, LeaseLost, NewJob

from .conftest import Job
from .helpers import job_row, jobs_by_status

NO_JITTER = Backoff(base=1, max=300, jitter=0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))


@pytest.fixture
def queue(clock: FakeClock) -> JobQueue:
    return JobQueue(Job, clock=clock, backoff=NO_JITTER)


def enqueue(engine: Engine, queue: JobQueue, n: int = 1, **kw: object) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [queue.enqueue(conn, "work", {"n": i}, **kw).id for i in range(n)]  # type: ignore[misc]


def test_enqueue_claim_complete(engine: Engine, queue: JobQueue) -> None:
    [job_id] = enqueue(engine, queue)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w1", batch=10)
    assert (job.id, job.kind, job.payload, job.attempts) == (job_id, "work", {"n": 0}, 1)
    row = job_row(engine, job_id)
    assert row.status == JobStatus.RUNNING and row.lease_token == job.lease_token
    assert row.worker_id == "w1" and row.lease_until == job.lease_until
    with engine.begin() as conn:
        queue.complete(conn, job.id, job.lease_token)
    row = job_row(engine, job_id)
    assert row.status == JobStatus.SUCCEEDED
    assert (row.lease_token, row.lease_until, row.worker_id) == (None, None, None)


def test_article_lease_loss_scenario(engine: Engine, queue: JobQueue, clock: FakeClock) -> None:
    """Article, section 10: the six steps, with a fake clock and no sleeping."""
    [job_id] = enqueue(engine, queue)
    with engine.begin() as conn:  # 1. worker A claims, token T1
        [a] = queue.claim(conn, worker_id="A", lease=30)
    clock.advance(31)  # 2. the clock passes the lease
    with engine.begin() as conn:  # 3. the reclaimer returns the job to the queue
        [reclaimed] = queue.reclaim_expired(conn)
    assert (reclaimed.id, reclaimed.status, reclaimed.worker_id) == (job_id, "pending", "A")
    clock.advance(NO_JITTER.delay(1))
    with engine.begin() as conn:  # 4. worker B claims the same job, token T2
        [b] = queue.claim(conn, worker_id="B")
    assert b.id == a.id and b.lease_token != a.lease_token and b.attempts == 2
    with engine.begin() as conn, pytest.raises(LeaseLost) as lost:  # 5. T1 touches nothing
        queue.complete(conn, a.id, a.lease_token)
    assert str(job_id) in str(lost.value) and lost.value.token == a.lease_token
    row = job_row(engine, job_id)
    assert (row.status, row.lease_token, row.worker_id) == ("running", b.lease_token, "B")
    with engine.begin() as conn:  # 6. T2 completes the job
        queue.complete(conn, b.id, b.lease_token)
    assert job_row(engine, job_id).status == JobStatus.SUCCEEDED


def test_skip_locked_second_transaction_claims_another_row(engine: Engine, queue: JobQueue) -> None:
    first, second = enqueue(engine, queue, 2)
    with engine.connect() as conn_a, engine.connect() as conn_b:
        tx_a = conn_a.begin()
        [held] = queue.claim(conn_a, worker_id="A")  # row locked, transaction still open
        assert held.id == first  # same priority and run_at: enqueue order (ids are v7)
        with conn_b.begin():
            conn_b.execute(text("SET LOCAL lock_timeout = '2s'"))
            [other] = queue.claim(conn_b, worker_id="B")
        assert other.id == second
        tx_a.rollback()
    assert jobs_by_status(engine) == {"pending": 1, "running": 1}


def test_explicitly_locked_row_is_skipped(engine: Engine, queue: JobQueue) -> None:
    first, second = enqueue(engine, queue, 2)
    with engine.connect() as locker, engine.begin() as conn, locker.begin():
        locker.execute(
            text(f"SELECT 1 FROM {Job.__table__.fullname} WHERE id = :id FOR UPDATE"),
            {"id": first},
        )
        assert [j.id for j in queue.claim(conn, worker_id="B", batch=2)] == [second]


def test_concurrent_claimers_take_each_job_exactly_once(engine: Engine, clock: FakeClock) -> None:
    queue = JobQueue(Job, clock=clock)
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("work", {"n": i}) for i in range(400)])
    claimed: list[list[uuid.UUID]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def claimer(slot: int) -> None:
        start.wait()
        while True:
            with engine.begin() as conn:
                jobs = queue.claim(conn, worker_id=f"w{slot}", batch=7)
            if not jobs:
                return
            claimed[slot].extend(j.id for j in jobs)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [j for chunk in claimed for j in chunk]
    assert len(everything) == 400 and len(set(everything)) == 400
    assert jobs_by_status(engine) == {"running": 400}


def test_jobs_of_one_transaction_are_claimed_in_enqueue_order(
    engine: Engine, queue: JobQueue
) -> None:
    ids = enqueue(engine, queue, 50)
    with engine.begin() as conn:
        ids += [r.id for r in queue.enqueue_many(conn, [NewJob("work", {}) for _ in range(50)])]
    with engine.begin() as conn:
        assert [j.id for j in queue.claim(conn, worker_id="w", batch=100)] == ids


def test_claim_order_is_priority_then_run_at_then_id(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    with engine.begin() as conn:
        late = queue.enqueue(conn, "work", {}, run_at=clock.now() - dt.timedelta(seconds=1)).id
        early = queue.enqueue(conn, "work", {}, run_at=clock.now() - dt.timedelta(seconds=9)).id
        urgent = queue.enqueue(conn, "work", {}, priority=5).id
        future = queue.enqueue(conn, "work", {}, delay=60).id
    with engine.begin() as conn:
        assert [j.id for j in queue.claim(conn, worker_id="w", batch=10)] == [urgent, early, late]
    clock.advance(60)
    with engine.begin() as conn:
        assert [j.id for j in queue.claim(conn, worker_id="w", batch=10)] == [future]


def test_queue_and_kind_filters(engine: Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        email = queue.enqueue(conn, "send-email", {}, queue="emails").id
        report = queue.enqueue(conn, "report", {}, queue="reports").id
        other = queue.enqueue(conn, "other", {}).id
    with engine.begin() as conn:
        assert [j.id for j in queue.claim(conn, worker_id="w", batch=9, queues="emails")] == [email]
        assert queue.claim(conn, worker_id="w", batch=9, queues=["emails"], kinds="report") == []
        got = queue.claim(conn, worker_id="w", batch=9, queues=["reports", "default"])
        assert {j.id for j in got} == {report, other}


def test_deduplication_does_not_abort_the_transaction(engine: Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        first = queue.enqueue(conn, "index-book", {"id": 1}, deduplication_key="book:1")
        again = queue.enqueue(conn, "index-book", {"id": 1}, deduplication_key="book:1")
        other_kind = queue.enqueue(conn, "email-book", {"id": 1}, deduplication_key="book:1")
        conn.execute(text("SELECT 1"))  # the transaction is still usable
    assert first.inserted and first.id is not None
    assert not again.inserted and again.id is None
    assert other_kind.inserted
    assert jobs_by_status(engine) == {"pending": 2}


def test_enqueue_many_reports_each_insert_in_order(engine: Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        queue.enqueue(conn, "k", {}, deduplication_key="taken")
        results = queue.enqueue_many(
            conn,
            [
                NewJob("k", {"a": 1}, deduplication_key="taken"),
                NewJob("k", {"a": 2}, deduplication_key="fresh"),
                NewJob("k", {"a": 3}, deduplication_key="fresh"),
                NewJob("k", {"a": 4}, queue="other", priority=3, max_attempts=2),
            ],
        )
    assert [r.inserted for r in results] == [False, True, False, True]
    row = job_row(engine, results[3].id)  # type: ignore[arg-type]
    assert (row.queue, row.priority, row.max_attempts, row.payload) == ("other", 3, 2, {"a": 4})
    assert jobs_by_status(engine) == {"pending": 3}


def test_rollback_removes_the_job(engine: Engine, queue: JobQueue) -> None:
    with engine.connect() as conn, conn.begin() as tx:
        queue.enqueue(conn, "work", {})
        tx.rollback()
    assert jobs_by_status(engine) == {}


def test_heartbeat_extends_a_live_lease_without_rotating_the_token(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    enqueue(engine, queue)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w1", lease=30)
    clock.advance(20)
    with engine.begin() as conn:
        until = queue.heartbeat(conn, job.id, job.lease_token, lease=30, worker_id="w1")
    assert until == clock.now() + dt.timedelta(seconds=30)
    row = job_row(engine, job.id)
    assert row.lease_token == job.lease_token and row.lease_until == until
    with engine.begin() as conn, pytest.raises(LeaseLost):
        queue.heartbeat(conn, job.id, job.lease_token, worker_id="someone-else")
    clock.advance(31)  # the lease has now expired: a heartbeat cannot revive it
    with engine.begin() as conn, pytest.raises(LeaseLost, match="cannot heartbeat job"):
        queue.heartbeat(conn, job.id, job.lease_token)
    assert job_row(engine, job.id).lease_until == until


def test_heartbeat_many_reports_the_lost(engine: Engine, queue: JobQueue, clock: FakeClock) -> None:
    enqueue(engine, queue, 2)
    with engine.begin() as conn:
        a, b = queue.claim(conn, worker_id="w1", batch=2, lease=30)
        queue.complete(conn, b.id, b.lease_token)
    clock.advance(10)
    with engine.begin() as conn:
        result = queue.heartbeat_many(conn, [(a.id, a.lease_token), (b.id, b.lease_token)])
    assert (result.done, result.lost) == ([a.id], [b.id])


def test_reclaim_applies_backoff_and_fails_at_max_attempts(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    [job_id] = enqueue(engine, queue, max_attempts=3)
    for attempt in (1, 2, 3):
        with engine.begin() as conn:
            [job] = queue.claim(conn, worker_id="crashy", lease=10)
        assert job.attempts == attempt
        clock.advance(11)
        with engine.begin() as conn:
            [back] = queue.reclaim_expired(conn)
        row = job_row(engine, job_id)
        if attempt < 3:
            assert back.status == JobStatus.PENDING
            assert row.run_at == clock.now() + NO_JITTER.delay(attempt)  # never a hot loop
            with engine.begin() as conn:
                assert queue.claim(conn, worker_id="eager") == []
            clock.advance(NO_JITTER.delay(attempt))
        else:
            assert back.status == JobStatus.FAILED and row.status == JobStatus.FAILED
    assert "lease expired" in row.last_error and "crashy" in row.last_error


def test_reclaim_leaves_live_leases_alone(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    enqueue(engine, queue)
    with engine.begin() as conn:
        queue.claim(conn, worker_id="w", lease=30)
    clock.advance(29)
    with engine.begin() as conn:
        assert queue.reclaim_expired(conn) == []
    assert jobs_by_status(engine) == {"running": 1}


def test_retry_backs_off_then_fails_at_max_attempts(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    [job_id] = enqueue(engine, queue, max_attempts=2)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w")
        first = queue.retry(conn, job.id, job.lease_token, error="timeout")
    assert first.status == JobStatus.PENDING and first.run_at == clock.now() + NO_JITTER.delay(1)
    clock.advance(NO_JITTER.delay(1))
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w")
        last = queue.retry(conn, job.id, job.lease_token, error="timeout again", delay=5)
    assert last.status == JobStatus.FAILED and last.run_at is None
    row = job_row(engine, job_id)
    assert (row.status, row.last_error, row.attempts) == ("failed", "timeout again", 2)
    with engine.begin() as conn, pytest.raises(LeaseLost):
        queue.retry(conn, job.id, job.lease_token)


def test_explicit_retry_delay(engine: Engine, queue: JobQueue, clock: FakeClock) -> None:
    enqueue(engine, queue)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w")
        result = queue.retry(conn, job.id, job.lease_token, delay=dt.timedelta(minutes=2))
    assert result.run_at == clock.now() + dt.timedelta(minutes=2)


def test_fail_is_permanent_and_requeue_brings_it_back(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    [job_id, other_id] = enqueue(engine, queue, 2)
    with engine.begin() as conn:
        jobs = queue.claim(conn, worker_id="w", batch=2)
        for job in jobs:
            queue.fail(conn, job.id, job.lease_token, error="bad payload: missing 'to'")
        with pytest.raises(LeaseLost):
            queue.fail(conn, jobs[0].id, jobs[0].lease_token)
    assert job_row(engine, job_id).last_error == "bad payload: missing 'to'"
    clock.advance(5)
    with engine.begin() as conn:
        assert queue.requeue_failed(conn, ids=[job_id]) == [job_id]
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.run_at) == ("pending", 0, clock.now())
    assert row.last_error == "bad payload: missing 'to'"  # kept for the record
    with engine.begin() as conn:
        assert queue.requeue_failed(conn, kinds="work", reset_attempts=False) == [other_id]
    assert job_row(engine, other_id).attempts == 1
    assert jobs_by_status(engine) == {"pending": 2}


def test_complete_many_completes_the_held_and_reports_the_lost(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    enqueue(engine, queue, 3)
    with engine.begin() as conn:
        a, b, c = queue.claim(conn, worker_id="w", batch=3, lease=10)
    clock.advance(11)
    with engine.begin() as conn:
        queue.reclaim_expired(conn)
        clock.advance(NO_JITTER.delay(1))
        [b2] = queue.claim(conn, worker_id="w2", kinds="work", batch=1)
    assert b2.id == a.id  # the oldest came back first
    with engine.begin() as conn:
        result = queue.complete_many(
            conn, [(a.id, a.lease_token), (b.id, b.lease_token), (b2.id, b2.lease_token)]
        )
    assert result.done == [b2.id] and result.lost == [a.id, b.id]
    assert jobs_by_status(engine) == {"succeeded": 1, "pending": 2}
    assert c.id != b.id


def test_prune_deletes_only_old_finished_jobs_in_bounded_batches(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    enqueue(engine, queue, 7)
    with engine.begin() as conn:
        jobs = queue.claim(conn, worker_id="w", batch=6)
        for job in jobs[:4]:
            queue.complete(conn, job.id, job.lease_token)
        queue.fail(conn, jobs[4].id, jobs[4].lease_token, error="x")
    clock.advance(dt.timedelta(days=8))
    with engine.begin() as conn:
        enqueue(engine, queue, 1)  # fresh pending job: never pruned
        assert queue.prune(conn, older_than=dt.timedelta(days=7), batch=2) == 2
        assert queue.prune(conn, older_than=dt.timedelta(days=7), statuses=["failed"]) == 1
        assert queue.prune(conn, older_than=dt.timedelta(days=7), batch=10) == 2
        assert queue.prune(conn, older_than=dt.timedelta(days=7)) == 0
    assert jobs_by_status(engine) == {"pending": 2, "running": 1}


def test_counts(engine: Engine, queue: JobQueue) -> None:
    enqueue(engine, queue, 3)
    with engine.begin() as conn:
        queue.claim(conn, worker_id="w")
        assert queue.counts(conn) == {
            JobStatus.PENDING: 2,
            JobStatus.RUNNING: 1,
            JobStatus.SUCCEEDED: 0,
            JobStatus.FAILED: 0,
            JobStatus.CANCELLED: 0,
        }


def test_database_clock_is_the_default(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "work", {})
        [job] = queue.claim(conn, worker_id="w", lease=30)
        db_now = conn.execute(text("SELECT now()")).scalar_one()
    assert job.lease_until == db_now + dt.timedelta(seconds=30)


def test_works_in_an_orm_session(engine: Engine, queue: JobQueue) -> None:
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        result = queue.enqueue(session, "work", {"via": "session"})
    with Session(engine) as session, session.begin():
        [job] = queue.claim(session, worker_id="w")
        assert job.id == result.id
        loaded = session.get(Job, job.id)
        assert loaded is not None and loaded.status == JobStatus.RUNNING


def test_an_error_message_with_a_nul_or_a_surrogate_is_kept_escaped(
    engine: Engine, queue: JobQueue
) -> None:
    """An exception's message may hold what PostgreSQL cannot store; last_error keeps it
    escaped instead of the retry or the failure failing (and the job staying running)."""
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("a", {}), NewJob("b", {})])
        a, b = queue.claim(conn, worker_id="w", batch=2)
        queue.retry(conn, a.id, a.lease_token, error="ValueError: bad \x00 byte")
        queue.fail(conn, b.id, b.lease_token, error="UnicodeError: \udc80 undecodable")
    assert job_row(engine, a.id).last_error == "ValueError: bad \\x00 byte"
    assert job_row(engine, b.id).last_error == "UnicodeError: \\udc80 undecodable"
    assert jobs_by_status(engine) == {"pending": 1, "failed": 1}
