"""Statements on the outbox table (article, section 5): append, claim → publish → mark."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import ARRAY, Delete, Text, Update, bindparam, cast, delete, func, select, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.dml import ReturningInsert

from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._ids import uuid7
from .._validation import count, duration, text
from ._common import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Dumps,
    as_uuid,
    compact_json,
    id_token_pairs,
    interval,
    jsonb,
    now_of,
    serialise,
    table_of,
    unnest_pairs,
    uuid_array,
)

DEFAULT_RELAY_LEASE = dt.timedelta(seconds=30)


def append_event(
    target: object,
    *,
    event_type: str,
    aggregate_type: str,
    aggregate_id: object,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> ReturningInsert[Any]:
    """``INSERT`` one outbox row; returns ``id, seq``.

    Run it in the transaction that changes the business data: the event exists exactly
    when that change commits. ``aggregate_id`` is stored as text (ints and UUIDs welcome).

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> stmt = append_event(OutboxEvent, event_type="OrderPlaced", aggregate_type="order",
        ...                     aggregate_id=42, payload={"total_cents": 1200})
        >>> "RETURNING outbox.id, outbox.seq" in str(stmt)
        True
    """
    event_id, aggregate_type_, aggregate_id_, kind, payload_, headers_ = _checked_event(
        NewEvent(event_type, aggregate_type, aggregate_id, payload, headers),
        dumps,
        max_payload_bytes,
    )
    t = table_of(target)
    now = now_of(clock)
    return (
        insert(t)
        .values(
            id=event_id,
            aggregate_type=aggregate_type_,
            aggregate_id=aggregate_id_,
            event_type=kind,
            payload=jsonb(payload_),
            headers=jsonb(headers_),
            created_at=now,
        )
        .returning(t.c.id, t.c.seq)
    )


@dataclasses.dataclass(frozen=True, slots=True)
class NewEvent:
    """One outbox row for `append_events`: the fields `append_event` takes.

    Example:
        >>> NewEvent("OrderPlaced", "order", "42", {"total_cents": 1200}).headers
    """

    event_type: str
    aggregate_type: str
    aggregate_id: object
    payload: Any
    headers: Mapping[str, Any] | None = None
    #: The row's id (the message id); a new time-ordered UUID when not given.
    id: uuid.UUID | None = None


def append_events(
    target: object,
    events: Iterable[NewEvent],
    *,
    clock: Clock | None = None,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> tuple[ReturningInsert[Any], list[uuid.UUID]]:
    """One ``INSERT … SELECT … FROM unnest(…) WITH ORDINALITY`` for many outbox rows.

    Rows are inserted in input order, so their ``seq`` values follow it. Returns the
    statement and the ids given to the rows, in input order. One statement shape serves any
    number of events (it compiles once).

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> stmt, ids = append_events(OutboxEvent, [NewEvent("A", "order", 1, {}),
        ...                                         NewEvent("B", "order", 1, {})])
        >>> "WITH ORDINALITY" in str(stmt), len(ids)
        (True, 2)
    """
    rows = [_checked_event(e, dumps, max_payload_bytes) for e in events]
    if not rows:
        raise InvalidArgument("append_events needs at least one event")
    t = table_of(target)
    now = now_of(clock)
    columns = ("id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers")
    arrays = [
        uuid_array([r[0] for r in rows]),
        *(
            bindparam(None, [r[i] for r in rows], type_=ARRAY(Text()))
            for i in range(1, len(columns))
        ),
    ]
    source = (
        func.unnest(*arrays)
        .table_valued(*columns, with_ordinality="ord")
        .render_derived(name="new_events")
    )
    select_rows = select(
        source.c.id,
        source.c.aggregate_type,
        source.c.aggregate_id,
        source.c.event_type,
        cast(source.c.payload, JSONB),
        cast(source.c.headers, JSONB),
        now,
    ).order_by(source.c.ord)
    stmt = insert(t).from_select([*columns, "created_at"], select_rows).returning(t.c.id)
    return stmt, [r[0] for r in rows]


def _checked_event(
    event: NewEvent, dumps: Dumps, limit: int
) -> tuple[uuid.UUID, str, str, str, str, str]:
    kind = text(event.event_type, "event_type")
    what = f"event type {kind!r}"
    headers = event.headers
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidArgumentType(f"headers of {what} must be a mapping, got {headers!r}")
    aggregate_id = event.aggregate_id
    if aggregate_id is None or isinstance(aggregate_id, bool):
        raise InvalidArgumentType(f"aggregate_id of {what} must be a str, int or UUID")
    return (
        uuid7() if event.id is None else as_uuid(event.id, f"id of {what}"),
        text(event.aggregate_type, "aggregate_type"),
        text(str(aggregate_id), "aggregate_id"),
        kind,
        serialise(event.payload, what, dumps, limit),
        serialise(dict(headers or {}), f"headers of {what}", dumps, limit),
    )


def claim_events(
    target: object,
    *,
    batch: int = 100,
    lease: dt.timedelta | float = DEFAULT_RELAY_LEASE,
    clock: Clock | None = None,
) -> Update:
    """Claim up to ``batch`` unpublished events in ``seq`` order for one relay.

    Skips rows another relay holds: locked right now (``SKIP LOCKED``) or claimed within an
    unexpired relay lease. Each claimed row gets ``relay_until = now + lease``, a new
    ``relay_token`` and ``attempts + 1``; ``published_at`` is *not* touched — the order is
    claim → publish → `mark_event_published`.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "published_at IS NULL" in str(claim_events(OutboxEvent))
        True
    """
    size = count(batch, "batch")
    lease_for = duration(lease, "lease")
    t = table_of(target)
    now = now_of(clock)
    relay = (
        select(t.c.id)
        .where(
            t.c.published_at.is_(None),
            (t.c.relay_until.is_(None)) | (t.c.relay_until <= now),
        )
        .order_by(t.c.seq)
        .limit(size)
        .with_for_update(skip_locked=True)
        .cte("relay")
    )
    return (
        update(t)
        .where(t.c.id == relay.c.id)
        .values(
            relay_until=now + interval(lease_for),
            relay_token=func.gen_random_uuid(),
            attempts=t.c.attempts + 1,
        )
        .returning(
            t.c.id,
            t.c.seq,
            t.c.event_type,
            t.c.aggregate_type,
            t.c.aggregate_id,
            t.c.payload,
            t.c.headers,
            t.c.attempts,
            t.c.relay_until,
            t.c.relay_token,
            t.c.created_at,
        )
    )


def mark_event_published(
    target: object, event_id: object, token: object, *, clock: Clock | None = None
) -> Update:
    """Set ``published_at`` after a successful publish, fenced by ``relay_token``.

    Example:
        >>> import uuid
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "relay_token = " in str(mark_event_published(OutboxEvent, uuid.uuid4(), uuid.uuid4()))
        True
    """
    t = table_of(target)
    now = now_of(clock)
    return (
        update(t)
        .where(
            t.c.id == as_uuid(event_id, "event id"),
            t.c.relay_token == as_uuid(token, "relay token"),
            t.c.published_at.is_(None),
        )
        .values(published_at=now, relay_until=None, relay_token=None)
        .returning(t.c.id)
    )


def mark_events_published(
    target: object, pairs: Iterable[tuple[object, object]], *, clock: Clock | None = None
) -> Update:
    """`mark_event_published` for many (id, relay_token) pairs; returns the pairs marked.

    Example:
        >>> import uuid
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "unnest" in str(mark_events_published(OutboxEvent, [(uuid.uuid4(), uuid.uuid4())]))
        True
    """
    ids, tokens = id_token_pairs(pairs, "published pairs")
    t = table_of(target)
    now = now_of(clock)
    done = unnest_pairs(ids, tokens, "done")
    return (
        update(t)
        .where(t.c.id == done.c.id, t.c.relay_token == done.c.token, t.c.published_at.is_(None))
        .values(published_at=now, relay_until=None, relay_token=None)
        .returning(t.c.id, done.c.token)
    )


def prune_events(
    target: object,
    *,
    older_than: dt.timedelta | float,
    batch: int = 1000,
    clock: Clock | None = None,
) -> Delete:
    """Delete one batch of events published more than ``older_than`` ago; never unpublished.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "published_at IS NOT NULL" in str(prune_events(OutboxEvent, older_than=86400))
        True
    """
    window = duration(older_than, "older_than", allow_zero=True)
    size = count(batch, "batch")
    t = table_of(target)
    now = now_of(clock)
    doomed = (
        select(t.c.id)
        .where(t.c.published_at.is_not(None), t.c.published_at < now - interval(window))
        .limit(size)
        .with_for_update(skip_locked=True)
    )
    return delete(t).where(t.c.id.in_(doomed.scalar_subquery()))
