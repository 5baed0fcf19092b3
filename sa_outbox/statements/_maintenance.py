"""Statements of the maintenance duties: the pruner's lock and the table health report.

Pure builders, like the rest of the query builder: they return SQL, never run it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Text, bindparam, func, select
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import BindParameter, TextClause

from .._clock import Clock
from ..schema import JobStatus
from ._common import now_of, table_of

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]

#: What the pruner's advisory lock key is derived from, before the table's qualified name.
PRUNE_LOCK_PREFIX = "sa_outbox.prune:"

_PRUNE_LOCK = f"""\
SELECT pg_try_advisory_xact_lock(
         hashtextextended('{PRUNE_LOCK_PREFIX}' || n.nspname || '.' || c.relname, 0)) AS locked
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(:prune_table)"""

# A table and every table under it: its partitions, theirs (sub-partitions), and the
# children of a table with (legacy) inheritance; UNION, so a table with two parents in the
# tree counts once. A partitioned table has no storage of its own (sizes 0) and, in the
# statistics, only what ANALYZE of it recorded: its rows are its partitions'.
_TREE = """\
WITH RECURSIVE tree(relid) AS (
    SELECT c.oid FROM pg_catalog.pg_class AS c WHERE c.oid = to_regclass(:{param})
    UNION
    SELECT i.inhrelid FROM pg_catalog.pg_inherits AS i JOIN tree AS t ON i.inhparent = t.relid
)
"""

_TABLE_STATS = (
    _TREE.format(param="health_table")
    + """\
SELECT n.nspname || '.' || c.relname AS name, a.*
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (
    SELECT CAST(sum(s.n_live_tup) AS bigint) AS live_tuples,
           CAST(sum(s.n_dead_tup) AS bigint) AS dead_tuples,
           max(s.last_vacuum) AS last_vacuum, max(s.last_autovacuum) AS last_autovacuum,
           max(s.last_analyze) AS last_analyze, max(s.last_autoanalyze) AS last_autoanalyze,
           CAST(sum(pg_total_relation_size(t.relid)) AS bigint) AS total_bytes,
           CAST(sum(pg_relation_size(t.relid)) AS bigint) AS table_bytes,
           CAST(sum(pg_indexes_size(t.relid)) AS bigint) AS index_bytes,
           CAST(count(*) - 1 AS integer) AS partitions
    FROM tree AS t
    LEFT JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = t.relid
) AS a
WHERE c.oid = to_regclass(:health_table)"""
)

_PARTITION_STATS = (
    _TREE.format(param="health_table")
    + """\
SELECT n.nspname || '.' || c.relname AS name,
       pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound,
       s.n_live_tup AS live_tuples, s.n_dead_tup AS dead_tuples,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       pg_total_relation_size(c.oid) AS total_bytes,
       pg_relation_size(c.oid) AS table_bytes,
       pg_indexes_size(c.oid) AS index_bytes
FROM tree AS t
JOIN pg_catalog.pg_class AS c ON c.oid = t.relid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid <> to_regclass(:health_table) AND c.relkind <> 'p'
ORDER BY n.nspname, c.relname"""
)

_XMIN_HOLDERS = """\
SELECT a.pid, a.state, age(a.backend_xmin) AS xmin_age, a.xact_start, a.query_start,
       now() - a.xact_start AS transaction_age
FROM pg_catalog.pg_stat_activity AS a
WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
  AND a.datname = current_database()
