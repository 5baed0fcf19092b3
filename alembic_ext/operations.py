"""Alembic operations that create and drop the library's tables.

``op.create_job_queue`` creates the ``job_status`` enum type (in the table's schema), the job
table, its indexes, its NOTIFY trigger (which wakes workers up) and its serial trigger
(which orders the jobs of each serial key), with the triggers' functions;
``op.drop_job_queue`` drops the table (its indexes and triggers go with it), the triggers'
functions, and then the type. ``op.create_outbox`` / ``op.drop_outbox`` do the same
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
the model's settings differ from ``pg_class.reloptions``). ``op.create_inbox`` /
``op.drop_inbox`` create and drop a consumer's inbox table (`InboxMixin`): a plain table
with its primary key and retention index (``alembic_ext._inbox_op``).

``op.add_job_status_values("jobs")`` upgrades an install made by an earlier release: it
adds the states the ``job_status`` type lacks (``cancelled``, new in this release) with
``ALTER TYPE … ADD VALUE IF NOT EXISTS``, outside the migration's transaction (PostgreSQL
before 12 refuses it in a transaction block, and from 12 on a value added in a
transaction cannot be used before it commits); running it again changes nothing.

The type is created with a statement of our own, which tolerates a type already made by
another job table in the same schema (with the same labels); dropping keeps the type while
another table still uses it. Identifiers are checked when an operation is built, before any
SQL. The functions of the same names take ``op`` as their first argument, for migrations
that a type checker reads (``alembic/op.pyi`` knows nothing of custom operations).
"""

from __future__ import annotations

from alembic.operations import MigrateOperation, Operations
from sqlalchemy import Enum, Table, literal
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DropTable

from sa_outbox._validation import identifier, optional_identifier
from sa_outbox.schema._notify_trigger import create_notify_trigger_sql, drop_notify_trigger_sql
from sa_outbox.schema._outbox_triggers import create_outbox_triggers_sql, drop_outbox_triggers_sql
from sa_outbox.schema._partition_ddl import (
    drop_dedup_trigger_sql,
    setup_sql,
)
from sa_outbox.schema._serial_trigger import create_serial_trigger_sql, drop_serial_trigger_sql
from sa_outbox.schema._status import JobStatus, job_status_enum

from ._base import StorageArgument, SupportsInvoke, _CreateOperation, _DropOperation
from ._inbox_op import CreateInboxOp, DropInboxOp, create_inbox, drop_inbox
from ._serial_op import (
    CreateSerialTriggerOp,
    DropSerialTriggerOp,
    create_serial_trigger,
    drop_serial_trigger,
)
from ._storage_op import SetTableStorageOp, set_table_storage
from ._tables import is_job_status_type

__all__ = [
    "AddJobStatusValuesOp",
    "CreateInboxOp",
    "CreateJobQueueOp",
    "CreateOutboxOp",
    "CreateSerialTriggerOp",
    "DropInboxOp",
    "DropJobQueueOp",
    "DropOutboxOp",
    "DropSerialTriggerOp",
    "SetTableStorageOp",
    "StorageArgument",
    "SupportsInvoke",
    "add_job_status_values",
    "create_inbox",
    "create_job_queue",
    "create_outbox",
    "create_serial_trigger",
    "drop_inbox",
    "drop_job_queue",
    "drop_outbox",
    "drop_serial_trigger",
    "set_table_storage",
]


@Operations.register_operation("create_job_queue")
class CreateJobQueueOp(_CreateOperation):
    """Create a job table: the ``job_status`` enum type, the table, its indexes, its trigger.

    Examples:
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

    Examples:
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

    Examples:
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

    Examples:
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
    if operation.kind == "job":  # the NOTIFY trigger, and the serial keys' ordering trigger
        for sql in [*create_notify_trigger_sql(table), *create_serial_trigger_sql(table)]:
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
        for sql in [
            *drop_notify_trigger_sql(table),
            *drop_serial_trigger_sql(table),
            *drop_dedup_trigger_sql(table),
        ]:
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


@Operations.register_operation("add_job_status_values")
class AddJobStatusValuesOp(MigrateOperation):
    """Add to the ``job_status`` type of a job table's schema the states it lacks.

    For an install made by an earlier release (``cancelled`` came later). It runs in an
    ``autocommit_block`` (``ALTER TYPE … ADD VALUE`` outside a transaction block, each value
    committed before anything uses it); ``IF NOT EXISTS`` makes it idempotent. PostgreSQL
    cannot drop an enum value, so the reverse does nothing: a downgraded worker never writes
    the new state, and a row in it must be pruned or changed by hand.

    Examples:
        >>> AddJobStatusValuesOp("jobs", schema="work")
        AddJobStatusValuesOp('jobs', schema='work')
    """

    def __init__(self, table_name: str, *, schema: str | None = None) -> None:
        self.table_name: str = identifier(table_name, "table name")
        self.schema: str | None = optional_identifier(schema, "schema")

    @classmethod
    def add_job_status_values(
        cls, operations: Operations, table_name: str, *, schema: str | None = None
    ) -> None:
        """Add the job states the table's ``job_status`` type lacks (outside a transaction).

        Example, in a migration::

            op.add_job_status_values("jobs", schema="work")
        """
        operations.invoke(cls(table_name, schema=schema))

    def reverse(self) -> _NoOp:
        return _NoOp()

    def __repr__(self) -> str:
        return f"AddJobStatusValuesOp({self.table_name!r}, schema={self.schema!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AddJobStatusValuesOp):
            return NotImplemented
        return (other.table_name, other.schema) == (self.table_name, self.schema)

    def __hash__(self) -> int:
        return hash((self.table_name, self.schema))


class _NoOp(MigrateOperation):
    """The reverse of `AddJobStatusValuesOp`: PostgreSQL cannot remove an enum value."""


@Operations.implementation_for(AddJobStatusValuesOp)
def _add_job_status_values(operations: Operations, operation: AddJobStatusValuesOp) -> None:
    enum = job_status_enum()
    enum.schema = operation.schema
    name = _type_name(enum, operations.get_context().dialect)
    with operations.get_context().autocommit_block():
        for status in JobStatus:
            operations.execute(f"ALTER TYPE {name} ADD VALUE IF NOT EXISTS '{status.value}'")


@Operations.implementation_for(_NoOp)
def _nothing(operations: Operations, operation: _NoOp) -> None:
    pass


def add_job_status_values(
    op: SupportsInvoke, table_name: str, *, schema: str | None = None
) -> None:
    """``op.add_job_status_values(...)`` in a form type checkers know.

    Example, in a migration::

        def upgrade() -> None:
            alembic_ext.add_job_status_values(op, "jobs", schema="work")
    """
    op.invoke(AddJobStatusValuesOp(table_name, schema=schema))
