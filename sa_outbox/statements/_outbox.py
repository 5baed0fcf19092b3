"""Statements on the outbox table (article, section 5): append, claim → publish → mark."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Delete,
    Integer,
    Select,
    Text,
    TextClause,
    Update,
    bindparam,
    case,
    cast,
    delete,
    func,
    null,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.sql.dml import ReturningInsert
from sqlalchemy.sql.elements import ColumnElement

from .._backoff import Backoff
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
#: The claim looks for aggregate heads among this many times ``batch`` oldest rows first.
_CLAIM_WINDOW_FACTOR = 2
#: How a rejected event backs off before its next attempt (capped at five minutes).
DEFAULT_RELAY_BACKOFF = Backoff(base=1.0, max=300.0, jitter=1.0)


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


def _seq(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"each claim candidate must be an int seq, got {value!r}")
    return value


def _has_no_earlier_unpublished(t: Any, row: Any) -> ColumnElement[bool]:
    """No unpublished event of ``row``'s aggregate comes before it: ``row`` is the head.

    The probe walks the aggregate index backwards from ``row``: an event that is not a head
    finds its unpublished predecessor at once, without stepping over the index entries
    that published events left behind until vacuum.
    """
    earlier = t.alias("earlier")
    probe = (
        select(earlier.c.seq)
        .where(
            earlier.c.aggregate_type == row.c.aggregate_type,
            earlier.c.aggregate_id == row.c.aggregate_id,
            earlier.c.published_at.is_(None),
            earlier.c.seq < row.c.seq,
        )
        .order_by(earlier.c.seq.desc())
        .limit(1)
    )
    return ~probe.exists()


def _free(t: Any, now: ColumnElement[dt.datetime]) -> ColumnElement[bool]:
    """Not held under an unexpired relay lease, nor backing off after a rejection."""
    free: ColumnElement[bool] = (t.c.relay_until.is_(None)) | (t.c.relay_until <= now)
    return free


def select_claim_candidates(
    target: object, *, batch: int = 100, clock: Clock | None = None
) -> Select[tuple[int]]:
    """The ``seq`` of claimable aggregate heads among the oldest unpublished rows: a hint.

    It walks the ready index in ``seq`` order over the ``2 * batch`` oldest unpublished,
    unparked rows, and keeps those that are free (no live lease, no backoff) and head their
    aggregate (the aggregate index says no earlier event of it is unpublished). Enough when
    heads are dense, the usual case; when it finds fewer than ``batch``,
    `select_aggregate_heads` looks past the window. `claim_events` checks every candidate
    again under its lock, so a stale candidate is harmless.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "LIMIT" in str(select_claim_candidates(OutboxEvent, batch=100))
        True
    """
    size = count(batch, "batch")
    t = table_of(target)
    now = now_of(clock)
    window = (
        select(t.c.aggregate_type, t.c.aggregate_id, t.c.seq, t.c.relay_until)
        .where(t.c.published_at.is_(None), t.c.parked_at.is_(None))
        .order_by(t.c.seq)
        .limit(bindparam("claim_window", size * _CLAIM_WINDOW_FACTOR, type_=Integer))
        .subquery("claim_window")
    )
    return (
        select(window.c.seq)
        .where(_free(window, now), _has_no_earlier_unpublished(t, window))
        .order_by(window.c.seq)
        .limit(size)
    )


def select_aggregate_heads(
    target: object, *, after_seq: int = 0, limit: int = 100, clock: Clock | None = None
) -> Select[tuple[int]]:
    """The ``seq`` of the claimable heads of all aggregates, past ``after_seq``, oldest first.

    A loose index scan: one probe of the aggregate index per aggregate with unpublished
    events, whatever their number, so a deep backlog in a few aggregates, or the events
    queued behind a parked one, neither make a claim read the whole backlog nor hide the
    other aggregates from it. A head is claimable when it is not parked and free.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "WITH RECURSIVE" in str(select_aggregate_heads(OutboxEvent))
        True
    """
    size = count(limit, "limit")
    if isinstance(after_seq, bool) or not isinstance(after_seq, int):
        raise InvalidArgumentType(f"after_seq must be an int, got {type(after_seq).__name__}")
    t = table_of(target)
    now = now_of(clock)
    first = t.alias("first_aggregate")
    aggregates = (
        select(first.c.aggregate_type, first.c.aggregate_id, first.c.seq)
        .where(first.c.published_at.is_(None))
        .order_by(first.c.aggregate_type, first.c.aggregate_id, first.c.seq)
        .limit(1)
        .cte("aggregate_heads", recursive=True)
    )
    after = t.alias("next_aggregate")
    step = (
        select(after.c.aggregate_type, after.c.aggregate_id, after.c.seq)
        .where(
            after.c.published_at.is_(None),
            tuple_(after.c.aggregate_type, after.c.aggregate_id)
            > tuple_(aggregates.c.aggregate_type, aggregates.c.aggregate_id),
        )
        .order_by(after.c.aggregate_type, after.c.aggregate_id, after.c.seq)
        .limit(1)
        .lateral("next_aggregate")
    )
    aggregates = aggregates.union_all(
        select(step.c.aggregate_type, step.c.aggregate_id, step.c.seq).select_from(
            aggregates.join(step, true())
        )
    )
    head = t.alias("aggregate_head")
    return (
        select(aggregates.c.seq)
        .join(head, head.c.seq == aggregates.c.seq)
        .where(
            head.c.parked_at.is_(None),
            _free(head, now),
            aggregates.c.seq > bindparam("after_seq", after_seq, type_=BigInteger),
        )
        .order_by(aggregates.c.seq)
        .limit(size)
    )


def claim_events(
    target: object,
    *,
    batch: int = 100,
    lease: dt.timedelta | float = DEFAULT_RELAY_LEASE,
    per_aggregate: int | None = None,
    candidates: Iterable[int] | None = None,
    clock: Clock | None = None,
) -> Update:
    """Claim up to ``batch`` unpublished events for one relay, keeping each aggregate's order.

    An aggregate (``aggregate_type``, ``aggregate_id``) is claimable when its *head*, its
    unpublished event of smallest ``seq``, is claimable: not parked, not held under an
    unexpired relay lease (nor backing off after a rejection), and not locked by another
    claim right now (``SKIP LOCKED``). The claim locks up to ``batch`` such heads, oldest
    first, and takes with each head the events that follow it in its aggregate (at most
    ``per_aggregate``, default ``batch``), then keeps the ``batch`` oldest of them all: so
    from each aggregate it takes a run of consecutive events that starts at the head. An
    aggregate whose head another relay holds is skipped whole, so two relays never hold
    events of one aggregate at once. Publish an aggregate's events in ``seq`` order.

    The heads are looked for among ``candidates`` (``seq`` values from
    `select_claim_candidates` and `select_aggregate_heads`, as `Outbox.claim` does), or,
    without them, among the oldest unpublished rows (`select_claim_candidates` inline).
    Either way the statement checks the head predicate itself, under the row lock.

    Each claimed row gets ``relay_until = now + lease``, a new ``relay_token`` and
    ``attempts + 1``; ``published_at`` is *not* touched — the order is claim → publish →
    `mark_event_published`.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> from sqlalchemy.dialects import postgresql
        >>> sql = str(claim_events(OutboxEvent).compile(dialect=postgresql.dialect()))
        >>> "earlier.seq < outbox.seq" in sql and "FOR UPDATE OF outbox SKIP LOCKED" in sql
        True
    """
    size = count(batch, "batch")
    per = size if per_aggregate is None else count(per_aggregate, "per_aggregate")
    lease_for = duration(lease, "lease")
    t = table_of(target)
    now = now_of(clock)
    if candidates is None:
        among: ColumnElement[bool] = t.c.seq.in_(
            select_claim_candidates(t, batch=size, clock=clock).scalar_subquery()
        )
    else:
        seqs = [_seq(value) for value in candidates]
        among = t.c.seq == func.any_(bindparam("candidates", seqs, type_=ARRAY(BigInteger)))
    heads = (
        select(t.c.id, t.c.aggregate_type, t.c.aggregate_id, t.c.seq)
        .where(
            among,
            t.c.published_at.is_(None),
            t.c.parked_at.is_(None),
            _free(t, now),
            _has_no_earlier_unpublished(t, t),
        )
        .order_by(t.c.seq)
        .limit(size)
        .with_for_update(skip_locked=True, of=t)
        .cte("heads")
    )
    run = t.alias("run")
    runs = (
        select(run.c.id, run.c.seq)
        .where(
            run.c.aggregate_type == heads.c.aggregate_type,
            run.c.aggregate_id == heads.c.aggregate_id,
            run.c.published_at.is_(None),
            run.c.seq >= heads.c.seq,
        )
        .order_by(run.c.seq)
        .limit(per)
        .lateral("runs")
    )
    picked = (
        select(runs.c.id)
        .select_from(heads.join(runs, true()))
        .order_by(runs.c.seq)
        .limit(size)
        .cte("picked")
    )
    return (
        update(t)
        .where(t.c.id == picked.c.id)
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


def reject_events(
    target: object,
    failures: Iterable[tuple[object, object, str]],
    *,
    max_attempts: int,
    backoff: Backoff = DEFAULT_RELAY_BACKOFF,
    clock: Clock | None = None,
) -> Update:
    """Record that the broker rejected claimed events: back off, or park at ``max_attempts``.

    For many (id, relay_token, error) triples in one ``UPDATE … FROM unnest(…)``, fenced by
    the token like a mark. Each row keeps ``error`` in ``last_error`` and drops its token.
    A row whose ``attempts`` reached ``max_attempts`` is *parked* (``parked_at = now``): no
    relay claims it again until `requeue_parked_events`, and, to keep the order, neither the
    later events of its aggregate. Any other row waits ``backoff.delay(attempts)``
    (``relay_until`` moves to then), and so do the later events of its aggregate; other
    aggregates are not held back. Returns ``id, token, parked_at, attempts, relay_until``.

    Example:
        >>> import uuid
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> stmt = reject_events(OutboxEvent, [(uuid.uuid4(), uuid.uuid4(), "nack")],
        ...                      max_attempts=10)
        >>> "parked_at=CASE" in str(stmt)
        True
    """
    ids: list[uuid.UUID] = []
    tokens: list[uuid.UUID] = []
    errors: list[str] = []
    for item in failures:
        if not isinstance(item, tuple) or len(item) != 3:
            raise InvalidArgumentType(
                f"each rejected event must be an (id, token, error) triple, got {item!r}"
            )
        ids.append(as_uuid(item[0], "rejected event id"))
        tokens.append(as_uuid(item[1], "rejected event token"))
        errors.append(text(item[2], "rejection error"))
    if not ids:
        raise InvalidArgument("reject_events needs at least one (id, token, error) triple")
    limit = count(max_attempts, "max_attempts", maximum=1_000_000)
    if not isinstance(backoff, Backoff):
        raise InvalidArgumentType(f"backoff must be a Backoff, got {backoff!r}")
    t = table_of(target)
    now = now_of(clock)
    failed = (
        func.unnest(
            uuid_array(ids), uuid_array(tokens), bindparam(None, errors, type_=ARRAY(Text()))
        )
        .table_valued("id", "token", "error")
        .render_derived(name="failed")
    )
    exhausted = t.c.attempts >= bindparam("max_attempts", limit, type_=Integer)
    return (
        update(t)
        .where(t.c.id == failed.c.id, t.c.relay_token == failed.c.token, t.c.published_at.is_(None))
        .values(
            relay_token=None,
            last_error=failed.c.error,
            relay_until=case((exhausted, null()), else_=now + backoff.sql_delay(t.c.attempts)),
            parked_at=case((exhausted, now), else_=null()),
        )
        .returning(t.c.id, failed.c.token, t.c.parked_at, t.c.attempts, t.c.relay_until)
    )


def release_events(
    target: object,
    pairs: Iterable[tuple[object, object]],
    *,
    error: str | None = None,
    attempted: bool = True,
    clock: Clock | None = None,
) -> Update:
    """Give claimed events back, claimable at once, without marking them.

    For many (id, relay_token) pairs in one statement, fenced by the token. Used when the
    broker could not be reached (``attempted=True``: the attempt stays counted, ``error``
    goes to ``last_error``) and for events a relay claimed but did not try, because an
    earlier event of their aggregate failed or the relay stopped (``attempted=False``: the
    claim's ``attempts + 1`` is taken back). Returns ``id, token`` of the pairs released.

    Example:
        >>> import uuid
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> stmt = release_events(OutboxEvent, [(uuid.uuid4(), uuid.uuid4())], attempted=False)
        >>> "attempts=greatest(outbox.attempts - " in str(stmt)
        True
    """
    ids, tokens = id_token_pairs(pairs, "released pairs")
    t = table_of(target)
    now_of(clock)  # checks the clock; releasing does not depend on the time
    held = unnest_pairs(ids, tokens, "held")
    values: dict[str, Any] = {"relay_token": None, "relay_until": None}
    if not attempted:
        values["attempts"] = func.greatest(t.c.attempts - 1, 0)
    if error is not None:
        values["last_error"] = bindparam("error", text(error, "error"), type_=Text)
    return (
        update(t)
        .where(t.c.id == held.c.id, t.c.relay_token == held.c.token, t.c.published_at.is_(None))
        .values(**values)
        .returning(t.c.id, held.c.token)
    )


def requeue_parked_events(
    target: object, *, ids: Iterable[object] | None = None, clock: Clock | None = None
) -> Update:
    """Un-park parked events (all, or those in ``ids``): attempts start again from zero.

    Run it once the cause is fixed; relays take the events again, in their aggregates'
    order. ``last_error`` is kept until the next attempt. Returns the ids requeued.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "parked_at IS NOT NULL" in str(requeue_parked_events(OutboxEvent))
        True
    """
    t = table_of(target)
    now_of(clock)
    stmt = (
        update(t)
        .where(t.c.parked_at.is_not(None), t.c.published_at.is_(None))
        .values(parked_at=None, attempts=0, relay_until=None, relay_token=None)
        .returning(t.c.id)
    )
    if ids is not None:
        chosen = [as_uuid(i, "parked event id") for i in ids]
        if not chosen:
            raise InvalidArgument("ids must name at least one event, or be None for all")
        stmt = stmt.where(t.c.id == func.any_(uuid_array(chosen)))
    return stmt


def select_parked_events(target: object) -> Select[Any]:
    """The parked events, oldest first: what the broker kept rejecting, and its last error.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "WHERE outbox.parked_at IS NOT NULL" in str(select_parked_events(OutboxEvent))
        True
    """
    t = table_of(target)
    return (
        select(
            t.c.id,
            t.c.seq,
            t.c.event_type,
            t.c.aggregate_type,
            t.c.aggregate_id,
            t.c.attempts,
            t.c.last_error,
            t.c.parked_at,
            t.c.created_at,
        )
        .where(t.c.parked_at.is_not(None), t.c.published_at.is_(None))
        .order_by(t.c.seq)
    )


_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]

# The channel as the outbox table's wake-up trigger computes it (sa_outbox._outbox_triggers),
# from the table the name resolves to: "schema.table", or "sa_outbox_" + md5 when too long.
_CHANNEL_OF_TABLE = """\
SELECT CASE WHEN octet_length(q.name) > 63 THEN 'sa_outbox_' || md5(q.name)
            ELSE q.name END AS channel
FROM (SELECT n.nspname || '.' || c.relname AS name
      FROM pg_catalog.pg_class AS c
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.oid = to_regclass(:outbox_table)) AS q"""


def _outbox_table_name(target: object) -> Any:
    return bindparam("outbox_table", _PREPARER.format_table(table_of(target)), type_=Text)


def outbox_notify_channel_of(target: object) -> TextClause:
    """The channel the outbox table's wake-up trigger sends on, as one row; none if no table.

    The database resolves the table (one declared without a schema is looked up on the
    ``search_path``), so the name is the one the trigger uses: ``"{schema}.{table}"``.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> outbox_notify_channel_of(OutboxEvent).compile().params
        {'outbox_table': 'outbox'}
    """
    return sql_text(_CHANNEL_OF_TABLE).bindparams(_outbox_table_name(target))


def notify_relays(target: object) -> TextClause:
    """``pg_notify`` on the outbox table's channel, as its trigger does for inserts.

    For events that became claimable by an update (requeued): relays listening on the
    channel wake up at commit.

    Example:
        >>> from sa_outbox.schema import OutboxMixin
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> "pg_notify(q.channel, '')" in str(notify_relays(OutboxEvent))
        True
    """
    return sql_text(f"SELECT pg_notify(q.channel, '') FROM ({_CHANNEL_OF_TABLE}) AS q").bindparams(
        _outbox_table_name(target)
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
