"""The job table's NOTIFY channel: notify, LISTEN and the payload's parser."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    Text,
    TextClause,
    bindparam,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql

from .._exceptions import InvalidArgument
from .._json import compact_json
from .._validation import name_filter, text
from ..schema._notify_trigger import MAX_CHANNEL_BYTES
from ._common import table_of

_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


# The channel as the table's NOTIFY trigger computes it (sa_outbox.schema._notify_trigger), from
# the table the name resolves to: "schema.table", or "sa_outbox_" + md5 of it when too long.
_CHANNEL_OF_TABLE = f"""\
SELECT CASE WHEN octet_length(q.name) > {MAX_CHANNEL_BYTES} THEN 'sa_outbox_' || md5(q.name)
            ELSE q.name END AS channel
FROM (SELECT n.nspname || '.' || c.relname AS name
      FROM pg_catalog.pg_class AS c
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.oid = to_regclass(:job_table)) AS q"""


def _job_table_name(target: object) -> Any:
    return bindparam("job_table", _PREPARER.format_table(table_of(target)), type_=Text)


def job_notify_channel_of(target: object) -> TextClause:
    """The channel the job table's NOTIFY trigger sends on, as one row; no row if no table.

    The database resolves the table (a table declared without a schema is looked up on the
    ``search_path``), so the name is the one the trigger uses: ``"{schema}.{table}"``.

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> job_notify_channel_of(Job).compile().params
        {'job_table': 'jobs'}
    """
    return sql_text(_CHANNEL_OF_TABLE).bindparams(_job_table_name(target))


def notify_jobs(target: object, queues: Iterable[str] | None = None) -> TextClause:
    """``pg_notify`` on the job table's channel, as its trigger does for inserts.

    For jobs that became ready by an update (released, requeued): workers listening on the
    channel wake up at commit. ``queues`` names the queues concerned (``None``: any).

    Examples:
        >>> from sa_outbox.schema import JobMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> notify_jobs(Job, ["emails", "default"]).compile().params["payload"]
        '["default","emails"]'
    """
    if queues is not None and not isinstance(queues, str):
        queues = list(queues)
    names = name_filter(queues, "queues") or ()
    payload = compact_json(sorted(set(names))) if names else ""
    if len(payload.encode()) > 7900:
        payload = ""
    return sql_text(
        f"SELECT pg_notify(q.channel, :payload) FROM ({_CHANNEL_OF_TABLE}) AS q"
    ).bindparams(_job_table_name(target), bindparam("payload", payload, type_=Text))


def listen_sql(channel: str) -> str:
    """``LISTEN "channel"``, as a plain string for a driver connection in autocommit mode.

    Examples:
        >>> listen_sql("work.jobs")
        'LISTEN "work.jobs"'
    """
    name = text(channel, "channel")
    if len(name.encode()) > MAX_CHANNEL_BYTES:
        raise InvalidArgument(f"channel {name!r} is longer than {MAX_CHANNEL_BYTES} bytes")
    return 'LISTEN "' + name.replace('"', '""') + '"'


def parse_notify_payload(payload: str) -> frozenset[str] | None:
    """The queues a job notification names; ``None`` when it names none in particular.

    Examples:
        >>> sorted(parse_notify_payload('["default","emails"]'))
        ['default', 'emails']
        >>> parse_notify_payload("") is None
        True
    """
    try:
        names = json.loads(payload) if payload else None
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return frozenset(names)
