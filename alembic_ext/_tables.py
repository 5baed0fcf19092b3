"""The library's tables as migrations see them: built from the mixins, recognised by shape.

Nothing here re-declares a column: `build_table` maps a throwaway class on `JobMixin` /
`OutboxMixin` / `InboxMixin` in a private registry (and MetaData), so operations create
exactly what the user's models declare.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeGuard

from sqlalchemy import Enum, Table
from sqlalchemy.orm import registry
from sqlalchemy.types import TypeEngine

from sa_outbox._validation import identifier, optional_identifier
from sa_outbox.schema import (
    JOB_STATUS_TYPE_NAME,
    RECOMMENDED_JOB_STORAGE,
    RECOMMENDED_OUTBOX_STORAGE,
    TABLE_KIND_INFO_KEY,
    InboxMixin,
    JobMixin,
    OutboxMixin,
    resolve_table,
)
from sa_outbox.schema._partition_ddl import PartitionInterval

TableKind = Literal["job", "outbox", "inbox"]
KINDS: tuple[TableKind, ...] = ("job", "outbox", "inbox")
_MIXINS: dict[TableKind, type] = {"job": JobMixin, "outbox": OutboxMixin, "inbox": InboxMixin}
_WHAT: dict[TableKind, str] = {
    "job": "job table name",
    "outbox": "outbox table name",
    "inbox": "inbox table name",
}
StorageSettings = Mapping[str, int | float | bool]
#: The storage settings each kind of table gets when none are given (an inbox takes none:
#: it is neither partitioned nor given storage settings).
RECOMMENDED_STORAGE: dict[TableKind, StorageSettings] = {
    "job": RECOMMENDED_JOB_STORAGE,
    "outbox": RECOMMENDED_OUTBOX_STORAGE,
}


def build_table(
    kind: TableKind,
    table_name: str,
    schema: str | None = None,
    *,
    partition_interval: PartitionInterval | None = None,
    storage: StorageSettings | Literal["recommended"] | None = "recommended",
) -> Table:
    """The table `JobMixin` / `OutboxMixin` / `InboxMixin` declares, on a MetaData of its own.

    ``partition_interval`` and ``storage`` are the model's ``__partition_interval__`` and
    ``__table_storage__`` (``"recommended"``: the mixin's default); `InboxMixin` has
    neither, so an inbox table ignores them.

    Its ``job_status`` column type has ``create_type=False`` (SQLAlchemy 2.1 would otherwise
    emit ``CREATE TYPE`` from the table's ``before_create`` event). The operations create the
    type with a statement of their own and run ``CREATE TABLE`` directly, without table
    events, so no second ``CREATE TYPE`` is emitted on SQLAlchemy 2.0 or 2.1.
    """
    name = identifier(table_name, _WHAT[kind])
    schema = optional_identifier(schema, "schema")
    namespace: dict[str, Any] = {
        "__tablename__": name,
        "__table_schema__": schema,
        "__partition_interval__": partition_interval,
        "__module__": __name__,
    }
    if storage != "recommended":
        namespace["__table_storage__"] = storage
    model = type(f"_{kind.capitalize()}Table", (_MIXINS[kind],), namespace)
    throwaway = registry()
    try:
        throwaway.map_declaratively(model)
        table = resolve_table(model)
    finally:
        throwaway.dispose()
    for column in table.columns:
        if is_job_status_type(column.type):
            column.type.create_type = False
    return table


def is_job_status_type(type_: TypeEngine[Any]) -> TypeGuard[Enum]:
    """Whether ``type_`` is the ``job_status`` enum (declared or reflected)."""
    return isinstance(type_, Enum) and type_.name == JOB_STATUS_TYPE_NAME


@functools.cache
def column_names(kind: TableKind) -> frozenset[str]:
    """The names of the columns the mixin of ``kind`` declares."""
    return frozenset(build_table(kind, "sa_outbox").columns.keys())


def index_names(kind: TableKind, table_name: str) -> frozenset[str]:
    """The names of the indexes the library gives a ``kind`` table named ``table_name``."""
    return frozenset(str(index.name) for index in build_table(kind, table_name).indexes)


def table_kind(table: Table) -> TableKind | None:
    """``"job"``, ``"outbox"`` or ``"inbox"`` for a table declared with the mixins, else
    ``None``.

    The mixins mark their tables in ``Table.info``; a table without the mark (its
    ``__table_args__`` replaced, or reflected from the database) is recognised by its columns.
    """
    marked = table.info.get(TABLE_KIND_INFO_KEY)
    if marked in KINDS:
        return marked  # type: ignore[no-any-return]
    return kind_from_columns((column.name, column.type) for column in table.columns)


#: Columns a release added after the first: a table made before it lacks them and is still
#: recognised (its ``alembic revision --autogenerate`` adds them, docs/upgrading.md).
ADDED_COLUMNS: dict[TableKind, frozenset[str]] = {
    "job": frozenset({"headers", "lock_key", "lock_seq", "unique_key", "unique_states"}),
    "outbox": frozenset(),
    "inbox": frozenset(),
}


def kind_from_columns(columns: Iterable[tuple[str, TypeEngine[Any]]]) -> TableKind | None:
    """The kind of table that has exactly these ``(name, type)`` columns, if any (a column
    of `ADDED_COLUMNS` may be missing: a table of an earlier release)."""
    types = dict(columns)
    for kind in KINDS:
        names = column_names(kind)
        if not names - ADDED_COLUMNS[kind] <= set(types) <= names:
            continue
        if kind == "job" and not is_job_status_type(types["status"]):
            continue
        return kind
    return None
