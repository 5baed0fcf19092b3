"""``op.create_inbox`` / ``op.drop_inbox``: a consumer's inbox table (`InboxMixin`).

A plain table (no enum, no trigger, no partitions): the table with its primary key
``(source, message_id)`` and its retention index; dropping the table takes the index.
Each operation reverses into the other, so autogenerate writes both directions.
"""

from __future__ import annotations

from typing import Any

from alembic.operations import MigrateOperation, Operations
from sqlalchemy import Table
from sqlalchemy.schema import CreateIndex, CreateTable, DropTable

from ._base import SupportsInvoke
from ._tables import build_table

__all__ = ["CreateInboxOp", "DropInboxOp", "create_inbox", "drop_inbox"]


class _InboxOperation(MigrateOperation):
    """An inbox table, by name and schema."""

    def __init__(self, table_name: str, *, schema: str | None = None) -> None:
        # Building the table checks the names (the index's, derived from the table's, too)
        # here, before any SQL.
        self._table = build_table("inbox", table_name, schema)
        self.table_name: str = table_name
        self.schema: str | None = schema

    def to_table(self) -> Table:
        """The table this operation creates or drops, as `InboxMixin` declares it."""
        return self._table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table_name!r}, schema={self.schema!r})"

    def _key(self) -> tuple[Any, ...]:
        return (self.table_name, self.schema)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _InboxOperation) or type(other) is not type(self):
            return NotImplemented
        return other._key() == self._key()

    def __hash__(self) -> int:
        return hash((type(self), *self._key()))


@Operations.register_operation("create_inbox")
class CreateInboxOp(_InboxOperation):
    """Create an inbox table and its retention index.

    Examples:
        >>> CreateInboxOp("inbox", schema="work").reverse()
        DropInboxOp('inbox', schema='work')
    """

    @classmethod
    def create_inbox(
        cls, operations: Operations, table_name: str, *, schema: str | None = None
    ) -> None:
        """Create the inbox table ``table_name`` with its index.

        Example, in a migration::

            op.create_inbox("inbox", schema="work")
        """
        operations.invoke(cls(table_name, schema=schema))

    def reverse(self) -> DropInboxOp:
        return DropInboxOp(self.table_name, schema=self.schema)

    def to_diff_tuple(self) -> tuple[str, Table]:
        return ("add_table", self.to_table())


@Operations.register_operation("drop_inbox")
class DropInboxOp(_InboxOperation):
    """Drop an inbox table (its index with it).

    Examples:
        >>> DropInboxOp("inbox").reverse()
        CreateInboxOp('inbox', schema=None)
    """

    @classmethod
    def drop_inbox(
        cls, operations: Operations, table_name: str, *, schema: str | None = None
    ) -> None:
        """Drop the inbox table ``table_name``.

        Example, in a migration::

            op.drop_inbox("inbox", schema="work")
        """
        operations.invoke(cls(table_name, schema=schema))

    def reverse(self) -> CreateInboxOp:
        return CreateInboxOp(self.table_name, schema=self.schema)

    def to_diff_tuple(self) -> tuple[str, Table]:
        return ("remove_table", self.to_table())


@Operations.implementation_for(CreateInboxOp)
def _create(operations: Operations, operation: CreateInboxOp) -> None:
    table = operation.to_table()
    operations.execute(CreateTable(table))
    for index in sorted(table.indexes, key=lambda index: str(index.name)):
        operations.execute(CreateIndex(index))


@Operations.implementation_for(DropInboxOp)
def _drop(operations: Operations, operation: DropInboxOp) -> None:
    operations.execute(DropTable(operation.to_table()))


def create_inbox(op: SupportsInvoke, table_name: str, *, schema: str | None = None) -> None:
    """``op.create_inbox(...)`` in a form type checkers know.

    Example, in a migration::

        def upgrade() -> None:
            alembic_ext.create_inbox(op, "inbox", schema="work")
    """
    op.invoke(CreateInboxOp(table_name, schema=schema))


def drop_inbox(op: SupportsInvoke, table_name: str, *, schema: str | None = None) -> None:
    """``op.drop_inbox(...)`` in a form type checkers know.

    Example, in a migration::

        def downgrade() -> None:
            alembic_ext.drop_inbox(op, "inbox", schema="work")
    """
    op.invoke(DropInboxOp(table_name, schema=schema))
