"""Layer 1: the outbox table's two triggers, which the relay's guarantees rest on.

``{table}_order_events`` (``BEFORE INSERT … FOR EACH ROW``) makes ``seq`` follow commit order
within an aggregate. It takes a transaction-scoped advisory lock on the row's aggregate
(``aggregate_type``, ``aggregate_id``), *then* draws the row's ``seq`` from the column's
sequence (the value the identity default drew before the trigger ran is discarded). Two
transactions that write events of one aggregate therefore run their inserts one after the
other: the second waits until the first has committed or rolled back, and draws a larger
``seq``. So, for one aggregate, ``seq`` order is commit order, and once a row is visible every
row of its aggregate with a smaller ``seq`` is visible too (or was rolled back): the relay
never has to wait for, or skip, an earlier event still in flight. Different aggregates never
wait on each other. docs/relay.md has the proof.

``{table}_wake_relay`` (``AFTER INSERT … FOR EACH STATEMENT``) sends one ``pg_notify`` per
inserting statement on the channel ``"{schema}.{table}"`` (``"sa_outbox_" + md5(…)`` when
longer than 63 bytes), so relays that ``LISTEN`` wake up at commit.

The lock is ``pg_advisory_xact_lock(hashtext('{schema}.{table}'), hashtext(type || '/' ||
id))``, the two-key form, so it does not meet the application's own one-key advisory locks.
A hash collision between two aggregates only makes their writers wait for each other.

`OutboxMixin` attaches `OutboxTriggers` to its table, so ``metadata.create_all`` creates the
triggers and their functions after the table; ``alembic_ext``'s ``create_outbox`` runs the same
`create_outbox_triggers_sql`. The SQL contains neither ``:`` nor ``%``, so it passes unchanged
through ``text()``, ``DDL()`` and psycopg.

Examples:
    >>> outbox_notify_channel("work", "outbox")
    'work.outbox'
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import DDL, Table, event
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.schema import SchemaItem

from .._validation import identifier
from ._partition_ddl import PARTITION_INFO_KEY

__all__ = [
    "OutboxTriggers",
    "create_outbox_triggers_sql",
    "drop_outbox_triggers_sql",
    "outbox_notify_channel",
    "outbox_trigger_names",
]

#: PostgreSQL's limit on a channel name (NAMEDATALEN - 1).
_MAX_CHANNEL_BYTES = 63
_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def outbox_notify_channel(schema: str, table_name: str) -> str:
    """The channel the outbox table ``schema.table_name`` notifies relays on.

    Examples:
        >>> outbox_notify_channel("public", "outbox")
        'public.outbox'
        >>> outbox_notify_channel("s" * 40, "outbox_of_a_rather_long_name")
        'sa_outbox_56e7b997a0c9ea5c400b9d4c6a5d9a2a'
    """
    name = f"{schema}.{table_name}"
    if len(name.encode()) > _MAX_CHANNEL_BYTES:
        return "sa_outbox_" + hashlib.md5(name.encode(), usedforsecurity=False).hexdigest()
    return name


def outbox_trigger_names(table: Table) -> tuple[str, str]:
    """The names of the ordering and the wake-up trigger (and of their functions).

    They never end in ``_notify``, the suffix of the job table's trigger, so the two kinds of
    table cannot take each other's function names.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> outbox_trigger_names(Table("outbox", MetaData()))
        ('outbox_order_events', 'outbox_wake_relay')
    """
    what = f"trigger name of outbox table {table.name!r}"
    return (
        identifier(f"{table.name}_order_events", what),
        identifier(f"{table.name}_wake_relay", what),
    )


def _qualified(table: Table, name: str) -> str:
    quoted = _PREPARER.quote(name)
    return quoted if table.schema is None else f"{_PREPARER.quote_schema(table.schema)}.{quoted}"


_TABLE_NAME = "TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME"


def _table_names(table: Table) -> tuple[str, str]:
    """SQL for the table's ``schema.name`` and its ``quote_ident``-ed form, in a trigger.

    On a partitioned table a row trigger fires on the partition (``TG_TABLE_NAME`` is
    ``outbox_p20300101``): the lock key and the ``seq`` sequence are the parent's, named here.
    """
    if PARTITION_INFO_KEY not in table.info:
        return _TABLE_NAME, "quote_ident(TG_TABLE_SCHEMA) || '.' || quote_ident(TG_TABLE_NAME)"
    name = "'" + table.name.replace("'", "''") + "'"
    return (
        f"TG_TABLE_SCHEMA || '.' || {name}",
        f"quote_ident(TG_TABLE_SCHEMA) || '.' || quote_ident({name})",
    )


def create_outbox_triggers_sql(table: Table) -> list[str]:
    """``CREATE FUNCTION`` and ``CREATE TRIGGER`` for both triggers of the outbox ``table``.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> sql = create_outbox_triggers_sql(Table("outbox", MetaData(), schema="w"))
        >>> sql[1].split(" EXECUTE ")  # doctest: +NORMALIZE_WHITESPACE
        ['CREATE TRIGGER outbox_order_events BEFORE INSERT ON w.outbox FOR EACH ROW',
         'FUNCTION w.outbox_order_events()']
        >>> sql[3].split(" EXECUTE ")  # doctest: +NORMALIZE_WHITESPACE
        ['CREATE TRIGGER outbox_wake_relay AFTER INSERT ON w.outbox FOR EACH STATEMENT',
         'FUNCTION w.outbox_wake_relay()']
    """
    order, wake = outbox_trigger_names(table)
    order_function, wake_function = _qualified(table, order), _qualified(table, wake)
    table_name, quoted_name = _table_names(table)
    target = _PREPARER.format_table(table)
    create_order = f"""\
