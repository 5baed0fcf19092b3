"""Alembic operations that create and drop the library's tables.

``op.create_job_queue`` creates the ``job_status`` enum type (in the table's schema), the job
table, its indexes and its NOTIFY trigger with the trigger's function (which wakes workers
up); ``op.drop_job_queue`` drops the table (its indexes and trigger go with it), the
trigger's function, and then the type. ``op.create_outbox`` / ``op.drop_outbox`` do the same
for an outbox table, whose two triggers (ordering and relay wake-up, see
``sa_outbox.schema._outbox_triggers``) are created and dropped the same way. Each operation
reverses into the other, so autogenerate writes both directions.

``partition_interval="day"`` (``"hour"``, ``"week"``, ``"month"``) creates the table
range-partitioned by ``created_at``, as a model with ``__partition_interval__`` declares it:
the parent, its indexes and triggers, a ``DEFAULT`` partition, the partition of the current
interval and three more ahead (bounds computed by the database from ``now()``, so the SQL
is the same offline), and on a job table the dedup trigger. ``storage`` is the table's
storage settings (``__table_storage__``; by default the mixin's recommended ones, ``None``
for the server's), applied to the table or, when partitioned, to each partition.
``op.set_table_storage`` changes them on an existing table (autogenerate renders it when
the model's settings differ from ``pg_class.reloptions``).

The type is created with a statement of our own, which tolerates a type already made by
another job table in the same schema (with the same labels); dropping keeps the type while
another table still uses it. Identifiers are checked when an operation is built, before any
SQL. The functions of the same names take ``op`` as their first argument, for migrations
that a type checker reads (``alembic/op.pyi`` knows nothing of custom operations).
"""

from __future__ import annotations

from alembic.operations import Operations
from sqlalchemy import Enum, Table, literal
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DropTable

from sa_outbox.schema._notify_trigger import create_notify_trigger_sql, drop_notify_trigger_sql
from sa_outbox.schema._outbox_triggers import create_outbox_triggers_sql, drop_outbox_triggers_sql
from sa_outbox.schema._partition_ddl import (
    drop_dedup_trigger_sql,
    setup_sql,
)

from ._base import StorageArgument, SupportsInvoke, _CreateOperation, _DropOperation
from ._storage_op import SetTableStorageOp, set_table_storage
from ._tables import is_job_status_type

__all__ = [
    "CreateJobQueueOp",
    "CreateOutboxOp",
    "DropJobQueueOp",
    "DropOutboxOp",
    "SetTableStorageOp",
    "StorageArgument",
    "SupportsInvoke",
    "create_job_queue",
    "create_outbox",
    "drop_job_queue",
    "drop_outbox",
    "set_table_storage",
]


