"""`Outbox` and `AsyncOutbox`: append events, and the relay's claim → publish → mark."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table

from . import statements as st
from ._clock import Clock
from ._exceptions import LeaseLost
from ._executors import Op, SyncConn, _adrive, _batch, _drive, _payload_options
from ._results import BatchResult, ClaimedEvent
from .schema import resolve_table
from .statements._common import Dumps

if TYPE_CHECKING:
    from ._executors import AsyncConn

Pairs = Sequence[tuple[uuid.UUID, uuid.UUID]]


class _OutboxOps:
    """The outbox operations, each written once as a generator over statements."""

    def __init__(
        self, model: object, *, clock: Clock | None, dumps: Dumps | None, max_payload_bytes: int
    ) -> None:
        self.table = resolve_table(model)
        self.clock = clock
        self.dumps, self.max_payload_bytes = _payload_options(dumps, max_payload_bytes)

    def append(self, options: dict[str, Any]) -> Op[uuid.UUID]:
        stmt = st.append_event(
            self.table,
            clock=self.clock,
            dumps=self.dumps,
            max_payload_bytes=self.max_payload_bytes,
            **options,
        )
        return (yield stmt).one()[0]  # type: ignore[no-any-return]

    def claim(self, batch: int, lease: dt.timedelta | float) -> Op[list[ClaimedEvent]]:
        stmt = st.claim_events(self.table, batch=batch, lease=lease, clock=self.clock)
        events = [ClaimedEvent(**row._asdict()) for row in (yield stmt)]
        events.sort(key=lambda e: e.seq)
        return events

    def mark_published(self, event_id: uuid.UUID, token: uuid.UUID) -> Op[None]:
        stmt = st.mark_event_published(self.table, event_id, token, clock=self.clock)
        if (yield stmt).first() is None:
            raise LeaseLost("outbox event", event_id, token, action="mark published")

    def mark_published_many(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> Op[BatchResult]:
        stmt = st.mark_events_published(self.table, pairs, clock=self.clock)
        return _batch(pairs, (yield stmt))

    def prune(self, older_than: dt.timedelta | float, batch: int) -> Op[int]:
        stmt = st.prune_events(self.table, older_than=older_than, batch=batch, clock=self.clock)
        return (yield stmt).rowcount  # type: ignore[no-any-return]


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
    ) -> None:
        self._ops = _OutboxOps(model, clock=clock, dumps=dumps, max_payload_bytes=max_payload_bytes)

    @property
    def table(self) -> Table:
        """The outbox table."""
        return self._ops.table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.fullname!r})"


class Outbox(_Base):
    """The outbox on a sync `Connection` or `Session`; the caller owns the transaction.

    Example:
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

        Example:
            outbox.append(
                conn, event_type="OrderPlaced", aggregate_type="order", aggregate_id=42,
                payload={},
            )
        """
        options = _event_options(event_type, aggregate_type, aggregate_id, payload, headers)
        return _drive(conn, self._ops.append(options))

    def claim(
        self,
        conn: SyncConn,
        *,
        batch: int = 100,
        lease: dt.timedelta | float = st.DEFAULT_RELAY_LEASE,
    ) -> list[ClaimedEvent]:
        """Claim up to ``batch`` unpublished events, in ``seq`` order.

        Example:
            events = outbox.claim(conn, batch=100)
        """
        return _drive(conn, self._ops.claim(batch, lease))

    def mark_published(self, conn: SyncConn, event_id: uuid.UUID, token: uuid.UUID) -> None:
        """Mark one event published after the broker took it, or raise `LeaseLost`.

        Example:
            outbox.mark_published(conn, event.id, event.relay_token)
        """
        _drive(conn, self._ops.mark_published(event_id, token))

    def mark_published_many(self, conn: SyncConn, pairs: Pairs) -> BatchResult:
        """Mark many events published in one statement.

        Example:
            pairs = [(e.id, e.relay_token) for e in events]
            outbox.mark_published_many(conn, pairs)
        """
        return _drive(conn, self._ops.mark_published_many(pairs))

    def prune(self, conn: SyncConn, *, older_than: dt.timedelta | float, batch: int = 1000) -> int:
        """Delete one batch of events published more than ``older_than`` ago.

        Example:
            outbox.prune(conn, older_than=dt.timedelta(days=7))
            # -> 0
        """
        return _drive(conn, self._ops.prune(older_than, batch))


class AsyncOutbox(_Base):
    """`Outbox` for asyncio, on an `AsyncConnection`/`AsyncSession`.

    Example:
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
        return await _adrive(conn, self._ops.append(options))

    async def claim(
        self,
        conn: AsyncConn,
        *,
        batch: int = 100,
        lease: dt.timedelta | float = st.DEFAULT_RELAY_LEASE,
    ) -> list[ClaimedEvent]:
        """See `Outbox.claim`."""
        return await _adrive(conn, self._ops.claim(batch, lease))

    async def mark_published(self, conn: AsyncConn, event_id: uuid.UUID, token: uuid.UUID) -> None:
        """See `Outbox.mark_published`."""
        await _adrive(conn, self._ops.mark_published(event_id, token))

    async def mark_published_many(self, conn: AsyncConn, pairs: Pairs) -> BatchResult:
        """See `Outbox.mark_published_many`."""
        return await _adrive(conn, self._ops.mark_published_many(pairs))

    async def prune(
        self, conn: AsyncConn, *, older_than: dt.timedelta | float, batch: int = 1000
    ) -> int:
        """See `Outbox.prune`."""
        return await _adrive(conn, self._ops.prune(older_than, batch))
