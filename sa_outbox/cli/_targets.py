"""Which tables the inspection commands read: a model's import path, or a table's name.

``--model myapp.models:Job`` (or its `JobApp`) and ``--outbox-model myapp.models:OutboxEvent``
import the user's models; ``--jobs-table work.jobs`` / ``--outbox-table work.outbox`` reflect
the tables from the database instead, for a shell with no application code at hand. An
embedding application (the Flask example) gives them, and its engine, as a `Preset`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator

from sqlalchemy import Connection, Engine, MetaData, Table
from sqlalchemy.exc import DBAPIError, NoSuchTableError

from ..schema import TABLE_KIND_INFO_KEY, resolve_table
from ._common import (
    CommandError,
    _add_database_url,
    _connect,
    _database_error,
    _import_target,
    load_table,
)

_JOB_COLUMNS = frozenset(
    {"id", "kind", "queue", "status", "attempts", "max_attempts", "run_at", "lease_token"}
)
_OUTBOX_COLUMNS = frozenset({"id", "seq", "event_type", "published_at", "parked_at"})
_PAUSE_COLUMNS = frozenset({"queue", "paused_at", "paused_by"})
_INBOX_COLUMNS = frozenset({"source", "message_id", "received_at"})
_STEP_COLUMNS = frozenset({"job_id", "name", "result"})
_DEPENDENCY_COLUMNS = frozenset({"job_id", "workflow_id", "parents", "job", "released_at"})
#: The option that takes each kind of model, for the hint when a model is given to another.
_MODEL_OPTION = {"job": "--model", "outbox": "--outbox-model", "inbox": "--inbox-model"}


@dataclasses.dataclass(frozen=True)
class Preset:
    """What an application embedding the commands already knows: its engine and models.

    Examples:
        >>> Preset().jobs is None
        True
    """

    engine: Engine | None = None
    jobs: object | None = None
    outbox: object | None = None
    pauses: object | None = None


def preset_of(args: argparse.Namespace) -> Preset:
    found = getattr(args, "preset", None)
    return found if isinstance(found, Preset) else Preset()


def _qualified(value: str) -> tuple[str | None, str]:
    schema, _, name = value.rpartition(".")
    if not name or (schema == "" and value.startswith(".")):
        raise argparse.ArgumentTypeError(f"expected a table name like work.jobs, got {value!r}")
    return schema or None, name


def table_name(value: str) -> str:
    """A ``[SCHEMA.]TABLE`` argument, checked for shape only (the database says if it exists).

    Examples:
        >>> table_name("work.jobs")
        'work.jobs'
        >>> table_name("work.")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a table name like work.jobs, got 'work.'
    """
    _qualified(value)
    return value


def job_id(value: str) -> uuid.UUID:
    """A job or event id on the command line: a UUID.

    Examples:
        >>> job_id("00000000-0000-0000-0000-000000000001").int
        1
        >>> job_id("42")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected an id like 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e, got '42'
    """  # noqa: E501 - a doctest's expected output is one line
    try:
        return uuid.UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an id like 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e, got {value!r}"
        ) from None


def _add_target(
    parser: argparse.ArgumentParser, model: str, model_help: str, table: str, table_help: str
) -> None:
    """``model`` (an import path) or ``table`` (a name to reflect), not both."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(model, metavar="TARGET", help=model_help)
    group.add_argument(table, metavar="[SCHEMA.]TABLE", type=table_name, help=table_help)


def add_job_target(parser: argparse.ArgumentParser) -> None:
    """``--model TARGET`` or ``--jobs-table [SCHEMA.]TABLE``."""
    _add_target(
        parser,
        "--model",
        "the job model (or its JobApp), as module:attribute, e.g. myapp.models:Job",
        "--jobs-table",
        "or the job table's name, read from the database, e.g. public.jobs",
    )


def add_outbox_target(parser: argparse.ArgumentParser) -> None:
    """``--outbox-model TARGET`` or ``--outbox-table [SCHEMA.]TABLE``."""
    _add_target(
        parser,
        "--outbox-model",
        "the outbox model, as module:attribute, e.g. myapp.models:OutboxEvent",
        "--outbox-table",
        "or the outbox table's name, read from the database, e.g. public.outbox",
    )


