"""Layer 1: tables range-partitioned by ``created_at``, and what each kind needs to be one.

A model with ``__partition_interval__ = "day"`` (or ``"hour"``, ``"week"``, ``"month"``)
declares its table ``PARTITION BY RANGE (created_at)`` with the primary key ``(id,
created_at)`` (a unique index on a partitioned table must hold the partition key). Its
indexes are declared on the parent; PostgreSQL creates them on every partition. `TableSetup`
(in the mixins' ``__table_args__``) makes ``create_all`` create, after the table:

- a ``DEFAULT`` partition, ``{table}_default``, so that no insert ever fails for want of a
  partition;
- the partition of the current interval and `INITIAL_PARTITIONS_AHEAD` more, computed by the
  database from ``now()`` in a ``DO`` block (so ``alembic upgrade --sql`` can print it);
- for a job table, the ``{table}_dedup`` trigger (see `create_dedup_trigger_sql`), since a
  unique index on ``(kind, deduplication_key)`` alone is impossible on a partitioned table.

Partitions are named ``{table}_p{start}``, their bounds in UTC: ``jobs_p2030010100``
(hour), ``jobs_p20300101`` (day, and week: its Monday), ``jobs_p203001`` (month).
``alembic_ext``'s operations run the same SQL; `sa_outbox.maintain_partitions` keeps
creating partitions ahead and drops the old ones. On an unpartitioned table, `TableSetup`
applies the storage settings (``ALTER TABLE … SET``); on a partitioned one, each partition
is created with them. The SQL contains neither ``:`` nor ``%``.

Examples:
    >>> import datetime as dt
    >>> start = interval_start(dt.datetime(2030, 1, 2, 15, 30, tzinfo=dt.UTC), "week")
    >>> start.isoformat(), partition_name("jobs", start, "week")
    ('2029-12-31T00:00:00+00:00', 'jobs_p20291231')
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy import DDL, PrimaryKeyConstraint, Table, event
from sqlalchemy.sql.schema import SchemaItem

from .._exceptions import InvalidArgument
from .._validation import identifier
from ._storage import alter_storage_sql, preparer, with_clause

__all__ = [
    "INITIAL_PARTITIONS_AHEAD",
    "PARTITION_INFO_KEY",
    "PARTITION_INTERVALS",
    "PartitionInterval",
    "TableSetup",
    "check_partition_interval",
    "create_dedup_trigger_sql",
    "create_partitions_sql",
    "default_partition_name",
    "drop_dedup_trigger_sql",
    "interval_start",
    "next_start",
    "partition_interval_of",
    "partition_name",
    "qualified_name",
    "setup_sql",
]

PartitionInterval = Literal["hour", "day", "week", "month"]
#: The intervals a table may be partitioned by.
PARTITION_INTERVALS: tuple[PartitionInterval, ...] = ("hour", "day", "week", "month")
#: Key of ``Table.info`` where the mixins record a partitioned table's interval.
PARTITION_INFO_KEY = "sa_outbox_partition_interval"
#: Partitions created with the table beyond the current interval's.
INITIAL_PARTITIONS_AHEAD = 3

_STEP = {"hour": "1 hour", "day": "1 day", "week": "7 days", "month": "1 month"}
_SQL_STAMP = {"hour": "YYYYMMDDHH24", "day": "YYYYMMDD", "week": "YYYYMMDD", "month": "YYYYMM"}
_STAMP = {"hour": "%Y%m%d%H", "day": "%Y%m%d", "week": "%Y%m%d", "month": "%Y%m"}


def check_partition_interval(value: object, what: str) -> PartitionInterval | None:
    """``value`` if it is one of `PARTITION_INTERVALS` or ``None``; else a clear error.

    Examples:
        >>> check_partition_interval("daily", "__partition_interval__ of Job")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: __partition_interval__ of Job must be one of \
