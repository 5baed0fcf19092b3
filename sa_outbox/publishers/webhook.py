"""`WebhookPublisher`: an HTTP POST per event (``pip install "sa-outbox[webhook]"``).

The body is the whole event as JSON (`envelope_of`: ``id``, ``event_type``,
``aggregate_type``, ``aggregate_id``, ``seq``, ``created_at``, ``headers``, ``payload``). The
request carries:

- ``Idempotency-Key``: the outbox row's id, the same on every retry;
- ``X-Outbox-Signature: sha256=<hex>``: the HMAC-SHA256 of the body under ``secret`` (when
  one is given), which the receiver recomputes to know the request is yours;
- ``X-Outbox-Event-Type`` and ``Content-Type: application/json``, plus ``headers``;
- ``traceparent`` and ``tracestate`` when the event carries a trace context (W3C Trace
  Context, which HTTP servers' tracing reads; docs/tracing.md).

Only a 2xx answer counts as published. Redirects are not followed (a 3xx rejects the
event, like 4xx and other 5xx answers); 408, 429, 502, 503 and 504 — the server saying it
cannot take anything *now* — and timeouts or connection errors make the batch unavailable,
so the relay backs off without parking events. Events of one batch are sent concurrently
(at most ``concurrency`` at a time); ``timeout`` bounds each request. After a publish that
timed out or was cancelled, the relay calls `WebhookPublisher.reset`, which closes the HTTP
client and its pooled connections (waiting at most ``RESET_CLOSE_TIMEOUT``): the next
publish opens new ones.

The URL must be an absolute ``http://`` or ``https://`` URL with a host (`checked_url`):
anything else (``ftp://``, ``file://``, no scheme, no host) is refused when the publisher
is built, since no request to it could ever succeed. A URL function's answer is checked
per event: a bad one rejects that event (parked after ``max_attempts``), rather than
passing for a broker that is down.

Examples:
    publisher = WebhookPublisher(
        "https://hooks.example.com/outbox",
        secret=os.environ["WEBHOOK_SECRET"],
        timeout=10.0,
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence

import httpx

from .._exceptions import InvalidArgument, InvalidArgumentType
from .._tracing import TRACE_FIELDS
from .._validation import count
from .._wire import (
    WEBHOOK_EVENT_TYPE_HEADER,
    WEBHOOK_IDEMPOTENCY_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    sign,
)
from ..queue import ClaimedEvent
from ..relay._core import describe
from ..relay._publisher import EventsRejected, PublisherUnavailable
from ..statements import compact_json
from ._message import envelope_of

__all__ = [
    "RESET_CLOSE_TIMEOUT",
    "RETRY_LATER_STATUSES",
    "WebhookPublisher",
    "checked_url",
    "sign",
]

#: Answers that mean "not now" rather than "not this event": the batch is unavailable.
RETRY_LATER_STATUSES = frozenset({408, 429, 502, 503, 504})
#: The schemes a webhook can be posted to.
URL_SCHEMES = ("http", "https")
#: Most concurrent requests `WebhookPublisher` takes for ``concurrency``.
MAX_CONCURRENCY = 1000
#: How long `WebhookPublisher.reset` waits for the client's connections to close.
RESET_CLOSE_TIMEOUT = 1.0


def checked_url(url: object) -> str:
    """``url`` if it is an absolute ``http://`` or ``https://`` URL with a host.

    Raises `InvalidArgumentType` for a non-str and `InvalidArgument` for anything else:
    another scheme (``ftp://``, ``file://``), no scheme (``hooks.example.com/x``), no host
    (``https:///x``), or whitespace and control characters, which no server would be found
    for.

    Examples:
        >>> checked_url("https://hooks.example.com/outbox")
        'https://hooks.example.com/outbox'
        >>> try:
        ...     checked_url("ftp://hooks.example.com/outbox")
        ... except InvalidArgument as exc:
        ...     print(str(exc).replace(" got", "\\n got"))
        webhook url must be an absolute http:// or https:// URL with a host,
         got 'ftp://hooks.example.com/outbox' (scheme 'ftp')
    """
    if not isinstance(url, str):
        raise InvalidArgumentType(f"webhook url must be a str, got {type(url).__name__}")
    shown = url if len(url) <= 200 else url[:200] + "…"
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidArgument(
            f"webhook url {shown!r} holds whitespace or control characters: percent-encode them"
        )
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidArgument(f"webhook url {shown!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in URL_SCHEMES or not parsed.host:
        found = f"scheme {parsed.scheme!r}" if parsed.scheme else "no scheme"
        if parsed.scheme in URL_SCHEMES:
            found = "no host"
        raise InvalidArgument(
            "webhook url must be an absolute http:// or https:// URL with a host, got "
            f"{shown!r} ({found})"
        )
    return url


class _Unreachable(Exception):
    pass


class WebhookPublisher:
    """POST each event to ``url`` (a str, or a function of the event); see the module.

    Examples:
        relay = Relay(engine, OutboxEvent, WebhookPublisher(url, secret=secret))
    """

    def __init__(
        self,
        url: str | Callable[[ClaimedEvent], str],
        *,
        secret: str | bytes | None = None,
        timeout: float | httpx.Timeout = 10.0,
        headers: Mapping[str, str] | None = None,
        concurrency: int = 10,
        signature_header: str = WEBHOOK_SIGNATURE_HEADER,
        idempotency_header: str = WEBHOOK_IDEMPOTENCY_HEADER,
    ) -> None:
        self._fixed_url: str | None = None
        if isinstance(url, str):
            fixed = self._fixed_url = checked_url(url)
            self._url_of: Callable[[ClaimedEvent], str] = lambda _event: fixed
        elif callable(url):
            self._url_of = url
        else:
            raise InvalidArgumentType(f"url must be a str or a function, got {url!r}")
        if secret is not None and not isinstance(secret, str | bytes):
            raise InvalidArgumentType("secret must be a str or bytes")
        # A semaphore of 0 would make every publish wait until it timed out, "unavailable".
        concurrency = count(concurrency, "concurrency", maximum=MAX_CONCURRENCY)
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._headers = dict(headers or {})
        self._concurrency = concurrency
        self._signature_header = signature_header
        self._idempotency_header = idempotency_header
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return "WebhookPublisher()"

    def request_for(self, event: ClaimedEvent) -> tuple[str, bytes, dict[str, str]]:
        """The URL, body and headers sent for ``event``.

        Examples:
            url, body, headers = publisher.request_for(event)
        """
        body = compact_json(envelope_of(event)).encode()
        headers = {
            **self._headers,
            "Content-Type": "application/json",
            self._idempotency_header: str(event.id),
            WEBHOOK_EVENT_TYPE_HEADER: event.event_type,
        }
        for name in TRACE_FIELDS:  # the relay's publish span, for the receiver to continue
            value = (event.headers or {}).get(name)
            if isinstance(value, str):
                headers[name] = value
        if self._secret is not None:
            headers[self._signature_header] = sign(self._secret, body)
        return self._url_of(event), body, headers

    async def _post(
        self, client: httpx.AsyncClient, limit: asyncio.Semaphore, event: ClaimedEvent
    ) -> str | None:
        url, body, headers = self.request_for(event)
        if self._fixed_url is None:  # a URL function: its answer is this event's problem
            try:
                checked_url(url)
            except (InvalidArgument, InvalidArgumentType) as exc:
                return f"the url function gave a bad URL for this event: {exc}"
        async with limit:
            try:
                response = await client.post(url, content=body, headers=headers)
            except httpx.TransportError as exc:  # timeouts, refused connections, …
                raise _Unreachable(f"POST {url}: {describe(exc)}") from exc
        if response.is_success:
            return None
        reason = f"POST {url}: HTTP {response.status_code} {response.reason_phrase}"
        if response.status_code in RETRY_LATER_STATUSES:
            raise _Unreachable(reason)
        if response.is_redirect:
            return f"{reason} (redirects are not followed)"
        return f"{reason}: {response.text[:200]}" if response.text else reason

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        """POST every event of the batch; only 2xx answers count.

        Examples:
            await publisher.publish(events)
        """
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)
        limit = asyncio.Semaphore(self._concurrency)
        results = await asyncio.gather(
            *(self._post(self._client, limit, event) for event in events), return_exceptions=True
        )
        rejected: dict[uuid.UUID, str] = {}
        for event, result in zip(events, results, strict=True):
            if isinstance(result, _Unreachable):
                raise PublisherUnavailable(str(result))
            if isinstance(result, BaseException):
                rejected[event.id] = describe(result)
            elif result is not None:
                rejected[event.id] = result
        if rejected:
            raise EventsRejected(rejected)

    async def reset(self) -> None:
        """Close the HTTP client and its pooled connections; the next publish opens new ones.

        The relay calls it after a publish that timed out or was cancelled: a pooled
        connection whose answer never came must not be reused. Waits at most
        ``RESET_CLOSE_TIMEOUT``.

        Examples:
            await publisher.reset()
        """
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), RESET_CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Close the HTTP client.

        Examples:
            await publisher.aclose()
        """
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
