"""LISTEN for the job table's notifications, so a worker wakes up as soon as jobs arrive.

`Listener` (a thread) and `AsyncListener` (a task) hold one dedicated connection in autocommit
mode, ``LISTEN`` on the table's channel, and call ``on_notify(payload)`` for each
notification. They reconnect with backoff when the connection drops, and call
``on_connect()`` once listening again (notifications sent meanwhile are lost, so the worker
claims at once instead). Polling stays the fallback: a worker whose listener is down still
claims every ``poll_interval``.

Behind a connection pooler in transaction mode (PgBouncer, managed poolers) a LISTEN runs
but hears nothing. So when the listening connection goes through a pooler
(`sa_outbox._pooler.through_pooler`), the listener sends itself a test notification
through the engine (``probe``); if none arrives within a few seconds it sets ``deaf`` and
calls ``on_deaf()`` once (the worker logs a warning naming ``listen_url=``).

Examples:
    listener = Listener(connect, channel, on_notify=print)
    listener.start()
    ...
    listener.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import tenacity

from .._pooler import NotifyProbe, athrough_pooler, through_pooler
from ..statements import listen_sql
from ._retry import DEFAULT_RECONNECT_WAIT

__all__ = ["AsyncListener", "Listener"]

log = logging.getLogger("sa_outbox.worker")

#: How long a listening connection may stay silent before it is checked with ``SELECT 1``.
KEEPALIVE_SECONDS = 30.0


def _backoff(attempt: int) -> float:
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = attempt
    return float(DEFAULT_RECONNECT_WAIT(state))


class _Flag(Protocol):
    """What the shared code needs of a `threading.Event` or an `asyncio.Event`."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def clear(self) -> None: ...


class _Base:
    """What `Listener` and `AsyncListener` share: the callbacks, and what to do with a
    notification, a silent wait, a deaf connection and a failure; each keeps its I/O."""

    deaf: _Flag
    listening: _Flag

    def __init__(
        self,
        on_notify: Callable[[str], None],
        on_connect: Callable[[], None],
        on_deaf: Callable[[], None],
    ) -> None:
        self._on_notify = on_notify
        self._on_connect = on_connect
        self._on_deaf = on_deaf

    def _listening_now(self) -> None:
        if not self.deaf.is_set():
            self.listening.set()
        self._on_connect()

    @staticmethod
    def _timeout(probe: NotifyProbe | None) -> float:
        return probe.timeout(KEEPALIVE_SECONDS) if probe else KEEPALIVE_SECONDS

    def _notified(self, probe: NotifyProbe | None, notify: Any) -> None:
        if probe is not None and probe.seen(notify.channel):
            self._heard_after_all()
        else:
            self._on_notify(notify.payload)

    def _check_after(self, probe: NotifyProbe | None, silent: bool) -> bool:
        """After a wait: whether to check the connection (it stayed silent)."""
        if probe is not None and probe.expired():
            self._deaf()
            return False
        return silent

    @staticmethod
    def _retry_wait(exc: Exception, attempt: int) -> float:
        wait = _backoff(attempt)
        log.warning(
            "listener connection failed (%s: %s); polling until it reconnects in %.2f s",
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc) else "",
            wait,
        )
        return wait

    def _deaf(self) -> None:
        self.listening.clear()
        if not self.deaf.is_set():
            self.deaf.set()
            self._on_deaf()

    def _heard_after_all(self) -> None:
        if self.deaf.is_set():
            log.info("a test notification arrived late after all: listening")
            self.deaf.clear()
        self.listening.set()


