"""The autogenerate hook: the library's tables come out as the library's operations.

Importing `alembic_ext` registers `compare_queue_tables` on Alembic's global comparator
registry (``alembic.autogenerate.comparators``, target ``"schema"``), which every autogenerate
run copies: Alembic 1.13 to 1.17 call it after their own table comparison because it is
registered later, Alembic 1.18+ because it is registered with the ``LAST`` priority. It
works whatever ``autogenerate_plugins`` says, so ``import alembic_ext`` in ``env.py`` is the
whole setup. It edits the operations Alembic produced:

- a new table declared with `JobMixin` / `OutboxMixin` / `InboxMixin` (marked in
  ``Table.info``): its ``create_table`` and the ``create_index`` of the library's indexes
  become one ``create_job_queue`` / ``create_outbox`` / ``create_inbox``; columns and
  indexes the model adds stay
  ``add_column`` / ``create_index`` operations after it. A model that changes a library
  column or index, or adds constraints, keeps Alembic's own operations (with a warning);
- a table removed from the models whose columns are exactly the library's: ``drop_table``
  and the index drops become ``drop_job_queue`` / ``drop_outbox`` / ``drop_inbox``;
- an existing table of the library: a partial index whose ``WHERE`` differs from the model is
  dropped and created again (Alembic does not compare index predicates), storage
  settings (``__table_storage__``) that differ from ``pg_class.reloptions`` (of the default
  partition, for a partitioned table) render ``set_table_storage``, and a job table without
  its serial trigger (made before serial keys) renders ``create_serial_trigger``;
- the partitions of a partitioned table are not tables of their own to Alembic: the
  ``drop_table`` (and ``drop_index``) it would render for each is left out.

Downgrades are the reverse of these operations. Alembic reports no other difference for
these tables (server defaults, identity, enum type and the ``DESC`` index column included),
so a second autogenerate after ``upgrade`` is empty.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from alembic.autogenerate import comparators
from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation, ops
from sqlalchemy import Column, Index, MetaData, PrimaryKeyConstraint, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateColumn, CreateIndex

from sa_outbox import statements as st
from sa_outbox._exceptions import SaOutboxError
from sa_outbox.schema._partition_ddl import PartitionInterval, partition_interval_of
from sa_outbox.schema._serial_trigger import serial_trigger_name
from sa_outbox.schema._storage import (
    STORAGE_INFO_KEY,
    parse_reloptions,
    same_storage,
    storage_from_reloptions,
    storage_of,
)

from ._serial_op import CreateSerialTriggerOp
from ._tables import TableKind, build_table, kind_from_columns, table_kind
from .operations import (
    CreateInboxOp,
    CreateJobQueueOp,
    CreateOutboxOp,
    DropInboxOp,
    DropJobQueueOp,
    DropOutboxOp,
    SetTableStorageOp,
    StorageArgument,
)

__all__ = ["compare_queue_tables"]

log = logging.getLogger(__name__)

_Key = tuple[str | None, str]
_KeyFunction = Callable[[str | None, str], _Key]
_CREATE = {"job": CreateJobQueueOp, "outbox": CreateOutboxOp}
_DROP = {"job": DropJobQueueOp, "outbox": DropOutboxOp}
_MIXIN = {"job": "JobMixin", "outbox": "OutboxMixin", "inbox": "InboxMixin"}


def _table_operation(
    kind: TableKind,
    create: bool,
    name: str,
    schema: str | None,
    interval: PartitionInterval | None,
    storage: StorageArgument,
) -> MigrateOperation:
    """The library's operation that creates (or drops) a ``kind`` table."""
    if kind == "inbox":  # neither partitioned nor given storage settings
        return (CreateInboxOp if create else DropInboxOp)(name, schema=schema)
    operation = (_CREATE if create else _DROP)[kind]
    return operation(name, schema=schema, partition_interval=interval, storage=storage)


@dataclass
class _Rewrite:
    """What becomes of one table's operations."""

    operation: MigrateOperation
    library_indexes: frozenset[str]
    extra_columns: list[Column[Any]] = field(default_factory=list)


