"""The exceptions sa-outbox raises, all under one root.

```
SaOutboxError
├── InvalidArgument          (also a ValueError)  — a value the library cannot accept
│   └── PayloadTooLarge                          — a serialised payload over the limit
├── InvalidArgumentType      (also a TypeError)   — an argument of the wrong type
│   └── PayloadNotSerializable                   — a payload JSON cannot encode
├── LeaseLost                                    — a fenced write matched no row
├── MissingExtra             (also an ImportError) — an optional dependency is not installed
│   (the worker runtime's, in sa_outbox.worker.errors:)
├── PermanentError                               — a handler's "do not retry": failed now
│   ├── UnknownJobKind                           — no handler for a claimed job's kind
│   └── InvalidPayload                           — the kind's ``parse`` refused the payload
├── JobTimeout                                   — a job ran past its kind's timeout
├── JobCancelled                                 — a cancelled job's token was checked
│   (the outbox relay's, in sa_outbox.relay:)
└── PublishError                                 — a publisher tells the relay what failed
    ├── PublisherUnavailable                     — the broker is unreachable: back off
    └── EventsRejected                           — the broker refused these events
```

Every check that raises ``InvalidArgument`` or ``InvalidArgumentType`` runs before any SQL is
built or sent, so bad input never reaches the database.

Examples:
    >>> from sa_outbox import SaOutboxError, InvalidArgument
    >>> issubclass(InvalidArgument, SaOutboxError) and issubclass(InvalidArgument, ValueError)
    True
"""

from __future__ import annotations

import uuid


class SaOutboxError(Exception):
    """Root of every exception sa-outbox raises on purpose.

    Examples:
        >>> try:
        ...     raise LeaseLost("job", uuid.UUID(int=1), uuid.UUID(int=2))
        ... except SaOutboxError as exc:
        ...     print(type(exc).__name__)
        LeaseLost
    """


class MissingExtra(SaOutboxError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra to install (``pip install "sa-outbox[asyncio]"``).

    Examples:
        >>> issubclass(MissingExtra, ImportError)
        True
    """


class InvalidArgument(SaOutboxError, ValueError):
    """A value the library cannot accept (negative batch, bad identifier, …).

    Examples:
        >>> raise InvalidArgument("batch must be between 1 and 10000, got 0")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: batch must be between 1 and 10000, got 0
    """


class InvalidArgumentType(SaOutboxError, TypeError):
    """An argument of a type the library does not take (a dict as a queue filter, …).

    Examples:
        >>> raise InvalidArgumentType("queues must be a str, got int")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgumentType: queues must be a str, got int
    """


class PayloadNotSerializable(InvalidArgumentType):
    """A payload that JSON cannot encode; the message names the job kind or event type.

    Examples:
        >>> raise PayloadNotSerializable("payload of job kind 'x' is not JSON")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.PayloadNotSerializable: payload of job kind 'x' is not JSON
    """


class PayloadTooLarge(InvalidArgument):
    """A serialised payload larger than the configured limit.

    Examples:
        >>> raise PayloadTooLarge("payload of job kind 'x' is 2000000 bytes")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.PayloadTooLarge: payload of job kind 'x' is 2000000 bytes
    """


class LeaseLost(SaOutboxError):
    """A fenced write (complete, retry, fail, heartbeat, mark published) matched no row.

    The row is no longer ``running`` under this token: the lease expired and the job was
    reclaimed (and maybe claimed again by another worker), or it was already finished. The
    current state of the row was left untouched.

    Attributes:
        entity: ``"job"`` or ``"outbox event"``.
        id: the row's primary key.
        token: the lease (or relay) token that no longer matches.

    Examples:
        >>> err = LeaseLost("job", uuid.UUID(int=1), uuid.UUID(int=2), action="complete")
        >>> print(err)  # doctest: +NORMALIZE_WHITESPACE
        cannot complete job 00000000-0000-0000-0000-000000000001: lease token
        00000000-0000-0000-0000-000000000002 no longer holds it (lease expired and the row was
        reclaimed, or it was already finished); the row was left untouched
    """

    def __init__(
        self, entity: str, id: object, token: uuid.UUID | None, *, action: str = "update"
    ) -> None:
        self.entity = entity
        self.id = id
        self.token = token
        self.action = action
        super().__init__(
            f"cannot {action} {entity} {id}: lease token {token} no longer holds it (lease "
            "expired and the row was reclaimed, or it was already finished); the row was left "
            "untouched"
        )
