"""Partitioned mode against a real PostgreSQL: the tables, dedup, maintenance, the CLI.

Each test gets a schema of its own with the two partitioned models created by
``create_all`` (a ``DEFAULT`` partition and the partitions around the real ``now()``).
Time is a `FakeClock` in 2030: enqueue and append stamp ``created_at`` with the clock's
"now", so rows go to the 2030 partitions `maintain_partitions` creates from the same clock,
and a test crosses a day boundary by advancing the clock.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass, Session

from sa_outbox import (
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobDataclassMixin,
    JobMixin,
    JobQueue,
    NewJob,
    Outbox,
    OutboxMixin,
    amaintain_partitions,
    maintain_partitions,
)
from sa_outbox.cli import main
from sa_outbox.schema import PARTITION_INFO_KEY, RECOMMENDED_JOB_STORAGE
from sa_outbox.statements import claim_jobs, listen_sql, partition_lock

from .conftest import Job as PlainJob

SCHEMA = f"sa_outbox_part_{os.getpid()}"
DAY = dt.timedelta(days=1)
START = dt.datetime(2030, 1, 1, 10, tzinfo=dt.UTC)
WAIT = 10.0


class Base(DeclarativeBase):
    pass


class PJob(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA
    __partition_interval__ = "day"


class PEvent(OutboxMixin, Base):
    __tablename__ = "outbox"
    __table_schema__ = SCHEMA
    __partition_interval__ = "day"


@pytest.fixture
def pg(engine: Engine) -> Iterator[Engine]:
    """The session's engine, with the partitioned tables created afresh for this test."""
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(engine)
    yield engine
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def partitions(engine: Engine, table: str = "jobs") -> list[str]:
    query = text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = to_regclass(:parent) ORDER BY 1"
    )
    with engine.connect() as conn:
        return list(conn.execute(query, {"parent": f"{SCHEMA}.{table}"}).scalars())


def rows_by_partition(engine: Engine, table: str = "jobs") -> dict[str, int]:
    query = text(
        f"SELECT c.relname, count(*) FROM {SCHEMA}.{table} AS t"
        " JOIN pg_class c ON c.oid = t.tableoid GROUP BY 1"
    )
    with engine.connect() as conn:
        return dict(conn.execute(query).all())  # type: ignore[arg-type]


def reloptions(engine: Engine, name: str) -> list[str] | None:
    query = text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:name)")
    with engine.connect() as conn:
        return conn.execute(query, {"name": name}).scalar_one()  # type: ignore[no-any-return]


RECOMMENDED = sorted(f"{name}={value}" for name, value in {**RECOMMENDED_JOB_STORAGE}.items())


# -- the model ------------------------------------------------------------------------------


def test_a_partitioned_model_declares_its_table_for_range_partitioning() -> None:
    table = PJob.__table__
    assert list(table.primary_key.columns.keys()) == ["id", "created_at"]
    assert table.info[PARTITION_INFO_KEY] == "day"
    assert table.dialect_options["postgresql"]["partition_by"] == "RANGE (created_at)"
    indexes = {index.name: index for index in table.indexes}
    assert not indexes["jobs_dedup_idx"].unique  # the dedup trigger keeps keys unique
    seq_key = {index.name: index for index in PEvent.__table__.indexes}["outbox_seq_key"]
    assert seq_key.unique and [c.name for c in seq_key.columns] == ["seq", "created_at"]
    # An unpartitioned model is as before.
    assert list(PlainJob.__table__.primary_key.columns.keys()) == ["id"]
    assert {i.name: i for i in PlainJob.__table__.indexes}["jobs_dedup_idx"].unique