def add_pause_target(parser: argparse.ArgumentParser) -> None:
    """``--pause-model TARGET`` or ``--pause-table [SCHEMA.]TABLE``."""
    _add_target(
        parser,
        "--pause-model",
        "the paused-queues model (QueuePauseMixin), as module:attribute, "
        "e.g. myapp.models:PausedQueue",
        "--pause-table",
        "or the paused-queues table's name, read from the database, e.g. public.paused_queues",
    )


def add_inbox_target(parser: argparse.ArgumentParser) -> None:
    """``--inbox-model TARGET`` or ``--inbox-table [SCHEMA.]TABLE``."""
    _add_target(
        parser,
        "--inbox-model",
        "the inbox model (InboxMixin), as module:attribute, e.g. consumer.models:InboxEntry",
        "--inbox-table",
        "or the inbox table's name, read from the database, e.g. public.inbox",
    )


def add_steps_target(parser: argparse.ArgumentParser) -> None:
    """``--steps-table [SCHEMA.]TABLE``: the durable steps' table (`JobStepMixin`)."""
    parser.add_argument(
        "--steps-table",
        metavar="TABLE",
        help="the durable steps' table (JobStepMixin), pruned with the jobs, e.g. public.job_steps",
    )


def steps_table(args: argparse.Namespace, conn: Connection) -> Table | None:
    """The steps table ``--steps-table`` names, if any (checked for its columns)."""
    name = getattr(args, "steps_table", None)
    return None if not name else _reflect(conn, name, "a steps", _STEP_COLUMNS)


def dependencies_table(args: argparse.Namespace, conn: Connection) -> Table:
    """The dependencies table ``--dependencies-table`` names (checked for its columns)."""
    return _reflect(conn, args.dependencies_table, "a dependencies", _DEPENDENCY_COLUMNS)


def add_json_and_target(
    parser: argparse.ArgumentParser,
    add_target: Callable[[argparse.ArgumentParser], None],
    *,
    json_help: str,
) -> None:
    """The last options of a ``jobs`` or ``outbox`` action: ``--json``, the table
    (`add_job_target` or `add_outbox_target`) and ``--database-url``."""
    parser.add_argument("--json", action="store_true", help=json_help)
    add_target(parser)
    _add_database_url(parser)


def _reflect(conn: Connection, value: str, kind: str, needed: frozenset[str]) -> Table:
    schema, name = _qualified(value)
    try:
        table = Table(name, MetaData(), schema=schema, autoload_with=conn)
    except NoSuchTableError:
        raise CommandError(f"no table {value} in the database") from None
    missing = sorted(needed - set(table.c.keys()))
    if missing:
        raise CommandError(f"{value} is not {kind} table (no column {', '.join(missing)})")
    return table


def _a(kind: str) -> str:
    return {"outbox": "an outbox", "pause": "a paused-queues", "inbox": "an inbox"}.get(
        kind, "a job"
    )


def _model(target: str, kind: str, option: str) -> Table:
    table = load_table(target)
    found = table.info.get(TABLE_KIND_INFO_KEY)
    if found is not None and found != kind:
        other = _MODEL_OPTION.get(found, "--model")
        raise CommandError(
            f"{target} is {_a(found)} model; {option} needs the {kind} model "
            f"(did you mean {other}?)"
        )
    return table


def _table(
    conn: Connection,
    *,
    model: str | None,
    name: str | None,
    preset: object | None,
    kind: str,
    option: str,
    columns: frozenset[str],
    missing: str,
    required: bool,
) -> Table | None:
    """The table of ``model`` (an import path), else the one reflected by ``name``, else the
    preset's; with none of them, ``missing`` as the error when ``required``."""
    if model:
        return _model(model, kind, option)
    if name:
        return _reflect(conn, name, _a(kind), columns)
    if preset is not None:
        return resolve_table(preset)
    if required:
        raise CommandError(missing)
    return None


