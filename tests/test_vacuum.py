"""The ready-path upkeep: Vacuumer / AsyncVacuumer against a real PostgreSQL.

The CI server runs with autovacuum off, so the dead tuples these tests make stay until a
vacuum removes them. Statistics reach other sessions when a backend flushes them;
``pg_stat_force_next_flush()`` (PostgreSQL 15) makes the writing connection flush when it
goes idle, before it answers, so the counts read afterwards are exact, with no waiting.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.pool import NullPool

from sa_outbox import (
    AsyncVacuumer,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobMixin,
    JobQueue,
    NewJob,
    Vacuumer,
    VacuumPolicy,
    Worker,
)

from .conftest import TEST_SCHEMA


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    """A job table of this module's own: statistics that other tests' connections (whose
    pending counts reach the server whenever they next flush) never touch."""

    __tablename__ = "vacuum_jobs"
    __table_schema__ = TEST_SCHEMA


JOBS = f"{TEST_SCHEMA}.vacuum_jobs"


@pytest.fixture(scope="module", autouse=True)
def _table(engine: Engine) -> Iterator[None]:
    Base.metadata.create_all(engine)
    yield
    with engine.begin() as conn:  # not drop_all: the job_status type is the schema's own
        conn.execute(text(f"DROP TABLE {JOBS}"))


@pytest.fixture(autouse=True)
def _empty(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text(f"TRUNCATE {JOBS}"))
        conn.commit()
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
        conn.commit()


def _flow(conn: Connection, jobs: int) -> None:
    """Enqueue, claim and complete ``jobs`` jobs: two dead tuples each, a dead ready head."""
    queue = JobQueue(Job)
    queue.enqueue_many(conn, [NewJob("noop", {"n": i}) for i in range(jobs)])
    conn.commit()
    while claimed := queue.claim(conn, worker_id="w", batch=500):
        conn.commit()
        assert not queue.complete_many(conn, [(j.id, j.lease_token) for j in claimed]).lost
        conn.commit()
    conn.execute(text("SELECT pg_stat_force_next_flush()"))
    conn.commit()


def _dead_tuples(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = :t ::regclass"),
                {"t": JOBS},
            ).scalar_one()
        )


def _claim_buffers(conn: Connection) -> int:
    """Buffers the claim's index scan touches to find the one pending job."""
    plan = conn.execute(
        text(
            f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT id FROM {JOBS} "
            "WHERE queue = 'default' AND status = 'pending' AND run_at <= now() "
            "ORDER BY priority DESC, run_at, id LIMIT 20"
        )
    ).scalars()
    text_plan = "\n".join(plan)
    assert "vacuum_jobs_ready_idx" in text_plan, text_plan
    first = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", text_plan)
    assert first is not None, text_plan
    return int(first.group(1)) + int(first.group(2) or 0)


def test_a_table_past_the_threshold_is_vacuumed_and_its_ready_head_shrinks(engine: Engine) -> None:
    with engine.connect() as conn:
        _flow(conn, 6000)
        JobQueue(Job).enqueue(conn, "noop", {"last": True})
        conn.commit()
        _claim_buffers(conn)  # the first scan marks the dead entries it walks (LP_DEAD)
        before = _claim_buffers(conn)
    assert _dead_tuples(engine) >= 12_000

    report = Vacuumer(engine, Job, VacuumPolicy(threshold=1000)).run_once()

    assert report.vacuumed == [JOBS]
    assert report.dead_tuples[JOBS] >= 12_000
    assert report.not_owned == []
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
        after = _claim_buffers(conn)
        counts = dict(conn.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    assert _dead_tuples(engine) == 0
    # The scan no longer walks the leaf pages of 6,000 claimed jobs' dead entries.
    assert after * 4 < before, (before, after)
    assert counts == {"succeeded": 6000, "pending": 1}  # vacuum removes nothing live


def test_below_the_threshold_nothing_is_vacuumed(engine: Engine) -> None:
    with engine.connect() as conn:
        _flow(conn, 50)
    report = Vacuumer(engine, Job, VacuumPolicy(threshold=1000)).run_once()
    assert report.vacuumed == []
    assert _dead_tuples(engine) >= 100


def test_a_big_table_waits_for_dead_tuples_in_proportion_to_its_live_ones(
    engine: Engine,
) -> None:
    """``threshold + scale * live``: a vacuum reads every index whole, so a big table (a
    backlog of 30,000 here) waits for more dead tuples; ``scale=0`` is the bare threshold."""
    with engine.connect() as conn:
        _flow(conn, 1000)  # 2,000 dead tuples
        JobQueue(Job).enqueue_copy(conn, [NewJob("later", {}) for _ in range(30_000)])
        conn.commit()  # next to 31,000 live ones
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    dead = _dead_tuples(engine)
    assert 2000 <= dead < 4000
    policy = VacuumPolicy(threshold=1000)  # the default scale, 0.1: 1,000 + 3,100 allowed
    assert policy.dead_tuples_allowed(live=31_000) == 4100

    assert Vacuumer(engine, Job, policy).run_once().vacuumed == []
    assert _dead_tuples(engine) == dead

    report = Vacuumer(engine, Job, VacuumPolicy(threshold=1000, scale=0)).run_once()
    assert report.vacuumed == [JOBS]
    assert _dead_tuples(engine) == 0
    with engine.begin() as conn:  # the backlog is all there
        assert dict(conn.execute(select(Job.status, func.count()).group_by(Job.status)).all()) == {
            "succeeded": 1000,
            "pending": 30_000,
        }


def test_a_table_another_vacuum_holds_is_skipped_without_waiting(engine: Engine) -> None:
    with engine.connect() as conn:
        _flow(conn, 200)
    # SHARE UPDATE EXCLUSIVE is the lock VACUUM (and autovacuum) takes.
    with engine.connect() as holder:
        holder.execute(text(f"LOCK TABLE {JOBS} IN SHARE UPDATE EXCLUSIVE MODE"))
        with engine.connect() as conn:
            conn.execute(text("SET lock_timeout = '5s'"))
            conn.commit()
        report = Vacuumer(engine, Job, VacuumPolicy(threshold=100)).run_once()
        holder.rollback()
    # The VACUUM ran with SKIP_LOCKED: it returned at once and removed nothing.
    assert report.vacuumed == [JOBS]
    assert _dead_tuples(engine) >= 400
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Job)).scalar_one() == 200