def test_the_dataclass_mixins_take_the_same_settings() -> None:
    class DataBase(MappedAsDataclass, DeclarativeBase):
        pass

    class Job(JobDataclassMixin, DataBase):
        __tablename__ = "jobs"
        __partition_interval__ = "week"
        __table_storage__ = {"fillfactor": 70}  # noqa: RUF012 - a class setting

    assert Job.__table__.info[PARTITION_INFO_KEY] == "week"
    assert list(Job.__table__.primary_key.columns.keys()) == ["id", "created_at"]
    assert Job(kind="k", payload={}).queue == "default"


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        (
            {"__partition_interval__": "daily"},
            InvalidArgument,
            "__partition_interval__ of BadJob must be one of 'hour', 'day', 'week', 'month'"
            " (or None), got 'daily'",
        ),
        (
            {"__partition_interval__": 1},
            InvalidArgument,
            "__partition_interval__ of BadJob must be one of",
        ),
        (
            {"__table_storage__": {"fill_factor": 80}},
            InvalidArgument,
            "__table_storage__ of BadJob: unknown table storage parameter 'fill_factor'",
        ),
        (
            {"__table_storage__": {"fillfactor": "80"}},
            InvalidArgumentType,
            "__table_storage__ of BadJob: fillfactor must be an int, a float or a bool",
        ),
        (
            {"__table_storage__": ["fillfactor"]},
            InvalidArgumentType,
            "__table_storage__ of BadJob must be a mapping",
        ),
    ],
)
def test_bad_settings_name_the_class_and_the_value(
    settings: dict[str, Any], error: type[Exception], message: str
) -> None:
    class OtherBase(DeclarativeBase):
        pass

    with pytest.raises(error) as raised:
        type("BadJob", (JobMixin, OtherBase), {"__tablename__": "jobs", **settings})
    assert message in str(raised.value)


def test_maintenance_refuses_bad_input_before_any_sql(clock: FakeClock) -> None:
    class Unconnectable:
        def connect(self) -> None:
            raise AssertionError("no SQL should be sent")

    engine: Any = Unconnectable()
    not_partitioned = r"table 'sa_outbox_test_\d+\.jobs' is not partitioned"
    with pytest.raises(InvalidArgument, match=not_partitioned):
        maintain_partitions(engine, PlainJob)
    with pytest.raises(InvalidArgument, match="ahead must be between 0 and 1000, got -1"):
        maintain_partitions(engine, PJob, ahead=-1)
    with pytest.raises(InvalidArgumentType, match="retention must be a timedelta"):
        maintain_partitions(engine, PJob, retention="7d")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="retention must be more than zero"):
        maintain_partitions(engine, PJob, retention=0)
    with pytest.raises(InvalidArgumentType, match="expected a Table or a mapped class"):
        maintain_partitions(engine, "jobs")


# -- create_all, storage ----------------------------------------------------------------------


def test_create_all_makes_a_default_partition_and_partitions_ahead_with_storage(
    pg: Engine,
) -> None:
    for table in ("jobs", "outbox"):
        found = partitions(pg, table)
        assert f"{table}_default" in found
        assert len(found) == 1 + 4  # the current day and three ahead
        for name in found:
            assert sorted(reloptions(pg, f"{SCHEMA}.{name}") or []) == RECOMMENDED
        assert reloptions(pg, f"{SCHEMA}.{table}") is None  # a parent takes none
    # A plain table gets them on itself.
    assert sorted(reloptions(pg, f"{PlainJob.__table__.schema}.jobs") or []) == RECOMMENDED


def test_storage_none_leaves_the_server_defaults(engine: Engine) -> None:
    schema = f"{SCHEMA}_defaults"

    class OtherBase(DeclarativeBase):
        pass

    class Job(JobMixin, OtherBase):
        __tablename__ = "jobs"
        __table_schema__ = schema
        __table_storage__ = None

    class Events(OutboxMixin, OtherBase):
        __tablename__ = "outbox"
        __table_schema__ = schema
        __table_storage__ = {"fillfactor": 90, "autovacuum_enabled": True}  # noqa: RUF012
        __partition_interval__ = "month"

    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        OtherBase.metadata.create_all(engine)
        assert reloptions(engine, f"{schema}.jobs") is None
        assert reloptions(engine, f"{schema}.outbox_default") == [
            "fillfactor=90",
            "autovacuum_enabled=true",
        ]
        report = maintain_partitions(engine, Events, ahead=1, clock=FakeClock(START))
        assert report.created == ["outbox_p203001", "outbox_p203002"]
        assert reloptions(engine, f"{schema}.outbox_p203002") == [
            "fillfactor=90",
            "autovacuum_enabled=true",
        ]
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