def compare_queue_tables(
    autogen_context: AutogenContext,
    upgrade_ops: ops.UpgradeOps,
    schemas: set[str | None],
) -> None:
    """Turn Alembic's operations for the library's tables into the library's operations.

    Registered on import for every autogenerate run (see the module documentation).

    Example, what ``alembic revision --autogenerate`` writes for new ``Job`` and
    ``OutboxEvent`` models (``import alembic_ext`` is added to the imports)::

        def upgrade() -> None:
            op.create_job_queue('jobs', schema='work')
            op.create_outbox('outbox', schema='work')
    """
    dialect = autogen_context.dialect
    default_schema = dialect.default_schema_name

    def key(schema: str | None, name: str) -> _Key:
        return (None if schema == default_schema else schema, name)

    models = {key(table.schema, table.name): table for table in autogen_context.sorted_tables}
    partitions = _partitions(autogen_context, upgrade_ops, key)
    upgrade_ops.ops[:] = [
        operation
        for operation in upgrade_ops.ops
        if not (
            isinstance(operation, ops.DropTableOp | ops.ModifyTableOps)
            and key(operation.schema, operation.table_name) in partitions
        )
    ]
    rewrites: dict[_Key, _Rewrite] = {}
    for operation in upgrade_ops.ops:
        if isinstance(operation, ops.CreateTableOp):
            table_key = key(operation.schema, operation.table_name)
            model = models.get(table_key)
            rewrite = None if model is None else _rewrite_create(model, dialect)
        elif isinstance(operation, ops.DropTableOp):
            table_key = key(operation.schema, operation.table_name)
            rewrite = _rewrite_drop(autogen_context, operation, key)
        else:
            continue
        if rewrite is not None:
            rewrites[table_key] = rewrite

    rewritten: list[MigrateOperation] = []
    for operation in upgrade_ops.ops:
        if isinstance(operation, ops.CreateTableOp | ops.DropTableOp | ops.ModifyTableOps):
            rewrite = rewrites.get(key(operation.schema, operation.table_name))
            if rewrite is not None:
                rewritten.extend(_apply(rewrite, operation))
                continue
        rewritten.append(operation)

    for table_key, model in models.items():
        if table_key not in rewrites and table_key[0] in schemas:
            _compare_predicates(autogen_context, model, table_key, rewritten)
            _compare_storage(autogen_context, model, table_key, rewritten)
            _compare_serial_trigger(autogen_context, model, table_key, rewritten)
    upgrade_ops.ops[:] = rewritten


def _partitions(
    autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps, key: _KeyFunction
) -> set[_Key]:
    """The tables Alembic would drop (and their indexes) that are partitions: their parent
    owns them."""
    connection = autogen_context.connection
    schemas = {
        op.schema for op in upgrade_ops.ops if isinstance(op, ops.DropTableOp | ops.ModifyTableOps)
    }
    if connection is None or not schemas:
        return set()
    return {
        key(schema, name)
        for schema in schemas
        for name in connection.execute(st.partitions_in_schema(schema)).scalars()
    }


def _model_storage(model: Table) -> StorageArgument:
    # A table recognised by its columns only (no mixin marks) declares no settings.
    return storage_of(model) if STORAGE_INFO_KEY in model.info else None


def _rewrite_create(model: Table, dialect: Dialect) -> _Rewrite | None:
    kind = table_kind(model)
    interval = partition_interval_of(model)
    storage = _model_storage(model)
    library = (
        None
        if kind is None
        else _library_table(kind, model.name, model.schema, interval=interval, storage=storage)
    )
    if kind is None or library is None:
        return None
    problem = _difference(model, library, dialect)
    if problem is not None:
        log.warning(
            "table %s uses %s but %s: autogenerate renders Alembic's create_table for it "
            "(a downgrade then leaves the job_status type in place)",
            model.fullname,
            _MIXIN[kind],
            problem,
        )
        return None
    return _Rewrite(
        operation=_table_operation(kind, True, model.name, model.schema, interval, storage),
        library_indexes=frozenset(str(index.name) for index in library.indexes),
        extra_columns=[column for column in model.columns if column.name not in library.c],
    )


def _difference(model: Table, library: Table, dialect: Dialect) -> str | None:
    """Why ``model`` is not ``library`` plus extra columns and indexes, or ``None``."""

    def ddl(element: CreateColumn | CreateIndex) -> str:
        return str(element.compile(dialect=dialect))

    for column in library.columns:
        model_column = model.columns.get(column.name)
        if model_column is None or ddl(CreateColumn(model_column)) != ddl(CreateColumn(column)):
            return f"changes column {column.name!r}"
    if list(model.primary_key.columns.keys()) != list(library.primary_key.columns.keys()):
        return "changes the primary key"
    model_indexes = {index.name: index for index in model.indexes}
    for index in library.indexes:
        model_index = model_indexes.get(index.name)
        if model_index is None or ddl(CreateIndex(model_index)) != ddl(CreateIndex(index)):
            return f"changes index {index.name!r}"
    if any(not isinstance(c, PrimaryKeyConstraint) for c in model.constraints):
        return "adds constraints"
    if model.comment is not None:
        return "has a table comment"
    return None


