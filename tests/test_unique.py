"""Unique jobs (docs/unique.md) on real PostgreSQL: one insert among 8 concurrent connections,
the states a job holds its key in, time windows on a fake clock, what the key is made of,
every enqueue path (sync, engine, session, async, many, follow-ups, COPY refused), retries by
hand that meet a live duplicate (API, CLI, dashboard, a concurrent enqueue), partitioned and
not-yet-migrated tables, autogenerate, and bad input. Every test counts the rows at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.operations.ops import AddColumnOp, CreateIndexOp, ModifyTableOps
from sqlalchemy import Engine, MetaData, Table, event, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Session

import alembic_ext  # noqa: F401  (registers the autogenerate comparators)
import sa_outbox
from alembic_ext._tables import kind_from_columns
from sa_outbox import (
    AsyncJobQueue,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobMixin,
    JobQueue,
    JobStatus,
    NewJob,
    Unique,
    Worker,
)
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL
from sa_outbox.queue import EnqueueResult, retry_failed
from sa_outbox.statements import retry_failed_jobs, select_unique_held_failed_jobs, snooze_job

from .conftest import TEST_SCHEMA, WORKER_T0, Job
from .helpers import autogenerate_in, job_row, jobs_by_status, run_cli, wait_until
from .helpers_admin import JOB_MODEL

WAIT = 10.0


def rows(engine: Engine) -> list[Any]:
    """Every job: kind, status, payload, unique_key, in enqueue order."""
    t = Job.__table__
    query = select(t.c.id, t.c.kind, t.c.status, t.c.payload, t.c.unique_key).order_by(t.c.id)
    with engine.connect() as conn:
        return list(conn.execute(query).all())


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Job.__table__)).scalar_one())


def fail(engine: Engine, queue: JobQueue, job_id: uuid.UUID) -> None:
    """Claim the job (the only pending one) and fail it for good."""
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w", batch=1)
        assert job.id == job_id
        queue.fail(conn, job.id, job.lease_token, error="boom")


# -- concurrency -------------------------------------------------------------------------


def test_eight_connections_enqueue_the_same_unique_job_at_once_and_one_is_inserted(
    engine: Engine,
) -> None:
    queue = JobQueue(Job)
    start = threading.Barrier(8)
    results: dict[int, EnqueueResult] = {}
    errors: list[BaseException] = []

    def enqueue(n: int) -> None:
        try:
            with engine.begin() as conn:  # a connection of its own, in its own transaction
                conn.execute(text("SELECT 1"))
                start.wait(timeout=WAIT)
                # The same payload, its keys in one order or the other.
                payload = {"customer": 7, "report": "daily"}
                if n % 2:
                    payload = {"report": "daily", "customer": 7}
                results[n] = queue.enqueue(conn, "report", payload, unique=Unique())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    inserted = [r for r in results.values() if r.inserted]
    assert len(results) == 8 and len(inserted) == 1
    assert all(r.id is None for r in results.values() if not r.inserted)
    [row] = rows(engine)
    assert row.id == inserted[0].id and row.unique_key is not None


# -- the states a job holds its key in ---------------------------------------------------


def test_a_succeeded_job_blocks_with_the_default_states_and_not_without_succeeded(
    engine: Engine, queue: JobQueue
) -> None:
    default, live_only = Unique(), Unique(states=("running", "pending"))
    with engine.begin() as conn:
        # Different states make different keys: these two never collide with each other.
        assert queue.enqueue(conn, "sync", {"id": 1}, unique=default).inserted
        assert queue.enqueue(conn, "sync", {"id": 1}, unique=live_only).inserted
    with engine.begin() as conn:
        jobs = queue.claim(conn, worker_id="w", batch=2)
        assert not queue.enqueue(conn, "sync", {"id": 1}, unique=default).inserted
        assert not queue.enqueue(conn, "sync", {"id": 1}, unique=live_only).inserted
        queue.complete_many(conn, [(job.id, job.lease_token) for job in jobs])
    with engine.begin() as conn:
        assert not queue.enqueue(conn, "sync", {"id": 1}, unique=default).inserted
        assert queue.enqueue(conn, "sync", {"id": 1}, unique=live_only).inserted
    assert jobs_by_status(engine) == {"succeeded": 2, "pending": 1}


def test_retries_snoozes_and_reclaims_move_a_job_without_colliding_with_itself(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    unique = Unique(fields=["id"])
    with engine.begin() as conn:
        job_id = queue.enqueue(conn, "sync", {"id": 1}, unique=unique).id
    for step in ("retry", "snooze", "reclaim"):
        with engine.begin() as conn:
            [job] = queue.claim(conn, worker_id="w", batch=1, lease=30)
            if step == "retry":
                queue.retry(conn, job.id, job.lease_token, error="timeout", delay=0)
            elif step == "snooze":  # what a handler's Snooze writes
                conn.execute(snooze_job(Job, job.id, job.lease_token, delay=0, clock=clock))
        if step == "reclaim":
            clock.advance(31)
            with engine.begin() as conn:
                [reclaimed] = queue.reclaim_expired(conn)
                assert reclaimed.status is JobStatus.PENDING
            clock.advance(3600)  # past the reclaim's backoff
        with engine.begin() as conn:
            assert not queue.enqueue(conn, "sync", {"id": 1, "n": 2}, unique=unique).inserted
    [row] = rows(engine)
    assert (row.id, str(row.status)) == (job_id, "pending")


def test_a_failed_or_cancelled_job_does_not_block_by_default(
    engine: Engine, queue: JobQueue
) -> None:
    with engine.begin() as conn:
        first = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique(), max_attempts=1).id
    assert first is not None
    fail(engine, queue, first)
    with engine.begin() as conn:
        second = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique())
        assert second.inserted
        assert queue.cancel(conn, [second.id]).cancelled == [second.id]
        assert queue.enqueue(conn, "sync", {"id": 1}, unique=Unique()).inserted
    assert jobs_by_status(engine) == {"failed": 1, "cancelled": 1, "pending": 1}


# -- time windows --------------------------------------------------------------------------


def test_a_period_holds_the_key_within_its_window_on_the_fake_clock(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    hourly = Unique(period=dt.timedelta(hours=1))
    assert WORKER_T0.timestamp() % 3600 == 0  # the clock starts on a window's edge
    with engine.begin() as conn:
        assert queue.enqueue(conn, "digest", {}, unique=hourly).inserted
    clock.advance(dt.timedelta(minutes=59, seconds=59))
    with engine.begin() as conn:
        assert not queue.enqueue(conn, "digest", {}, unique=hourly).inserted
    clock.advance(1)  # the next window
    with engine.begin() as conn:
        assert queue.enqueue(conn, "digest", {}, unique=hourly).inserted
        # The same period in seconds is the same key: this window's is taken.
        assert not queue.enqueue(conn, "digest", {}, unique=Unique(period=3600)).inserted
        # Another period is another key.
        assert queue.enqueue(conn, "digest", {}, unique=Unique(period=7200)).inserted
    hour = int(WORKER_T0.timestamp()) // 3600
    keys = [row.unique_key for row in rows(engine)]
    assert [key.rsplit(":", 1)[1] for key in keys] == [str(hour), str(hour + 1), str(hour // 2)]
    assert keys[0].split(":")[0] == keys[1].split(":")[0] != keys[2].split(":")[0]


def test_a_period_on_the_database_clock(engine: Engine) -> None:
    queue = JobQueue(Job)  # now() of the database
    daily = Unique(period=dt.timedelta(days=1))
    with engine.begin() as conn:
        now = conn.execute(select(func.now())).scalar_one()
        assert queue.enqueue(conn, "digest", {}, unique=daily).inserted
        assert not queue.enqueue(conn, "digest", {}, unique=daily).inserted
    [row] = rows(engine)
    assert row.unique_key.endswith(f":{int(now.timestamp()) // 86400}")


# -- what the key is made of ---------------------------------------------------------------


def test_some_fields_of_the_payload_or_the_whole_of_it(engine: Engine, queue: JobQueue) -> None:
    by_to = Unique(fields="to")
    with engine.begin() as conn:
        assert queue.enqueue(conn, "mail", {"to": "ana", "n": 1}, unique=by_to).inserted
        assert not queue.enqueue(conn, "mail", {"n": 2, "to": "ana"}, unique=by_to).inserted
        assert queue.enqueue(conn, "mail", {"to": "bob", "n": 1}, unique=by_to).inserted
        whole = Unique()
        assert queue.enqueue(conn, "sum", {"a": 1, "b": {"x": 1, "y": 2}}, unique=whole).inserted
        assert not queue.enqueue(
            conn, "sum", {"b": {"y": 2, "x": 1}, "a": 1}, unique=whole
        ).inserted
        assert queue.enqueue(conn, "sum", {"a": 1, "b": {"x": 1, "y": 3}}, unique=whole).inserted
        # The kind is always part of the key.
        assert queue.enqueue(conn, "sum2", {"a": 1, "b": {"x": 1, "y": 2}}, unique=whole).inserted
        # Not a unique job: never refused, and it holds no key.
        assert queue.enqueue(conn, "mail", {"to": "ana", "n": 1}).inserted
    assert [(row.kind, row.unique_key is None) for row in rows(engine)] == [
        ("mail", False),
        ("mail", False),
        ("sum", False),
        ("sum", False),
        ("sum2", False),
        ("mail", True),
    ]


def test_an_explicit_key(engine: Engine, queue: JobQueue) -> None:
    mine = Unique(key="customer:7")
    with engine.begin() as conn:
        assert queue.enqueue(conn, "sync", {"v": 1}, unique=mine).inserted
        assert not queue.enqueue(conn, "sync", {"v": 2}, unique=mine).inserted
        assert queue.enqueue(conn, "sync", {"v": 1}, unique=Unique(key="customer:8")).inserted
        assert queue.enqueue(conn, "other", {"v": 1}, unique=mine).inserted
    assert count(engine) == 3


def test_by_queue(engine: Engine, queue: JobQueue) -> None:
    per_queue = Unique(by_queue=True)
    with engine.begin() as conn:
        assert queue.enqueue(conn, "sync", {}, queue="a", unique=per_queue).inserted
        assert queue.enqueue(conn, "sync", {}, queue="b", unique=per_queue).inserted
        assert not queue.enqueue(conn, "sync", {}, queue="a", unique=per_queue).inserted
        assert queue.enqueue(conn, "sync", {}, queue="a", unique=Unique()).inserted
        assert not queue.enqueue(conn, "sync", {}, queue="c", unique=Unique()).inserted
    assert count(engine) == 3


def test_a_unique_job_with_a_deduplication_key_is_skipped_by_either(
    engine: Engine, queue: JobQueue
) -> None:
    with engine.begin() as conn:
        assert queue.enqueue(
            conn, "sync", {"v": 1}, deduplication_key="d", unique=Unique()
        ).inserted
        # Its unique key is free, its deduplication key is not.
        assert not queue.enqueue(
            conn, "sync", {"v": 2}, deduplication_key="d", unique=Unique()
        ).inserted
        # Its deduplication key is free, its unique key is not.
        assert not queue.enqueue(
            conn, "sync", {"v": 1}, deduplication_key="e", unique=Unique()
        ).inserted
    assert count(engine) == 1


# -- every enqueue path --------------------------------------------------------------------


def test_every_sync_path_engine_session_and_a_connection_with_listeners(engine: Engine) -> None:
    queue = JobQueue(Job)  # the database clock: the driver's cursor where it can
    unique = Unique(key="one")
    assert queue.enqueue(engine, "sync", {}, unique=unique).inserted  # autocommit
    assert not queue.enqueue(engine, "sync", {}, unique=unique).inserted
    with Session(engine) as session, session.begin():
        assert not sa_outbox.enqueue(session, "sync", {}, model=Job, unique=unique).inserted
        result = sa_outbox.enqueue(session, "sync", {}, model=Job, unique=Unique(key="two"))
        assert result.inserted
    seen: list[str] = []
    with engine.begin() as conn:  # a listener: SQLAlchemy runs the statement itself
        event.listen(conn, "before_cursor_execute", lambda *args: seen.append(args[2]))
        assert not queue.enqueue(conn, "sync", {}, unique=unique).inserted
        assert queue.enqueue(conn, "sync", {}, unique=Unique(key="three")).inserted
        assert queue.enqueue(conn, "sync", {}).inserted  # the ordinary statement, as before
    assert len(seen) == 3 and "ON CONFLICT DO NOTHING" in seen[0]
    assert "ON CONFLICT (kind, deduplication_key)" in seen[2]
    assert sa_outbox.enqueue(engine, "sync", {}, model=Job, unique=Unique(key="four")).inserted
    assert count(engine) == 5


async def test_the_async_paths(engine: Engine, async_engine: AsyncEngine) -> None:
    queue = AsyncJobQueue(Job)
    unique = Unique(fields=["id"])
    async with async_engine.begin() as conn:
        assert (await queue.enqueue(conn, "sync", {"id": 1}, unique=unique)).inserted
        assert not (await queue.enqueue(conn, "sync", {"id": 1, "x": 0}, unique=unique)).inserted
    assert not (await queue.enqueue(async_engine, "sync", {"id": 1}, unique=unique)).inserted
    assert (await queue.enqueue(async_engine, "sync", {"id": 2}, unique=unique)).inserted
    async with AsyncSession(async_engine) as session, session.begin():
        result = await sa_outbox.enqueue(session, "sync", {"id": 2}, model=Job, unique=unique)
        assert not result.inserted
        many = await queue.enqueue_many(
            session,
            [NewJob("sync", {"id": 3}, unique=unique), NewJob("sync", {"id": 3}, unique=unique)],
        )
        assert [r.inserted for r in many] == [True, False]
    assert count(engine) == 3


def test_enqueue_many_mixes_unique_and_plain_jobs_with_a_duplicate_in_the_batch(
    engine: Engine, queue: JobQueue
) -> None:
    by_to = Unique(fields=["to"])
    with engine.begin() as conn:
        assert queue.enqueue(conn, "held", {"n": 0}, unique=Unique()).inserted
        results = queue.enqueue_many(
            conn,
            [
                NewJob("plain", {}),
                NewJob("mail", {"to": "a"}, unique=by_to),
                NewJob("plain", {}),
                NewJob("mail", {"to": "a", "x": 1}, unique=by_to),  # a duplicate in the batch
                NewJob("held", {"n": 0}, unique=Unique()),  # held by the job before
                NewJob("mail", {"to": "b"}, unique=by_to, deduplication_key="b"),
                NewJob("other", {}, deduplication_key="b"),  # another kind: its own key
                NewJob("mail", {"to": "c"}, unique=by_to, deduplication_key="b"),  # dedup
            ],
        )
    assert [r.inserted for r in results] == [True, True, True, False, False, True, True, False]
    assert [r.id is None for r in results] == [not r.inserted for r in results]
    assert sorted(row.kind for row in rows(engine)) == [
        "held",
        "mail",
        "mail",
        "other",
        "plain",
        "plain",
    ]


def test_a_handlers_unique_follow_ups_are_written_once(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    app = JobApp(Job)
    ran: list[str] = []

    @app.handler("order")
    def order(job: JobContext) -> None:
        job.enqueue(
            "invoice", {"customer": 7, "order": job.payload["n"]}, unique=Unique(fields="customer")
        )

    @app.handler("invoice")
    def invoice(job: JobContext) -> None:
        ran.append(job.kind)

    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("order", {"n": n}) for n in range(3)])
    worker = make_worker(app)
    assert worker.drain(timeout=WAIT) == 4  # three orders, one invoice
    assert ran == ["invoice"]
    assert sorted((row.kind, str(row.status)) for row in rows(engine)) == [
        ("invoice", "succeeded"),
        ("order", "succeeded"),
        ("order", "succeeded"),
        ("order", "succeeded"),
    ]


def test_enqueue_copy_refuses_unique_jobs_and_writes_nothing(
    engine: Engine, queue: JobQueue
) -> None:
    jobs = [NewJob("plain", {}), NewJob("sync", {}, unique=Unique())]
    with (
        pytest.raises(InvalidArgument, match=r"jobs\[1\]: is unique .*enqueue_many"),
        engine.begin() as conn,
    ):
        queue.enqueue_copy(conn, jobs)
    assert count(engine) == 0


# -- retries by hand that meet a live duplicate ------------------------------------------


def failed_and_live(engine: Engine, queue: JobQueue) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """A unique job that failed, the live duplicate enqueued since (pending), and a plain
    failed job."""
    with engine.begin() as conn:
        failed = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique(), max_attempts=1).id
    assert failed is not None
    fail(engine, queue, failed)
    with engine.begin() as conn:
        plain = queue.enqueue(conn, "plain", {}, max_attempts=1).id
    assert plain is not None
    fail(engine, queue, plain)
    with engine.begin() as conn:
        live = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique()).id
    assert live is not None
    return failed, live, plain


def test_a_retry_by_hand_skips_a_job_whose_key_is_held_and_says_by_which(
    engine: Engine, queue: JobQueue
) -> None:
    failed, live, plain = failed_and_live(engine, queue)
    with engine.begin() as conn:
        retried = retry_failed(conn, Job, ids=[failed])  # by id: skipped, not an error
    assert retried == [] and retried.skipped == {failed: live}
    with engine.begin() as conn:
        retried = retry_failed(conn, Job)
    assert retried == [plain] and retried.skipped == {failed: live}
    statuses = {row.id: str(row.status) for row in rows(engine)}
    assert statuses == {failed: "failed", live: "pending", plain: "pending"}
    with engine.begin() as conn:  # the statement and JobQueue's requeue skip it too
        assert conn.execute(retry_failed_jobs(Job)).all() == []
        requeued = queue.requeue_failed(conn)
        assert requeued == [] and requeued.skipped == {failed: live}
        [held] = conn.execute(select_unique_held_failed_jobs(Job, kinds="sync")).all()
        assert tuple(held) == (failed, live, JobStatus.PENDING)
    assert jobs_by_status(engine) == {"failed": 1, "pending": 2}


def test_of_several_failed_duplicates_the_first_goes_back(engine: Engine, queue: JobQueue) -> None:
    failed = []
    for _ in range(3):
        with engine.begin() as conn:
            job_id = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique(), max_attempts=1).id
        assert job_id is not None
        fail(engine, queue, job_id)
        failed.append(job_id)
    with engine.begin() as conn:
        retried = retry_failed(conn, Job, reset_attempts=True)
    first, *others = sorted(failed)
    assert retried == [first] and retried.skipped == {other: first for other in others}
    assert jobs_by_status(engine) == {"failed": 2, "pending": 1}


def test_a_unique_job_that_failed_among_its_states_keeps_its_key_when_retried(
    engine: Engine, queue: JobQueue
) -> None:
    keeps = Unique(states=["pending", "running", "failed"])
    with engine.begin() as conn:
        job_id = queue.enqueue(conn, "sync", {}, unique=keeps, max_attempts=1).id
    assert job_id is not None
    fail(engine, queue, job_id)
    with engine.begin() as conn:
        assert not queue.enqueue(conn, "sync", {}, unique=keeps).inserted  # failed holds it
        retried = retry_failed(conn, Job)
    assert retried == [job_id] and retried.skipped == {}
    assert jobs_by_status(engine) == {"pending": 1}


def test_a_retry_that_meets_a_concurrent_unique_enqueue_runs_again_and_skips_it(
    engine: Engine, queue: JobQueue
) -> None:
    """The retry's guard cannot see a unique job enqueued by a transaction still open: its
    UPDATE then waits on the unique index, and fails when that transaction commits. The
    retry by hand runs again in a savepoint, and skips the job."""
    with engine.begin() as conn:
        failed = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique(), max_attempts=1).id
    assert failed is not None
    fail(engine, queue, failed)
    outcome: dict[str, Any] = {}
    with engine.connect() as other:
        enqueueing = other.begin()
        live = queue.enqueue(other, "sync", {"id": 1}, unique=Unique()).id

        def retry() -> None:
            try:
                with engine.begin() as conn:
                    outcome["retried"] = retry_failed(conn, Job)
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=retry)
        thread.start()
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            f" AND query LIKE 'UPDATE {TEST_SCHEMA}.jobs SET%'"
        )

        def retry_waits() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(waiting).scalar())

        wait_until(retry_waits, "the retry's UPDATE waiting on the enqueue", timeout=WAIT)
        enqueueing.commit()
        thread.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["retried"] == [] and outcome["retried"].skipped == {failed: live}
    statuses = {row.id: str(row.status) for row in rows(engine)}
    assert statuses == {failed: "failed", live: "pending"}


def test_the_statement_alone_meets_the_concurrent_enqueue(engine: Engine, queue: JobQueue) -> None:
    """What `retry_failed` guards against: the bare statement fails with the unique index's
    violation (and so this test can fail: the race is real)."""
    with engine.begin() as conn:
        failed = queue.enqueue(conn, "sync", {"id": 1}, unique=Unique(), max_attempts=1).id
    assert failed is not None
    fail(engine, queue, failed)
    outcome: dict[str, Any] = {}
    with engine.connect() as other:
        enqueueing = other.begin()
        queue.enqueue(other, "sync", {"id": 1}, unique=Unique())

        def retry() -> None:
            try:
                with engine.begin() as conn:
                    conn.execute(retry_failed_jobs(Job)).all()
            except IntegrityError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=retry)
        thread.start()
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            f" AND query LIKE 'UPDATE {TEST_SCHEMA}.jobs SET%'"
        )

        def retry_waits() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(waiting).scalar())

        wait_until(retry_waits, "the retry's UPDATE waiting on the enqueue", timeout=WAIT)
        enqueueing.commit()
        thread.join(timeout=60)
    assert "jobs_unique_idx" in str(outcome["error"])
    assert jobs_by_status(engine) == {"failed": 1, "pending": 1}


def test_the_cli_says_which_jobs_it_skipped(
    engine: Engine,
    queue: JobQueue,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)
    failed, live, plain = failed_and_live(engine, queue)
    code, out, err = run_cli(capsys, "jobs", "retry", str(failed), *JOB_MODEL)
    assert (code, err) == (0, "")
    assert out == (
        "no job retried\n"
        "skipped 1 unique job(s) whose key another job holds:\n"
        f"  {failed} (key held by {live})\n"
    )
    code, out, _ = run_cli(capsys, "jobs", "retry", "--all-failed", "--json", *JOB_MODEL)
    assert code == 0
    assert json.loads(out) == {"retried": [str(plain)], "skipped": {str(failed): str(live)}}
    code, out, _ = run_cli(capsys, "jobs", "show", str(live), *JOB_MODEL)
    assert re.search(r"\nunique_states: +pending, running, succeeded\n", out)
    assert jobs_by_status(engine) == {"failed": 1, "pending": 2}


def test_the_dashboard_says_which_jobs_it_skipped(engine: Engine, queue: JobQueue) -> None:
    pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")
    from sa_outbox.dashboard import create_app

    from .test_dashboard import SECRET, client_of, token

    client = client_of(create_app(engine, jobs=Job, token=SECRET))
    failed, live, plain = failed_and_live(engine, queue)
    response = client.post(f"/jobs/{failed}/retry", data={"csrf_token": token(client)})
    assert response.status_code == 409
    assert f"job {failed} was not retried: job {live} holds its unique key" in response.get_data(
        as_text=True
    )
    response = client.post("/jobs/retry-failed", data={"csrf_token": token(client)})
    assert response.status_code == 302 and "skipped=1" in response.location
    html = client.get(response.location).get_data(as_text=True)
    assert "1 unique job(s) not retried: another job holds each one" in html
    html = client.get(f"/jobs/{live}").get_data(as_text=True)
    assert '<td id="col-unique_states">pending, running, succeeded</td>' in html
    assert str(job_row(engine, plain).status) == "pending"
    assert jobs_by_status(engine) == {"failed": 1, "pending": 2}


# -- tables that cannot take unique jobs -------------------------------------------------


def test_a_partitioned_table_refuses_unique_jobs_and_takes_the_others(engine: Engine) -> None:
    schema = f"unique_parts_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        metadata = MetaData()

    class Parts(JobMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = schema
        __partition_interval__ = "day"

    assert "jobs_unique_idx" not in {index.name for index in Parts.__table__.indexes}
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        Base.metadata.create_all(engine)
        parts = JobQueue(Parts)
        with engine.begin() as conn:
            with pytest.raises(InvalidArgument, match=r"is partitioned .*refused"):
                parts.enqueue(conn, "sync", {}, unique=Unique())
            with pytest.raises(InvalidArgument, match="is partitioned"):
                parts.enqueue_many(conn, [NewJob("a", {}), NewJob("b", {}, unique=Unique())])
            assert parts.enqueue(conn, "sync", {}).inserted
            assert parts.enqueue_many(conn, [NewJob("a", {})])[0].inserted
        with engine.connect() as conn:
            found = conn.execute(text(f"SELECT kind FROM {schema}.jobs ORDER BY kind")).all()
        assert [row.kind for row in found] == ["a", "sync"]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))


def test_a_table_made_before_unique_jobs_takes_the_others_and_autogenerate_migrates_it(
    database_url: str,
) -> None:
    """A job table made before unique jobs: still a job table (reflected, it enqueues,
    claims and retries, and refuses unique jobs naming the migration); autogenerate finds
    two columns and the index to add, then nothing (tests/test_alembic_upgrade.py runs the
    migration it writes, and the one docs/alembic.md gives)."""
    schema = f"unique_upgrade_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        metadata = MetaData()

    class Jobs(JobMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = schema

    def changes(connection: Any) -> Any:
        return autogenerate_in(connection, Base.metadata, schema)

    pg = sa.create_engine(database_url)
    try:
        with pg.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        Base.metadata.create_all(pg)
        with pg.begin() as conn:  # as the previous release made it
            conn.execute(
                text(f"ALTER TABLE {schema}.jobs DROP COLUMN unique_key, DROP COLUMN unique_states")
            )
        with pg.begin() as conn:
            old = Table("jobs", MetaData(), schema=schema, autoload_with=conn)
            assert kind_from_columns((c.name, c.type) for c in old.columns) == "job"
            before = JobQueue(old)
            assert before.enqueue(conn, "before", {}, max_attempts=1).inserted
            message = "has no unique_key and unique_states columns: add them and the index"
            with pytest.raises(InvalidArgument, match=message):
                before.enqueue(conn, "before", {}, unique=Unique())
            with pytest.raises(InvalidArgument, match=message):
                before.enqueue_many(conn, [NewJob("before", {}, unique=Unique())])
            [claimed] = before.claim(conn, worker_id="w")
            before.fail(conn, claimed.id, claimed.lease_token, error="no")
            assert retry_failed(conn, old) == [claimed.id]
        with pg.begin() as conn:
            found = changes(conn)
            [table_ops] = found.ops
            assert isinstance(table_ops, ModifyTableOps)
            added = [op for op in table_ops.ops if isinstance(op, AddColumnOp)]
            assert [op.column.name for op in added] == ["unique_key", "unique_states"]
            assert all(op.column.nullable and op.column.server_default is None for op in added)
            [index] = [op for op in table_ops.ops if isinstance(op, CreateIndexOp)]
            assert index.index_name == "jobs_unique_idx" and len(table_ops.ops) == 3
            operations = Operations(MigrationContext.configure(conn))
            for operation in table_ops.ops:
                operations.invoke(operation)
        with pg.begin() as conn:
            assert changes(conn).is_empty()
            queue = JobQueue(Jobs)
            assert queue.enqueue(conn, "after", {}, unique=Unique()).inserted
            assert not queue.enqueue(conn, "after", {}, unique=Unique()).inserted
            kinds = conn.execute(text(f"SELECT kind FROM {schema}.jobs ORDER BY kind")).all()
        assert [row.kind for row in kinds] == ["after", "before"]
    finally:
        with pg.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        pg.dispose()


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Unique(fields=[]), InvalidArgument, "must name at least one payload field"),
        (lambda: Unique(fields=["a", "a"]), InvalidArgument, "names a field twice"),
        (lambda: Unique(fields=[""]), InvalidArgument, "must not be empty"),
        (lambda: Unique(fields=3), InvalidArgumentType, "a field name or a sequence"),
        (lambda: Unique(states=["pending", "running", "done"]), InvalidArgument, "'done'"),
        (lambda: Unique(states=["pending", "succeeded"]), InvalidArgument, "missing: running"),
        (lambda: Unique(states=[]), InvalidArgument, "missing: pending, running"),
        (lambda: Unique(states="pending"), InvalidArgumentType, "a sequence of job states"),
        (lambda: Unique(period=0), InvalidArgument, "more than zero"),
        (lambda: Unique(period=-5), InvalidArgument, "more than zero"),
        (lambda: Unique(period=float("nan")), InvalidArgument, "finite"),
        (lambda: Unique(period=dt.timedelta(days=-1)), InvalidArgument, "more than zero"),
        (lambda: Unique(period=True), InvalidArgumentType, "timedelta or a number"),
        (lambda: Unique(period=1e12), InvalidArgument, "at most"),
        (lambda: Unique(key="k", fields=["a"]), InvalidArgument, "fields= or key=, not both"),
        (lambda: Unique(key=""), InvalidArgument, "must not be empty"),
        (lambda: Unique(key=7), InvalidArgumentType, "must be a str"),
        (lambda: Unique(by_queue="yes"), InvalidArgumentType, "True or False"),
    ],
)
def test_a_bad_unique_is_refused_with_a_clear_error(
    make: Callable[[], Unique], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


def test_bad_unique_jobs_are_refused_before_any_sql_and_nothing_is_written(
    engine: Engine, queue: JobQueue
) -> None:
    cases: list[tuple[Callable[[Any], Any], type[Exception], str]] = [
        (
            lambda conn: queue.enqueue(conn, "s", {}, unique="yes"),  # type: ignore[arg-type]
            InvalidArgumentType,
            r"unique must be a Unique\(\.\.\.\)",
        ),
        (
            lambda conn: queue.enqueue(conn, "s", [1], unique=Unique(fields="a")),
            InvalidArgument,
            "needs a payload that is a JSON object, got list",
        ),
        (
            lambda conn: queue.enqueue(conn, "s", {"b": 1}, unique=Unique(fields=["a", "b"])),
            InvalidArgument,
            "the payload has no field 'a'",
        ),
        (
            lambda conn: queue.enqueue_many(
                conn, [NewJob("s", {"a": 1}), NewJob("s", {}, unique=Unique(fields="a"))]
            ),
            InvalidArgument,
            "job kind 's': the payload has no field 'a'",
        ),
        (
            lambda conn: queue.enqueue_many(conn, [NewJob("s", {}, unique=Unique)]),  # type: ignore[arg-type]
            InvalidArgumentType,
            "got type",
        ),
    ]
    for action, error, message in cases:
        with pytest.raises(error, match=message), engine.begin() as conn:
            action(conn)
    assert count(engine) == 0


def test_a_unique_states_array_in_the_model_follows_each_tables_schema() -> None:
    """The copies of the mixin's array column share their element type: each table gets one
    of its own, in its own schema, that never emits CREATE TYPE."""

    class Base(DeclarativeBase):
        metadata = MetaData()

    class One(JobMixin, Base):
        __tablename__ = "one"
        __table_schema__ = "s1"

    class Two(JobMixin, Base):
        __tablename__ = "two"
        __table_schema__ = "s2"

    one, two = (model.__table__.c.unique_states.type.item_type for model in (One, Two))
    assert (one.schema, two.schema) == ("s1", "s2") and one is not two
    assert not one.create_type and not two.create_type