# -- jobs through the boundary ---------------------------------------------------------------


def test_jobs_flow_through_a_day_boundary_and_only_finished_partitions_go(
    pg: Engine, clock: FakeClock
) -> None:
    queue = JobQueue(PJob, clock=clock)
    first = maintain_partitions(pg, PJob, ahead=1, clock=clock)
    assert first.created == ["jobs_p20300101", "jobs_p20300102"]
    assert maintain_partitions(pg, PJob, ahead=1, clock=clock).created == []  # idempotent

    with pg.begin() as conn:
        queue.enqueue_many(conn, [NewJob("send", {"n": n}) for n in range(5)])
    clock.advance(DAY)  # 2030-01-02 10:00
    with pg.begin() as conn:
        queue.enqueue_many(conn, [NewJob("send", {"n": n}) for n in range(5, 10)])
    assert rows_by_partition(pg) == {"jobs_p20300101": 5, "jobs_p20300102": 5}

    # One claim walks both partitions, oldest run_at first.
    with pg.begin() as conn:
        claimed = queue.claim(conn, worker_id="w1", batch=10)
    assert [job.payload["n"] for job in claimed] == list(range(10))
    with pg.begin() as conn:
        done = queue.complete_many(
            conn, [(job.id, job.lease_token) for job in claimed if job.payload["n"] != 0]
        )
    assert len(done.done) == 9
    straggler = claimed[0]  # still running in the first day's partition

    clock.advance(4 * DAY)  # 2030-01-06 10:00: both days are past a 2-day retention
    report = maintain_partitions(pg, PJob, ahead=1, retention=2 * DAY, clock=clock)
    assert report.created == ["jobs_p20300106", "jobs_p20300107"]
    assert report.kept == ["jobs_p20300101"]  # the running job keeps it
    assert "jobs_p20300102" in report.dropped
    # The partitions create_all made around the real now() were empty: dropped too.
    assert all(name.startswith("jobs_p20") for name in report.dropped)
    assert "jobs_default" in partitions(pg)
    assert rows_by_partition(pg) == {"jobs_p20300101": 5}

    with pg.begin() as conn:
        queue.complete(conn, straggler.id, straggler.lease_token)
    again = maintain_partitions(pg, PJob, ahead=1, retention=2 * DAY, clock=clock)
    assert again.dropped == ["jobs_p20300101"] and again.kept == []
    assert partitions(pg) == ["jobs_default", "jobs_p20300106", "jobs_p20300107"]
    with pg.connect() as conn:
        assert conn.execute(select(func.count()).select_from(PJob.__table__)).scalar() == 0


