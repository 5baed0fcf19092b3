"""Table health and the worker's vacuum on partitioned tables: the parent holds no rows.

A partitioned table's ``pg_stat_user_tables`` row and sizes are its own (zeros): the rows,
and their dead versions, live in the partitions. `table_health` sums over the partition tree
and lists each partition; `Vacuumer` vacuums the partitions past their threshold, however
deep the tree. Each test has a schema of its own with the partitioned models made by
``create_all`` (a ``DEFAULT`` partition and one per day around the real ``now()``); dead
tuples come from deletes, whose statistics the deleting session flushes before another one
reads them (``pg_stat_force_next_flush``, PostgreSQL 15+), and autovacuum is off on every
partition, so nothing else changes them.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import JobMixin, OutboxMixin, Vacuumer, VacuumPolicy
from sa_outbox.cli._maintenance import _format_health
from sa_outbox.maintenance import PartitionHealth, table_health
from sa_outbox.statements import partition_stats, table_stats, vacuum_candidates

from .conftest import Job as PlainJob

SCHEMA = f"sa_outbox_health_part_{os.getpid()}"


class Base(DeclarativeBase):
    pass


class PJob(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA
    __partition_interval__ = "day"
    # Each partition's; where the server runs autovacuum, it must not change the counts.
    __table_storage__ = {"autovacuum_enabled": False}  # noqa: RUF012


class PEvent(OutboxMixin, Base):
    __tablename__ = "outbox"
    __table_schema__ = SCHEMA
    __partition_interval__ = "day"
    __table_storage__ = {"autovacuum_enabled": False}  # noqa: RUF012


@pytest.fixture
def pg(engine: Engine) -> Iterator[Engine]:
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(engine)
    yield engine
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))


def flushed(engine: Engine, *statements: str) -> None:
    """Run ``statements`` in one transaction, whose statistics its session sends as it
    commits (before the commit returns), not up to a second later."""
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))
        conn.execute(text("SELECT pg_stat_force_next_flush()"))


def insert_jobs(n: int, created_at: str) -> str:
    return (
        f"INSERT INTO {SCHEMA}.jobs (kind, payload, status, created_at)"
        f" SELECT 'report', '{{}}', 'succeeded', {created_at} FROM generate_series(1, {n})"
    )


def rows_by_partition(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                f"SELECT c.relname, count(*) FROM {SCHEMA}.jobs AS t"
                " JOIN pg_class c ON c.oid = t.tableoid GROUP BY 1"
            )
        ).all()
    return {f"{SCHEMA}.{name}": n for name, n in found}


def test_health_sums_the_partitions_and_lists_each(pg: Engine) -> None:
    today, old = "now()", "now() - interval '10 years'"  # today's partition, the default one
    flushed(pg, insert_jobs(3000, today), insert_jobs(1002, old))
    held = rows_by_partition(pg)
    assert sorted(held.values()) == [1002, 3000]
    flushed(pg, f"DELETE FROM {SCHEMA}.jobs")

    with pg.connect() as conn:
        report = table_health(conn, jobs=PJob, outbox=PEvent)
    jobs = report.jobs
    assert jobs is not None and jobs.table == f"{SCHEMA}.jobs"
    assert sum(jobs.rows.values()) == 0
    # The issue: the parent's own row said 0 dead tuples and 0 bytes.
    assert jobs.dead_tuples == 4002 and jobs.live_tuples == 0
    assert jobs.total_bytes > 0 and jobs.table_bytes > 0 and jobs.index_bytes > 0
    names = [p.table for p in jobs.partitions]
    assert names == sorted(names) and len(names) == 5  # the default, today, three ahead
    assert f"{SCHEMA}.jobs_default" in names
    by_name = {p.table: p for p in jobs.partitions}
    assert {name: by_name[name].dead_tuples for name in held} == held
    assert by_name[f"{SCHEMA}.jobs_default"].bound == "DEFAULT"
    assert all(
        p.bound is not None and p.bound.startswith("FOR VALUES FROM")
        for p in jobs.partitions
        if p.table != f"{SCHEMA}.jobs_default"
    )
    for field in ("live_tuples", "dead_tuples", "total_bytes", "table_bytes", "index_bytes"):
        assert getattr(jobs, field) == sum(getattr(p, field) for p in jobs.partitions), field
    assert jobs.last_vacuum is None  # nothing vacuumed yet, anywhere
    # The outbox is partitioned too; it holds nothing.
    assert report.outbox is not None and len(report.outbox.partitions) == 5
    assert report.outbox.dead_tuples == 0

    # Vacuum one partition: the table's last vacuum is the most recent of its partitions',
    # and the partition's dead tuples are gone from the sum.
    today_partition = next(name for name, n in held.items() if n == 3000)
    with pg.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            text(f"VACUUM {today_partition}")
        )
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
    with pg.connect() as conn:
        after = table_health(conn, jobs=PJob).jobs
    assert after is not None
    vacuumed = {p.table: p for p in after.partitions}[today_partition]
    assert isinstance(vacuumed.last_vacuum, dt.datetime)
    assert after.last_vacuum == vacuumed.last_vacuum
    assert vacuumed.dead_tuples == 0 and after.dead_tuples == 1002
    assert [p.last_vacuum for p in after.partitions].count(None) == 4


def test_a_plain_table_has_no_partitions(engine: Engine) -> None:
    with engine.connect() as conn:
        jobs = table_health(conn, jobs=PlainJob).jobs
        assert conn.execute(partition_stats(PlainJob)).all() == []
        assert conn.execute(table_stats(PlainJob)).one().partitions == 0
    assert jobs is not None and jobs.partitions == () and jobs.table_bytes >= 0


def test_the_cli_shows_the_sums_and_the_partitions(pg: Engine) -> None:
    flushed(pg, insert_jobs(40, "now()"))
    flushed(pg, f"DELETE FROM {SCHEMA}.jobs")
    with pg.connect() as conn:
        report = table_health(conn, jobs=PJob)
    lines = _format_health(report).splitlines()
    assert lines[1] == "  live tuples 0, dead tuples 40"
    listed = [line for line in lines if line.startswith("  partition ")]
    assert len(listed) == 5
    assert f"  partition {SCHEMA}.jobs_default: live tuples 0, dead tuples 0, size " in (
        "\n".join(listed)
    )
    assert sum(", dead tuples 40, " in line for line in listed) == 1


# -- the worker's vacuum ------------------------------------------------------------------


@pytest.fixture
def two_levels(engine: Engine) -> Iterator[Table]:
    """A table partitioned by list, one of whose partitions is partitioned again."""
    schema = f"{SCHEMA}_deep"
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {schema}"))
        conn.execute(text(f"CREATE TABLE {schema}.t (a int, b int) PARTITION BY LIST (a)"))
        conn.execute(
            text(
                f"CREATE TABLE {schema}.t_1 PARTITION OF {schema}.t FOR VALUES IN (1)"
                " PARTITION BY RANGE (b)"
            )
        )
        conn.execute(
            text(
                f"CREATE TABLE {schema}.t_1_low PARTITION OF {schema}.t_1"
                " FOR VALUES FROM (0) TO (100) WITH (autovacuum_enabled = off)"
            )
        )
        conn.execute(
            text(
                f"CREATE TABLE {schema}.t_2 PARTITION OF {schema}.t FOR VALUES IN (2)"
                " WITH (autovacuum_enabled = off)"
            )
        )
    yield Table("t", MetaData(), Column("a", Integer), Column("b", Integer), schema=schema)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))


def test_the_vacuum_reaches_a_sub_partition(engine: Engine, two_levels: Table) -> None:
    schema = two_levels.schema
    flushed(
        engine,
        f"INSERT INTO {schema}.t SELECT 1, g % 100 FROM generate_series(1, 500) AS g",
        f"INSERT INTO {schema}.t SELECT 2, g FROM generate_series(1, 20) AS g",
    )
    flushed(engine, f"DELETE FROM {schema}.t")
    with engine.connect() as conn:
        candidates = {
            r.table_name: r.dead_tuples for r in conn.execute(vacuum_candidates(two_levels))
        }
        stats = conn.execute(table_stats(two_levels)).one()
        leaves = [r.name for r in conn.execute(partition_stats(two_levels))]
    # The partitioned ones (PostgreSQL 14+ lists them, with no tuples) hold nothing.
    assert {name: n for name, n in candidates.items() if name in ("t", "t_1")} in (
        {},
        {"t": 0, "t_1": 0},
    )
    assert {name: n for name, n in candidates.items() if n} == {"t_1_low": 500, "t_2": 20}
    assert stats.dead_tuples == 520 and stats.partitions == 3
    assert leaves == [f"{schema}.t_1_low", f"{schema}.t_2"]  # the tables that hold rows

    report = Vacuumer(engine, two_levels, VacuumPolicy(threshold=100, scale=0)).run_once()
    assert report.vacuumed == [f"{schema}.t_1_low"]
    assert report.dead_tuples == {f"{schema}.t_1_low": 500}


def test_partition_health_is_exported() -> None:
    from sa_outbox import maintenance

    assert "PartitionHealth" in maintenance.__all__
    assert maintenance.PartitionHealth is PartitionHealth
