"""What every operation of ``alembic_ext`` shares: a table name, a schema, ``reverse()``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from alembic.operations import MigrateOperation
from sqlalchemy import Table

from sa_outbox.schema._partition_ddl import (
    PartitionInterval,
    check_partition_interval,
)
from sa_outbox.schema._storage import Storage, check_storage

from ._tables import RECOMMENDED_STORAGE, TableKind, build_table

#: Storage settings as the operations take them: ``"recommended"`` is the mixin's default.
StorageArgument = Mapping[str, int | float | bool] | Literal["recommended"] | None


class SupportsInvoke(Protocol):
    """What the plain functions need of ``op``: the ``alembic.op`` module or an `Operations`.

    Examples:
        >>> from alembic import op
        >>> callable(op.invoke)
        True
    """

    def invoke(self, operation: MigrateOperation) -> Any: ...


_T = TypeVar("_T", bound="_TableOperation")


class _TableOperation(MigrateOperation):
    """One of the library's tables, by name and schema (and partitioning and storage)."""

    kind: ClassVar[TableKind]

    def __init__(
        self,
        table_name: str,
        *,
        schema: str | None = None,
        partition_interval: str | None = None,
        storage: StorageArgument = "recommended",
    ) -> None:
        # Building the table checks the names (the index names derived from the table's
        # included) here, before any SQL; so are the interval and the storage settings.
        interval = check_partition_interval(partition_interval, "partition_interval")
        checked: Storage | None = (
            dict(RECOMMENDED_STORAGE[self.kind])
            if storage == "recommended"
            else check_storage(storage, "storage")
        )
        self._table = build_table(
            self.kind, table_name, schema, partition_interval=interval, storage=checked
        )
        self.table_name: str = table_name
        self.schema: str | None = schema
        self.partition_interval: PartitionInterval | None = interval
        self.storage: Storage | None = checked

    @property
    def recommended_storage(self) -> bool:
        """Whether the storage settings are the mixin's recommended ones."""
        return self.storage == dict(RECOMMENDED_STORAGE[self.kind])

    def to_table(self) -> Table:
        """The table this operation creates or drops, as the mixin declares it."""
        return self._table

    def __repr__(self) -> str:
        extra = ""
        if self.partition_interval is not None:
            extra += f", partition_interval={self.partition_interval!r}"
        if not self.recommended_storage:
            extra += f", storage={self.storage!r}"
        return f"{type(self).__name__}({self.table_name!r}, schema={self.schema!r}{extra})"

    def _key(self) -> tuple[Any, ...]:
        storage = None if self.storage is None else tuple(sorted(self.storage.items()))
        return (self.table_name, self.schema, self.partition_interval, storage)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _TableOperation) or type(other) is not type(self):
            return NotImplemented
        return other._key() == self._key()

    def __hash__(self) -> int:
        return hash((type(self), *self._key()))

    def _same(self, other: type[_T]) -> _T:
        return other(
            self.table_name,
            schema=self.schema,
            partition_interval=self.partition_interval,
            storage=self.storage,
        )


class _CreateOperation(_TableOperation):
    def to_diff_tuple(self) -> tuple[str, Table]:
        return ("add_table", self.to_table())


class _DropOperation(_TableOperation):
    def to_diff_tuple(self) -> tuple[str, Table]:
        return ("remove_table", self.to_table())