def test_rows_already_in_the_default_partition_move_into_the_new_one(
    pg: Engine, clock: FakeClock
) -> None:
    queue = JobQueue(PJob, clock=clock)
    outbox = Outbox(PEvent, clock=clock)
    with pg.begin() as conn:  # no 2030 partition yet: all of it lands in the default one
        ids = [r.id for r in queue.enqueue_many(conn, [NewJob("k", {}) for _ in range(3)])]
        queue.enqueue(conn, "k", {}, deduplication_key="once")
        event = outbox.append(
            conn, event_type="placed", aggregate_type="order", aggregate_id=1, payload={}
        )
    assert rows_by_partition(pg) == {"jobs_default": 4}

    report = maintain_partitions(pg, PJob, ahead=0, clock=clock)
    assert report.created == ["jobs_p20300101"] and report.moved == {"jobs_p20300101": 4}
    assert rows_by_partition(pg) == {"jobs_p20300101": 4}
    events = maintain_partitions(pg, PEvent, ahead=0, clock=clock)
    assert events.moved == {"outbox_p20300101": 1}

    # The moved rows are the same rows, and the new partition has the indexes and triggers.
    with pg.begin() as conn:
        assert queue.enqueue(conn, "k", {}, deduplication_key="once").inserted is False
        claimed = queue.claim(conn, worker_id="w1", batch=10)
        assert {job.id for job in claimed} >= set(ids)
        assert [e.id for e in outbox.claim(conn)] == [event]
    with pg.connect() as conn:
        indexes = conn.execute(
            text("SELECT count(*) FROM pg_indexes WHERE schemaname = :s AND tablename = :t"),
            {"s": SCHEMA, "t": "jobs_p20300101"},
        ).scalar()
    assert indexes == 8  # the primary key and the seven declared on the parent
    assert rows_by_partition(pg) == {"jobs_p20300101": 4}


# -- dedup ---------------------------------------------------------------------------------


def test_dedup_holds_across_partitions_as_on_a_plain_table(pg: Engine, clock: FakeClock) -> None:
    maintain_partitions(pg, PJob, ahead=1, clock=clock)
    results = {}
    for model in (PJob, PlainJob):
        queue = JobQueue(model, clock=FakeClock(START))
        with pg.begin() as conn:
            first = queue.enqueue(conn, "mail", {}, deduplication_key="welcome:ana")
        later = JobQueue(model, clock=FakeClock(START + DAY))
        with pg.begin() as conn:
            again = later.enqueue(conn, "mail", {}, deduplication_key="welcome:ana")
            other_kind = later.enqueue(conn, "sms", {}, deduplication_key="welcome:ana")
            batch = later.enqueue_many(
                conn,
                [
                    NewJob("mail", {}, deduplication_key="welcome:ana"),
                    NewJob("mail", {}, deduplication_key="welcome:bob"),
                    NewJob("mail", {}, deduplication_key="welcome:bob"),
                    NewJob("mail", {}),
                    NewJob("mail", {}),
                ],
            )
        results[model] = (
            first.inserted,
            (again.id, again.inserted),
            other_kind.inserted,
            [r.inserted for r in batch],
            [r.id is None for r in batch],
        )
    assert results[PJob] == results[PlainJob]
    assert results[PJob] == (
        True,
        (None, False),
        True,
        [False, True, False, True, True],
        [True, False, True, False, False],
    )
    assert rows_by_partition(pg) == {"jobs_p20300101": 1, "jobs_p20300102": 4}


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_concurrent_enqueues_of_one_key_in_two_partitions_insert_once(
    pg: Engine, clock: FakeClock, first_ends: str
) -> None:
    maintain_partitions(pg, PJob, ahead=1, clock=clock)
    today, tomorrow = JobQueue(PJob, clock=clock), JobQueue(PJob, clock=FakeClock(START + DAY))
    with pg.connect() as first, pg.connect() as second:
        second_pid = second.execute(text("SELECT pg_backend_pid()")).scalar()
        second.commit()
        assert today.enqueue(first, "mail", {}, deduplication_key="k").inserted
        outcome: dict[str, Any] = {}

        def enqueue_again() -> None:
            try:
                outcome["result"] = tomorrow.enqueue(second, "mail", {}, deduplication_key="k")
                second.commit()
            except BaseException as exc:  # reported to the test thread below
                outcome["error"] = exc

        thread = threading.Thread(target=enqueue_again)
        thread.start()
        # The second enqueue waits on the key's advisory lock until the first one ends.
        deadline = time.monotonic() + WAIT
        waiting = text(
            "SELECT count(*) FROM pg_locks WHERE pid = :pid AND locktype = 'advisory'"
            " AND NOT granted"
        )
        with pg.connect() as observer:
            while not observer.execute(waiting, {"pid": second_pid}).scalar():
                assert time.monotonic() < deadline, "the second enqueue never waited"
                observer.rollback()
                time.sleep(0.01)
        (first.commit if first_ends == "commit" else first.rollback)()
        thread.join(WAIT)
        assert not thread.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    if first_ends == "commit":
        assert (result.id, result.inserted) == (None, False)
        assert rows_by_partition(pg) == {"jobs_p20300101": 1}
    else:
        assert result.inserted is True
        assert rows_by_partition(pg) == {"jobs_p20300102": 1}


