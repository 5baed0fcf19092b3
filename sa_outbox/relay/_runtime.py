"""What `Relay` and `AsyncRelay` do differently; the rest of them is written once.

``_async.py`` (`AsyncRelay`) is the source: ``tools/async_to_sync.py`` generates ``_sync.py``
(`Relay`) from it, turning ``await x`` into ``x`` and each name of an asyncio helper here into
its synchronous twin's: `AsyncPortal` → `Portal` (where the publisher runs), `AsyncStopSignal`
→ `StopSignal` (`stop`, and the waits it cuts short), `require_async_engine` →
`require_engine`. The twins have the same methods, so one body of code drives either.

Examples:
    >>> signal = StopSignal()
    >>> signal.set(); signal.is_set()
    True
    >>> signal.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from sqlalchemy import Engine

from .._exceptions import InvalidArgumentType
from ._listen import AsyncListener, SyncListener, WakePipe
from ._publisher import Publisher, PublisherUnavailable

__all__ = [
    "AsyncPortal",
    "AsyncStopSignal",
    "Portal",
    "StopSignal",
    "require_async_engine",
    "require_engine",
]

T = TypeVar("T")


def require_engine(engine: object) -> None:
    """`Relay`'s engine: a synchronous ``Engine``, else `InvalidArgumentType`.

    Examples:
        >>> try:
        ...     require_engine("postgresql://")
        ... except InvalidArgumentType as exc:
        ...     print(exc)
        Relay needs a synchronous Engine, got str (use AsyncRelay with an AsyncEngine)
    """
    if not isinstance(engine, Engine):
        raise InvalidArgumentType(
            f"Relay needs a synchronous Engine, got {type(engine).__name__} "
            "(use AsyncRelay with an AsyncEngine)"
        )


def require_async_engine(engine: object) -> None:
    """`AsyncRelay`'s engine: an ``AsyncEngine``, else `InvalidArgumentType`.

    Examples:
        >>> try:
        ...     require_async_engine("postgresql://")
        ... except InvalidArgumentType as exc:
        ...     print(exc)
        AsyncRelay needs an AsyncEngine, got str (use Relay with a synchronous Engine)
    """
    if not hasattr(engine, "sync_engine"):
        raise InvalidArgumentType(
            f"AsyncRelay needs an AsyncEngine, got {type(engine).__name__} "
            "(use Relay with a synchronous Engine)"
        )


class Portal:
    """An event loop in a thread of its own, on which `Relay`'s (async) publisher runs.

    It lives as long as the relay, so broker connections stay open between batches (their
    heartbeats keep being answered while the relay waits for work).

    Examples:
        >>> async def answer():
        ...     return 42
        >>> portal = Portal("relay-1")
        >>> portal.call(answer(), 1.0)
        42
        >>> portal.close_loop()
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` on the loop; `PublisherUnavailable` (and the task cancelled) when it
        has not finished within ``timeout`` seconds (``None``: no bound)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name=f"sa-outbox relay {self._name}", daemon=True
            )
            self._thread.start()
            self._loop = loop
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # cancels the task on the loop (which resets a guarded publish)
            raise PublisherUnavailable(f"the publisher did not finish within {timeout} s") from None

    def close(self, publisher: Publisher) -> None:
        """Close ``publisher`` on the loop, then the loop and its thread."""
        try:
            self.call(publisher.aclose(), None)
        finally:
            self.close_loop()

    def close_loop(self) -> None:
        """Stop the loop and its thread (a later `call` starts new ones)."""
        if self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join()
        self._loop.close()
        self._loop = None


class AsyncPortal:
    """`Portal` for `AsyncRelay`: the publisher runs on the relay's own loop, so a call is an
    ``await``. ``timeout`` is `Portal`'s guard for a caller in another thread; here the
    publish bounds itself (`sa_outbox.relay._core.GuardedPublisher`).

    Examples:
        >>> async def answer():
        ...     return 42
        >>> asyncio.run(AsyncPortal("relay-1").call(answer(), 1.0))
        42
    """

    def __init__(self, name: str) -> None:
        self._name = name

    async def call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Await ``coro``."""
        return await coro

    async def aclose(self, publisher: Publisher) -> None:
        """Close ``publisher``."""
        await publisher.aclose()


class StopSignal:
    """`Relay.stop`'s flag: safe to set from a signal handler or another thread, and it ends
    the relay's waits (a pause, a LISTEN) at once.

    Examples:
        >>> signal = StopSignal()
        >>> signal.begin(); signal.is_set()
        False
        >>> signal.set(); signal.pause(60)  # returns at once: stop was asked
        >>> signal.close()
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._wake = WakePipe()

    def is_set(self) -> bool:
        """Whether `set` was called since `begin`."""
        return self._event.is_set()

    def set(self) -> None:
        """Ask the relay to stop; ends a wait in progress."""
        self._event.set()
        self._wake.wake()

    def begin(self) -> None:
        """`Relay.run` starts: forget an earlier stop."""
        self._event.clear()
        self._wake.drain()

    def end(self) -> None:
        """`Relay.run` returns (nothing to undo here)."""

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if `set` is called."""
        self._event.wait(seconds)

    def wait_on(self, listener: SyncListener, timeout: float) -> None:
        """Until ``listener`` hears a notification, `set`, or ``timeout`` seconds."""
        try:
            listener.wait(timeout, self._wake)
        finally:
            self._wake.drain()

    def close(self) -> None:
        """Release the pipe that wakes the waits."""
        self._wake.close()


class AsyncStopSignal:
    """`StopSignal` for `AsyncRelay`: set from the loop, another thread or a signal handler;
    its waits run on the loop that runs `AsyncRelay.run`.

    Examples:
        >>> async def main():
        ...     signal = AsyncStopSignal()
        ...     signal.begin()
        ...     signal.set()
        ...     await signal.pause(60)  # returns at once: stop was asked
        ...     return signal.is_set()
        >>> asyncio.run(main())
        True
    """

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def is_set(self) -> bool:
        """Whether `set` was called since `begin`."""
        return self._requested.is_set()

    def set(self) -> None:
        """Ask the relay to stop; ends a wait in progress (safe from any thread)."""
        self._requested.set()
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def begin(self) -> None:
        """`AsyncRelay.run` starts, on the running loop: forget an earlier stop."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._requested.is_set():
            self._requested.clear()

    def end(self) -> None:
        """`AsyncRelay.run` returns: `set` no longer reaches into its loop."""
        self._loop = None

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if `set` is called."""
        assert self._event is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)

    async def wait_on(self, listener: AsyncListener, timeout: float) -> None:
        """Until ``listener`` hears a notification, `set`, or ``timeout`` seconds."""
        assert self._event is not None
        await listener.wait(timeout, self._event)

    def close(self) -> None:
        """Nothing to release."""
