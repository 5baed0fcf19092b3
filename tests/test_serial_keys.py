"""Serial keys: jobs sharing a ``lock_key`` run one at a time, in commit order (issue 13).

Real PostgreSQL. The table's serial trigger orders each key's jobs by commit (a per-key
lock, then the WAL position); the claim takes a job of a key only when no job of the key
runs and none before it is pending. Time comes from a `FakeClock`; every test counts the
jobs at the end.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from typing import Any

import pytest
from alembic.autogenerate import render_python_code
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.operations.ops import AddColumnOp, ModifyTableOps
from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.orm import DeclarativeBase

import alembic_ext
from sa_outbox import FakeClock, InvalidArgument, JobApp, JobQueue, NewJob
from sa_outbox.schema import JobMixin

from .conftest import TEST_SCHEMA, Job
from .helpers import (
    autogenerate_in,
    database_clock,
    jobs_by_status,
    unfinished_jobs,
    wait_until,
    waits_on_advisory_lock,
)

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def queue(clock: FakeClock) -> JobQueue:
    return JobQueue(Job, clock=clock)


def claim(engine: Engine, queue: JobQueue, batch: int = 50) -> list[Any]:
    with engine.begin() as conn:
        return queue.claim(conn, worker_id="w", batch=batch)


def complete(engine: Engine, queue: JobQueue, jobs: list[Any]) -> None:
    if jobs:
        with engine.begin() as conn:
            queue.complete_many(conn, [(job.id, job.lease_token) for job in jobs])


def test_a_key_runs_one_job_at_a_time_in_enqueue_order(engine: Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        for n in range(4):
            queue.enqueue(conn, "charge", {"n": n}, lock_key="account:1")
            queue.enqueue(conn, "refund", {"n": n}, lock_key="account:2")
        queue.enqueue(conn, "other", {})
    order: dict[str, list[int]] = {"account:1": [], "account:2": []}
    rounds = 0
    while jobs_by_status(engine).get("pending"):
        taken = claim(engine, queue)
        keys = [job.payload.get("n") for job in taken if job.kind != "other"]
        assert len(keys) <= 2, taken  # one job per key at most
        for job in taken:
            if job.kind == "charge":
                order["account:1"].append(job.payload["n"])
            elif job.kind == "refund":
                order["account:2"].append(job.payload["n"])
        complete(engine, queue, taken)
        rounds += 1
    assert order == {"account:1": [0, 1, 2, 3], "account:2": [0, 1, 2, 3]}
    assert rounds == 4
    assert jobs_by_status(engine) == {"succeeded": 9}


def test_kinds_share_a_key_and_a_retry_keeps_its_place(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    with engine.begin() as conn:
        queue.enqueue(conn, "charge", {"n": 0}, lock_key="order:7")
        queue.enqueue(conn, "ship", {"n": 1}, lock_key="order:7")
    [first] = claim(engine, queue)
    assert first.kind == "charge"
    with engine.begin() as conn:  # a transient failure: back to pending, a minute later
        queue.retry(conn, first.id, first.lease_token, error="timeout", delay=60)
    assert claim(engine, queue) == []  # "ship" waits behind the pending "charge"
    clock.advance(60)
    [again] = claim(engine, queue)
    assert again.id == first.id
    complete(engine, queue, [again])
    [ship] = claim(engine, queue)
    assert ship.kind == "ship"
    complete(engine, queue, [ship])
    assert jobs_by_status(engine) == {"succeeded": 2}


def test_a_failed_or_cancelled_job_lets_the_next_one_run(engine: Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        ids = [queue.enqueue(conn, "step", {"n": n}, lock_key="k").id for n in range(3)]
        queue.cancel(conn, [ids[0]])
    [second] = claim(engine, queue)
    assert second.id == ids[1]
    with engine.begin() as conn:
        queue.fail(conn, second.id, second.lease_token, error="bad payload")
    [third] = claim(engine, queue)
    assert third.id == ids[2]
    complete(engine, queue, [third])
    assert jobs_by_status(engine) == {"cancelled": 1, "failed": 1, "succeeded": 1}


def test_the_order_is_the_order_of_commits_not_of_transactions(
    engine: Engine, queue: JobQueue
) -> None:
    # B's transaction starts first (its now() is earlier), A's commits first: A's job runs
    # first. And while A holds its key, B's insert of the same key waits for A's commit.
    done: list[str] = []
    with engine.connect() as a, engine.connect() as b:
        b.begin()
        b.execute(text("SELECT 1"))  # B's transaction has begun
        b_pid = b.execute(text("SELECT pg_backend_pid()")).scalar()
        a.begin()
        queue.enqueue(a, "step", {"by": "A"}, lock_key="k")

        def insert_b() -> None:
            queue.enqueue(b, "step", {"by": "B"}, lock_key="k")
            b.commit()
            done.append("B")

        thread = threading.Thread(target=insert_b)
        thread.start()
        try:
            wait_until(lambda: waits_on_advisory_lock(engine, b_pid), "B to wait for the key", 30)
            assert done == []
            a.commit()
        finally:
            thread.join(30)
    assert done == ["B"]
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT payload->>'by', created_at, lock_seq FROM {TEST_SCHEMA}.jobs "
                "ORDER BY lock_seq"
            )
        ).all()
    assert [row[0] for row in rows] == ["A", "B"]
    assert rows[1][1] <= rows[0][1]  # B's transaction began first: created_at says B, A
    [first] = claim(engine, queue)
    assert first.payload == {"by": "A"}
    assert claim(engine, queue) == []
    complete(engine, queue, [first])
    [second] = claim(engine, queue)
    assert second.payload == {"by": "B"}
    complete(engine, queue, [second])
    assert jobs_by_status(engine) == {"succeeded": 2}


def test_eight_concurrent_claimers_never_overlap_a_key_and_keep_its_order(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    jobs = [
        NewJob("step", {"key": f"k{n % 4}", "n": n // 4}, lock_key=f"k{n % 4}") for n in range(80)
    ]
    jobs += [NewJob("free", {"n": n}) for n in range(40)]
    with engine.begin() as conn:
        queue.enqueue_many(conn, jobs)
    ledger: list[tuple[float, float, str, int]] = []
    guard = threading.Lock()
    errors: list[BaseException] = []
    deadline = time.monotonic() + 120

    def claimer(n: int) -> None:
        try:
            own = JobQueue(Job, clock=clock)
            while time.monotonic() < deadline:
                with engine.begin() as conn:
                    taken = own.claim(conn, worker_id=f"c{n}", batch=1 + n % 4)
                started = database_clock(engine)
                if not taken:
                    if unfinished_jobs(engine) == 0:
                        return
                    continue
                time.sleep(0.003)  # the jobs' work: other claimers take their turns
                ended = database_clock(engine)
                with engine.begin() as conn:
                    own.complete_many(conn, [(job.id, job.lease_token) for job in taken])
                with guard:
                    ledger.extend(
                        (started, ended, job.payload["key"], job.payload["n"])
                        for job in taken
                        if job.kind == "step"
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert jobs_by_status(engine) == {"succeeded": 120}
    assert len(ledger) == 80
    for key in ("k0", "k1", "k2", "k3"):
        runs = sorted((start, end, n) for start, end, k, n in ledger if k == key)
        assert [n for _, _, n in runs] == list(range(20))  # in enqueue order
        assert all(runs[i][1] <= runs[i + 1][0] for i in range(19))  # never two at once
    # Different keys did run side by side.
    spans = sorted((start, end) for start, end, _, _ in ledger)
    assert any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1))


def test_a_worker_runs_a_key_in_order_with_free_handlers(
    engine: Engine, queue: JobQueue, make_worker: Any
) -> None:
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("step", {"n": n}, lock_key="k") for n in range(6)])
    seen: list[int] = []
    app = JobApp(Job)
    app.register("step", lambda job: seen.append(job.payload["n"]))
    worker = make_worker(app, concurrency=8)
    assert worker.drain(30) == 6
    assert seen == list(range(6))
    assert jobs_by_status(engine) == {"succeeded": 6}


def test_bad_serial_keys_are_refused_before_any_sql(engine: Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match="lock_key must not be empty"):
            queue.enqueue(conn, "step", {}, lock_key="")
        with pytest.raises(InvalidArgument, match="lock_key"):
            queue.enqueue(conn, "step", {}, lock_key="x" * 10_000)
        with pytest.raises(InvalidArgument, match="COPY does not take serial jobs"):
            queue.enqueue_copy(conn, [NewJob("step", {}, lock_key="k")])
    assert jobs_by_status(engine) == {}


def test_autogenerate_adds_serial_keys_to_an_existing_install(database_url: str) -> None:
    """A job table made before serial keys: autogenerate adds the two columns, the index and
    the trigger; a second autogenerate is empty; serial jobs then run in order."""
    schema = f"serial_upgrade_{uuid.uuid4().hex[:8]}"

    class New(DeclarativeBase):
        metadata = MetaData()

    class NewJobs(JobMixin, New):
        __tablename__ = "jobs"
        __table_schema__ = schema

    def changes(connection: Any) -> Any:
        return autogenerate_in(connection, New.metadata, schema)

    pg = create_engine(database_url)
    try:
        with pg.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
            operations = Operations(MigrationContext.configure(conn))
            operations.invoke(alembic_ext.CreateJobQueueOp("jobs", schema=schema))
            # As an earlier release made it: no serial columns, index or trigger.
            conn.execute(text(f"DROP TRIGGER jobs_serial ON {schema}.jobs"))
            conn.execute(text(f"DROP FUNCTION {schema}.jobs_serial()"))
            conn.execute(text(f"ALTER TABLE {schema}.jobs DROP COLUMN lock_key, DROP lock_seq"))
        with pg.begin() as conn:
            found = changes(conn)
            rendered = render_python_code(found)
            assert "op.add_column('jobs', sa.Column('lock_key'" in rendered
            assert "op.create_index('jobs_serial_idx'" in rendered
            assert "op.create_serial_trigger('jobs', schema=" in rendered
            operations = Operations(MigrationContext.configure(conn))
            for op in found.ops:
                for each in op.ops if isinstance(op, ModifyTableOps) else [op]:
                    operations.invoke(each)
            assert any(
                isinstance(each, AddColumnOp)
                for op in found.ops
                if isinstance(op, ModifyTableOps)
                for each in op.ops
            )
        with pg.begin() as conn:
            again = changes(conn)
            assert again.ops == [], render_python_code(again)
            upgraded = JobQueue(NewJobs)
            first = upgraded.enqueue(conn, "step", {"n": 0}, lock_key="k").id
            upgraded.enqueue(conn, "step", {"n": 1}, lock_key="k")
        with pg.begin() as conn:
            taken = upgraded.claim(conn, worker_id="w", batch=5)
            assert [job.id for job in taken] == [first]
    finally:
        with pg.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        pg.dispose()