# -- the outbox -----------------------------------------------------------------------------


def test_outbox_events_keep_their_order_across_partitions_and_published_ones_go(
    pg: Engine, clock: FakeClock
) -> None:
    outbox = Outbox(PEvent, clock=clock)
    maintain_partitions(pg, PEvent, ahead=1, clock=clock)
    with pg.begin() as conn:
        first = outbox.append(
            conn, event_type="placed", aggregate_type="order", aggregate_id=1, payload={}
        )
        parked = outbox.append(
            conn, event_type="placed", aggregate_type="order", aggregate_id=2, payload={}
        )
    clock.advance(DAY)
    with pg.begin() as conn:
        second = outbox.append(
            conn, event_type="paid", aggregate_type="order", aggregate_id=1, payload={}
        )
    with Session(pg) as session, session.begin():  # the ORM writes the composite key too
        session.add(
            PEvent(
                aggregate_type="order",
                aggregate_id="3",
                event_type="placed",
                payload={},
                created_at=clock.now(),
            )
        )
    assert rows_by_partition(pg, "outbox") == {"outbox_p20300101": 2, "outbox_p20300102": 2}

    with pg.begin() as conn:
        claimed = outbox.claim(conn, batch=10)
    assert [e.id for e in claimed if e.aggregate_id == "1"] == [first, second]
    assert claimed[0].seq < claimed[-1].seq
    by_id = {e.id: e for e in claimed}
    with pg.begin() as conn:
        outbox.reject_many(conn, [(parked, by_id[parked].relay_token, "no")], max_attempts=1)
        outbox.mark_published_many(
            conn, [(e.id, e.relay_token) for e in claimed if e.id != parked and e.id != second]
        )
    clock.advance(3 * DAY)
    report = maintain_partitions(pg, PEvent, ahead=0, retention=DAY, clock=clock)
    # Day one holds a published and a parked event: gone. Day two an unpublished one: kept.
    assert "outbox_p20300101" in report.dropped
    assert report.kept == ["outbox_p20300102"]
    assert rows_by_partition(pg, "outbox") == {"outbox_p20300102": 2}


# -- the claim's plan ------------------------------------------------------------------------


def plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """The plan's nodes, less its subplans (the serial keys' check, run only for a job with
    a ``lock_key``: there is none here)."""
    yield plan
    for child in plan.get("Plans", []):
        if child.get("Parent Relationship") != "SubPlan":
            yield from plan_nodes(child)


