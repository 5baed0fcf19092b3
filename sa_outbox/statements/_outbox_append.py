"""Statements that append outbox events (article, section 5): `NewEvent`, `append_event(s)`."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    ARRAY,
    Text,
    bindparam,
    cast,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.dml import ReturningInsert

from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._ids import uuid7
from .._json import compact_json
from .._validation import MAX_AGGREGATE_ID_LENGTH, key, name
from ._common import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Dumps,
    as_uuid,
    jsonb,
    now_of,
    serialise,
    table_of,
    uuid_array,
)


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

    Examples:
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

    Examples:
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

    Examples:
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


def check_event(
    event: NewEvent,
    *,
    dumps: Dumps = compact_json,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> None:
    """Raise what `append_events` would raise for ``event``, without building a statement.

    For a check that must come before anything else happens (the session hooks check every
    domain event of a flush before the flush writes any row).

    Examples:
        >>> check_event(NewEvent("OrderPlaced", "order", 42, {"total_cents": 1200}))
        >>> check_event(NewEvent("OrderPlaced", " ", 42, {}))
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: aggregate_type must not be blank (only \
whitespace), got ' '
    """
    _checked_event(event, dumps, max_payload_bytes)


def _checked_event(
    event: NewEvent, dumps: Dumps, limit: int
) -> tuple[uuid.UUID, str, str, str, str, str]:
    kind = name(event.event_type, "event_type")
    what = f"event type {kind!r}"
    headers = event.headers
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidArgumentType(f"headers of {what} must be a mapping, got {headers!r}")
    aggregate_id = event.aggregate_id
    if aggregate_id is None or isinstance(aggregate_id, bool):
        raise InvalidArgumentType(f"aggregate_id of {what} must be a str, int or UUID")
    return (
        uuid7() if event.id is None else as_uuid(event.id, f"id of {what}"),
        name(event.aggregate_type, "aggregate_type"),
        key(str(aggregate_id), "aggregate_id", MAX_AGGREGATE_ID_LENGTH),
        kind,
        serialise(event.payload, what, dumps, limit),
        serialise(dict(headers or {}), f"headers of {what}", dumps, limit),
    )
