"""Batched writes to held rows lock them in one order (issue 18, item 1).

A worker's keeper heartbeats every job it holds while its loop completes some of them, on
two connections at once. Both statements take row locks; if each takes them in its own
order (the order of the pairs it was given), they deadlock, PostgreSQL cancels one after
``deadlock_timeout``, and a failed heartbeat may cancel healthy handlers. Every batched
update of held rows now locks them in ``id`` order, so two of them wait for each other at
most, never in a cycle.

Two proofs on real connections: a reproduction that deadlocked before (the heartbeat and
the completion of the same 300 jobs, pairs in opposite orders, started together, 15
rounds), and a direct one (a row held by a third session stops the statement; the rows
below it are locked already, the rows above it not yet).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from sa_outbox import FakeClock, JobQueue, NewJob
from sa_outbox import statements as st

from .conftest import Job
from .helpers import jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
TABLE = Job.__table__.fullname
ROWS = 300
ROUNDS = 15


@pytest.fixture
def queue() -> JobQueue:
    return JobQueue(Job, clock=FakeClock(T0))


def _hold(engine: Engine, queue: JobQueue, n: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("work", {"n": i}) for i in range(n)])
        jobs = queue.claim(conn, worker_id="w1", batch=n)
    return [(j.id, j.lease_token) for j in jobs]


def _deadlocked(error: BaseException) -> bool:
    return isinstance(error, DBAPIError) and getattr(error.orig, "sqlstate", None) == "40P01"


def _run_together(
    engine: Engine, start: threading.Barrier, stmt: Any, errors: list[BaseException]
) -> None:
    try:
        with engine.begin() as conn:
            start.wait()
            conn.execute(stmt)
    except BaseException as exc:
        errors.append(exc)


def test_heartbeat_and_completion_of_the_same_jobs_never_deadlock(engine, queue):
    deadlocks = 0
    for _ in range(ROUNDS):
        pairs = _hold(engine, queue, ROWS)
        start = threading.Barrier(2)
        errors: list[BaseException] = []
        # The keeper renews in one order, the loop acknowledges in the other.
        beat = st.heartbeat_jobs(Job, list(reversed(pairs)), clock=FakeClock(T0))
        done = st.complete_jobs(Job, pairs, clock=FakeClock(T0))
        threads = [
            threading.Thread(target=_run_together, args=(engine, start, stmt, errors))
            for stmt in (beat, done)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        deadlocks += sum(_deadlocked(e) for e in errors)
        assert all(_deadlocked(e) for e in errors), errors
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {TABLE}"))
    assert deadlocks == 0


def _wait_until_blocked(engine: Engine, pid: int) -> None:
    # Across connections there is no event to wait on: poll the server's view, bounded.
    deadline = time.monotonic() + 10
    with engine.connect() as watcher:
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            ).scalar()
            if waiting == "Lock":
                return
            watcher.rollback()
            time.sleep(0.01)
    raise AssertionError("the statement never waited for the held row")


def _locked_now(engine: Engine, job_id: uuid.UUID) -> bool:
    with engine.begin() as conn:
        try:
            conn.execute(
                text(f"SELECT 1 FROM {TABLE} WHERE id = :id FOR UPDATE NOWAIT"), {"id": job_id}
            )
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            return True
    return False


STATEMENTS: dict[str, Callable[[list[tuple[uuid.UUID, uuid.UUID]]], Any]] = {
    "heartbeat_jobs": lambda pairs: st.heartbeat_jobs(Job, pairs, clock=FakeClock(T0)),
    "complete_jobs": lambda pairs: st.complete_jobs(Job, pairs, clock=FakeClock(T0)),
    "release_jobs": lambda pairs: st.release_jobs(Job, pairs, clock=FakeClock(T0)),
    "complete_and_claim_jobs": lambda pairs: st.complete_and_claim_jobs(
        Job, pairs, worker_id="w1", batch=5, clock=FakeClock(T0)
    ),
}


def _reverse_physical_order(engine: Engine, ids: list[uuid.UUID]) -> None:
    # Whatever way the planner reaches the rows, it meets the highest id first: each UPDATE
    # writes a new row version after the others (a sequential scan), and the later the id,
    # the earlier its lease ends (a scan of the expired-lease index).
    with engine.begin() as conn:
        for rank, job_id in enumerate(sorted(ids, reverse=True)):
            conn.execute(
                text(
                    f"UPDATE {TABLE} SET lease_until = lease_until + make_interval(secs => :k)"
                    " WHERE id = :id"
                ),
                {"id": job_id, "k": rank},
            )


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_a_batched_write_locks_its_rows_in_id_order(engine, queue, name):
    pairs = sorted(_hold(engine, queue, 9))
    _reverse_physical_order(engine, [job_id for job_id, _ in pairs])
    low, middle, high = pairs[:4], pairs[4], pairs[5:]
    given = [*reversed(high), middle, *reversed(low)]  # the highest id first
    with engine.connect() as locker, locker.begin():
        locker.execute(text(f"SELECT 1 FROM {TABLE} WHERE id = :id FOR UPDATE"), {"id": middle[0]})
        with engine.connect() as writer:
            pid = writer.execute(text("SELECT pg_backend_pid()")).scalar_one()
            writer.rollback()
            done = threading.Event()

            def write() -> None:
                with writer.begin():
                    writer.execute(STATEMENTS[name](given))
                done.set()

            thread = threading.Thread(target=write)
            thread.start()
            try:
                _wait_until_blocked(engine, pid)
                assert [_locked_now(engine, job_id) for job_id, _ in low] == [True] * 4
                assert [_locked_now(engine, job_id) for job_id, _ in high] == [False] * 4
            finally:
                locker.rollback()
                thread.join(10)
            assert done.is_set()
    counts = jobs_by_status(engine)
    assert sum(counts.values()) == 9
