"""A worker's settings (`make_settings`: every option checked once), its id, and the small
helpers both drivers share: which errors are transient, an error's text, jitter.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import random
import socket
import traceback
import uuid
from collections.abc import Sequence

from sqlalchemy import Engine

from .._exceptions import InvalidArgument, InvalidArgumentType
from .._sqlstate import is_transient as is_transient
from .._validation import count, duration, name_filter, text

log = logging.getLogger("sa_outbox.worker")


#: The default ``batch``: jobs per claim, and acknowledgements per write.
DEFAULT_BATCH = 50


#: With ``prefetch=None``, jobs claimed ahead of a free handler may wait locally about this
#: long (by the handlers' average run time): short jobs share commits, long ones are not hoarded.
PREFETCH_HORIZON = 0.1


#: … and at most this many batches of them: one being worked through, one claimed meanwhile.
PREFETCH_BATCHES = 2


def default_worker_id() -> str:
    """``host:pid:random``, unique enough to tell workers apart in ``worker_id``.

    Examples:
        >>> default_worker_id().count(":")
        2
    """
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def seconds(value: dt.timedelta | float, what: str, *, allow_zero: bool = False) -> float:
    return duration(value, what, allow_zero=allow_zero).total_seconds()


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """A worker's options, checked (see `Worker` for what each means)."""

    worker_id: str
    queues: tuple[str, ...] | None
    kinds: tuple[str, ...] | None
    concurrency: int
    batch: int
    prefetch: int | None
    lease: float
    heartbeat_interval: float
    poll_interval: float
    listen: bool
    ack_delay: float
    ack_batch: int
    grace: float
    reclaim_interval: float | None
    max_error_chars: int


def make_settings(
    *,
    worker_id: str | None,
    queues: str | Sequence[str] | None,
    kinds: str | Sequence[str] | None,
    concurrency: int,
    batch: int | None,
    prefetch: int | None = None,
    lease: dt.timedelta | float,
    heartbeat_interval: dt.timedelta | float | None,
    poll_interval: dt.timedelta | float,
    listen: bool,
    ack_delay: dt.timedelta | float,
    ack_batch: int | None,
    grace: dt.timedelta | float,
    reclaim: bool,
    reclaim_interval: dt.timedelta | float | None,
    max_error_chars: int,
) -> Settings:
    """Check a worker's options before anything runs; errors name the option."""
    workers = count(concurrency, "concurrency", maximum=1000)
    size = count(batch if batch is not None else max(workers, DEFAULT_BATCH), "batch")
    ahead = None if prefetch is None else count(prefetch, "prefetch", minimum=0)
    lease_s = seconds(lease, "lease")
    beat = (
        lease_s / 3
        if heartbeat_interval is None
        else seconds(heartbeat_interval, "heartbeat_interval")
    )
    if beat >= lease_s:
        raise InvalidArgument(
            f"heartbeat_interval ({beat} s) must be shorter than the lease ({lease_s} s)"
        )
    reclaim_s = None
    if reclaim:
        reclaim_s = (
            lease_s / 2
            if reclaim_interval is None
            else seconds(reclaim_interval, "reclaim_interval")
        )
    return Settings(
        worker_id=text(worker_id if worker_id is not None else default_worker_id(), "worker_id"),
        queues=name_filter(queues, "queues"),
        kinds=name_filter(kinds, "kinds"),
        concurrency=workers,
        batch=size,
        prefetch=ahead,
        lease=lease_s,
        heartbeat_interval=beat,
        poll_interval=seconds(poll_interval, "poll_interval"),
        listen=bool(listen),
        ack_delay=seconds(ack_delay, "ack_delay", allow_zero=True),
        ack_batch=count(ack_batch if ack_batch is not None else size, "ack_batch"),
        grace=seconds(grace, "grace", allow_zero=True),
        reclaim_interval=reclaim_s,
        max_error_chars=count(max_error_chars, "max_error_chars", minimum=100, maximum=1 << 20),
    )


def error_text(error: BaseException, limit: int) -> str:
    """``last_error`` for an exception: its type and message, then the traceback's head.

    Examples:
        >>> try:
        ...     raise ValueError("bad input")
        ... except ValueError as exc:
        ...     print(error_text(exc, 4000).splitlines()[0])
        ValueError: bad input
    """
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    head = f"{name}: {error}"
    if error.__traceback__ is not None:
        head += "\n" + "".join(traceback.format_exception(error)).rstrip()
    if len(head) > limit:
        head = head[: limit - 15].rstrip() + "\n… (truncated)"
    # PostgreSQL's text takes neither NUL nor a lone surrogate: an exception's message may.
    head = head.replace("\x00", "\\x00")
    return head.encode("utf-8", "backslashreplace").decode("utf-8")


def jittered(seconds: float) -> float:
    """``seconds`` ± 20 %, so that workers started together spread their reclaims."""
    return seconds * random.uniform(0.8, 1.2)


def check_engine(engine: object, what: str) -> None:
    if not isinstance(engine, Engine):
        raise InvalidArgumentType(
            f"{what} needs a sync Engine (create_engine), got {type(engine).__name__}"
        )
