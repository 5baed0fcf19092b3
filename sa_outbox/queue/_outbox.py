"""`Outbox` and `AsyncOutbox`: append events, and the relay's claim → publish → mark."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table

from .. import statements as st
from .._backoff import Backoff
from .._clock import Clock
from ..ops import OutboxOps, SyncConn, arun, run
from ..ops._results import BatchResult, ClaimedEvent, ParkedEvent, RejectedEvent
from ..statements._common import Dumps

if TYPE_CHECKING:
    from ..ops import AsyncConn

Pairs = Sequence[tuple[uuid.UUID, uuid.UUID]]


def _event_options(
    event_type: str,
    aggregate_type: str,
    aggregate_id: object,
    payload: Any,
    headers: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "event_type": event_type,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "payload": payload,
        "headers": headers,
    }


class _Base:
    def __init__(
        self,
        model: object,
        *,
        clock: Clock | None = None,
        dumps: Dumps | None = None,
        max_payload_bytes: int = st.DEFAULT_MAX_PAYLOAD_BYTES,
        backoff: Backoff | None = None,
    ) -> None:
        self._ops = OutboxOps(
            model, clock=clock, dumps=dumps, max_payload_bytes=max_payload_bytes, backoff=backoff
        )

    @property
    def table(self) -> Table:
        """The outbox table."""
        return self._ops.table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.fullname!r})"


class Outbox(_Base):
    """The outbox on a sync `Connection` or `Session`; the caller owns the transaction.

    Examples:
        outbox = Outbox(OutboxEvent)
        with Session(engine) as session, session.begin():
            session.add(order)
            outbox.append(session, event_type="OrderPlaced", aggregate_type="order",
                          aggregate_id=order.id, payload={"total_cents": 1200})
        with engine.begin() as conn:
            events = outbox.claim(conn, batch=100)
        # publish each event, then:
        with engine.begin() as conn:
            outbox.mark_published_many(conn, [(e.id, e.relay_token) for e in events])
    """

    def append(
        self,
        conn: SyncConn,
        *,
        event_type: str,
        aggregate_type: str,
        aggregate_id: object,
        payload: Any,
        headers: Mapping[str, Any] | None = None,
    ) -> uuid.UUID:
        """Insert one event in the caller's transaction; returns its id (the message id).

        With OpenTelemetry installed, the current trace context (``traceparent``,
        ``tracestate``) joins ``headers``, under the ones given; the relay continues it.

        Examples:
            outbox.append(
                conn, event_type="OrderPlaced", aggregate_type="order", aggregate_id=42,
                payload={},
            )
        """
        options = _event_options(event_type, aggregate_type, aggregate_id, payload, headers)
        return run(conn, self._ops.append(options))

    def claim(
        self,
        conn: SyncConn,
        *,
        batch: int = 100,
        lease: dt.timedelta | float = st.DEFAULT_RELAY_LEASE,
        per_aggregate: int | None = None,
    ) -> list[ClaimedEvent]:
        """Claim up to ``batch`` unpublished events, in ``seq`` order, aggregate by aggregate.

        From each aggregate it takes a run of consecutive events starting at the oldest
        unpublished one, and skips aggregates another relay holds (see
        `sa_outbox.statements.claim_events`): publish each aggregate's events in order.

        Examples:
            events = outbox.claim(conn, batch=100)
        """
        return run(conn, self._ops.claim(batch, lease, per_aggregate))

    def mark_published(self, conn: SyncConn, event_id: uuid.UUID, token: uuid.UUID) -> None:
        """Mark one event published after the broker took it, or raise `LeaseLost`.

        Examples:
            outbox.mark_published(conn, event.id, event.relay_token)
        """
        run(conn, self._ops.mark_published(event_id, token))

    def mark_published_many(self, conn: SyncConn, pairs: Pairs) -> BatchResult:
        """Mark many events published in one statement.

        Examples:
            pairs = [(e.id, e.relay_token) for e in events]
            outbox.mark_published_many(conn, pairs)
        """
        return run(conn, self._ops.mark_published_many(pairs))

    def prune(self, conn: SyncConn, *, older_than: dt.timedelta | float, batch: int = 1000) -> int:
        """Delete one batch of events published more than ``older_than`` ago.

        Examples:
            outbox.prune(conn, older_than=dt.timedelta(days=7))
            # -> 0
        """
        return run(conn, self._ops.prune(older_than, batch))

    def reject_many(
        self,
        conn: SyncConn,
        failures: Sequence[tuple[uuid.UUID, uuid.UUID, str]],
        *,
        max_attempts: int,
    ) -> list[RejectedEvent]:
        """Record broker rejections: each event backs off, or is parked at ``max_attempts``.

        Fenced by the relay token: a triple whose token no longer holds is left out of the
        result. The backoff is the outbox's (``Outbox(..., backoff=Backoff(...))``).

        Examples:
            rejected = outbox.reject_many(
                conn, [(event.id, event.relay_token, "message too large")], max_attempts=10
            )
        """
        return run(conn, self._ops.reject_many(failures, max_attempts))

    def release_many(
        self, conn: SyncConn, pairs: Pairs, *, error: str | None = None, attempted: bool = False
    ) -> BatchResult:
        """Give claimed events back unmarked, claimable at once (broker down, relay stopping).

        The claim's attempt is taken back (``attempted=True`` keeps it counted): only
        rejections (`reject_many`) count against ``max_attempts``.

        Examples:
            outbox.release_many(conn, [(e.id, e.relay_token) for e in events],
                                error="connection refused")
        """
        return run(conn, self._ops.release_many(pairs, error, attempted))

    def requeue_parked(
        self, conn: SyncConn, *, ids: Sequence[object] | None = None
    ) -> list[uuid.UUID]:
        """Un-park parked events (all, or ``ids``) once the cause is fixed; wakes the relays.

        Examples:
            outbox.requeue_parked(conn, ids=[parked.id])
        """
        return run(conn, self._ops.requeue_parked(ids))

    def parked(self, conn: SyncConn) -> list[ParkedEvent]:
        """The parked events, oldest first, each with its ``last_error``.

        Examples:
            for event in outbox.parked(conn):
                print(event.event_type, event.aggregate_id, event.last_error)
        """
        return run(conn, self._ops.parked())


class AsyncOutbox(_Base):
    """`Outbox` for asyncio, on an `AsyncConnection`/`AsyncSession`.

    Examples:
        outbox = AsyncOutbox(OutboxEvent)
        async with async_engine.begin() as conn:
            events = await outbox.claim(conn)
    """

    async def append(
        self,
        conn: AsyncConn,
        *,
        event_type: str,
        aggregate_type: str,
        aggregate_id: object,
        payload: Any,
        headers: Mapping[str, Any] | None = None,
    ) -> uuid.UUID:
        """See `Outbox.append`."""
        options = _event_options(event_type, aggregate_type, aggregate_id, payload, headers)
        return await arun(conn, self._ops.append(options))

    async def claim(
        self,
        conn: AsyncConn,
        *,
        batch: int = 100,
        lease: dt.timedelta | float = st.DEFAULT_RELAY_LEASE,
        per_aggregate: int | None = None,
    ) -> list[ClaimedEvent]:
        """See `Outbox.claim`."""
        return await arun(conn, self._ops.claim(batch, lease, per_aggregate))

    async def mark_published(self, conn: AsyncConn, event_id: uuid.UUID, token: uuid.UUID) -> None:
        """See `Outbox.mark_published`."""
        await arun(conn, self._ops.mark_published(event_id, token))

    async def mark_published_many(self, conn: AsyncConn, pairs: Pairs) -> BatchResult:
        """See `Outbox.mark_published_many`."""
        return await arun(conn, self._ops.mark_published_many(pairs))

    async def prune(
        self, conn: AsyncConn, *, older_than: dt.timedelta | float, batch: int = 1000
    ) -> int:
        """See `Outbox.prune`."""
        return await arun(conn, self._ops.prune(older_than, batch))

    async def reject_many(
        self,
        conn: AsyncConn,
        failures: Sequence[tuple[uuid.UUID, uuid.UUID, str]],
        *,
        max_attempts: int,
    ) -> list[RejectedEvent]:
        """See `Outbox.reject_many`."""
        return await arun(conn, self._ops.reject_many(failures, max_attempts))

    async def release_many(
        self, conn: AsyncConn, pairs: Pairs, *, error: str | None = None, attempted: bool = False
    ) -> BatchResult:
        """See `Outbox.release_many`."""
        return await arun(conn, self._ops.release_many(pairs, error, attempted))

    async def requeue_parked(
        self, conn: AsyncConn, *, ids: Sequence[object] | None = None
    ) -> list[uuid.UUID]:
        """See `Outbox.requeue_parked`."""
        return await arun(conn, self._ops.requeue_parked(ids))

    async def parked(self, conn: AsyncConn) -> list[ParkedEvent]:
        """See `Outbox.parked`."""
        return await arun(conn, self._ops.parked())