def _rewrite_drop(
    autogen_context: AutogenContext, operation: ops.DropTableOp, key: _KeyFunction
) -> _Rewrite | None:
    name, schema = operation.table_name, operation.schema
    columns = autogen_context.inspector.get_columns(name, schema=schema)
    kind = kind_from_columns((column["name"], column["type"]) for column in columns)
    library = None if kind is None else _library_table(kind, name, schema)
    if kind is None or library is None:
        return None
    if kind == "job":
        status = next(column["type"] for column in columns if column["name"] == "status")
        if key(getattr(status, "schema", None), name) != key(schema, name):
            return None  # the type lives elsewhere: dropping it is not this table's call
    # What the table is in the database, so that the downgrade creates it the same way.
    interval, storage = _found_layout(autogen_context, name, schema)
    return _Rewrite(
        operation=_table_operation(kind, False, name, schema, interval, storage),
        library_indexes=frozenset(str(index.name) for index in library.indexes),
    )


def _apply(rewrite: _Rewrite, operation: MigrateOperation) -> list[MigrateOperation]:
    """The operations that replace ``operation``, one of a rewritten table's."""
    if isinstance(operation, ops.ModifyTableOps):
        operation.ops = [
            op
            for op in operation.ops
            if not (
                isinstance(op, ops.CreateIndexOp | ops.DropIndexOp)
                and op.index_name in rewrite.library_indexes
            )
        ]
        return [] if operation.is_empty() else [operation]
    if not rewrite.extra_columns:
        return [rewrite.operation]
    # The model's own columns come right after the table, before any index on them.
    assert isinstance(operation, ops.CreateTableOp)
    added: list[MigrateOperation] = [
        ops.AddColumnOp.from_column_and_tablename(operation.schema, operation.table_name, c)
        for c in rewrite.extra_columns
    ]
    return [
        rewrite.operation,
        ops.ModifyTableOps(operation.table_name, added, schema=operation.schema),
    ]


def _compare_predicates(
    autogen_context: AutogenContext,
    model: Table,
    table_key: _Key,
    rewritten: list[MigrateOperation],
) -> None:
    kind = table_kind(model)
    schema, name = table_key
    library = None if kind is None else _library_table(kind, name, None)
    if (
        library is None
        or not autogen_context.run_name_filters(name, "table", {"schema_name": schema})
        or not autogen_context.run_object_filters(model, name, "table", False, None)
    ):
        return
    inspector = autogen_context.inspector
    if name not in inspector.get_table_names(schema=schema):
        return
    reflected = {
        index["name"]: index.get("dialect_options", {}).get("postgresql_where")
        for index in inspector.get_indexes(name, schema=schema)
    }
    library_indexes = {str(index.name) for index in library.indexes}
    dialect = autogen_context.dialect
    changed = [
        index
        for index in sorted(model.indexes, key=lambda index: str(index.name))
        if index.name in library_indexes
        and index.name in reflected
        and _normalise(reflected[index.name]) != _normalise(_predicate(index, dialect))
        and autogen_context.run_object_filters(index, index.name, "index", False, None)
    ]
    if not changed:
        return
    container = next(
        (
            op
            for op in rewritten
            if isinstance(op, ops.ModifyTableOps) and (op.schema, op.table_name) == table_key
        ),
        None,
    )
    if container is None:
        container = ops.ModifyTableOps(name, [], schema=schema)
        rewritten.append(container)
    handled = {
        op.index_name for op in container.ops if isinstance(op, ops.CreateIndexOp | ops.DropIndexOp)
    }
    connection_table = Table(name, MetaData(), schema=schema)
    inspector.reflect_table(connection_table, None)
    in_database = {index.name: index for index in connection_table.indexes}
    for index in changed:
        if index.name in handled:
            continue
        log.info("Detected changed predicate of index %r on table %r", index.name, name)
        container.ops.append(ops.DropIndexOp.from_index(in_database[index.name]))
        container.ops.append(ops.CreateIndexOp.from_index(index))


def _found_layout(
    autogen_context: AutogenContext, name: str, schema: str | None
) -> tuple[PartitionInterval | None, StorageArgument]:
    """A table's partition interval (from its partitions' width) and storage settings."""
    connection = autogen_context.connection
    if connection is None:
        return None, "recommended"
    table = Table(name, MetaData(), schema=schema)
    layout = connection.execute(st.table_layout(table)).one_or_none()
    if layout is None:
        return None, "recommended"
    if layout.kind != "p":
        return None, storage_from_reloptions(parse_reloptions(layout.own_options)) or None
    interval: PartitionInterval = "day"
    for partition in connection.execute(st.list_partitions(table)):
        if partition.lower is not None and partition.upper is not None:
            width = partition.upper - partition.lower
            interval = _INTERVALS.get(width, "month" if width.days >= 28 else "day")
            break
    storage = storage_from_reloptions(parse_reloptions(layout.partition_options)) or None
    return interval, storage