def test_the_claim_reads_each_partition_through_its_ready_index(
    pg: Engine, clock: FakeClock
) -> None:
    maintain_partitions(pg, PJob, ahead=2, clock=clock)
    queue = JobQueue(PJob, clock=clock)
    for _ in range(3):  # three days, each with finished work and ready jobs
        with pg.begin() as conn:
            queue.enqueue_many(conn, [NewJob("k", {}) for _ in range(2000)])
            conn.execute(
                PJob.__table__.update()
                .where(PJob.__table__.c.created_at == clock.now())
                .values(status="succeeded")
            )
            queue.enqueue_many(conn, [NewJob("k", {}) for _ in range(500)])
        clock.advance(DAY)
    with pg.begin() as conn:
        conn.execute(text(f"ANALYZE {SCHEMA}.jobs"))
    statement = claim_jobs(PJob, worker_id="w", batch=10, queues="default", clock=clock)
    compiled = statement.compile(dialect=pg.dialect)
    with pg.begin() as conn:
        # No enable_seqscan = off: with 2,000 finished and 500 ready jobs per partition and
        # fresh statistics, the planner picks the partial ready index on its own, as it would in
        # production; forcing it would only prove that the index *can* serve the claim.
        explain = "EXPLAIN (FORMAT JSON) " + compiled.string
        plan = conn.exec_driver_sql(explain, compiled.params).scalar_one()
    with pg.connect() as conn:  # the partitions' own indexes attached to the ready indexes
        ready = set(
            conn.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent IN (to_regclass(:queue), to_regclass(:kind),"
                    " to_regclass(:order))"
                ),
                {
                    "queue": f"{SCHEMA}.jobs_ready_idx",
                    "kind": f"{SCHEMA}.jobs_ready_kind_idx",
                    "order": f"{SCHEMA}.jobs_ready_order_idx",
                },
            ).scalars()
        )
    nodes = list(plan_nodes(plan[0]["Plan"]))
    claim = next(n for n in nodes if n["Node Type"] == "LockRows")  # the CTE that picks
    merge = claim["Plans"][0]
    assert merge["Node Type"] == "Merge Append", json.dumps(plan, indent=1)
    scans = {n["Relation Name"]: n for n in plan_nodes(merge) if "Relation Name" in n}
    assert set(scans) == set(partitions(pg))  # every partition, the default one included
    assert {n["Node Type"] for n in scans.values()} == {"Index Scan"}
    assert {n["Index Name"] for n in scans.values()} <= ready


# -- notifications ---------------------------------------------------------------------------


def test_the_notify_trigger_fires_once_for_a_statement_across_partitions(
    pg: Engine, clock: FakeClock
) -> None:
    maintain_partitions(pg, PJob, ahead=0, clock=clock)
    queue = JobQueue(PJob, clock=clock)
    with pg.connect() as conn:
        channel = queue.notify_channel(conn)
    raw = pg.raw_connection()
    listener = raw.driver_connection
    raw.detach()
    assert isinstance(listener, psycopg.Connection)
    try:
        listener.autocommit = True
        listener.execute(listen_sql(str(channel)))
        with pg.begin() as conn:
            queue.enqueue_many(conn, [NewJob("k", {}, queue="q")])
            JobQueue(PJob).enqueue(conn, "k", {}, queue="r")  # the real now(): default one
        listener.execute("SELECT 1")
        got = [json.loads(n.payload) for n in listener.notifies(timeout=0)]
    finally:
        listener.close()
    assert got == [["q"], ["r"]]


# -- one maintainer, locks, async --------------------------------------------------------------


def test_one_maintainer_at_a_time(pg: Engine, clock: FakeClock) -> None:
    before = partitions(pg)
    with pg.connect() as other:
        assert other.execute(partition_lock(PJob)).scalar() is True
        other.commit()  # a session-level lock outlives the transaction
        report = maintain_partitions(pg, PJob, ahead=1, clock=clock)
        other.execute(text("SELECT pg_advisory_unlock_all()"))
    assert report.skipped and report.created == []
    assert partitions(pg) == before
    assert maintain_partitions(pg, PJob, ahead=1, clock=clock).created


def test_a_partition_whose_table_stays_locked_is_left_for_the_next_run(
    pg: Engine, clock: FakeClock
) -> None:
    maintain_partitions(pg, PJob, ahead=0, clock=clock)
    clock.advance(10 * DAY)
    with pg.connect() as reader:  # a long transaction that has read the table
        reader.execute(select(func.count()).select_from(PJob.__table__))
        report = maintain_partitions(
            pg, PJob, ahead=0, retention=DAY, clock=clock, lock_timeout=0.05
        )
        reader.rollback()
    assert "jobs_p20300101" in report.busy
    assert report.dropped == [] and "jobs_p20300101" in partitions(pg)
    again = maintain_partitions(pg, PJob, ahead=0, retention=DAY, clock=clock)
    assert "jobs_p20300101" in again.dropped and again.busy == []


