"""The relay's claim: each aggregate's head run of unpublished events, in order."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    Select,
    Update,
    bindparam,
    func,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from .._backoff import Backoff
from .._clock import Clock
from .._exceptions import InvalidArgumentType
from .._validation import count, duration
from ._common import interval, now_of, table_of

DEFAULT_RELAY_LEASE = dt.timedelta(seconds=30)


#: The claim looks for aggregate heads among this many times ``batch`` oldest rows first.
_CLAIM_WINDOW_FACTOR = 2


#: How a rejected event backs off before its next attempt (capped at five minutes).
DEFAULT_RELAY_BACKOFF = Backoff(base=1.0, max=300.0, jitter=1.0)


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

    Examples:
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

    Examples:
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

    Examples:
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