def job_table(args: argparse.Namespace, conn: Connection, *, required: bool = True) -> Table | None:
    """The job table the arguments name (``--model``, ``--jobs-table``, or the preset)."""
    return _table(
        conn,
        model=getattr(args, "model", None),
        name=getattr(args, "jobs_table", None),
        preset=preset_of(args).jobs,
        kind="job",
        option="--model",
        columns=_JOB_COLUMNS,
        missing="give the job table: --model myapp.models:Job or --jobs-table SCHEMA.TABLE",
        required=required,
    )


def outbox_table(
    args: argparse.Namespace, conn: Connection, *, required: bool = True
) -> Table | None:
    """The outbox table the arguments name (``--outbox-model``, ``--outbox-table``, preset)."""
    return _table(
        conn,
        model=getattr(args, "outbox_model", None),
        name=getattr(args, "outbox_table", None),
        preset=preset_of(args).outbox,
        kind="outbox",
        option="--outbox-model",
        columns=_OUTBOX_COLUMNS,
        missing=(
            "give the outbox table: --outbox-model myapp.models:OutboxEvent "
            "or --outbox-table SCHEMA.TABLE"
        ),
        required=required,
    )


def inbox_table(
    args: argparse.Namespace, conn: Connection, *, required: bool = True
) -> Table | None:
    """The inbox table the arguments name (``--inbox-model``, ``--inbox-table``)."""
    return _table(
        conn,
        model=getattr(args, "inbox_model", None),
        name=getattr(args, "inbox_table", None),
        preset=None,
        kind="inbox",
        option="--inbox-model",
        columns=_INBOX_COLUMNS,
        missing=(
            "give the inbox table: --inbox-model consumer.models:InboxEntry "
            "or --inbox-table SCHEMA.TABLE"
        ),
        required=required,
    )


def _pause_model(target: str) -> Table:
    table = load_table(target)
    found = table.info.get(TABLE_KIND_INFO_KEY)
    if found is not None:
        raise CommandError(
            f"{target} is {_a(found)} model; --pause-model needs the QueuePauseMixin model"
        )
    missing = sorted(_PAUSE_COLUMNS - set(table.c.keys()))
    if missing:
        raise CommandError(
            f"{target} is not a QueuePauseMixin model (no column {', '.join(missing)})"
        )
    return table


def load_pause_model(target: str) -> object:
    """The `QueuePauseMixin` model (or its `Table`) at ``module:attribute``, as imported: a
    class pickles by reference, so `Supervisor`'s child processes get it too."""
    _pause_model(target)
    return _import_target(target)


def pause_table(
    args: argparse.Namespace, conn: Connection, *, required: bool = True
) -> Table | None:
    """The paused-queues table the arguments name (``--pause-model``, ``--pause-table``,
    or the preset's)."""
    model = getattr(args, "pause_model", None)
    if model:
        return _pause_model(model)
    return _table(
        conn,
        model=None,
        name=getattr(args, "pause_table", None),
        preset=preset_of(args).pauses,
        kind="pause",
        option="--pause-model",
        columns=_PAUSE_COLUMNS,
        missing=(
            "no pause table configured: give --pause-model myapp.models:PausedQueue "
            "or --pause-table SCHEMA.TABLE (a QueuePauseMixin table, docs/control.md)"
        ),
        required=required,
    )


@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[Engine]:
    """The command's engine (the preset's, or one on the database URL, disposed at the end);
    a database error inside becomes a one-line `CommandError` without the password."""
    preset = preset_of(args)
    if preset.engine is not None and not args.database_url:
        url, engine, own = preset.engine.url, preset.engine, False
    else:
        url, engine = _connect(args)
        own = True
    try:
        yield engine
    except DBAPIError as exc:
        raise _database_error(url, exc) from exc
    finally:
        if own:
            engine.dispose()


@contextlib.contextmanager
def connection(args: argparse.Namespace, *, write: bool = False) -> Iterator[Connection]:
    """A connection on the command's `database`; with ``write``, in a transaction committed
    at the end (rolled back on an error)."""
    with database(args) as engine, engine.begin() if write else engine.connect() as conn:
        yield conn
