"""``op.create_serial_trigger`` / ``op.drop_serial_trigger``: the serial keys' trigger on a
job table made before serial keys existed.

A new job table gets the trigger from ``op.create_job_queue``. An existing one gets the
``lock_key`` and ``lock_seq`` columns and ``{table}_serial_idx`` from autogenerate as plain
``add_column`` / ``create_index``, and the trigger from this operation, which autogenerate
renders after them when the database's table has no ``{table}_serial`` trigger
(docs/upgrading.md). Creating it again replaces it (``CREATE OR REPLACE``, ``DROP TRIGGER
IF EXISTS`` first); the reverse drops the trigger and its function.
"""

from __future__ import annotations

from alembic.operations import MigrateOperation, Operations
from sqlalchemy import MetaData, Table

from sa_outbox._validation import identifier, optional_identifier
from sa_outbox.schema._serial_trigger import create_serial_trigger_sql, drop_serial_trigger_sql

from ._base import SupportsInvoke


class _SerialTriggerOp(MigrateOperation):
    def __init__(self, table_name: str, *, schema: str | None = None) -> None:
        self.table_name: str = identifier(table_name, "table name")
        self.schema: str | None = optional_identifier(schema, "schema")

    def to_table(self) -> Table:
        """The table, by name only."""
        return Table(self.table_name, MetaData(), schema=self.schema)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table_name!r}, schema={self.schema!r})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _SerialTriggerOp)
        return (other.table_name, other.schema) == (self.table_name, self.schema)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.table_name, self.schema))


@Operations.register_operation("create_serial_trigger")
class CreateSerialTriggerOp(_SerialTriggerOp):
    """Create (or replace) the serial trigger of an existing job table.

    Examples:
        >>> CreateSerialTriggerOp("jobs", schema="work").reverse()
        DropSerialTriggerOp('jobs', schema='work')
    """

    @classmethod
    def create_serial_trigger(
        cls, operations: Operations, table_name: str, *, schema: str | None = None
    ) -> None:
        """Create the ``{table}_serial`` trigger and its function on ``table_name``.

        Example, in a migration::

            op.create_serial_trigger("jobs", schema="work")
        """
        operations.invoke(cls(table_name, schema=schema))

    def reverse(self) -> DropSerialTriggerOp:
        return DropSerialTriggerOp(self.table_name, schema=self.schema)


@Operations.register_operation("drop_serial_trigger")
class DropSerialTriggerOp(_SerialTriggerOp):
    """Drop the serial trigger of a job table and its function (the table stays).

    Examples:
        >>> DropSerialTriggerOp("jobs").reverse()
        CreateSerialTriggerOp('jobs', schema=None)
    """

    @classmethod
    def drop_serial_trigger(
        cls, operations: Operations, table_name: str, *, schema: str | None = None
    ) -> None:
        """Drop the ``{table}_serial`` trigger and its function from ``table_name``.

        Example, in a migration::

            op.drop_serial_trigger("jobs", schema="work")
        """
        operations.invoke(cls(table_name, schema=schema))

    def reverse(self) -> CreateSerialTriggerOp:
        return CreateSerialTriggerOp(self.table_name, schema=self.schema)


@Operations.implementation_for(CreateSerialTriggerOp)
def _create_serial_trigger(operations: Operations, operation: CreateSerialTriggerOp) -> None:
    table = operation.to_table()
    function, trigger = create_serial_trigger_sql(table)
    operations.execute(function)
    operations.execute(drop_serial_trigger_sql(table, with_trigger=True)[0])
    operations.execute(trigger)


@Operations.implementation_for(DropSerialTriggerOp)
def _drop_serial_trigger(operations: Operations, operation: DropSerialTriggerOp) -> None:
    for sql in drop_serial_trigger_sql(operation.to_table(), with_trigger=True):
        operations.execute(sql)


def create_serial_trigger(
    op: SupportsInvoke, table_name: str, *, schema: str | None = None
) -> None:
    """``op.create_serial_trigger(...)`` in a form type checkers know.

    Example, in a migration::

        def upgrade() -> None:
            alembic_ext.create_serial_trigger(op, "jobs")
    """
    op.invoke(CreateSerialTriggerOp(table_name, schema=schema))


def drop_serial_trigger(op: SupportsInvoke, table_name: str, *, schema: str | None = None) -> None:
    """``op.drop_serial_trigger(...)`` in a form type checkers know.

    Example, in a migration::

        def downgrade() -> None:
            alembic_ext.drop_serial_trigger(op, "jobs")
    """
    op.invoke(DropSerialTriggerOp(table_name, schema=schema))