CREATE OR REPLACE FUNCTION {order_function}() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
BEGIN
    -- One writer per aggregate at a time, until it commits or rolls back; then draw seq.
    PERFORM pg_advisory_xact_lock(
        hashtext({table_name}),
        hashtext(NEW.aggregate_type || '/' || NEW.aggregate_id));
    NEW.seq = nextval(pg_get_serial_sequence(
        {quoted_name}, 'seq'));
    RETURN NEW;
END
$sa_outbox$"""
    create_wake = f"""\
CREATE OR REPLACE FUNCTION {wake_function}() RETURNS trigger LANGUAGE plpgsql AS $sa_outbox$
DECLARE
    channel text = {_TABLE_NAME};
BEGIN
    IF octet_length(channel) > {_MAX_CHANNEL_BYTES} THEN
        channel = 'sa_outbox_' || md5(channel);
    END IF;
    PERFORM pg_notify(channel, '');
    RETURN NULL;
END
$sa_outbox$"""
    return [
        create_order,
        f"CREATE TRIGGER {_PREPARER.quote(order)} BEFORE INSERT ON {target}"
        f" FOR EACH ROW EXECUTE FUNCTION {order_function}()",
        create_wake,
        f"CREATE TRIGGER {_PREPARER.quote(wake)} AFTER INSERT ON {target}"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {wake_function}()",
    ]


def drop_outbox_triggers_sql(table: Table) -> list[str]:
    """``DROP FUNCTION`` of both functions (``DROP TABLE`` drops the triggers themselves).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> for sql in drop_outbox_triggers_sql(Table("outbox", MetaData())):
        ...     print(sql)
        DROP FUNCTION IF EXISTS outbox_order_events()
        DROP FUNCTION IF EXISTS outbox_wake_relay()
    """
    return [
        f"DROP FUNCTION IF EXISTS {_qualified(table, name)}()"
        for name in outbox_trigger_names(table)
    ]


class OutboxTriggers(SchemaItem):
    """A table item that creates the outbox triggers after its table (``create_all``) and
    drops their functions after the table (``drop_all``).

    `OutboxMixin` puts one in its ``__table_args__``; on a table of your own, pass one to
    ``Table(...)``. Only PostgreSQL runs it.

    Examples:
        >>> from sqlalchemy import Column, Integer, MetaData, Text
        >>> t = Table("outbox", MetaData(), Column("seq", Integer), OutboxTriggers())
        >>> len(t.dispatch.after_create), len(t.dispatch.after_drop)
        (4, 2)
    """

    __visit_name__ = "sa_outbox_outbox_triggers"

    def _set_parent(self, parent: Any, **kw: Any) -> None:
        assert isinstance(parent, Table)
        for sql in create_outbox_triggers_sql(parent):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_create", ddl.execute_if(dialect="postgresql"))
        for sql in drop_outbox_triggers_sql(parent):
            ddl = DDL(sql)  # type: ignore[no-untyped-call]
            event.listen(parent, "after_drop", ddl.execute_if(dialect="postgresql"))
