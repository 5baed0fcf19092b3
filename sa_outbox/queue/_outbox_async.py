"""`AsyncOutbox`: append events in the caller's transaction, and the relay's claim → publish →
mark, on asyncio. `Outbox` (``_outbox_sync.py``) is generated from this file.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import statements as st
from ..ops import arun
from ..ops._results import BatchResult, ClaimedEvent, ParkedEvent, RejectedEvent
from ._outbox import OutboxBase, Pairs, event_options

if TYPE_CHECKING:
    from ..ops import AsyncConn

__all__ = ["AsyncOutbox"]


class AsyncOutbox(OutboxBase):
    """The outbox on the caller's `AsyncConnection` or `AsyncSession`, in its transaction.

    Examples:
        outbox = AsyncOutbox(OutboxEvent)
        async with AsyncSession(async_engine) as session, session.begin():
            session.add(order)
            await outbox.append(
                session, event_type="OrderPlaced", aggregate_type="order",
                aggregate_id=order.id, payload={"total_cents": 1200},
            )
        async with async_engine.begin() as conn:
            events = await outbox.claim(conn, batch=100)
        # publish each event, then:
        async with async_engine.begin() as conn:
            await outbox.mark_published_many(conn, [(e.id, e.relay_token) for e in events])
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
        """Insert one event in the caller's transaction; returns its id (the message id).

        With OpenTelemetry installed, the current trace context (``traceparent``,
        ``tracestate``) joins ``headers``, under the ones given; the relay continues it.

        Examples:
            await outbox.append(
                conn, event_type="OrderPlaced", aggregate_type="order", aggregate_id=42,
                payload={},
            )
        """
        options = event_options(event_type, aggregate_type, aggregate_id, payload, headers)
        return await arun(conn, self._ops.append(options))

    async def claim(
        self,
        conn: AsyncConn,
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
            events = await outbox.claim(conn, batch=100)
        """
        return await arun(conn, self._ops.claim(batch, lease, per_aggregate))

    async def mark_published(self, conn: AsyncConn, event_id: uuid.UUID, token: uuid.UUID) -> None:
        """Mark one event published after the broker took it, or raise `LeaseLost`.

        Examples:
            await outbox.mark_published(conn, event.id, event.relay_token)
        """
        await arun(conn, self._ops.mark_published(event_id, token))

    async def mark_published_many(self, conn: AsyncConn, pairs: Pairs) -> BatchResult:
        """Mark many events published in one statement.

        Examples:
            pairs = [(e.id, e.relay_token) for e in events]
            await outbox.mark_published_many(conn, pairs)
        """
        return await arun(conn, self._ops.mark_published_many(pairs))

    async def prune(
        self, conn: AsyncConn, *, older_than: dt.timedelta | float, batch: int = 1000
    ) -> int:
        """Delete one batch of events published more than ``older_than`` ago.

        Examples:
            await outbox.prune(conn, older_than=dt.timedelta(days=7))
            # -> 0
        """
        return await arun(conn, self._ops.prune(older_than, batch))

    async def reject_many(
        self,
        conn: AsyncConn,
        failures: Sequence[tuple[uuid.UUID, uuid.UUID, str]],
        *,
        max_attempts: int,
    ) -> list[RejectedEvent]:
        """Record broker rejections: each event backs off, or is parked at ``max_attempts``.

        Fenced by the relay token: a triple whose token no longer holds is left out of the
        result. The backoff is the outbox's (``AsyncOutbox(..., backoff=Backoff(...))``).

        Examples:
            rejected = await outbox.reject_many(
                conn, [(event.id, event.relay_token, "message too large")], max_attempts=10
            )
        """
        return await arun(conn, self._ops.reject_many(failures, max_attempts))

    async def release_many(
        self, conn: AsyncConn, pairs: Pairs, *, error: str | None = None, attempted: bool = False
    ) -> BatchResult:
        """Give claimed events back unmarked, claimable at once (broker down, relay stopping).

        The claim's attempt is taken back (``attempted=True`` keeps it counted): only
        rejections (`reject_many`) count against ``max_attempts``.

        Examples:
            await outbox.release_many(
                conn, [(e.id, e.relay_token) for e in events], error="connection refused"
            )
        """
        return await arun(conn, self._ops.release_many(pairs, error, attempted))

    async def requeue_parked(
        self, conn: AsyncConn, *, ids: Sequence[object] | None = None
    ) -> list[uuid.UUID]:
        """Un-park parked events (all, or ``ids``) once the cause is fixed; wakes the relays.

        Examples:
            await outbox.requeue_parked(conn, ids=[parked.id])
        """
        return await arun(conn, self._ops.requeue_parked(ids))

    async def parked(self, conn: AsyncConn) -> list[ParkedEvent]:
        """The parked events, oldest first, each with its ``last_error``.

        Examples:
            for event in await outbox.parked(conn):
                print(event.event_type, event.aggregate_id, event.last_error)
        """
        return await arun(conn, self._ops.parked())
