"""Layer 1: the job table's NOTIFY trigger, so workers wake up when jobs arrive.

One statement-level trigger per job table: ``AFTER INSERT … REFERENCING NEW TABLE … FOR EACH
STATEMENT``. It sends one notification per statement, however many rows it inserted (a bulk
enqueue of 1,000 jobs costs one ``pg_notify``, not 1,000), and PostgreSQL folds identical
notifications of one transaction into one. The payload is the JSON array of the queues that
received pending jobs (``'["default","emails"]'``), or ``''`` when that list would not fit in
a notification; a worker that serves other queues ignores it.

The channel is the table's schema-qualified name, ``"{schema}.{table}"``, computed from the
table the trigger fires on (so a table declared without a schema gets the schema it was
actually created in); a name longer than PostgreSQL's 63-byte limit becomes
``"sa_outbox_" + md5(name)``. `job_notify_channel` computes the same in Python.

`JobMixin` attaches `NotifyTrigger` to its table, so ``metadata.create_all`` creates the
trigger and its function after the table; ``alembic_ext``'s ``create_job_queue`` runs the
same `create_notify_trigger_sql`. The SQL contains neither ``:`` nor ``%``, so it passes
unchanged through ``text()``, ``DDL()`` and psycopg.

Examples:
    >>> job_notify_channel("work", "jobs")
    'work.jobs'
    >>> job_notify_channel("s" * 40, "jobs_of_a_rather_long_name")
    'sa_outbox_b71f9f20d1dcb05b717b4527133b2a2c'
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import DDL, Table, event
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.schema import SchemaItem

from .._validation import identifier

__all__ = [
    "MAX_CHANNEL_BYTES",
    "NotifyTrigger",
    "create_notify_trigger_sql",
    "drop_notify_trigger_sql",
    "job_notify_channel",
    "notify_function_name",
]

#: PostgreSQL's limit on a channel name (NAMEDATALEN - 1).
MAX_CHANNEL_BYTES = 63
#: Notifications must be shorter than 8,000 bytes; a longer queue list is sent as ''.
_MAX_PAYLOAD_BYTES = 7900
_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def job_notify_channel(schema: str, table_name: str) -> str:
    """The channel the job table ``schema.table_name`` notifies on.

    Examples:
        >>> job_notify_channel("public", "jobs")
        'public.jobs'
    """
    name = f"{schema}.{table_name}"
    if len(name.encode()) > MAX_CHANNEL_BYTES:
        return "sa_outbox_" + hashlib.md5(name.encode(), usedforsecurity=False).hexdigest()
    return name


def notify_function_name(table: Table) -> str:
    """The trigger's (and its function's) name: ``{table}_notify``.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> notify_function_name(Table("jobs", MetaData()))
        'jobs_notify'
    """
    return identifier(f"{table.name}_notify", f"notify trigger name of table {table.name!r}")


def _qualified(table: Table, name: str) -> str:
    quoted = _PREPARER.quote(name)
    return quoted if table.schema is None else f"{_PREPARER.quote_schema(table.schema)}.{quoted}"


def create_notify_trigger_sql(table: Table) -> list[str]:
    """``CREATE FUNCTION`` and ``CREATE TRIGGER`` for the job table ``table``.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> create, trigger = create_notify_trigger_sql(Table("jobs", MetaData(), schema="w"))
        >>> print(create.splitlines()[0])
        CREATE OR REPLACE FUNCTION w.jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
        >>> head, _, tail = trigger.partition(" REFERENCING ")
        >>> head
        'CREATE TRIGGER jobs_notify AFTER INSERT ON w.jobs'
        >>> tail
        'NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION w.jobs_notify()'
    """
    name = notify_function_name(table)
    function = _qualified(table, name)
    create_function = f"""\
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
DECLARE
    queues text;
    channel text;
BEGIN
    SELECT CAST(json_agg(DISTINCT new_jobs.queue) AS text) INTO queues
        FROM new_jobs WHERE new_jobs.status = 'pending';
    IF queues IS NULL THEN
        RETURN NULL;
    END IF;
    IF octet_length(queues) > {_MAX_PAYLOAD_BYTES} THEN
        queues = '';
    END IF;
    channel = TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME;
    IF octet_length(channel) > {MAX_CHANNEL_BYTES} THEN
        channel = 'sa_outbox_' || md5(channel);
    END IF;
    PERFORM pg_notify(channel, queues);
    RETURN NULL;
END
$sa_outbox$"""
    create_trigger = (
        f"CREATE TRIGGER {_PREPARER.quote(name)} AFTER INSERT ON {_PREPARER.format_table(table)}"
        f" REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    )
    return [create_function, create_trigger]


def drop_notify_trigger_sql(table: Table) -> list[str]:
    """``DROP FUNCTION`` of the trigger's function (``DROP TABLE`` drops the trigger itself).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> drop_notify_trigger_sql(Table("jobs", MetaData()))
        ['DROP FUNCTION IF EXISTS jobs_notify()']
    """
    return [f"DROP FUNCTION IF EXISTS {_qualified(table, notify_function_name(table))}()"]


class NotifyTrigger(SchemaItem):
    """A table item that creates the NOTIFY trigger after its table (``metadata.create_all``)
    and drops the trigger's function after the table (``metadata.drop_all``).

    `JobMixin` puts one in its ``__table_args__``; on a table of your own, pass one to
    ``Table(...)``. Only PostgreSQL runs it.

    Examples:
        >>> from sqlalchemy import Column, Integer, MetaData, Text
        >>> from sqlalchemy import create_mock_engine
        >>> t = Table("jobs", MetaData(), Column("id", Integer, primary_key=True),
        ...           Column("queue", Text), NotifyTrigger())
        >>> ddl = []
        >>> engine = create_mock_engine("postgresql+psycopg://", lambda sql, *a, **kw: ddl.append(
        ...     " ".join(str(sql.compile(dialect=engine.dialect)).split()[:3])))
        >>> t.metadata.create_all(engine, checkfirst=False)
        >>> ddl
        ['CREATE TABLE jobs', 'CREATE OR REPLACE', 'CREATE TRIGGER jobs_notify']
    """

    __visit_name__ = "sa_outbox_notify_trigger"

    def _set_parent(self, parent: Any, **kw: Any) -> None:
        assert isinstance(parent, Table)
        for sql in create_notify_trigger_sql(parent):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_create", ddl.execute_if(dialect="postgresql"))
        for sql in drop_notify_trigger_sql(parent):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_drop", ddl.execute_if(dialect="postgresql"))
