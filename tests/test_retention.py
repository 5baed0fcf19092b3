"""Batched retention (`Pruner` / `AsyncPruner`) and table health, on real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, insert, select, text

from sa_outbox import (
    AsyncPruner,
    AsyncWorker,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    PermanentError,
    Pruner,
    Retention,
    Worker,
)
from sa_outbox.cli import ENV_DATABASE_URL, main
from sa_outbox.maintenance import table_health
from sa_outbox.statements import prune_lock

from .conftest import Job, OutboxEvent
from .helpers import jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
JOBS = Job.__table__
EVENTS = OutboxEvent.__table__

#: (status, age, how many): what `seed` inserts into the job table.
JOB_ROWS = [
    ("succeeded", 2 * DAY, 25),
    ("succeeded", dt.timedelta(hours=1), 3),
    ("failed", 40 * DAY, 7),
    ("failed", 10 * DAY, 2),
    ("pending", 100 * DAY, 4),
    ("running", 100 * DAY, 3),
]
#: (published, parked, age, how many): what `seed` inserts into the outbox.
EVENT_ROWS = [
    (True, False, 9 * DAY, 12),
    (True, False, DAY, 2),
    (False, False, 100 * DAY, 3),
    (False, True, 100 * DAY, 2),
]
POLICY = Retention(succeeded=DAY, failed=30 * DAY, published=7 * DAY, batch=4)


def seed(engine: Engine, *, scale: int = 1, now: dt.datetime = T0) -> None:
    with engine.begin() as conn:
        for status, age, n in JOB_ROWS:
            when = now - age
            conn.execute(
                insert(JOBS),
                [
                    {"kind": "k", "payload": {}, "status": status, "updated_at": when}
                    | {"created_at": when, "run_at": when}
                    for _ in range(n * scale)
                ],
            )
        for published, parked, age, n in EVENT_ROWS:
            when = now - age
            conn.execute(
                insert(EVENTS),
                [
                    {"aggregate_type": "a", "aggregate_id": "1", "event_type": "e", "payload": {}}
                    | {"created_at": when, "published_at": when if published else None}
                    | {"parked_at": when if parked else None}
                    for _ in range(n * scale)
                ],
            )


def job_counts(engine: Engine, now: dt.datetime = T0) -> dict[tuple[str, bool], int]:
    """(status, older than its window) -> rows left."""
    old = {"succeeded": now - DAY, "failed": now - 30 * DAY}
    with engine.connect() as conn:
        rows = conn.execute(select(JOBS.c.status, JOBS.c.updated_at)).all()
    found: dict[tuple[str, bool], int] = {}
    for status, updated in rows:
        key = (str(status), updated < old.get(str(status), now - 1000 * DAY))
        found[key] = found.get(key, 0) + 1
    return found


def event_counts(engine: Engine, now: dt.datetime = T0) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            "old published": conn.execute(
                select(func.count()).where(EVENTS.c.published_at < now - 7 * DAY)
            ).scalar_one(),
            "recent published": conn.execute(
                select(func.count()).where(EVENTS.c.published_at >= now - 7 * DAY)
            ).scalar_one(),
            "unpublished": conn.execute(
                select(func.count()).where(EVENTS.c.published_at.is_(None))
            ).scalar_one(),
        }


KEPT_JOBS = {
    ("succeeded", False): 3,
    ("failed", False): 2,
    ("pending", False): 4,
    ("running", False): 3,
}


def test_prunes_each_window_in_bounded_batches_and_keeps_the_rest(engine):
    seed(engine)
    seen: list[tuple[str, str, int]] = []
    pruner = Pruner(
        engine,
        jobs=Job,
        outbox=OutboxEvent,
        retention=POLICY,
        clock=FakeClock(T0),
        progress=lambda table, what, n, report: seen.append((table, what, n)),
    )
    report = pruner.run_once()
    assert (report.succeeded, report.failed, report.published) == (25, 7, 12)
    assert report.deleted == 44 and report.skipped == []
    # batches of at most 4, each its own transaction, until one deletes fewer than 4
    assert [n for _, what, n in seen if what == "succeeded"] == [4, 4, 4, 4, 4, 4, 1]
    assert [n for _, what, n in seen if what == "failed"] == [4, 3]
    assert [n for _, what, n in seen if what == "cancelled"] == [0]  # none to prune
    assert [n for _, what, n in seen if what == "published"] == [4, 4, 4, 0]
    assert report.batches == len(seen) == 14
    assert {table for table, _, _ in seen} == {JOBS.fullname, EVENTS.fullname}
    assert job_counts(engine) == KEPT_JOBS
    assert event_counts(engine) == {"old published": 0, "recent published": 2, "unpublished": 5}
    # a second round finds nothing
    assert pruner.run_once().deleted == 0
    assert job_counts(engine) == KEPT_JOBS


def test_none_keeps_that_kind_of_row_forever(engine):
    seed(engine)
    policy = Retention(succeeded=None, failed=30 * DAY, published=None)
    report = Pruner(
        engine, jobs=Job, outbox=OutboxEvent, retention=policy, clock=FakeClock(T0)
    ).run_once()
    assert (report.succeeded, report.failed, report.published) == (0, 7, 0)
    assert job_counts(engine)[("succeeded", True)] == 25
    assert event_counts(engine)["old published"] == 12


def test_a_held_lock_makes_the_pruner_skip_the_table(engine):
    seed(engine)
    pruner = Pruner(engine, jobs=Job, outbox=OutboxEvent, retention=POLICY, clock=FakeClock(T0))
    with engine.connect() as other:
        assert other.execute(prune_lock(Job)).scalar() is True  # another pruner, mid-batch
        report = pruner.run_once()
        assert report.skipped == [JOBS.fullname]
        assert (report.succeeded, report.failed, report.published) == (0, 0, 12)
        other.rollback()
    assert job_counts(engine)[("succeeded", True)] == 25
    report = pruner.run_once()
    assert (report.succeeded, report.failed, report.skipped) == (25, 7, [])
    assert job_counts(engine) == KEPT_JOBS


@pytest.fixture
def watched_engine(database_url: str, engine: Engine) -> Iterator[tuple[Engine, dict[str, int]]]:
    """An engine that records, per table, how many transactions with a DELETE are open."""
    eng = create_engine(database_url, pool_size=8)
    lock = threading.Lock()
    stats = {"jobs open": 0, "jobs max": 0, "outbox open": 0, "outbox max": 0, "deletes": 0}

    @event.listens_for(eng, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE") and "deleting" not in conn.info:
            table = "jobs" if f"DELETE FROM {JOBS.fullname} " in statement else "outbox"
            conn.info["deleting"] = table
            with lock:
                stats[f"{table} open"] += 1
                stats["deletes"] += 1
                stats[f"{table} max"] = max(stats[f"{table} max"], stats[f"{table} open"])

    def end(conn: Any) -> None:  # fires before the COMMIT that releases the lock
        table = conn.info.pop("deleting", None)
        if table is not None:
            with lock:
                stats[f"{table} open"] -= 1

    event.listen(eng, "commit", end)
    event.listen(eng, "rollback", end)
    yield eng, stats
    eng.dispose()


def test_concurrent_pruners_never_delete_at_once_and_delete_only_finished(watched_engine):
    eng, stats = watched_engine
    seed(eng, scale=8)
    pruners = 6
    barrier = threading.Barrier(pruners)
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        pruner = Pruner(eng, jobs=Job, outbox=OutboxEvent, retention=POLICY, clock=FakeClock(T0))
        barrier.wait()
        try:
            for _ in range(3):
                reports.append(pruner.run_once())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(pruners)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # one DELETE at a time on each table (the two tables have locks of their own)
    assert stats["deletes"] > 0 and stats["jobs max"] == 1 and stats["outbox max"] == 1
    assert sum(r.succeeded for r in reports) == 25 * 8
    assert sum(r.failed for r in reports) == 7 * 8
    assert sum(r.published for r in reports) == 12 * 8
    assert job_counts(eng) == {key: n * 8 for key, n in KEPT_JOBS.items()}
    assert event_counts(eng) == {"old published": 0, "recent published": 16, "unpublished": 40}


async def test_async_pruner(engine, async_engine):
    seed(engine)
    report = await AsyncPruner(
        async_engine, jobs=Job, outbox=OutboxEvent, retention=POLICY, clock=FakeClock(T0)
    ).run_once()
    assert (report.succeeded, report.failed, report.published) == (25, 7, 12)
    assert job_counts(engine) == KEPT_JOBS
    async with async_engine.connect() as other:
        assert (await other.execute(prune_lock(Job))).scalar() is True
        report = await AsyncPruner(async_engine, jobs=Job, retention=POLICY).run_once()
        assert report.skipped == [JOBS.fullname]
        await other.rollback()
    assert job_counts(engine) == KEPT_JOBS


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"succeeded": -1}, InvalidArgument, "succeeded must be zero or more"),
        ({"failed": "30d"}, InvalidArgumentType, "failed must be a timedelta"),
        ({"batch": 0}, InvalidArgument, "batch must be between 1"),
        ({"interval": 0}, InvalidArgument, "interval must be more than zero"),
    ],
)
def test_bad_retention_is_refused(engine, kwargs, error, message):
    seed(engine)
    with pytest.raises(error, match=message):
        Retention(**kwargs)
    with pytest.raises(InvalidArgument, match="needs a job model"):
        Pruner(engine)
    with pytest.raises(InvalidArgumentType, match="must be a Retention"):
        Pruner(engine, jobs=Job, retention=7)  # type: ignore[arg-type]
    assert sum(job_counts(engine).values()) == 44


def test_table_health_reports_every_field(engine):
    clock = FakeClock(T0)
    seed(engine)
    with engine.begin() as conn:
        conn.execute(insert(JOBS).values(kind="later", payload={}, run_at=T0 + DAY))
        conn.execute(
            insert(JOBS).values(kind="ready", payload={}, run_at=T0 - dt.timedelta(minutes=5))
        )
    with engine.connect() as conn:
        before = table_health(conn, jobs=Job, outbox=OutboxEvent, clock=clock)
    assert before.jobs is not None and before.outbox is not None
    assert before.jobs.table == JOBS.fullname and before.outbox.table == EVENTS.fullname
    assert before.jobs.rows == {
        "pending": 6,
        "running": 3,
        "succeeded": 28,
        "failed": 9,
        "cancelled": 0,
    }
    # the oldest ready pending job: seeded 100 days ago; the future one does not count
    assert before.jobs.oldest_pending_age == 100 * DAY
    assert before.outbox.rows == {"published": 14, "unpublished": 3, "parked": 2}
    assert before.outbox.oldest_pending_age is None

    # dead tuples: delete, flush this backend's statistics, read them from another session
    with engine.begin() as conn:
        conn.execute(JOBS.delete().where(JOBS.c.status == "succeeded"))
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
    with engine.connect() as conn:
        dead = table_health(conn, jobs=Job, clock=clock).jobs
    assert dead is not None and dead.dead_tuples is not None and dead.dead_tuples >= 28
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(f"VACUUM (ANALYZE) {JOBS.fullname}")
        )
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
    with engine.connect() as conn:
        after = table_health(conn, jobs=Job, clock=clock)
    assert after.jobs is not None and after.outbox is None
    # vacuum removed the dead rows; live tuples are the statistics' estimate (an int)
    assert after.jobs.dead_tuples is not None and after.jobs.dead_tuples < dead.dead_tuples
    assert isinstance(after.jobs.live_tuples, int) and after.jobs.live_tuples >= 0
    for now_, then in (
        (after.jobs.last_vacuum, dead.last_vacuum),
        (after.jobs.last_analyze, dead.last_analyze),
    ):
        assert isinstance(now_, dt.datetime) and (then is None or now_ > then)
    # autovacuum is the server's to schedule: whatever it did is reported as it is
    for field in (after.jobs.last_autovacuum, after.jobs.last_autoanalyze):
        assert field is None or isinstance(field, dt.datetime)
    sizes = after.jobs
    assert sizes.table_bytes > 0 and sizes.index_bytes > 0
    assert sizes.total_bytes >= sizes.table_bytes + sizes.index_bytes
    assert after.jobs.rows["succeeded"] == 0 and after.jobs.rows["pending"] == 6


def test_table_health_reports_the_session_holding_back_xmin(engine):
    with engine.connect() as holder:
        holder.execution_options(isolation_level="REPEATABLE READ")
        pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        holder.execute(select(func.count()).select_from(JOBS))  # takes the snapshot
        with engine.connect() as conn:
            report = table_health(conn, jobs=Job)
        held = [h for h in report.xmin_holders if h.pid == pid]
        assert len(held) == 1
        (mine,) = held
        assert mine.state == "idle in transaction"
        assert mine.xmin_age >= 0
        assert mine.transaction_start is not None and mine.query_start is not None
        assert mine.query_start >= mine.transaction_start
        assert mine.transaction_age is not None and mine.transaction_age >= dt.timedelta(0)
        assert report.oldest_xmin == report.xmin_holders[0]
        ages = [h.xmin_age for h in report.xmin_holders]
        assert ages == sorted(ages, reverse=True)
        holder.rollback()
    with engine.connect() as conn:
        report = table_health(conn, jobs=Job)
    assert pid not in [h.pid for h in report.xmin_holders]
    assert report.jobs is not None and sum(report.jobs.rows.values()) == 0


def test_table_health_needs_a_table(engine):
    with engine.connect() as conn, pytest.raises(InvalidArgument, match="needs a job model"):
        table_health(conn)


# -- on a schedule inside the worker ---------------------------------------------------------


def worker_setup(engine: Engine, clock: FakeClock) -> JobApp:
    app = JobApp(Job)

    @app.handler("ok")
    def ok(job: JobContext) -> None:
        pass

    @app.handler("bad")
    def bad(job: JobContext) -> None:
        raise PermanentError("no")

    with engine.begin() as conn:
        queue = JobQueue(Job, clock=clock)
        queue.enqueue_many(conn, [NewJob("ok", {"n": i}) for i in range(5)])
        queue.enqueue_many(conn, [NewJob("bad", {"n": i}) for i in range(2)])
        queue.enqueue_many(conn, [NewJob("ok", {}, run_at=T0 + 100 * DAY)])  # stays pending
    return app


WORKER_POLICY = Retention(succeeded=3600, failed=None, interval=600, batch=2)


def test_the_worker_prunes_on_its_schedule(engine):
    clock = FakeClock(T0)
    app = worker_setup(engine, clock)
    worker = Worker(
        app,
        engine,
        clock=clock,
        timer=lambda: clock.now().timestamp(),
        listen=False,
        install_signal_handlers=False,
        retention=WORKER_POLICY,
    )
    try:
        assert worker.drain(timeout=30) == 7
        assert jobs_by_status(engine) == {"succeeded": 5, "failed": 2, "pending": 1}
        assert worker.prune_due() is None  # the first round is an interval (± 20 %) away
        clock.advance(479)
        assert worker.prune_due() is None
        clock.advance(242)  # 721 s: due; the succeeded jobs are not an hour old yet
        report = worker.prune_due()
        # one batch per window: succeeded, cancelled (the policy keeps failed jobs)
        assert report is not None and (report.succeeded, report.batches) == (0, 2)
        assert worker.prune_due() is None  # not due again at once
        clock.advance(3600)
        report = worker.prune_due()
        assert report is not None and (report.succeeded, report.failed) == (5, 0)
        assert report.batches == 4  # 2 + 2 + 1, and one for the cancelled jobs (none)
    finally:
        worker.close()
    assert jobs_by_status(engine) == {"failed": 2, "pending": 1}


def test_a_worker_without_a_policy_does_not_prune(engine):
    clock = FakeClock(T0)
    app = worker_setup(engine, clock)
    worker = Worker(app, engine, clock=clock, listen=False, install_signal_handlers=False)
    try:
        worker.drain(timeout=30)
        clock.advance(100 * DAY)
        assert worker.pruner is None and worker.prune_due() is None
        with pytest.raises(InvalidArgument, match="no retention policy"):
            worker.prune()
    finally:
        worker.close()
    assert jobs_by_status(engine) == {"succeeded": 5, "failed": 2, "pending": 1}


async def test_the_async_worker_prunes_on_its_schedule(engine, async_engine):
    clock = FakeClock(T0)
    app = worker_setup(engine, clock)
    worker = AsyncWorker(
        app,
        async_engine,
        clock=clock,
        timer=lambda: clock.now().timestamp(),
        listen=False,
        install_signal_handlers=False,
        retention=WORKER_POLICY,
    )
    try:
        assert await worker.drain(timeout=30) == 7
        assert await worker.prune_due() is None
        clock.advance(721)
        report = await worker.prune_due()
        assert report is not None and report.succeeded == 0
        clock.advance(3600)
        report = await worker.prune_due()
        assert report is not None and (report.succeeded, report.failed) == (5, 0)
    finally:
        worker.close()
    assert jobs_by_status(engine) == {"failed": 2, "pending": 1}


# -- the command line ----------------------------------------------------------------------

NOW = dt.datetime.now(dt.UTC)
SEEDED_JOBS = {
    ("succeeded", True): 25,
    ("succeeded", False): 3,
    ("failed", True): 7,
    ("failed", False): 2,
    ("pending", False): 4,
    ("running", False): 3,
}
SEEDED_EVENTS = {"old published": 12, "recent published": 2, "unpublished": 5}


def test_cli_prunes_in_batches_with_progress(engine, database_url, capsys):
    seed(engine, now=NOW)
    argv = ["prune", "--model", "tests.conftest:Job", "--older-than", "1d"]
    argv += ["--failed-older-than", "30d", "--outbox-model", "tests.conftest:OutboxEvent"]
    argv += ["--outbox-older-than", "7d"]
    argv += ["--batch", "4", "--progress-every", "5", "--database-url", database_url]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == (
        "pruned 25 succeeded, 7 failed and 0 cancelled jobs, 12 published events in 14 batches\n"
    )
    assert err.count("... ") == 2  # after batches 5 and 10
    assert f"... {JOBS.fullname}: pruned 20 succeeded, 0 failed and 0 cancelled jobs" in err
    assert job_counts(engine, NOW) == KEPT_JOBS
    assert event_counts(engine, NOW) == {
        "old published": 0,
        "recent published": 2,
        "unpublished": 5,
    }


def test_cli_keep_failed_and_the_default_windows(engine, database_url, capsys, monkeypatch):
    seed(engine, now=NOW)
    monkeypatch.setenv(ENV_DATABASE_URL, database_url)
    assert (
        main(["prune", "--model", "tests.conftest:Job", "--older-than", "1d", "--keep-failed"]) == 0
    )
    assert capsys.readouterr().out.startswith("pruned 25 succeeded, 0 failed and 0 cancelled")
    left = {key: n for key, n in SEEDED_JOBS.items() if key != ("succeeded", True)}
    assert job_counts(engine, NOW) == left
    assert event_counts(engine, NOW) == SEEDED_EVENTS


def add_cancelled(engine: Engine, ages: dict[dt.timedelta, int]) -> None:
    with engine.begin() as conn:
        for age, n in ages.items():
            when = NOW - age
            row = {"kind": "k", "payload": {}, "status": "cancelled", "updated_at": when}
            conn.execute(insert(JOBS), [row | {"created_at": when} for _ in range(n)])


def cancelled_left(engine: Engine) -> dict[bool, int]:
    """Cancelled jobs left, by whether they were cancelled more than 5 days ago."""
    old = (JOBS.c.updated_at < NOW - 5 * DAY).label("old")
    query = select(old, func.count()).where(JOBS.c.status == "cancelled").group_by(old)
    with engine.connect() as conn:
        return {bool(is_old): n for is_old, n in conn.execute(query).all()}


def test_cli_prunes_cancelled_jobs_past_their_own_window(engine, database_url, capsys):
    seed(engine, now=NOW)
    add_cancelled(engine, {10 * DAY: 6, 2 * DAY: 4})
    argv = ["prune", "--model", "tests.conftest:Job", "--older-than", "1d", "--keep-failed"]
    assert main([*argv, "--cancelled", "5d", "--batch", "4", "--database-url", database_url]) == 0
    assert capsys.readouterr().out.startswith("pruned 25 succeeded, 0 failed and 6 cancelled ")
    assert cancelled_left(engine) == {False: 4}
    left = {key: n for key, n in SEEDED_JOBS.items() if key != ("succeeded", True)}
    assert job_counts(engine, NOW) == left | {("cancelled", False): 4}
    assert event_counts(engine, NOW) == SEEDED_EVENTS


def test_cli_cancelled_defaults_to_older_than_and_can_be_kept(engine, database_url, capsys):
    add_cancelled(engine, {10 * DAY: 3, 2 * DAY: 2, dt.timedelta(hours=1): 1})
    argv = ["prune", "--model", "tests.conftest:Job", "--database-url", database_url]
    assert main([*argv, "--older-than", "1d", "--keep-cancelled"]) == 0
    assert "0 cancelled jobs" in capsys.readouterr().out
    assert cancelled_left(engine) == {True: 3, False: 3}
    assert main([*argv, "--older-than", "1d"]) == 0
    assert "and 5 cancelled jobs" in capsys.readouterr().out
    assert cancelled_left(engine) == {False: 1}


def test_cli_refuses_a_bad_cancelled_window_before_any_sql(engine, capsys):
    add_cancelled(engine, {10 * DAY: 2})
    with pytest.raises(SystemExit) as exit_:
        main(["prune", "--model", "tests.conftest:Job", "--older-than", "1d", "--cancelled", "0s"])
    assert exit_.value.code == 2
    assert "argument --cancelled/--cancelled-older-than: must be more than" in (
        capsys.readouterr().err
    )
    assert cancelled_left(engine) == {True: 2}


@pytest.mark.parametrize("bad", ["7days", "d", "-1d", "1.5h", "7"])
def test_cli_refuses_a_bad_duration_before_any_sql(engine, bad, capsys):
    seed(engine, now=NOW)
    with pytest.raises(SystemExit) as exit_:
        # no database URL at all: the duration is refused before anything connects
        main(["prune", "--model", "tests.conftest:Job", f"--older-than={bad}"])
    assert exit_.value.code == 2
    assert "expected a duration like 7d, 12h, 30m or 90s" in capsys.readouterr().err
    assert job_counts(engine, NOW) == SEEDED_JOBS
    assert event_counts(engine, NOW) == SEEDED_EVENTS


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("json:dumps", "json:dumps is not a job or outbox model"),
        ("tests.nowhere:Job", "cannot import 'tests.nowhere'"),
        ("tests.conftest", "expected TARGET as module:attribute"),
    ],
)
def test_cli_refuses_a_bad_target(engine, database_url, target, message, capsys):
    seed(engine, now=NOW)
    for command in (
        ["prune", "--model", target, "--older-than", "1d"],
        ["health", "--model", target],
    ):
        assert main([*command, "--database-url", database_url]) == 1
        assert message in capsys.readouterr().err
    assert job_counts(engine, NOW) == SEEDED_JOBS
    assert event_counts(engine, NOW) == SEEDED_EVENTS


def test_cli_health(engine, database_url, capsys):
    seed(engine, now=NOW)
    argv = [
        "health",
        "--model",
        "tests.conftest:Job",
        "--outbox-model",
        "tests.conftest:OutboxEvent",
    ]
    assert main([*argv, "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    assert f"{JOBS.fullname}: pending 4, running 3, succeeded 28, failed 9" in out
    assert f"{EVENTS.fullname}: published 14, unpublished 3, parked 2" in out
    assert "dead tuples" in out and "last vacuum" in out and "indexes" in out
    assert "oldest ready pending job: 100d" in out
    assert "xmin horizon" in out
    assert job_counts(engine, NOW) == SEEDED_JOBS
