"""Statements of partition maintenance: the catalog reads, the lock, the DDL.

Pure builders, like the rest of the query builder: they return SQL, never run it. DDL takes
no bind parameters, so bounds and names are rendered into the text: names are identifiers
checked by `sa_outbox.schema._partition_ddl` and quoted here, bounds are ``datetime`` values
rendered in ISO 8601. Every statement names the parent as ``parent`` (a `Table` whose
``schema`` is the schema the table really lives in: partitions are created beside it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy import DDL, DateTime, Select, Text, bindparam, select
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import TextClause

from .._clock import Clock
from .._exceptions import InvalidArgument
from .._validation import identifier
from ..schema._partition_ddl import qualified_name
from ..schema._storage import with_clause
from ._common import now_of, table_of

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]

#: What the maintainer's advisory lock key is derived from, before the table's name.
PARTITION_LOCK_PREFIX = "sa_outbox.partitions:"

_LOCK = f"""\
SELECT {{function}}(
         hashtextextended('{PARTITION_LOCK_PREFIX}' || n.nspname || '.' || c.relname, 0)) AS locked
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(:partitioned_table)"""

_LAYOUT = """\
SELECT c.relkind AS kind, n.nspname AS schema, c.reloptions AS own_options,
       (SELECT p.reloptions
        FROM pg_catalog.pg_inherits AS i
        JOIN pg_catalog.pg_class AS p ON p.oid = i.inhrelid
        WHERE i.inhparent = c.oid
        ORDER BY pg_get_expr(p.relpartbound, p.oid) = 'DEFAULT' DESC, p.relname
        LIMIT 1) AS partition_options
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(:partitioned_table)"""

_PARTITIONS = """\
SELECT q.name, q.is_default,
       CAST(q.bounds[1] AS timestamptz) AS lower, CAST(q.bounds[2] AS timestamptz) AS upper
FROM (SELECT p.relname AS name,
             pg_get_expr(p.relpartbound, p.oid) = 'DEFAULT' AS is_default,
             regexp_match(pg_get_expr(p.relpartbound, p.oid),
                          $re$FROM \\('([^']*)'\\) TO \\('([^']*)'\\)$re$) AS bounds
      FROM pg_catalog.pg_inherits AS i
      JOIN pg_catalog.pg_class AS p ON p.oid = i.inhrelid
      WHERE i.inhparent = to_regclass(:partitioned_table)) AS q
