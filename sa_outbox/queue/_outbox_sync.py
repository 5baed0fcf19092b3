# generated from _outbox_async.py by tools/async_to_sync.py — do not edit
# (edit _outbox_async.py and run `python tools/async_to_sync.py`)
"""`Outbox`: append events in the caller's transaction, and the relay's claim → publish →
mark, generated from `AsyncOutbox` (``_outbox_async.py``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import statements as st
from ..ops import run
from ..ops._results import BatchResult, ClaimedEvent, ParkedEvent, RejectedEvent
from ._outbox import OutboxBase, Pairs, event_options

if TYPE_CHECKING:
    from ..ops import SyncConn

__all__ = ["Outbox"]


class Outbox(OutboxBase):
    """The outbox on the caller's `Connection` or `Session`, in its transaction.

    Examples:
        outbox = Outbox(OutboxEvent)
        with Session(engine) as session, session.begin():
            session.add(order)
            outbox.append(
                session, event_type="OrderPlaced", aggregate_type="order",
                aggregate_id=order.id, payload={"total_cents": 1200},
            )
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
        options = event_options(event_type, aggregate_type, aggregate_id, payload, headers)
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
            outbox.release_many(
                conn, [(e.id, e.relay_token) for e in events], error="connection refused"
            )
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