'hour', 'day', 'week', 'month' (or None), got 'daily'
    """
    if value is None:
        return None
    for interval in PARTITION_INTERVALS:
        if value == interval and isinstance(value, str):
            return interval
    choices = ", ".join(repr(i) for i in PARTITION_INTERVALS)
    raise InvalidArgument(f"{what} must be one of {choices} (or None), got {value!r}")


def partition_interval_of(table: Table) -> PartitionInterval | None:
    """The interval a mixin's table is partitioned by; ``None`` when it is not partitioned.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> partition_interval_of(Table("jobs", MetaData(), info={PARTITION_INFO_KEY: "day"}))
        'day'
    """
    value = table.info.get(PARTITION_INFO_KEY)
    return check_partition_interval(value, f"partition interval of table {table.name!r}")


def interval_start(when: dt.datetime, interval: PartitionInterval) -> dt.datetime:
    """The start (UTC) of the partition interval holding ``when``.

    Examples:
        >>> interval_start(dt.datetime(2030, 5, 17, 9, 45, tzinfo=dt.UTC), "month")
        datetime.datetime(2030, 5, 1, 0, 0, tzinfo=datetime.timezone.utc)
    """
    at = when.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    if interval == "hour":
        return at
    day = at.replace(hour=0)
    if interval == "day":
        return day
    if interval == "week":
        return day - dt.timedelta(days=day.weekday())
    return day.replace(day=1)


def next_start(start: dt.datetime, interval: PartitionInterval) -> dt.datetime:
    """The start of the interval after the one starting at ``start``.

    Examples:
        >>> next_start(dt.datetime(2030, 12, 1, tzinfo=dt.UTC), "month").date()
        datetime.date(2031, 1, 1)
    """
    if interval == "hour":
        return start + dt.timedelta(hours=1)
    if interval == "day":
        return start + dt.timedelta(days=1)
    if interval == "week":
        return start + dt.timedelta(days=7)
    year, month = divmod(start.month, 12)
    return start.replace(year=start.year + year, month=month + 1)


def partition_name(table_name: str, start: dt.datetime, interval: PartitionInterval) -> str:
    """The name of the partition of ``table_name`` starting at ``start``.

    Examples:
        >>> partition_name("jobs", dt.datetime(2030, 1, 1, 7, tzinfo=dt.UTC), "hour")
        'jobs_p2030010107'
    """
    stamp = start.astimezone(dt.UTC).strftime(_STAMP[interval])
    return identifier(f"{table_name}_p{stamp}", f"partition name of table {table_name!r}")


def default_partition_name(table_name: str) -> str:
    """The name of a partitioned table's ``DEFAULT`` partition.

    Examples:
        >>> default_partition_name("jobs")
        'jobs_default'
    """
    return identifier(f"{table_name}_default", f"default partition name of {table_name!r}")


def qualified_name(table: Table, name: str) -> str:
    """``name`` (a partition, a function) in ``table``'s schema, quoted as SQL needs it.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> qualified_name(Table("jobs", MetaData(), schema="w"), "jobs_default")
        'w.jobs_default'
    """
    return _in_schema(table, name)


def _in_schema(table: Table, name: str) -> str:
    quoted = preparer().quote(name)
    return quoted if table.schema is None else f"{preparer().quote_schema(table.schema)}.{quoted}"


def create_partitions_sql(
    table: Table,
    interval: PartitionInterval,
    storage: Mapping[str, int | float | bool] | None,
    *,
    ahead: int = INITIAL_PARTITIONS_AHEAD,
) -> list[str]:
    """The ``DEFAULT`` partition, then a ``DO`` block creating the current interval's
    partition and ``ahead`` more, from the database's ``now()`` (UTC bounds).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> default, block = create_partitions_sql(Table("jobs", MetaData()), "day", None)
        >>> default
        'CREATE TABLE IF NOT EXISTS jobs_default PARTITION OF jobs DEFAULT'
        >>> "date_trunc('day', now() AT TIME ZONE 'UTC')" in block
        True
    """
    parent = str(preparer().format_table(table))
    options = with_clause(storage)
    default = default_partition_name(table.name)
    prefix = "" if table.schema is None else f"'{preparer().quote_schema(table.schema)}.' || "
    create_default = (
        f"CREATE TABLE IF NOT EXISTS {_in_schema(table, default)} PARTITION OF {parent} "
        f"DEFAULT{options}"
    )
    create_ahead = f"""\
DO $sa_outbox$
DECLARE
    first_start timestamp = date_trunc('{interval}', now() AT TIME ZONE 'UTC');
    lower_bound timestamp;
    upper_bound timestamp;
BEGIN
    FOR i IN 0..{int(ahead)} LOOP
        lower_bound = first_start + i * interval '{_STEP[interval]}';
        upper_bound = lower_bound + interval '{_STEP[interval]}';
        EXECUTE 'CREATE TABLE IF NOT EXISTS ' || {prefix}quote_ident('{table.name}_p'
            || to_char(lower_bound, '{_SQL_STAMP[interval]}'))
            || ' PARTITION OF {parent} FOR VALUES FROM ('
            || quote_literal(CAST(lower_bound AT TIME ZONE 'UTC' AS text)) || ') TO ('
            || quote_literal(CAST(upper_bound AT TIME ZONE 'UTC' AS text)) || ')'
            || '{options}';
    END LOOP;
