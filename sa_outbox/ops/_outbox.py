"""`OutboxOps`: the outbox's operations (append, the relay's claim → publish → mark)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .. import statements as st
from .._backoff import Backoff
from .._clock import Clock
from .._exceptions import LeaseLost
from .._tracing import current_trace_headers
from ..schema import resolve_table
from ..statements._common import Dumps
from ._drive import Op
from ._jobs import _batch, _payload_options
from ._results import BatchResult, ClaimedEvent, ParkedEvent, RejectedEvent

__all__ = ["OutboxOps"]

Pairs = Sequence[tuple[uuid.UUID, uuid.UUID]]


class OutboxOps:
    """The outbox's operations, each written once as a generator over statements.

    What `sa_outbox.queue.Outbox` and the relay run: each method returns an operation
    (`run` or `arun` drives it on a connection). ``backoff``: the rejections' backoff.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import OutboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Event(OutboxMixin, Base): __tablename__ = "outbox"
        >>> ops = OutboxOps(Event)
        >>> op = ops.prune(older_than=86400, batch=1000)
        >>> next(op).is_delete
        True
    """

    def __init__(
        self,
        model: object,
        *,
        clock: Clock | None = None,
        dumps: Dumps | None = None,
        max_payload_bytes: int = st.DEFAULT_MAX_PAYLOAD_BYTES,
        backoff: Backoff | None = None,
    ) -> None:
        self.table = resolve_table(model)
        self.clock = clock
        self.backoff = backoff or st.DEFAULT_RELAY_BACKOFF
        self.dumps, self.max_payload_bytes = _payload_options(dumps, max_payload_bytes)

    def append(self, options: dict[str, Any]) -> Op[uuid.UUID]:
        trace = current_trace_headers()
        headers = options["headers"]
        if trace is not None and (headers is None or isinstance(headers, Mapping)):
            # The current trace context joins the event's headers, under its own.
            options = {**options, "headers": {**trace, **(headers or {})}}
        stmt = st.append_event(
            self.table,
            clock=self.clock,
            dumps=self.dumps,
            max_payload_bytes=self.max_payload_bytes,
            **options,
        )
        return (yield stmt).one()[0]  # type: ignore[no-any-return]

    def claim(
        self, batch: int, lease: dt.timedelta | float, per_aggregate: int | None = None
    ) -> Op[list[ClaimedEvent]]:
        # Candidates first (cheap, lock-free reads), then the claim, which checks each again.
        window = st.select_claim_candidates(self.table, batch=batch, clock=self.clock)
        candidates = list((yield window).scalars())
        if len(candidates) < batch:  # heads are sparse near the front: look past the window
            beyond = st.select_aggregate_heads(
                self.table,
                after_seq=max(candidates, default=0),
                limit=batch - len(candidates),
                clock=self.clock,
            )
            candidates += (yield beyond).scalars()
        if not candidates:
            return []
        stmt = st.claim_events(
            self.table,
            batch=batch,
            lease=lease,
            per_aggregate=per_aggregate,
            candidates=candidates,
            clock=self.clock,
        )
        events = [ClaimedEvent(**row._asdict()) for row in (yield stmt)]
        events.sort(key=lambda e: e.seq)
        return events

    def reject_many(
        self, failures: Sequence[tuple[uuid.UUID, uuid.UUID, str]], max_attempts: int
    ) -> Op[list[RejectedEvent]]:
        stmt = st.reject_events(
            self.table, failures, max_attempts=max_attempts, backoff=self.backoff, clock=self.clock
        )
        return [
            RejectedEvent(row[0], parked=row[2] is not None, attempts=row[3], relay_until=row[4])
            for row in (yield stmt)
        ]

    def release_many(self, pairs: Pairs, error: str | None, attempted: bool) -> Op[BatchResult]:
        stmt = st.release_events(
            self.table, pairs, error=error, attempted=attempted, clock=self.clock
        )
        return _batch(pairs, (yield stmt))

    def requeue_parked(self, ids: Sequence[object] | None) -> Op[list[uuid.UUID]]:
        requeued = [row[0] for row in (yield st.requeue_parked_events(self.table, ids=ids))]
        if requeued:  # claimable again: wake the relays that listen
            yield st.notify_relays(self.table)
        return requeued

    def parked(self) -> Op[list[ParkedEvent]]:
        return [ParkedEvent(**row._asdict()) for row in (yield st.select_parked_events(self.table))]

    def notify_channel(self) -> Op[str | None]:
        return (yield st.outbox_notify_channel_of(self.table)).scalar()  # type: ignore[no-any-return]

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