ORDER BY q.is_default DESC, 3, q.name"""

_PARTITIONS_IN_SCHEMA = """\
SELECT c.relname
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relispartition AND n.nspname = coalesce(:schema, current_schema())"""

LockMode = Literal["EXCLUSIVE", "ACCESS EXCLUSIVE"]


def _parent_name(parent: object) -> Any:
    return bindparam("partitioned_table", _PREPARER.format_table(table_of(parent)), type_=Text)


def _partition(parent: object, name: str) -> str:
    t = table_of(parent)
    return qualified_name(t, identifier(name, "partition name"))


def _bound(when: dt.datetime) -> str:
    if when.tzinfo is None:
        raise InvalidArgument(f"a partition bound must be timezone-aware, got naive {when}")
    return "'" + when.astimezone(dt.UTC).isoformat() + "'"


def partition_lock(parent: object) -> TextClause:
    """Try the maintainer's session-level advisory lock of a table; one row, ``locked``.

    Session-level, because maintenance runs several short transactions: release it with
    `partition_unlock` on the same connection. No row when the table does not exist.

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> partition_lock(Table("jobs", MetaData())).compile().params
        {'partitioned_table': 'jobs'}
    """
    sql = _LOCK.format(function="pg_try_advisory_lock")
    return sql_text(sql).bindparams(_parent_name(parent))


def partition_unlock(parent: object) -> TextClause:
    """Release the lock `partition_lock` took.

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> "pg_advisory_unlock" in str(partition_unlock(Table("jobs", MetaData())))
        True
    """
    return sql_text(_LOCK.format(function="pg_advisory_unlock")).bindparams(_parent_name(parent))


def table_layout(parent: object) -> TextClause:
    """One row about a table: ``kind`` (``relkind``: ``p`` when partitioned), ``schema``,
    ``own_options`` (its ``reloptions``) and ``partition_options`` (the ``DEFAULT``
    partition's, else the first partition's). No row when the table does not exist.

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> table_layout(Table("jobs", MetaData(), schema="w")).compile().params
        {'partitioned_table': 'w.jobs'}
    """
    return sql_text(_LAYOUT).bindparams(_parent_name(parent))


_TRIGGER = """\
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_trigger AS t
    WHERE t.tgrelid = to_regclass(:partitioned_table) AND t.tgname = :trigger
        AND NOT t.tgisinternal AND t.tgparentid = 0
) AS present"""


def table_has_trigger(table: object, trigger: str) -> TextClause:
    """One row, ``present``: whether ``table`` has a trigger of its own named ``trigger``
    (false when the table does not exist).

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> table_has_trigger(Table("jobs", MetaData(), schema="w"), "jobs_serial").compile().params
        {'partitioned_table': 'w.jobs', 'trigger': 'jobs_serial'}
    """
    name = bindparam("trigger", identifier(trigger, "trigger name"), type_=Text)
    return sql_text(_TRIGGER).bindparams(_parent_name(table), name)


def list_partitions(parent: object) -> TextClause:
    """The partitions of a table: ``name``, ``is_default``, ``lower``, ``upper`` (range
    bounds as ``timestamptz``; ``NULL`` for the default partition), the default first,
    then by lower bound.

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> "pg_inherits" in str(list_partitions(Table("jobs", MetaData())))
        True
    """
    return sql_text(_PARTITIONS).bindparams(_parent_name(parent))


def partitions_in_schema(schema: str | None) -> TextClause:
    """The names of the tables of a schema (``None``: the current one) that are partitions.

    Examples:
        >>> partitions_in_schema("work").compile().params
        {'schema': 'work'}
    """
    return sql_text(_PARTITIONS_IN_SCHEMA).bindparams(bindparam("schema", schema, type_=Text))


def select_now(clock: Clock | None = None) -> Select[tuple[dt.datetime]]:
    """``SELECT now()`` as ``clock`` says it (the database's, or a `FakeClock`'s).

    Examples:
        >>> str(select_now())
        'SELECT now() AS now_1'
    """
    return select(now_of(clock))


def set_lock_timeout(timeout: dt.timedelta) -> TextClause:
    """``lock_timeout`` for the rest of the transaction (``set_config(…, true)``).

    Examples:
        >>> import datetime as dt
        >>> set_lock_timeout(dt.timedelta(seconds=5)).compile().params
        {'lock_timeout': '5000ms'}
    """
    milliseconds = max(1, int(timeout.total_seconds() * 1000))
    return sql_text("SELECT set_config('lock_timeout', :lock_timeout, true)").bindparams(
        bindparam("lock_timeout", f"{milliseconds}ms", type_=Text)
    )


def lock_partition(parent: object, name: str, mode: LockMode = "EXCLUSIVE") -> DDL:
    """``LOCK TABLE partition IN … MODE`` (``EXCLUSIVE`` lets reads through, not writes).

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> print(lock_partition(Table("jobs", MetaData()), "jobs_default").statement)
        LOCK TABLE jobs_default IN EXCLUSIVE MODE
    """
    if mode not in ("EXCLUSIVE", "ACCESS EXCLUSIVE"):
        raise InvalidArgument(f"lock mode must be EXCLUSIVE or ACCESS EXCLUSIVE, got {mode!r}")
    return DDL(f"LOCK TABLE {_partition(parent, name)} IN {mode} MODE")  # type: ignore[no-untyped-call]


def count_in_range(parent: object, name: str, lower: dt.datetime, upper: dt.datetime) -> TextClause:
    """How many rows of partition ``name`` have ``lower <= created_at < upper``.

    Examples:
        >>> import datetime as dt
        >>> from sqlalchemy import MetaData, Table
        >>> day = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        >>> sql = count_in_range(Table("jobs", MetaData()), "jobs_default", day, day)
        >>> str(sql).split(" WHERE ")[0]
        'SELECT count(*) FROM jobs_default'
    """
    return sql_text(
        f"SELECT count(*) FROM {_partition(parent, name)}"
        " WHERE created_at >= :lower AND created_at < :upper"
    ).bindparams(
        bindparam("lower", lower, type_=DateTime(timezone=True)),
        bindparam("upper", upper, type_=DateTime(timezone=True)),
    )


def create_partition(
    parent: object,
    name: str,
    lower: dt.datetime,
    upper: dt.datetime,
    storage: Mapping[str, int | float | bool] | None,
) -> DDL:
    """``CREATE TABLE name PARTITION OF parent FOR VALUES FROM (lower) TO (upper) WITH (…)``.

    Examples:
        >>> import datetime as dt
        >>> from sqlalchemy import MetaData, Table
        >>> day = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        >>> print(create_partition(Table("jobs", MetaData()), "jobs_p20300101", day,
        ...                        day + dt.timedelta(days=1), {"fillfactor": 80}).statement)
        ... # doctest: +NORMALIZE_WHITESPACE
        CREATE TABLE jobs_p20300101 PARTITION OF jobs FOR VALUES
        FROM ('2030-01-01T00:00:00+00:00') TO ('2030-01-02T00:00:00+00:00') WITH (fillfactor = 80)
    """
    t = table_of(parent)
    return DDL(  # type: ignore[no-untyped-call]
        f"CREATE TABLE {_partition(t, name)} PARTITION OF {_PREPARER.format_table(t)}"
        f" FOR VALUES FROM ({_bound(lower)}) TO ({_bound(upper)}){with_clause(storage)}"
    )


def create_table_like(
    parent: object, name: str, storage: Mapping[str, int | float | bool] | None
) -> DDL:
    """A table shaped like ``parent``, not attached yet (rows move in before it is).

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> print(create_table_like(Table("jobs", MetaData()), "jobs_p20300101", None)
        ...       .statement)
        CREATE TABLE jobs_p20300101 (LIKE jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    """
    t = table_of(parent)
    return DDL(  # type: ignore[no-untyped-call]
        f"CREATE TABLE {_partition(t, name)} (LIKE {_PREPARER.format_table(t)}"
        f" INCLUDING DEFAULTS INCLUDING CONSTRAINTS){with_clause(storage)}"
    )


def move_rows(
    parent: object, source: str, target: str, lower: dt.datetime, upper: dt.datetime
) -> TextClause:
    """Move the rows of ``source`` with ``lower <= created_at < upper`` into ``target`` (a
    table shaped like the parent, not attached): one ``DELETE … RETURNING`` feeding an
    ``INSERT``, so the rows are never in both nor in neither.

    Examples:
        >>> import datetime as dt
        >>> from sqlalchemy import MetaData, Table
        >>> day = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        >>> sql = str(move_rows(Table("jobs", MetaData()), "jobs_default", "jobs_p20300101",
        ...                     day, day))
        >>> sql.startswith("WITH moved AS (DELETE FROM jobs_default")
        True
    """
    return sql_text(
        f"WITH moved AS (DELETE FROM {_partition(parent, source)}"
        " WHERE created_at >= :lower AND created_at < :upper RETURNING *)"
        f" INSERT INTO {_partition(parent, target)} SELECT * FROM moved"
    ).bindparams(
        bindparam("lower", lower, type_=DateTime(timezone=True)),
        bindparam("upper", upper, type_=DateTime(timezone=True)),
    )


def attach_partition(parent: object, name: str, lower: dt.datetime, upper: dt.datetime) -> DDL:
    """``ALTER TABLE parent ATTACH PARTITION name FOR VALUES FROM (…) TO (…)``.

    Examples:
        >>> import datetime as dt
        >>> from sqlalchemy import MetaData, Table
        >>> day = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        >>> attach_partition(Table("jobs", MetaData()), "jobs_p20300101", day, day
        ...                  ).statement.split(" FOR ")[0]
        'ALTER TABLE jobs ATTACH PARTITION jobs_p20300101'
    """
    t = table_of(parent)
    return DDL(  # type: ignore[no-untyped-call]
        f"ALTER TABLE {_PREPARER.format_table(t)} ATTACH PARTITION {_partition(t, name)}"
        f" FOR VALUES FROM ({_bound(lower)}) TO ({_bound(upper)})"
    )


def detach_partition(parent: object, name: str) -> DDL:
    """``ALTER TABLE parent DETACH PARTITION name`` (not ``CONCURRENTLY``: PostgreSQL
    refuses that on a table with a default partition, and it cannot run in a transaction).

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> print(detach_partition(Table("jobs", MetaData()), "jobs_p20300101").statement)
        ALTER TABLE jobs DETACH PARTITION jobs_p20300101
    """
    t = table_of(parent)
    return DDL(  # type: ignore[no-untyped-call]
        f"ALTER TABLE {_PREPARER.format_table(t)} DETACH PARTITION {_partition(t, name)}"
    )


def drop_partition(parent: object, name: str) -> DDL:
    """``DROP TABLE name`` (a partition already detached).

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> print(drop_partition(Table("jobs", MetaData(), schema="w"), "jobs_p20300101")
        ...       .statement)
        DROP TABLE w.jobs_p20300101
    """
    return DDL(f"DROP TABLE {_partition(parent, name)}")  # type: ignore[no-untyped-call]


_UNFINISHED = {
    "job": "status IN ('pending', 'running')",
    "outbox": "published_at IS NULL AND parked_at IS NULL",
}


def has_unfinished_rows(parent: object, name: str, kind: str) -> TextClause:
    """Whether partition ``name`` holds work not done: a ``pending`` or ``running`` job, or
    an event neither published nor parked. Either keeps the partition from being dropped.

    Examples:
        >>> from sqlalchemy import MetaData, Table
        >>> print(has_unfinished_rows(Table("jobs", MetaData()), "jobs_p20300101", "job"))
        SELECT EXISTS (SELECT 1 FROM jobs_p20300101 WHERE status IN ('pending', 'running'))
    """
    if kind not in _UNFINISHED:
        raise InvalidArgument(f"table kind must be 'job' or 'outbox', got {kind!r}")
    return sql_text(
        f"SELECT EXISTS (SELECT 1 FROM {_partition(parent, name)} WHERE {_UNFINISHED[kind]})"
    )
