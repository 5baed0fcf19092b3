"""``op.set_table_storage``: make a table's storage parameters exactly the given ones.

On a partitioned table, on each of its partitions too. Rendered by autogenerate when the
model's ``__table_storage__`` and the database's ``pg_class.reloptions`` differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from alembic.operations import MigrateOperation, Operations
from sqlalchemy import MetaData, Table

from sa_outbox._validation import identifier, optional_identifier
from sa_outbox.schema._storage import Storage, check_storage, set_storage_sql

from ._base import SupportsInvoke


@Operations.register_operation("set_table_storage")
class SetTableStorageOp(MigrateOperation):
    """Make a table's storage settings exactly ``storage`` (``None``: the server defaults).

    Known parameters not in ``storage`` are reset. On a partitioned table, every partition
    gets the settings (a partitioned table has none of its own). ``existing_storage`` is
    what the table had, for the reverse operation; autogenerate fills it in.

    Examples:
        >>> SetTableStorageOp("jobs", {"fillfactor": 90}, existing_storage=None).reverse()
        SetTableStorageOp('jobs', None, schema=None, existing_storage={'fillfactor': 90})
    """

    def __init__(
        self,
        table_name: str,
        storage: Mapping[str, int | float | bool] | None,
        *,
        schema: str | None = None,
        existing_storage: Mapping[str, int | float | bool] | None = None,
    ) -> None:
        self.table_name: str = identifier(table_name, "table name")
        self.schema: str | None = optional_identifier(schema, "schema")
        self.storage: Storage | None = check_storage(storage, "storage")
        self.existing_storage: Storage | None = check_storage(existing_storage, "existing_storage")

    @classmethod
    def set_table_storage(
        cls,
        operations: Operations,
        table_name: str,
        storage: Mapping[str, int | float | bool] | None,
        *,
        schema: str | None = None,
        existing_storage: Mapping[str, int | float | bool] | None = None,
    ) -> None:
        """Set the storage settings of ``table_name`` (``ALTER TABLE … RESET / SET``).

        Example, in a migration::

            op.set_table_storage("jobs", {"fillfactor": 70}, schema="work")
        """
        operations.invoke(
            cls(table_name, storage, schema=schema, existing_storage=existing_storage)
        )

    def reverse(self) -> SetTableStorageOp:
        return SetTableStorageOp(
            self.table_name,
            self.existing_storage,
            schema=self.schema,
            existing_storage=self.storage,
        )

    def to_table(self) -> Table:
        """The table, by name only."""
        return Table(self.table_name, MetaData(), schema=self.schema)

    def __repr__(self) -> str:
        return (
            f"SetTableStorageOp({self.table_name!r}, {self.storage!r}, schema={self.schema!r}, "
            f"existing_storage={self.existing_storage!r})"
        )

    def _key(self) -> tuple[Any, ...]:
        def items(storage: Storage | None) -> Any:
            return None if storage is None else tuple(sorted(storage.items()))

        return (self.table_name, self.schema, items(self.storage), items(self.existing_storage))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SetTableStorageOp):
            return NotImplemented
        return other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())


@Operations.implementation_for(SetTableStorageOp)
def _set_storage(operations: Operations, operation: SetTableStorageOp) -> None:
    operations.execute(set_storage_sql(operation.to_table(), operation.storage))


def set_table_storage(
    op: SupportsInvoke,
    table_name: str,
    storage: Mapping[str, int | float | bool] | None,
    *,
    schema: str | None = None,
    existing_storage: Mapping[str, int | float | bool] | None = None,
) -> None:
    """``op.set_table_storage(...)`` in a form type checkers know.

    Example, in a migration::

        def upgrade() -> None:
            alembic_ext.set_table_storage(op, "jobs", {"fillfactor": 70})
    """
    op.invoke(
        SetTableStorageOp(table_name, storage, schema=schema, existing_storage=existing_storage)
    )