ORDER BY age(a.backend_xmin) DESC, a.pid
LIMIT :holders"""


def _name(target: object, key: str) -> BindParameter[str]:
    return bindparam(key, _PREPARER.format_table(table_of(target)), type_=Text)


def prune_lock(target: object) -> TextClause:
    """Try the pruner's transaction-level advisory lock of a table; one row, ``locked``.

    The key is ``hashtextextended('sa_outbox.prune:' || schema || '.' || table, 0)``, from
    the name the table resolves to, so every process pruning that table asks for the same
    lock. No row when the table does not exist.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> prune_lock(Job).compile().params
        {'prune_table': 'jobs'}
    """
    return sql_text(_PRUNE_LOCK).bindparams(_name(target, "prune_table"))


def table_stats(target: object) -> TextClause:
    """A table's vacuum statistics and sizes (``pg_stat_user_tables``, ``pg_*_size``),
    summed over its partitions when it has some; one row.

    Rows: ``name``; ``live_tuples``, ``dead_tuples`` and the sizes (``total_bytes``,
    ``table_bytes``, ``index_bytes``) summed over the table and every table under it
    (partitions, sub-partitions, inheritance children); ``last_vacuum``,
    ``last_autovacuum``, ``last_analyze``, ``last_autoanalyze``, the most recent over them;
    ``partitions``, how many tables are under it (0 for a plain table). No row when the
    table does not exist. `partition_stats` has the same numbers partition by partition.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "n_dead_tup" in str(table_stats(Job))
        True
    """
    return sql_text(_TABLE_STATS).bindparams(_name(target, "health_table"))


def partition_stats(target: object) -> TextClause:
    """`table_stats`'s columns, one row per partition of a table (the tables under it that
    hold rows: leaf partitions, inheritance children), by name; none for a plain table.

    ``bound`` is the partition's bound as PostgreSQL prints it (``FOR VALUES FROM (…) TO
    (…)``, ``DEFAULT``; ``NULL`` for an inheritance child).

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> partition_stats(Job).compile().params
        {'health_table': 'jobs'}
    """
    return sql_text(_PARTITION_STATS).bindparams(_name(target, "health_table"))


def xmin_holders(limit: int = 5) -> TextClause:
    """The other sessions of this database holding back the xmin horizon, oldest first.

    Examples:
        >>> xmin_holders(3).compile().params
        {'holders': 3}
    """
    return sql_text(_XMIN_HOLDERS).bindparams(holders=limit)


def oldest_ready_pending_age(target: object, *, clock: Clock | None = None) -> Select[Any]:
    """How long the oldest ready ``pending`` job (``run_at`` passed) has waited; NULL if none.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> "min(jobs.run_at)" in str(oldest_ready_pending_age(Job))
        True
    """
    t = table_of(target)
    now = now_of(clock)
    return select(now - func.min(t.c.run_at)).where(
        t.c.status == JobStatus.PENDING, t.c.run_at <= now
    )


def count_events_by_state(target: object) -> Select[int, int, int]:
    """How many outbox events are published, unpublished (claimable) and parked; one row.

    Examples:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "FILTER" in str(count_events_by_state(OutboxEvent))
        True
    """
    t = table_of(target)
    published = t.c.published_at.is_not(None)
    parked = t.c.published_at.is_(None) & t.c.parked_at.is_not(None)
    unpublished = t.c.published_at.is_(None) & t.c.parked_at.is_(None)
    return select(
        func.count().filter(published),
        func.count().filter(unpublished),
        func.count().filter(parked),
    ).select_from(t)


_VACUUM_CANDIDATES = (
    _TREE.format(param="vacuum_table")
    + """\
SELECT n.nspname AS schema_name, c.relname AS table_name, s.n_dead_tup AS dead_tuples,
       s.n_live_tup AS live_tuples, pg_catalog.pg_has_role(c.relowner, 'USAGE') AS owned
FROM tree AS t
JOIN pg_catalog.pg_class AS c ON c.oid = t.relid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid
ORDER BY s.n_dead_tup DESC, n.nspname, c.relname"""
)


def vacuum_candidates(target: object) -> TextClause:
    """A table's dead-tuple count, with one row per partition when it is partitioned.

    Rows: ``schema_name``, ``table_name``, ``dead_tuples`` and ``live_tuples``
    (``pg_stat_user_tables``) and ``owned`` (whether the current role may ``VACUUM`` it),
    most dead tuples first. A partitioned parent has no statistics of its own: its
    partitions (and theirs, when sub-partitioned) are listed too.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> vacuum_candidates(Job).compile().params
        {'vacuum_table': 'jobs'}
    """
    return sql_text(_VACUUM_CANDIDATES).bindparams(_name(target, "vacuum_table"))


def vacuum_table(schema: str, name: str) -> TextClause:
    """``VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON)`` of one table; run it outside a transaction.

    ``SKIP_LOCKED`` returns at once when another vacuum (autovacuum included) holds the
    table. ``INDEX_CLEANUP ON`` matters: with the default (``AUTO``) PostgreSQL skips the
    index pass when dead rows touch under 2 % of a big table's pages, which is exactly the
    case of a large history with a dead head in the ready index.

    Examples:
        >>> str(vacuum_table("work", "jobs"))
        'VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) work.jobs'
    """
    qualified = f"{_PREPARER.quote_schema(schema)}.{_PREPARER.quote(name)}"
    return sql_text(f"VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) {qualified}")