async def test_the_async_twin_does_the_same(
    pg: Engine, async_engine: AsyncEngine, clock: FakeClock
) -> None:
    report = await amaintain_partitions(async_engine, PJob, ahead=1, clock=clock)
    assert report.created == ["jobs_p20300101", "jobs_p20300102"]
    clock.advance(5 * DAY)
    report = await amaintain_partitions(async_engine, PJob, ahead=0, retention=DAY, clock=clock)
    assert report.created == ["jobs_p20300106"]
    assert {"jobs_p20300101", "jobs_p20300102"} <= set(report.dropped)


def test_a_table_not_partitioned_in_the_database_is_a_clear_error(engine: Engine) -> None:
    schema = f"{SCHEMA}_plain"

    class OtherBase(DeclarativeBase):
        pass

    class Job(JobMixin, OtherBase):
        __tablename__ = "jobs"
        __table_schema__ = schema

    class DeclaredBase(DeclarativeBase):
        pass

    class Declared(JobMixin, DeclaredBase):
        __tablename__ = "jobs"
        __table_schema__ = schema
        __partition_interval__ = "day"

    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        OtherBase.metadata.create_all(engine)
        with pytest.raises(InvalidArgument, match="is not partitioned in the database"):
            maintain_partitions(engine, Declared)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    with pytest.raises(InvalidArgument, match="does not exist"):
        maintain_partitions(engine, Declared)


# -- the command line ------------------------------------------------------------------------


def test_the_cli_maintains_and_prints_what_it_did(
    pg: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pg.begin() as conn:  # an old finished partition, and one still holding work
        for day, status in (("2020-01-01", "succeeded"), ("2020-01-02", "pending")):
            name = f"jobs_p{day.replace('-', '')}"
            end = f"2020-01-0{int(day[-1]) + 1}"
            conn.execute(
                text(
                    f"CREATE TABLE {SCHEMA}.{name} PARTITION OF {SCHEMA}.jobs"
                    f" FOR VALUES FROM ('{day} 00\\:00+00') TO ('{end} 00\\:00+00')"
                )
            )
            conn.execute(
                text(
                    f"INSERT INTO {SCHEMA}.jobs (kind, payload, status, created_at)"
                    f" VALUES ('k', '{{}}', '{status}', '{day} 12\\:00+00')"
                )
            )
    argv = ["partitions", "maintain", "--model", "tests.test_partitions:PJob"]
    assert main([*argv, "--database-url", database_url, "--retention", "30d"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{SCHEMA}.jobs: created ")
    assert "  dropped jobs_p20200101" in out
    assert "  kept (unfinished work inside) jobs_p20200102" in out
    assert partitions(pg).count("jobs_p20200102") == 1
    assert "jobs_p20200101" not in partitions(pg)


def test_the_cli_says_what_is_wrong(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["partitions", "maintain", "--database-url", database_url, "--model"]
    assert main([*argv, "tests.conftest:Job"]) == 1
    assert "sa-outbox partitions: error: table " in capsys.readouterr().err
    assert main([*argv, "json:dumps"]) == 1
    assert "json:dumps is not a job or outbox model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["partitions", "maintain", "--model", "x:y", "--retention", "7 days"])
    assert exit_.value.code == 2
    assert "expected a duration like 7d" in capsys.readouterr().err


def test_uuid_only_lookups_still_work_on_a_partitioned_table(pg: Engine, clock: FakeClock) -> None:
    queue = JobQueue(PJob, clock=clock)
    with pg.begin() as conn:
        job_id = queue.enqueue(conn, "k", {}).id
    assert isinstance(job_id, uuid.UUID)
    with Session(pg) as session:
        row = session.execute(select(PJob).where(PJob.id == job_id)).scalar_one()
        assert session.get(PJob, (job_id, row.created_at)) is row
