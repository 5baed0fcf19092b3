"""OpenTelemetry, when it is installed (the ``otel`` extra): the trace context a row carries.

The only module of the package that imports ``opentelemetry`` (its API, never the SDK: the
application configures that). Without it installed everything here is inert:
`current_trace_headers` returns ``None`` and `start_span` starts nothing, at the cost of one
test of a module-level constant.

A job or an event stores the trace context current when it was enqueued (or added) as the
two W3C Trace Context fields, ``{"traceparent": …, "tracestate": …}``, in its ``headers``
column; the worker and the relay continue that trace with `start_span`, and the relay puts
its own span's fields in the message it publishes (`TraceSpan.trace_headers`), so a consumer
continues the trace in turn. The fields are W3C's whatever propagator the application set
globally: they are stored in a row, read back by another process, and go to brokers whose
consumers speak W3C.

Examples:
    >>> current_trace_headers() is None  # no span is active here
    True
    >>> trace_id_of({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    '0af7651916cd43dd8448eb211c80319c'
    >>> start_span(None, "process send-email", kind="consumer") is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: every function here is a no-op
    _trace = None  # type: ignore[assignment]
    _PROPAGATOR: Any = None
else:
    _PROPAGATOR = TraceContextTextMapPropagator()

__all__ = [
    "AVAILABLE",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_FIELDS",
    "TraceSpan",
    "current_trace_headers",
    "start_span",
    "trace_id_of",
    "without_trace_fields",
]

#: Whether ``opentelemetry-api`` could be imported (the ``otel`` extra).
AVAILABLE = _trace is not None
#: The W3C Trace Context fields, as they are stored in ``headers`` and sent to brokers.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_FIELDS = (TRACEPARENT, TRACESTATE)
#: The instrumentation scope of every span sa-outbox starts.
TRACER_NAME = "sa_outbox"

SpanKindName = Literal["consumer", "producer"]


def _fields(context: Any) -> dict[str, str]:
    """A valid span context as its W3C carrier fields (the propagator's format)."""
    fields = {
        TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    }
    state = context.trace_state
    if state:
        fields[TRACESTATE] = state.to_header()
    return fields


def current_trace_headers() -> dict[str, str] | None:
    """The current span's context as ``{"traceparent": …[, "tracestate": …]}``, or ``None``
    when OpenTelemetry is absent or no valid span is current (then nothing else is done).

    Examples:
        >>> current_trace_headers() is None
        True
    """
    if _trace is None:
        return None
    context = _trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return _fields(context)


def trace_id_of(headers: Mapping[str, Any] | None) -> str | None:
    """The trace id (32 hex digits) of the ``traceparent`` in ``headers``, if any; for log
    lines, so it needs no OpenTelemetry.

    Examples:
        >>> trace_id_of(None), trace_id_of({"traceparent": "garbage"})
        (None, None)
    """
    if not headers:
        return None
    value = headers.get(TRACEPARENT)
    if isinstance(value, str) and len(value) >= 55 and value[2] == "-" and value[35] == "-":
        return value[3:35]
    return None


def without_trace_fields(headers: Mapping[str, Any]) -> dict[str, Any]:
    """``headers`` less ``traceparent`` and ``tracestate``.

    Examples:
        >>> without_trace_fields({"traceparent": "00-…", "tenant": "acme"})
        {'tenant': 'acme'}
    """
    return {k: v for k, v in headers.items() if k not in TRACE_FIELDS}


class TraceSpan:
    """A span sa-outbox started (`start_span`): make it current, record a failure, end it.

    Examples:
        span = start_span(job.headers, "process send-email", kind="consumer")
        if span is not None:
            with span.current():
                ...
            span.end()
    """

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def current(self) -> AbstractContextManager[Any]:
        """A context manager in which this span is the current one (it does not end it)."""
        assert _trace is not None
        return _trace.use_span(
            self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    def trace_headers(self) -> dict[str, str] | None:
        """This span's own W3C fields (``None`` if it has no valid context: a no-op tracer
        that was given no parent)."""
        context = self._span.get_span_context()
        return _fields(context) if context.is_valid else None

    def set_attribute(self, key: str, value: str | int | bool) -> None:
        """Set one attribute of the span."""
        self._span.set_attribute(key, value)

    def fail(self, error: BaseException | str) -> None:
        """Record ``error`` (an exception, or a broker's reason) and set the status to error."""
        assert _trace is not None
        if isinstance(error, BaseException):
            self._span.record_exception(error)
            description = f"{type(error).__name__}: {error}"
        else:
            description = error
        self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, description))

    def end(self) -> None:
        """End the span (it is exported then)."""
        self._span.end()


_KINDS: dict[str, Any] = {}
if _trace is not None:
    _KINDS = {"consumer": _trace.SpanKind.CONSUMER, "producer": _trace.SpanKind.PRODUCER}


def start_span(
    parent: Mapping[str, Any] | None,
    name: str,
    *,
    kind: SpanKindName,
    attributes: Mapping[str, str | int | bool] | None = None,
) -> TraceSpan | None:
    """Start a span whose parent is the trace context in ``parent`` (a row's ``headers``).

    ``None``, and nothing started, when OpenTelemetry is absent or ``parent`` holds no valid
    ``traceparent``: sa-outbox continues traces, it never starts one of its own. The span is
    not made current (see `TraceSpan.current`) and must be ended (`TraceSpan.end`).

    Examples:
        >>> start_span({"traceparent": "not one"}, "publish OrderPlaced", kind="producer")
    """
    if _trace is None or not parent:
        return None
    traceparent = parent.get(TRACEPARENT)
    if not isinstance(traceparent, str):
        return None
    carrier = {TRACEPARENT: traceparent}
    tracestate = parent.get(TRACESTATE)
    if isinstance(tracestate, str):
        carrier[TRACESTATE] = tracestate
    context = _PROPAGATOR.extract(carrier)
    if not _trace.get_current_span(context).get_span_context().is_valid:
        return None
    tracer = _trace.get_tracer(TRACER_NAME)
    span = tracer.start_span(name, context=context, kind=_KINDS[kind], attributes=attributes)
    return TraceSpan(span)