class Listener(_Base):
    """A thread that LISTENs on a channel and calls back for each notification.

    ``connect`` returns a new psycopg connection; ``channel`` returns the channel name (it
    may ask the database, once connected). Callbacks run on the listener's thread.
    ``probe(channel)`` sends ``pg_notify(channel, '')`` through the engine; it is called
    only when the connection goes through a pooler, to check that notifications arrive.

    Examples:
        listener = Listener(connect, lambda: "public.jobs", on_notify=worker_wake)
        listener.start()
    """

    deaf: threading.Event
    listening: threading.Event

    def __init__(
        self,
        connect: Callable[[], Any],
        channel: Callable[[], str | None],
        *,
        on_notify: Callable[[str], None],
        on_connect: Callable[[], None] = lambda: None,
        listening: threading.Event | None = None,
        name: str = "sa-outbox-listener",
        probe: Callable[[str], None] | None = None,
        on_deaf: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(on_notify, on_connect, on_deaf)
        self._connect = connect
        self._channel = channel
        self._probe = probe
        #: Set when the connection goes through a pooler and no test notification arrived.
        self.deaf = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._conn: Any = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: Set while the connection is listening.
        self.listening = listening if listening is not None else threading.Event()

    def start(self) -> None:
        """Start listening, in the background."""
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop, and close the connection (which interrupts a wait at once)."""
        self._stopped.set()
        self.listening.clear()
        with self._lock:
            conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        attempt = 0
        while not self._stopped.is_set():
            conn = None
            try:
                channel = self._channel()
                if channel is None:
                    log.warning("the job table does not exist yet: not listening, polling only")
                    return
                conn = self._connect()
                conn.autocommit = True
                with self._lock:
                    self._conn = conn
                if self._stopped.is_set():
                    return
                probe = self._start_probe(conn)
                conn.execute(listen_sql(channel))  # last: pg_stat_activity shows it
                attempt = 0
                log.debug("listening on channel %r", channel)
                self._listening_now()
                while not self._stopped.is_set():
                    silent = True
                    for notify in conn.notifies(timeout=self._timeout(probe)):
                        silent = False
                        self._notified(probe, notify)
                    if self._check_after(probe, silent) and not self._stopped.is_set():
                        conn.execute("SELECT 1")
            except Exception as exc:
                self.listening.clear()
                if self._stopped.is_set():
                    return
                attempt += 1
                self._stopped.wait(self._retry_wait(exc, attempt))
            finally:
                with self._lock:
                    self._conn = None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def _start_probe(self, conn: Any) -> NotifyProbe | None:
        if self._probe is None or self.deaf.is_set() or not through_pooler(conn):
            return None
        probe = NotifyProbe()
        conn.execute(probe.listen_sql())
        self._probe(probe.channel)
        probe.start()
        return probe


class AsyncListener(_Base):
    """`Listener` as an asyncio task, on a psycopg ``AsyncConnection``.

    Examples:
        listener = AsyncListener(connect, channel, on_notify=worker_wake)
        listener.start()
        ...
        await listener.stop()
    """

    deaf: asyncio.Event
    listening: asyncio.Event

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        channel: Callable[[], Awaitable[str | None]],
        *,
        on_notify: Callable[[str], None],
        on_connect: Callable[[], None] = lambda: None,
        listening: asyncio.Event | None = None,
        probe: Callable[[str], Awaitable[None]] | None = None,
        on_deaf: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(on_notify, on_connect, on_deaf)
        self._connect = connect
        self._channel = channel
        self._probe = probe
        #: Set when the connection goes through a pooler and no test notification arrived.
        self.deaf = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Set while the connection is listening.
        self.listening = listening if listening is not None else asyncio.Event()

    def start(self) -> None:
        """Start listening, in a task of the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sa-outbox-listener")

    async def stop(self) -> None:
        """Stop, and close the connection."""
        self.listening.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        attempt = 0
        while True:
            conn = None
            try:
                channel = await self._channel()
                if channel is None:
                    log.warning("the job table does not exist yet: not listening, polling only")
                    return
                conn = await self._connect()
                await conn.set_autocommit(True)
                probe = await self._start_probe(conn)
                await conn.execute(listen_sql(channel))  # last: pg_stat_activity shows it
                attempt = 0
                self._listening_now()
                while True:
                    silent = True
                    async for notify in conn.notifies(timeout=self._timeout(probe)):
                        silent = False
                        self._notified(probe, notify)
                    if self._check_after(probe, silent):
                        await conn.execute("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                attempt += 1
                await asyncio.sleep(self._retry_wait(exc, attempt))
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    async def _start_probe(self, conn: Any) -> NotifyProbe | None:
        if self._probe is None or self.deaf.is_set() or not await athrough_pooler(conn):
            return None
        probe = NotifyProbe()
        await conn.execute(probe.listen_sql())
        await self._probe(probe.channel)
        probe.start()
        return probe