def test_a_table_the_role_does_not_own_is_reported_and_left_alone(
    engine: Engine, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"sa_outbox_not_owner_{TEST_SCHEMA.rsplit('_', 1)[-1]}"
    with engine.begin() as conn:
        conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        conn.execute(text(f"CREATE ROLE {role}"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA {TEST_SCHEMA} TO {role}"))
    restricted = create_engine(database_url, poolclass=NullPool)

    @event.listens_for(restricted, "connect")
    def as_role(dbapi_conn: Any, _record: object) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute(f"SET ROLE {role}")
        dbapi_conn.commit()

    try:
        with engine.connect() as conn:
            _flow(conn, 100)
        report = Vacuumer(restricted, Job, VacuumPolicy(threshold=50)).run_once()
        assert report.vacuumed == []
        assert report.not_owned == [JOBS]
        assert _dead_tuples(engine) >= 200
        # A worker says so, once: with least-privilege roles its vacuum is off otherwise
        # without a word.
        worker = Worker(
            JobApp(Job, handlers={"noop": lambda job: None}),
            restricted,
            vacuum=VacuumPolicy(threshold=50),
            listen=False,
            install_signal_handlers=False,
        )
        try:
            with caplog.at_level(logging.WARNING, logger="sa_outbox.worker"):
                assert worker.vacuum() == worker.vacuum() == report
        finally:
            worker.close()
        warnings = [r.getMessage() for r in caplog.records if "cannot vacuum" in r.getMessage()]
        assert len(warnings) == 1 and JOBS in warnings[0], warnings
    finally:
        restricted.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"REVOKE USAGE ON SCHEMA {TEST_SCHEMA} FROM {role}"))
            conn.execute(text(f"DROP ROLE {role}"))


def test_due_follows_the_interval_on_the_injected_timer(engine: Engine) -> None:
    now = itertools.count(100.0, 0.5)
    ticks: list[float] = []

    def timer() -> float:
        ticks.append(next(now))
        return ticks[-1]

    vacuumer = Vacuumer(engine, Job, VacuumPolicy(interval=1.0), timer=timer)
    assert vacuumer.due()  # never checked yet
    vacuumer.run_once()  # checked at 100.0: next check at 101.0
    assert not vacuumer.due()  # 100.5
    assert vacuumer.due()  # 101.0


async def test_the_async_vacuumer_vacuums_too(engine: Engine, async_engine: AsyncEngine) -> None:
    with engine.connect() as conn:
        _flow(conn, 600)
    report = await AsyncVacuumer(async_engine, Job, VacuumPolicy(threshold=1000)).run_once()
    assert report.vacuumed == [JOBS]
    assert _dead_tuples(engine) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"threshold": 0}, InvalidArgument, "threshold must be between 1"),
        ({"threshold": "many"}, InvalidArgumentType, "threshold must be an int"),
        ({"interval": 0}, InvalidArgument, "interval must be more than zero"),
        ({"scale": -0.1}, InvalidArgument, "scale must be between 0 and 100"),
        ({"scale": "half"}, InvalidArgumentType, "scale must be a number"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        VacuumPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_vacuumer_needs_a_policy_and_a_library_table(engine: Engine) -> None:
    with pytest.raises(InvalidArgumentType, match="policy must be a VacuumPolicy, got dict"):
        Vacuumer(engine, Job, {"threshold": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType):
        Vacuumer(engine, object())
