"""The relay's settings, checked once, shared by `Relay` and `AsyncRelay`.

Examples:
    >>> settings = RelaySettings.build(batch=50, lease=30)
    >>> settings.batch, settings.publish_timeout.total_seconds()
    (50, 15.0)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket

from sqlalchemy import URL

from .._backoff import Backoff
from .._connect_args import check_listen_url
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import count, duration

__all__ = ["DEFAULT_RETENTION", "RelaySettings", "default_relay_name"]

#: How long published events are kept before the relay's retention routine deletes them.
DEFAULT_RETENTION = dt.timedelta(days=7)


def default_relay_name() -> str:
    """``host:pid``, the name a relay logs and reports under unless given one.

    Examples:
        >>> default_relay_name().endswith(f":{os.getpid()}")
        True
    """
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclasses.dataclass(frozen=True, slots=True)
class RelaySettings:
    """Every knob of a relay, validated (see `Relay` for what each one does).

    Examples:
        >>> RelaySettings.build(batch=0)
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: batch must be between 1 and 10000, got 0
    """

    name: str
    batch: int
    per_aggregate: int | None
    lease: dt.timedelta
    publish_timeout: dt.timedelta
    max_attempts: int
    backoff: Backoff
    poll_interval: dt.timedelta
    listen: bool
    retention: dt.timedelta | None
    prune_interval: dt.timedelta
    retry_initial: dt.timedelta
    retry_max: dt.timedelta
    #: Where the LISTEN connection goes (``None``: the engine's URL), see `Relay`.
    listen_url: URL | None = None

    @classmethod
    def build(
        cls,
        *,
        name: str | None = None,
        batch: int = 100,
        per_aggregate: int | None = None,
        lease: dt.timedelta | float = 30.0,
        publish_timeout: dt.timedelta | float | None = None,
        max_attempts: int = 10,
        backoff: Backoff | None = None,
        poll_interval: dt.timedelta | float = 1.0,
        listen: bool = True,
        retention: dt.timedelta | float | None = DEFAULT_RETENTION,
        prune_interval: dt.timedelta | float = 300.0,
        retry_initial: dt.timedelta | float = 0.5,
        retry_max: dt.timedelta | float = 30.0,
        listen_url: str | URL | None = None,
    ) -> RelaySettings:
        """Check every value; ``publish_timeout`` defaults to half the lease."""
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgumentType(f"name must be a non-empty str, got {name!r}")
        lease_for = duration(lease, "lease")
        timeout = lease_for / 2 if publish_timeout is None else duration(publish_timeout, "timeout")
        if timeout >= lease_for:
            raise InvalidArgument(
                f"publish_timeout ({timeout}) must be shorter than the lease ({lease_for}): "
                "a publish still running when the lease ends could reorder an aggregate"
            )
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgumentType(f"backoff must be a Backoff, got {backoff!r}")
        if not isinstance(listen, bool):
            raise InvalidArgumentType(f"listen must be a bool, got {listen!r}")
        return cls(
            name=name or default_relay_name(),
            batch=count(batch, "batch"),
            per_aggregate=None if per_aggregate is None else count(per_aggregate, "per_aggregate"),
            lease=lease_for,
            publish_timeout=timeout,
            max_attempts=count(max_attempts, "max_attempts", maximum=1_000_000),
            backoff=backoff or Backoff(base=1.0, max=300.0, jitter=1.0),
            poll_interval=duration(poll_interval, "poll_interval"),
            listen=listen,
            retention=None if retention is None else duration(retention, "retention"),
            prune_interval=duration(prune_interval, "prune_interval"),
            retry_initial=duration(retry_initial, "retry_initial"),
            retry_max=duration(retry_max, "retry_max"),
            listen_url=check_listen_url(listen_url),
        )