_INTERVALS: dict[dt.timedelta, PartitionInterval] = {
    dt.timedelta(hours=1): "hour",
    dt.timedelta(days=1): "day",
    dt.timedelta(days=7): "week",
}


def _compare_storage(
    autogen_context: AutogenContext,
    model: Table,
    table_key: _Key,
    rewritten: list[MigrateOperation],
) -> None:
    """``set_table_storage`` when the model's storage settings are not the database's."""
    connection = autogen_context.connection
    schema, name = table_key
    if (
        connection is None
        or table_kind(model) is None
        or STORAGE_INFO_KEY not in model.info
        or not autogen_context.run_name_filters(name, "table", {"schema_name": schema})
        or not autogen_context.run_object_filters(model, name, "table", False, None)
    ):
        return
    layout = connection.execute(st.table_layout(Table(name, MetaData(), schema=schema)))
    found = layout.one_or_none()
    if found is None:
        return
    partitioned = found.kind == "p"
    if partitioned != (partition_interval_of(model) is not None):
        log.warning(
            "table %s is %s in the database but %s in the model: autogenerate cannot convert "
            "it (see docs/partitions.md)",
            model.fullname,
            "partitioned" if partitioned else "not partitioned",
            "not" if partitioned else "partitioned",
        )
    declared = storage_of(model)
    existing = parse_reloptions(found.partition_options if partitioned else found.own_options)
    if same_storage(declared, existing):
        return
    log.info("Detected changed storage settings of table %r", name)
    rewritten.append(
        SetTableStorageOp(
            name,
            declared,
            schema=schema,
            existing_storage=storage_from_reloptions(existing) or None,
        )
    )


def _compare_serial_trigger(
    autogen_context: AutogenContext,
    model: Table,
    table_key: _Key,
    rewritten: list[MigrateOperation],
) -> None:
    """``create_serial_trigger`` for a job table of the database that lacks it (made before
    serial keys existed: its ``add_column`` operations come before this one)."""
    connection = autogen_context.connection
    schema, name = table_key
    if (
        connection is None
        or table_kind(model) != "job"
        or not autogen_context.run_name_filters(name, "table", {"schema_name": schema})
        or not autogen_context.run_object_filters(model, name, "table", False, None)
    ):
        return
    table = Table(name, MetaData(), schema=schema)
    if connection.execute(st.table_layout(table)).one_or_none() is None:
        return  # not in the database: created whole, trigger included
    if connection.execute(st.table_has_trigger(table, serial_trigger_name(table))).scalar():
        return
    log.info("Detected a job table without its serial trigger: %r", name)
    rewritten.append(CreateSerialTriggerOp(name, schema=schema))


def _library_table(
    kind: TableKind,
    name: str,
    schema: str | None,
    *,
    interval: PartitionInterval | None = None,
    storage: StorageArgument = "recommended",
) -> Table | None:
    """The library's table under this name, or ``None`` if the library cannot make one.

    A table that was recognised by its columns, or reflected, may carry a name the library
    would refuse (quotes, or too long to derive index names from): Alembic's own
    operations stay in place for it.
    """
    try:
        return build_table(kind, name, schema, partition_interval=interval, storage=storage)
    except SaOutboxError:
        return None


def _predicate(index: Index, dialect: Dialect) -> str | None:
    where = index.dialect_options["postgresql"]["where"]
    if where is None or isinstance(where, str):
        return where
    return str(where.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


# PostgreSQL deparses "status = 'pending'" as "(status = 'pending'::work.job_status)".
_CAST = re.compile(r'::(?:"[^"]*"|\w+)(?:\.(?:"[^"]*"|\w+))*(?:\[\])?')


def _normalise(predicate: str | None) -> str | None:
    """The library's index predicates, compared the way PostgreSQL stores them."""
    if predicate is None:
        return None
    words = _CAST.sub("", predicate).replace("(", " ").replace(")", " ").lower().split()
    return " ".join(words) or None


def _register() -> None:
    try:
        from alembic.util import DispatchPriority
    except ImportError:  # Alembic < 1.18: registered after Alembic's own, so it runs after
        comparators.dispatch_for("schema")(compare_queue_tables)
    else:
        comparators.dispatch_for("schema", priority=DispatchPriority.LAST)(compare_queue_tables)


_register()