@Operations.register_operation("create_job_queue")
class CreateJobQueueOp(_CreateOperation):
    """Create a job table: the ``job_status`` enum type, the table, its indexes, its trigger.

    Example:
        >>> CreateJobQueueOp("jobs", schema="work").reverse()
        DropJobQueueOp('jobs', schema='work')
    """

    kind = "job"

    @classmethod
    def create_job_queue(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        partition_interval: str | None = None,
        storage: StorageArgument = "recommended",
    ) -> None:
        """Create the job table ``table_name`` with its indexes and ``job_status`` type.

        ``partition_interval``: ``"hour"``, ``"day"``, ``"week"`` or ``"month"`` to
        partition it by ``created_at``; ``storage``: its storage settings (default: the
        recommended ones; ``None``: the server's).

        Example, in a migration::

            op.create_job_queue("jobs", schema="work", partition_interval="day")
        """
        operation = cls(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
        operations.invoke(operation)

    def reverse(self) -> DropJobQueueOp:
        return self._same(DropJobQueueOp)


@Operations.register_operation("drop_job_queue")
class DropJobQueueOp(_DropOperation):
    """Drop a job table (its indexes and trigger with it), the trigger's function, then its
    ``job_status`` type if unused.

    Example:
        >>> DropJobQueueOp("jobs").reverse()
        CreateJobQueueOp('jobs', schema=None)
    """

    kind = "job"

    @classmethod
    def drop_job_queue(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        partition_interval: str | None = None,
        storage: StorageArgument = "recommended",
    ) -> None:
        """Drop the job table ``table_name`` and, once no table uses it, ``job_status``.

        Example, in a migration::

            op.drop_job_queue("jobs", schema="work")
        """
        operation = cls(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
        operations.invoke(operation)

    def reverse(self) -> CreateJobQueueOp:
        return self._same(CreateJobQueueOp)


@Operations.register_operation("create_outbox")
class CreateOutboxOp(_CreateOperation):
    """Create an outbox table and its indexes.

    Example:
        >>> CreateOutboxOp("outbox").reverse()
        DropOutboxOp('outbox', schema=None)
    """

    kind = "outbox"

    @classmethod
    def create_outbox(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        partition_interval: str | None = None,
        storage: StorageArgument = "recommended",
    ) -> None:
        """Create the outbox table ``table_name`` with its indexes.

        Example, in a migration::

            op.create_outbox("outbox", schema="work")
        """
        operation = cls(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
        operations.invoke(operation)

    def reverse(self) -> DropOutboxOp:
        return self._same(DropOutboxOp)


@Operations.register_operation("drop_outbox")
class DropOutboxOp(_DropOperation):
    """Drop an outbox table (its indexes with it).

    Example:
        >>> DropOutboxOp("outbox", schema="work").reverse()
        CreateOutboxOp('outbox', schema='work')
    """

    kind = "outbox"

    @classmethod
    def drop_outbox(
        cls,
        operations: Operations,
        table_name: str,
        *,
        schema: str | None = None,
        partition_interval: str | None = None,
        storage: StorageArgument = "recommended",
    ) -> None:
        """Drop the outbox table ``table_name``.

        Example, in a migration::

            op.drop_outbox("outbox", schema="work")
        """
        operation = cls(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
        operations.invoke(operation)

    def reverse(self) -> CreateOutboxOp:
        return self._same(CreateOutboxOp)


@Operations.implementation_for(CreateJobQueueOp)
@Operations.implementation_for(CreateOutboxOp)
def _create(operations: Operations, operation: _CreateOperation) -> None:
    table = operation.to_table()
    dialect = operations.get_context().dialect
    for enum in _enum_types(table):
        operations.execute(_create_type_sql(enum, dialect))
    # CREATE TABLE without table events: the enum type is already there (see build_table).
    operations.execute(CreateTable(table))
    for index in sorted(table.indexes, key=lambda index: str(index.name)):
        operations.execute(CreateIndex(index))
    if operation.kind == "job":
        for sql in create_notify_trigger_sql(table):
            operations.execute(sql)
    if operation.kind == "outbox":  # the ordering and wake-up triggers, with their functions
        for sql in create_outbox_triggers_sql(table):
            operations.execute(sql)
    # The storage settings; when partitioned, the partitions (with the settings) instead,
    # and for jobs the dedup trigger.
    for sql in setup_sql(table, operation.kind, operation.partition_interval, operation.storage):
        operations.execute(sql)


@Operations.implementation_for(DropJobQueueOp)
@Operations.implementation_for(DropOutboxOp)
def _drop(operations: Operations, operation: _DropOperation) -> None:
    table = operation.to_table()
    dialect = operations.get_context().dialect
    operations.execute(DropTable(table))  # its triggers and partitions go with it
    if operation.kind == "job":
        for sql in [*drop_notify_trigger_sql(table), *drop_dedup_trigger_sql(table)]:
            operations.execute(sql)
    if operation.kind == "outbox":
        for sql in drop_outbox_triggers_sql(table):
            operations.execute(sql)
    for enum in _enum_types(table):
        operations.execute(_drop_type_sql(enum, dialect))


def _enum_types(table: Table) -> list[Enum]:
    return [column.type for column in table.columns if is_job_status_type(column.type)]


def _type_name(enum: Enum, dialect: Dialect) -> str:
    preparer = dialect.identifier_preparer
    name = preparer.quote(str(enum.name))
    return name if enum.schema is None else f"{preparer.quote_schema(enum.schema)}.{name}"


def _create_type_sql(enum: Enum, dialect: Dialect) -> str:
    # One job_status type per schema serves every job table in it: an existing type is
    # accepted when its labels are ours, refused otherwise. No ':' or '%' in this text.
    name = _type_name(enum, dialect)
    labels = ", ".join(
        str(literal(label).compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        for label in enum.enums
    )
    return (
        "DO $sa_outbox$\n"
        "BEGIN\n"
        f"    CREATE TYPE {name} AS ENUM ({labels});\n"
        "EXCEPTION WHEN duplicate_object THEN\n"
        f"    IF CAST(enum_range(CAST(NULL AS {name})) AS text[])"
        f" IS DISTINCT FROM ARRAY[{labels}] THEN\n"
        f"        RAISE EXCEPTION 'type {name} exists with labels other than"
        f" {', '.join(enum.enums)}';\n"
        "    END IF;\n"
        "END\n"
        "$sa_outbox$"
    )


def _drop_type_sql(enum: Enum, dialect: Dialect) -> str:
    # Another job table of the same schema may still use the type: then it stays.
    return (
        "DO $sa_outbox$\n"
        "BEGIN\n"
        f"    DROP TYPE {_type_name(enum, dialect)};\n"
        "EXCEPTION WHEN dependent_objects_still_exist THEN\n"
        "    NULL;\n"
        "END\n"
        "$sa_outbox$"
    )


def create_job_queue(
    op: SupportsInvoke,
    table_name: str,
    *,
    schema: str | None = None,
    partition_interval: str | None = None,
    storage: StorageArgument = "recommended",
) -> None:
    """``op.create_job_queue(...)`` in a form type checkers know.

    Example, in a migration::

        from alembic import op
        import alembic_ext

        def upgrade() -> None:
            alembic_ext.create_job_queue(op, "jobs", schema="work")
    """
    op.invoke(
        CreateJobQueueOp(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
    )


def drop_job_queue(
    op: SupportsInvoke,
    table_name: str,
    *,
    schema: str | None = None,
    partition_interval: str | None = None,
    storage: StorageArgument = "recommended",
) -> None:
    """``op.drop_job_queue(...)`` in a form type checkers know.

    Example, in a migration::

        def downgrade() -> None:
            alembic_ext.drop_job_queue(op, "jobs", schema="work")
    """
    op.invoke(
        DropJobQueueOp(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
    )


def create_outbox(
    op: SupportsInvoke,
    table_name: str,
    *,
    schema: str | None = None,
    partition_interval: str | None = None,
    storage: StorageArgument = "recommended",
) -> None:
    """``op.create_outbox(...)`` in a form type checkers know.

    Example, in a migration::

        def upgrade() -> None:
            alembic_ext.create_outbox(op, "outbox", schema="work")
    """
    op.invoke(
        CreateOutboxOp(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
    )


def drop_outbox(
    op: SupportsInvoke,
    table_name: str,
    *,
    schema: str | None = None,
    partition_interval: str | None = None,
    storage: StorageArgument = "recommended",
) -> None:
    """``op.drop_outbox(...)`` in a form type checkers know.

    Example, in a migration::

        def downgrade() -> None:
            alembic_ext.drop_outbox(op, "outbox", schema="work")
    """
    op.invoke(
        DropOutboxOp(
            table_name, schema=schema, partition_interval=partition_interval, storage=storage
        )
    )
