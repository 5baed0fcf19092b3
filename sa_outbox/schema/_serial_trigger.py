"""Layer 1: the job table's serial trigger, which orders the jobs of each serial key.

Jobs enqueued with the same ``lock_key`` run one at a time, in the order they were
enqueued (docs/concurrency.md). "Enqueued" must mean *committed*: a transaction that began
first may commit last, and a job that becomes visible after a later one has run would run
out of order. So ``{table}_serial`` (``BEFORE INSERT … FOR EACH ROW``, only for rows with a
``lock_key``: its ``WHEN`` clause spares every other job even the call) takes a
transaction-level advisory lock on ``(table, lock_key)`` — one enqueuer per key until it
commits — and then sets ``lock_seq`` to the WAL insert position. The position only grows,
and the next enqueuer of the key reads it after this one's commit record was written: so
within a key, ``lock_seq`` follows commit order, and once a job of the key is visible, every
earlier one is visible too (or was rolled back). Rows that share a position (an unlogged
table writes no WAL) are ordered by ``id``, which one process makes increasing.

The claim then takes a job with a ``lock_key`` only if no other job of the key is running
and none with a smaller ``(lock_seq, id)`` is pending (see
`sa_outbox.statements.claim_jobs`). `JobMixin` attaches `SerialTrigger` to its table, so
``metadata.create_all`` creates it; ``alembic_ext``'s ``create_job_queue`` runs the same
SQL, and ``op.create_serial_trigger`` adds it to a table made before serial keys existed.

Examples:
    >>> from sqlalchemy import MetaData, Table
    >>> serial_trigger_name(Table("jobs", MetaData()))
    'jobs_serial'
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DDL, Table, event
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.schema import SchemaItem

from .._validation import identifier

__all__ = [
    "SerialTrigger",
    "create_serial_trigger_sql",
    "drop_serial_trigger_sql",
    "serial_trigger_name",
]

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def serial_trigger_name(table: Table) -> str:
    """The trigger's (and its function's) name: ``{table}_serial``.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> serial_trigger_name(Table("background_jobs", MetaData()))
        'background_jobs_serial'
    """
    return identifier(f"{table.name}_serial", f"serial trigger name of table {table.name!r}")


def _qualified(table: Table, name: str) -> str:
    quoted = _PREPARER.quote(name)
    return quoted if table.schema is None else f"{_PREPARER.quote_schema(table.schema)}.{quoted}"


def create_serial_trigger_sql(table: Table) -> list[str]:
    """``CREATE FUNCTION`` and ``CREATE TRIGGER`` of the serial trigger of ``table``.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> function, trigger = create_serial_trigger_sql(Table("jobs", MetaData(), schema="w"))
        >>> print(function.splitlines()[0])
        CREATE OR REPLACE FUNCTION w.jobs_serial() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
        >>> trigger.split(" FOR EACH ROW ")  # doctest: +NORMALIZE_WHITESPACE
        ['CREATE TRIGGER jobs_serial BEFORE INSERT ON w.jobs',
         'WHEN (NEW.lock_key IS NOT NULL) EXECUTE FUNCTION w.jobs_serial()']
    """
    name = serial_trigger_name(table)
    function = _qualified(table, name)
    # The parent's name, also when the trigger fires on a partition: one lock per key.
    lock_table = table.name.replace("'", "''")
    create_function = f"""\
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
BEGIN
    -- One enqueuer per key until it commits; then a position later than its commit.
    PERFORM pg_advisory_xact_lock(hashtext('{lock_table}'), hashtext(NEW.lock_key));
    NEW.lock_seq = pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn);
    RETURN NEW;
END
$sa_outbox$"""
    create_trigger = (
        f"CREATE TRIGGER {_PREPARER.quote(name)} BEFORE INSERT ON "
        f"{_PREPARER.format_table(table)} FOR EACH ROW WHEN (NEW.lock_key IS NOT NULL) "
        f"EXECUTE FUNCTION {function}()"
    )
    return [create_function, create_trigger]


def drop_serial_trigger_sql(table: Table, *, with_trigger: bool = False) -> list[str]:
    """``DROP FUNCTION`` of the trigger's function (``DROP TABLE`` drops the trigger); with
    ``with_trigger``, the trigger first (the table stays).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> drop_serial_trigger_sql(Table("jobs", MetaData()))
        ['DROP FUNCTION IF EXISTS jobs_serial()']
    """
    name = serial_trigger_name(table)
    drop_function = f"DROP FUNCTION IF EXISTS {_qualified(table, name)}()"
    if not with_trigger:
        return [drop_function]
    target = _PREPARER.format_table(table)
    return [f"DROP TRIGGER IF EXISTS {_PREPARER.quote(name)} ON {target}", drop_function]


class SerialTrigger(SchemaItem):
    """A table item that creates the serial trigger after its table (``create_all``) and
    drops its function after the table (``drop_all``); only PostgreSQL runs it.

    Examples:
        >>> from sqlalchemy import Column, Integer, MetaData, Text, create_mock_engine
        >>> t = Table("jobs", MetaData(), Column("id", Integer, primary_key=True),
        ...           Column("lock_key", Text), SerialTrigger())
        >>> ddl = []
        >>> engine = create_mock_engine("postgresql+psycopg://", lambda sql, *a, **kw: ddl.append(
        ...     " ".join(str(sql.compile(dialect=engine.dialect)).split()[:3])))
        >>> t.metadata.create_all(engine, checkfirst=False)
        >>> ddl
        ['CREATE TABLE jobs', 'CREATE OR REPLACE', 'CREATE TRIGGER jobs_serial']
    """

    __visit_name__ = "sa_outbox_serial_trigger"

    def _set_parent(self, parent: Any, **kw: Any) -> None:
        assert isinstance(parent, Table)
        for sql in create_serial_trigger_sql(parent):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_create", ddl.execute_if(dialect="postgresql"))
        for sql in drop_serial_trigger_sql(parent):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_drop", ddl.execute_if(dialect="postgresql"))
