"""A job's ``headers``: string names to string values, checked and serialised once.

A job carries headers beside its payload: the W3C trace context it was enqueued in
(``traceparent``, ``tracestate``; docs/tracing.md) and whatever the caller adds. They are
metadata, not data: str to str only, at most `MAX_HEADERS_BYTES` as JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import InvalidArgument, InvalidArgumentType, PayloadTooLarge
from .._json import compact_json
from .._validation import shown, unstorable

__all__ = ["MAX_HEADERS_BYTES", "job_headers_text"]

#: Most bytes of a job's headers, serialised as JSON (8 KiB: an HTTP request's headers).
MAX_HEADERS_BYTES = 8 << 10


def job_headers_text(
    headers: Mapping[str, str] | None, trace: Mapping[str, str] | None, what: str
) -> str | None:
    """``headers`` over ``trace`` (the caller's own win a clash) as JSON text; ``None`` when
    both are empty (the column stays NULL). Bad headers raise, naming ``what`` they belong to.

    Examples:
        >>> job_headers_text({"tenant": "acme"}, {"traceparent": "00-…"}, "job kind 'k'")
        '{"traceparent":"00-…","tenant":"acme"}'
        >>> job_headers_text(None, None, "job kind 'k'") is None
        True
        >>> job_headers_text({"attempt": 2}, None, "job kind 'k'")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgumentType: headers of job kind 'k' map str to str: the \
value of 'attempt' is of type int
    """
    if headers is None:
        if not trace:
            return None
        merged: Mapping[str, Any] = trace
    else:
        _check(headers, what)
        merged = {**trace, **headers} if trace else headers
        if not merged:
            return None
    text = compact_json(dict(merged))
    size = len(text) if text.isascii() else len(text.encode())
    if size > MAX_HEADERS_BYTES:
        raise PayloadTooLarge(
            f"headers of {what} are {size} bytes as JSON, over the limit of {MAX_HEADERS_BYTES}"
        )
    return text


def _check(headers: object, what: str) -> None:
    if not isinstance(headers, Mapping):
        raise InvalidArgumentType(
            f"headers of {what} must be a mapping of str to str, got {type(headers).__name__}"
        )
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidArgumentType(
                f"headers of {what} map str to str: the name {name!r} is of type "
                f"{type(name).__name__}"
            )
        if not isinstance(value, str):
            raise InvalidArgumentType(
                f"headers of {what} map str to str: the value of {shown(name)} is of type "
                f"{type(value).__name__}"
            )
        if not name.strip():
            raise InvalidArgument(f"headers of {what}: a name must not be blank, got {name!r}")
        for part, label in ((name, "name"), (value, "value")):
            problem = unstorable(part)
            if problem is not None:
                raise InvalidArgument(f"headers of {what}: the {label} of {shown(name)} {problem}")