END
$sa_outbox$"""
    return [create_default, create_ahead]


def dedup_trigger_name(table: Table) -> str:
    """The name of a partitioned job table's deduplication trigger (and its function).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> dedup_trigger_name(Table("jobs", MetaData()))
        'jobs_dedup'
    """
    return identifier(f"{table.name}_dedup", f"dedup trigger name of table {table.name!r}")


def create_dedup_trigger_sql(table: Table) -> list[str]:
    """The trigger that keeps ``(kind, deduplication_key)`` unique across all partitions.

    ``BEFORE INSERT … FOR EACH ROW`` (PostgreSQL 13+ clones it onto every partition): for a
    row with a key, take a transaction-level advisory lock on ``(table, kind, key)``, then
    look for the key in the whole table; if a row holds it, skip the insert (``RETURN
    NULL``), as ``ON CONFLICT DO NOTHING`` would. A second enqueue of the key waits on the
    lock until the first commits or rolls back, then looks: at ``READ COMMITTED`` each
    query of a trigger takes a new snapshot, so it sees the committed row. Rows earlier in
    the same statement are seen too.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> function, trigger = create_dedup_trigger_sql(Table("jobs", MetaData()))
        >>> trigger
        'CREATE TRIGGER jobs_dedup BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_dedup()'
    """
    name = dedup_trigger_name(table)
    function = _in_schema(table, name)
    parent = table.name.replace("'", "''")
    create_function = f"""\
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
DECLARE
    taken boolean;
BEGIN
    IF NEW.deduplication_key IS NULL THEN
        RETURN NEW;
    END IF;
    -- One enqueue of a key at a time, until it commits or rolls back; then look for it.
    PERFORM pg_advisory_xact_lock(
        hashtext('sa_outbox.dedup/' || TG_TABLE_SCHEMA || '.' || '{parent}'),
        hashtext(NEW.kind || '/' || NEW.deduplication_key));
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || quote_ident(TG_TABLE_SCHEMA) || '.'
        || quote_ident('{parent}') || ' WHERE kind = $1 AND deduplication_key = $2'
        || ' AND deduplication_key IS NOT NULL)'
        INTO taken USING NEW.kind, NEW.deduplication_key;
    IF taken THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$sa_outbox$"""
    create_trigger = (
        f"CREATE TRIGGER {preparer().quote(name)} BEFORE INSERT ON "
        f"{preparer().format_table(table)} FOR EACH ROW EXECUTE FUNCTION {function}()"
    )
    return [create_function, create_trigger]


def drop_dedup_trigger_sql(table: Table) -> list[str]:
    """``DROP FUNCTION IF EXISTS`` of the dedup trigger's function (the table takes the
    trigger with it); harmless for a table that never had one.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> drop_dedup_trigger_sql(Table("jobs", MetaData(), schema="w"))
        ['DROP FUNCTION IF EXISTS w.jobs_dedup()']
    """
    return [f"DROP FUNCTION IF EXISTS {_in_schema(table, dedup_trigger_name(table))}()"]


def setup_sql(
    table: Table,
    kind: str,
    interval: PartitionInterval | None,
    storage: Mapping[str, int | float | bool] | None,
) -> list[str]:
    """What follows ``CREATE TABLE`` (and its indexes) for a mixin's table.

    Unpartitioned: the storage settings. Partitioned: the partitions, with the settings,
    and for jobs the dedup trigger.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> setup_sql(Table("jobs", MetaData()), "job", None, {"fillfactor": 80})
        ['ALTER TABLE jobs SET (fillfactor = 80)']
    """
    if interval is None:
        if not storage:
            return []
        return [alter_storage_sql(table, storage)]
    sql = create_partitions_sql(table, interval, storage)
    if kind == "job":
        sql += create_dedup_trigger_sql(table)
    return sql


class TableSetup(SchemaItem):
    """A table item of the mixins: the primary key of a partitioned table, and the DDL that
    follows ``CREATE TABLE`` in ``create_all`` (`setup_sql`).

    Examples:
        >>> from sqlalchemy import Column, DateTime, MetaData, Uuid
        >>> t = Table("jobs", MetaData(), Column("id", Uuid, primary_key=True),
        ...           Column("created_at", DateTime(timezone=True)),
        ...           TableSetup("job", "day", None), postgresql_partition_by="RANGE (created_at)")
        >>> list(t.primary_key.columns.keys())
        ['id', 'created_at']
    """

    __visit_name__ = "sa_outbox_table_setup"

    def __init__(
        self,
        kind: str,
        interval: PartitionInterval | None,
        storage: Mapping[str, int | float | bool] | None,
    ) -> None:
        self.kind = kind
        self.interval = interval
        self.storage = None if storage is None else dict(storage)

    def _set_parent(self, parent: Any, **kw: Any) -> None:
        assert isinstance(parent, Table)
        if self.interval is not None:
            # The partition key joins the primary key. Flag the column first: SQLAlchemy
            # warns when an explicit primary key differs from the flagged columns.
            parent.c.created_at.primary_key = True
            parent.append_constraint(PrimaryKeyConstraint(parent.c.id, parent.c.created_at))
        for sql in setup_sql(parent, self.kind, self.interval, self.storage):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_create", ddl.execute_if(dialect="postgresql"))
        if self.interval is not None and self.kind == "job":
            for sql in drop_dedup_trigger_sql(parent):
                ddl = DDL(sql)  # type: ignore[no-untyped-call]
                event.listen(parent, "after_drop", ddl.execute_if(dialect="postgresql"))
