"""Layer 1: a table's storage parameters (``WITH (fillfactor = 80, …)``, ``reloptions``).

The job and outbox tables are updated all the time (claim, heartbeat, complete): per-table
autovacuum thresholds make vacuum follow the queue's churn instead of the table's size. (A
``fillfactor`` below 100 would leave room for HOT updates, but none of the queue's updates
can be HOT: each changes an indexed column. It stays available as a setting.) The mixins
declare `RECOMMENDED_JOB_STORAGE` / `RECOMMENDED_OUTBOX_STORAGE` (``__table_storage__``);
``create_all`` and ``alembic_ext``'s operations apply them, autogenerate compares them with
``pg_class.reloptions``. A partitioned table has no storage of its own: its partitions get
the settings, each as it is created.

Names are checked against `STORAGE_PARAMETERS` and values must be int, float or bool, so
what reaches SQL is a known name and a number: nothing to quote. The SQL contains neither
``:`` nor ``%``, so it passes unchanged through ``text()``, ``DDL()`` and psycopg.

Examples:
    >>> storage_clause({"fillfactor": 80, "autovacuum_enabled": True})
    'fillfactor = 80, autovacuum_enabled = true'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql

from .._exceptions import InvalidArgument, InvalidArgumentType

__all__ = [
    "RECOMMENDED_JOB_STORAGE",
    "RECOMMENDED_OUTBOX_STORAGE",
    "STORAGE_INFO_KEY",
    "STORAGE_PARAMETERS",
    "Storage",
    "alter_storage_sql",
    "check_storage",
    "parse_reloptions",
    "same_storage",
    "set_storage_sql",
    "storage_clause",
    "storage_from_reloptions",
    "storage_of",
    "with_clause",
]

Storage = dict[str, int | float | bool]

#: Key of ``Table.info`` where the mixins record the table's storage settings (or ``None``).
STORAGE_INFO_KEY = "sa_outbox_storage"

#: The table storage parameters PostgreSQL (13 to 17) accepts on a heap table.
STORAGE_PARAMETERS = frozenset(
    {
        "fillfactor",
        "toast_tuple_target",
        "parallel_workers",
        "autovacuum_enabled",
        "vacuum_index_cleanup",
        "vacuum_truncate",
        "autovacuum_vacuum_threshold",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_insert_threshold",
        "autovacuum_vacuum_insert_scale_factor",
        "autovacuum_analyze_threshold",
        "autovacuum_analyze_scale_factor",
        "autovacuum_vacuum_cost_delay",
        "autovacuum_vacuum_cost_limit",
        "autovacuum_freeze_min_age",
        "autovacuum_freeze_max_age",
        "autovacuum_freeze_table_age",
        "autovacuum_multixact_freeze_min_age",
        "autovacuum_multixact_freeze_max_age",
        "autovacuum_multixact_freeze_table_age",
        "log_autovacuum_min_duration",
    }
)

# One place for the recommended values (docs/retention.md, "Storage settings", says why).
# No fillfactor: none of the queue's updates can be HOT (each changes a column an index or
# a partial index's predicate names: status, lease_until, updated_at, published_at), so
# free room on each page would buy nothing and cost a fifth more table.
_RECOMMENDED: Storage = {
    "autovacuum_vacuum_scale_factor": 0.0,
    "autovacuum_vacuum_threshold": 1000,
    "autovacuum_vacuum_cost_delay": 0,
    "autovacuum_vacuum_insert_scale_factor": 0.0,
    "autovacuum_vacuum_insert_threshold": 1000,
    "autovacuum_analyze_scale_factor": 0.02,
}
#: What `JobMixin` tables get unless ``__table_storage__`` says otherwise.
RECOMMENDED_JOB_STORAGE: Mapping[str, int | float | bool] = dict(_RECOMMENDED)
#: What `OutboxMixin` tables get unless ``__table_storage__`` says otherwise.
RECOMMENDED_OUTBOX_STORAGE: Mapping[str, int | float | bool] = dict(_RECOMMENDED)

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def check_storage(value: object, what: str) -> Storage | None:
    """``value`` as a checked storage mapping (``None`` stays ``None``: server defaults).

    Examples:
        >>> check_storage({"fillfactor": 90}, "__table_storage__ of Job")
        {'fillfactor': 90}
        >>> try:
        ...     check_storage({"fill_factor": 90}, "__table_storage__ of Job")
        ... except InvalidArgument as exc:
        ...     print(str(exc)[:71])
        __table_storage__ of Job: unknown table storage parameter 'fill_factor'
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgumentType(
            f"{what} must be a mapping of storage parameters to values, or None, "
            f"got {type(value).__name__}"
        )
    checked: Storage = {}
    for name, setting in value.items():
        if name not in STORAGE_PARAMETERS:
            raise InvalidArgument(
                f"{what}: unknown table storage parameter {name!r}; "
                f"known: {', '.join(sorted(STORAGE_PARAMETERS))}"
            )
        if not isinstance(setting, int | float) or (
            isinstance(setting, float) and setting != setting
        ):
            raise InvalidArgumentType(
                f"{what}: {name} must be an int, a float or a bool, got {setting!r}"
            )
        checked[name] = setting
    return checked


