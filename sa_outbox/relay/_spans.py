"""Publish spans: each event that carries a trace context is published in a span of its own.

The span is a child of the context the event was added in (its ``traceparent`` header),
of kind PRODUCER, named ``publish <event type>``; the event the publisher is handed carries
that span's ``traceparent`` / ``tracestate`` instead of the stored ones, so whoever consumes
the message continues the trace from the publish (docs/tracing.md). An event without a trace
context is published as it is, in no span. Without OpenTelemetry installed, nothing here
does more than test a constant.

Examples:
    >>> traced_wave([])
    ([], None)
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from .._tracing import AVAILABLE, TRACEPARENT, TraceSpan, start_span, without_trace_fields
from ..queue import ClaimedEvent
from ._publisher import EventsRejected

__all__ = ["end_publish_spans", "event_attributes", "traced_wave"]


def event_attributes(event: ClaimedEvent) -> dict[str, str | int | bool]:
    """The span attributes of publishing ``event``.

    Examples:
        >>> from sa_outbox.queue import ClaimedEvent
        >>> event = ClaimedEvent(uuid.UUID(int=1), 7, "OrderPlaced", "order", "42", {}, {}, 1,
        ...                      None, uuid.UUID(int=2), None)
        >>> event_attributes(event)["sa_outbox.event.seq"]
        7
    """
    return {
        "messaging.system": "sa-outbox",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.id": str(event.id),
        "sa_outbox.event.type": event.event_type,
        "sa_outbox.aggregate.type": event.aggregate_type,
        "sa_outbox.aggregate.id": event.aggregate_id,
        "sa_outbox.event.seq": event.seq,
        "sa_outbox.event.attempt": event.attempts,
    }


def traced_wave(
    wave: Sequence[ClaimedEvent],
) -> tuple[list[ClaimedEvent], dict[uuid.UUID, TraceSpan] | None]:
    """The events to hand the publisher, and the spans started for them by id (``None``:
    none, then the events are ``wave`` itself)."""
    if not AVAILABLE:
        return list(wave), None
    spans: dict[uuid.UUID, TraceSpan] = {}
    sent: list[ClaimedEvent] = []
    for event in wave:
        headers = event.headers
        span = None
        if headers and TRACEPARENT in headers:
            name = f"publish {event.event_type}"
            span = start_span(headers, name, kind="producer", attributes=event_attributes(event))
        if span is None:
            sent.append(event)
            continue
        spans[event.id] = span
        fields = span.trace_headers()
        if fields is not None:  # the message continues the trace from this span
            event = dataclasses.replace(event, headers={**without_trace_fields(headers), **fields})
        sent.append(event)
    return sent, spans or None


def end_publish_spans(spans: dict[uuid.UUID, TraceSpan], error: BaseException | None) -> None:
    """Record how the publish of the spans' events ended, then end the spans.

    No error: every event went out. `EventsRejected`: the rejected ones fail with the
    broker's reason. Any other error fails them all (the relay may then try the events one
    by one, each in a new span).
    """
    for event_id, span in spans.items():
        try:
            if isinstance(error, EventsRejected):
                reason = error.rejected.get(event_id)
                if reason is not None:
                    span.fail(reason or "rejected")
            elif error is not None:
                span.fail(error)
        finally:
            span.end()
