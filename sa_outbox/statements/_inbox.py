"""A consumer's inbox: record a message once (``ON CONFLICT DO NOTHING``), prune old entries."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Delete, Table, delete, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert

from .._clock import Clock
from .._exceptions import InvalidArgumentType
from .._validation import MAX_MESSAGE_ID_LENGTH, count, duration, key, name
from ._common import interval, now_of, table_of

_INBOX_COLUMNS = ("source", "message_id", "received_at")


def inbox_table(target: object) -> Table:
    """The `Table` of an `InboxMixin` model (or the table itself), checked for its columns.

    Examples:
        >>> from sqlalchemy import Column, MetaData, Table, Text
        >>> inbox_table(Table("t", MetaData(), Column("message_id", Text)))
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgumentType: table 't' is not an inbox table (no column \
source, received_at): declare it with InboxMixin
    """
    t = table_of(target)
    missing = [column for column in _INBOX_COLUMNS if column not in t.c]
    if missing:
        raise InvalidArgumentType(
            f"table {t.fullname!r} is not an inbox table (no column {', '.join(missing)}): "
            "declare it with InboxMixin"
        )
    return t


def checked_message(message_id: object, source: object) -> tuple[str, str]:
    """``(source, message_id)`` if both can be stored and indexed, else a clear error.

    ``source`` is a name (1 to 128 characters, not only whitespace); ``message_id`` a str of
    1 to `MAX_MESSAGE_ID_LENGTH` characters. Neither may hold a NUL or a lone surrogate.

    Examples:
        >>> checked_message("0190", "orders")
        ('orders', '0190')
        >>> import uuid
        >>> checked_message(uuid.UUID(int=1), "orders")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgumentType: message_id must be a str, got UUID
    """
    if not isinstance(message_id, str):
        raise InvalidArgumentType(f"message_id must be a str, got {type(message_id).__name__}")
    return name(source, "source"), key(message_id, "message_id", MAX_MESSAGE_ID_LENGTH)


def accept_message(
    target: object, message_id: str, *, source: str, clock: Clock | None = None
) -> ReturningInsert[Any]:
    """Record ``(source, message_id)``; returns its ``message_id`` only if it was new.

    ``INSERT … ON CONFLICT (source, message_id) DO NOTHING RETURNING message_id``: run it in
    the transaction that applies the message, and apply it only when a row comes back. A
    second insert of the same key while the first one's transaction is still open waits
    for it: it returns nothing once that one commits, and inserts if it rolls back.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import InboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class InboxEntry(InboxMixin, Base): __tablename__ = "inbox"
        >>> stmt = accept_message(InboxEntry, "0190", source="orders")
        >>> "ON CONFLICT (source, message_id) DO NOTHING" in str(stmt)
        True
    """
    src, mid = checked_message(message_id, source)
    t = inbox_table(target)
    return (
        insert(t)
        .values(source=src, message_id=mid, received_at=now_of(clock))
        .on_conflict_do_nothing(index_elements=[t.c.source, t.c.message_id])
        .returning(t.c.message_id)
    )


def prune_inbox(
    target: object,
    *,
    older_than: dt.timedelta | float,
    batch: int = 1000,
    clock: Clock | None = None,
) -> Delete:
    """Delete one batch of inbox entries received more than ``older_than`` ago.

    Rows are picked oldest first through ``{t}_retention_idx``, with ``FOR UPDATE SKIP
    LOCKED``; run it until it deletes fewer than ``batch`` rows. A message redelivered
    after its entry was pruned is accepted again: keep entries longer than any
    redelivery can come (docs/inbox.md, "How long to keep entries").

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import InboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class InboxEntry(InboxMixin, Base): __tablename__ = "inbox"
        >>> str(prune_inbox(InboxEntry, older_than=14 * 86400)).startswith("DELETE FROM inbox")
        True
    """
    window = duration(older_than, "older_than", allow_zero=True)
    size = count(batch, "batch")
    t = inbox_table(target)
    now = now_of(clock)
    doomed = (
        select(t.c.source, t.c.message_id)
        .where(t.c.received_at < now - interval(window))
        .order_by(t.c.received_at)
        .limit(size)
        .with_for_update(skip_locked=True)
    )
    return delete(t).where(tuple_(t.c.source, t.c.message_id).in_(doomed))