def storage_of(table: Table) -> Storage | None:
    """The storage settings recorded on a mixin's table; ``None`` for any other table.

    Examples:
        >>> from sqlalchemy import MetaData
        >>> storage_of(Table("t", MetaData())) is None
        True
    """
    value = table.info.get(STORAGE_INFO_KEY)
    return None if value is None else dict(value)


def _value(setting: int | float | bool) -> str:
    if isinstance(setting, bool):
        return "true" if setting else "false"
    return repr(setting)


def storage_clause(storage: Mapping[str, int | float | bool]) -> str:
    """``name = value, …`` for ``WITH (…)`` / ``SET (…)``; the values as PostgreSQL reads them.

    Examples:
        >>> storage_clause({"autovacuum_analyze_scale_factor": 0.02})
        'autovacuum_analyze_scale_factor = 0.02'
    """
    return ", ".join(f"{name} = {_value(setting)}" for name, setting in storage.items())


def with_clause(storage: Mapping[str, int | float | bool] | None) -> str:
    """`` WITH (…)`` for ``CREATE TABLE``, or ``""`` when there is nothing to set.

    Examples:
        >>> with_clause({"fillfactor": 80}), with_clause(None)
        (' WITH (fillfactor = 80)', '')
    """
    return f" WITH ({storage_clause(storage)})" if storage else ""


def _normal(raw: object) -> object:
    text = str(raw).strip().lower()
    if text in ("true", "on", "yes"):
        return True
    if text in ("false", "off", "no"):
        return False
    try:
        return float(text)
    except ValueError:
        return text


def parse_reloptions(reloptions: Iterable[str] | None) -> dict[str, str]:
    """``pg_class.reloptions`` (``['fillfactor=80', …]``) as a dict, storage parameters only.

    Examples:
        >>> parse_reloptions(["fillfactor=80", "toast.autovacuum_enabled=false"])
        {'fillfactor': '80'}
    """
    found: dict[str, str] = {}
    for option in reloptions or ():
        name, _, value = option.partition("=")
        if name in STORAGE_PARAMETERS:
            found[name] = value
    return found


def storage_from_reloptions(found: Mapping[str, str]) -> Storage:
    """`parse_reloptions`' text values as numbers and booleans, for an operation to render.

    Examples:
        >>> storage_from_reloptions({"fillfactor": "80", "autovacuum_enabled": "off",
        ...                          "autovacuum_vacuum_scale_factor": "0.0"})
        {'fillfactor': 80, 'autovacuum_enabled': False, 'autovacuum_vacuum_scale_factor': 0.0}
    """
    storage: Storage = {}
    for name, raw in found.items():
        value = _normal(raw)
        if isinstance(value, bool):
            storage[name] = value
        elif isinstance(value, float):
            storage[name] = int(raw) if raw.strip().lstrip("-").isdigit() else value
    return storage


