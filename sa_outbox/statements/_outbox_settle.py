"""After publishing: mark, reject, release, requeue parked, prune, notify relays."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    ARRAY,
    Delete,
    Integer,
    Select,
    Text,
    TextClause,
    Update,
    bindparam,
    case,
    delete,
    func,
    null,
    select,
    update,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql

from .._backoff import Backoff
from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import count, duration, text
from ._common import as_uuid, id_token_pairs, interval, now_of, table_of, unnest_pairs, uuid_array
from ._outbox_claim import DEFAULT_RELAY_BACKOFF


def mark_event_published(
    target: object, event_id: object, token: object, *, clock: Clock | None = None
) -> Update:
    """Set ``published_at`` after a successful publish, fenced by ``relay_token``.

    Examples:
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

    Examples:
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

    Examples:
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
    attempted: bool = False,
    clock: Clock | None = None,
) -> Update:
    """Give claimed events back, claimable at once, without marking them.

    For many (id, relay_token) pairs in one statement, fenced by the token. Used when the
    broker could not be reached (``error`` goes to ``last_error``) and for events a relay
    claimed but did not try, because an earlier event of their aggregate failed or the
    relay stopped. Either way the claim's ``attempts + 1`` is taken back: only a rejection
    (`reject_events`) counts against ``max_attempts``, so an outage, however long, parks
    nothing and leaves every event its full ``max_attempts``. ``attempted=True`` keeps the
    attempt counted instead. Returns ``id, token`` of the pairs released.

    Examples:
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

    Examples:
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

    Examples:
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


# The channel as the outbox table's wake-up trigger computes it (sa_outbox.schema._outbox_triggers),
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

    Examples:
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

    Examples:
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

    Examples:
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
