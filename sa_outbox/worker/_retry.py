"""Reconnecting with backoff (tenacity): how every runtime survives a database that went away.

A transient error (`is_transient`: the connection was lost, the server is restarting or
refuses connections, a serialization failure) is retried after an exponential backoff with
jitter; anything else propagates. ``stop`` says when to give up (a hard stop, or a shutdown
whose deadline passed); ``sleep`` waits and can be cut short.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity
from tenacity.wait import wait_base

from ._settings import is_transient

log = logging.getLogger("sa_outbox.worker")
T = TypeVar("T")

#: 50 ms, doubling, up to 5 s, plus up to 100 ms of jitter: quick after a blip, gentle on a
#: server that is down, and workers that lost the server together do not return together.
DEFAULT_RECONNECT_WAIT: wait_base = tenacity.wait_exponential(
    multiplier=0.05, max=5.0
) + tenacity.wait_random(0, 0.1)


def first_line(error: BaseException | None) -> str:
    """An error's first line: what a log line shows of it (SQLAlchemy's errors go on with
    the whole statement and its parameters).

    Examples:
        >>> first_line(ValueError("no such table\\n[SQL: SELECT …]"))
        'no such table'
        >>> first_line(None)
        ''
    """
    text = "" if error is None else str(error).strip()
    return text.splitlines()[0] if text else ""


def _before_sleep(
    operation: str, report: Callable[[str, BaseException], None]
) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        if error is not None:
            report(operation, error)
        log.warning(
            "database unavailable during %s (%s: %s); retry %d in %.2f s",
            operation,
            type(error).__name__,
            first_line(error),
            state.attempt_number,
            wait,
        )

    return before_sleep


def retrying(
    operation: str,
    *,
    stop: Callable[[], bool],
    sleep: Callable[[float], None],
    report: Callable[[str, BaseException], None],
    wait: wait_base = DEFAULT_RECONNECT_WAIT,
) -> tenacity.Retrying:
    """A tenacity `Retrying` for one sync database operation.

    Examples:
        >>> r = retrying("claim", stop=lambda: False, sleep=lambda s: None,
        ...              report=lambda op, e: None)
        >>> r(lambda: 42)
        42
    """
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=wait,
        stop=lambda state: stop(),
        sleep=sleep,
        before_sleep=_before_sleep(operation, report),
        reraise=True,
    )


def async_retrying(
    operation: str,
    *,
    stop: Callable[[], bool],
    sleep: Callable[[float], Awaitable[None]],
    report: Callable[[str, BaseException], None],
    wait: wait_base = DEFAULT_RECONNECT_WAIT,
) -> tenacity.AsyncRetrying:
    """`retrying` for asyncio.

    Examples:
        >>> import asyncio
        >>> async def sleep(s): pass
        >>> async def answer(): return 42
        >>> r = async_retrying("claim", stop=lambda: False, sleep=sleep,
        ...                    report=lambda op, e: None)
        >>> asyncio.run(r(answer))
        42
    """
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=wait,
        stop=lambda state: stop(),
        sleep=sleep,
        before_sleep=_before_sleep(operation, report),
        reraise=True,
    )


def call_retrying(
    attempt: Callable[[], T],
    operation: str,
    *,
    stop: Callable[[], bool],
    sleep: Callable[[float], None],
    report: Callable[[str, BaseException], None],
) -> T:
    """``attempt()``; after a first transient failure, what `retrying` does with it.

    The first call runs outside tenacity (a hot loop pays for it at every batch); its
    failure is handed to tenacity as the first attempt's, so what follows — the report,
    the log line, the backoff, giving up — is as if tenacity had made that call.

    Examples:
        >>> calls = []
        >>> def flaky():
        ...     calls.append(1)
        ...     if len(calls) == 1:
        ...         raise ConnectionError("lost")  # not a database error: raised as it is
        ...     return 42
        >>> try:
        ...     call_retrying(flaky, "claim", stop=lambda: False, sleep=lambda s: None,
        ...                   report=lambda op, e: None)
        ... except ConnectionError as exc:
        ...     print(exc)
        lost
    """
    try:
        return attempt()
    except Exception as exc:
        if not is_transient(exc):
            raise
        first: BaseException | None = exc

    def again() -> T:
        nonlocal first
        if first is not None:
            error, first = first, None
            raise error
        return attempt()

    retry: Callable[[Callable[[], T]], T] = retrying(
        operation, stop=stop, sleep=sleep, report=report
    )
    return retry(again)


async def async_call_retrying(
    attempt: Callable[[], Awaitable[T]],
    operation: str,
    *,
    stop: Callable[[], bool],
    sleep: Callable[[float], Awaitable[None]],
    report: Callable[[str, BaseException], None],
) -> T:
    """`call_retrying` for asyncio.

    Examples:
        >>> import asyncio
        >>> async def answer(): return 42
        >>> async def sleep(s): pass
        >>> asyncio.run(async_call_retrying(answer, "claim", stop=lambda: False, sleep=sleep,
        ...                                 report=lambda op, e: None))
        42
    """
    try:
        return await attempt()
    except Exception as exc:
        if not is_transient(exc):
            raise
        first: BaseException | None = exc

    async def again() -> T:
        nonlocal first
        if first is not None:
            error, first = first, None
            raise error
        return await attempt()

    retry = async_retrying(operation, stop=stop, sleep=sleep, report=report)
    return await retry(again)