def same_storage(
    declared: Mapping[str, int | float | bool] | None, found: Mapping[str, object]
) -> bool:
    """Whether the database's settings (`parse_reloptions`) are the declared ones.

    ``0`` and ``0.0``, ``true`` and ``on`` are the same setting.

    Examples:
        >>> same_storage({"fillfactor": 80, "autovacuum_enabled": True},
        ...              {"fillfactor": "80", "autovacuum_enabled": "on"})
        True
        >>> same_storage(None, {"fillfactor": "80"})
        False
    """
    wanted = {name: _normal(_value(v)) for name, v in (declared or {}).items()}
    return wanted == {name: _normal(v) for name, v in found.items()}


def _qualified(table: Table) -> str:
    return str(_PREPARER.format_table(table))


def alter_storage_sql(table: Table, storage: Mapping[str, int | float | bool]) -> str:
    """``ALTER TABLE … SET (…)`` for a table just created (nothing to reset).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> alter_storage_sql(Table("jobs", MetaData(), schema="w"), {"fillfactor": 80})
        'ALTER TABLE w.jobs SET (fillfactor = 80)'
    """
    return f"ALTER TABLE {_qualified(table)} SET ({storage_clause(storage)})"


def set_storage_sql(table: Table, storage: Mapping[str, int | float | bool] | None) -> str:
    """Make a table's storage settings exactly ``storage`` (``None``: the server defaults).

    Every known parameter not in ``storage`` is ``RESET``, then ``storage`` is ``SET``. A
    partitioned table takes no settings itself: each of its partitions does. One ``DO``
    block finds out which when it runs, so the SQL is the same offline
    (``alembic upgrade --sql``).

    Examples:
        >>> from sqlalchemy import MetaData
        >>> sql = set_storage_sql(Table("jobs", MetaData(), schema="w"), {"fillfactor": 80})
        >>> "' SET (fillfactor = 80)'" in sql and "to_regclass('w.jobs')" in sql
        True
    """
    reset = [name for name in _ordered(STORAGE_PARAMETERS) if name not in (storage or {})]
    alters = []
    if reset:
        alters.append(f"RESET ({', '.join(reset)})")
    if storage:
        alters.append(f"SET ({storage_clause(storage)})")
    target = _qualified(table)
    literal = "'" + target.replace("'", "''") + "'"
    body = "\n".join(
        f"        EXECUTE 'ALTER TABLE ' || CAST(CAST(target.oid AS regclass) AS text)"
        f" || ' {alter}';"
        for alter in alters
    )
    return (
        "DO $sa_outbox$\n"
        "DECLARE\n"
        "    target record;\n"
        "BEGIN\n"
        f"    IF to_regclass({literal}) IS NULL THEN\n"
        f"        RAISE EXCEPTION 'table {target.replace(chr(39), chr(39) * 2)} does not exist';\n"
        "    END IF;\n"
        "    -- A partitioned table: its partitions. Any other table: itself.\n"
        "    FOR target IN\n"
        "        SELECT c.oid FROM pg_catalog.pg_class AS c\n"
        f"            WHERE c.oid = to_regclass({literal}) AND c.relkind <> 'p'\n"
        "        UNION ALL\n"
        "        SELECT i.inhrelid FROM pg_catalog.pg_inherits AS i\n"
        f"            WHERE i.inhparent = to_regclass({literal})\n"
        "    LOOP\n"
        f"{body}\n"
        "    END LOOP;\n"
        "END\n"
        "$sa_outbox$"
    )


def _ordered(names: Iterable[str]) -> list[str]:
    return sorted(names)  # stable SQL, for tests and reviews


def quote_table(table: Table) -> str:
    """The table's name as SQL writes it (schema-qualified when it has a schema)."""
    return _qualified(table)


def preparer() -> Any:
    """PostgreSQL's identifier preparer, for the modules that build DDL text."""
    return _PREPARER
