"""LISTEN on the outbox table's channel, so an idle relay wakes up when events commit.

Each listener holds one dedicated psycopg 3 connection, in autocommit mode, outside the
engine's pool. With another driver, or when the connection fails, the relay falls back to
polling every ``poll_interval`` (and tries to listen again on its next idle wait).
With ``listen_url`` the connection goes there instead of to the engine's URL: a direct one,
when the engine goes through a transaction pooler that LISTEN cannot pass. A listening
connection that goes through a pooler sends itself a test notification through the engine
(`sa_outbox._pooler.NotifyProbe`); `deaf` says when none came back in time.

Examples:
    >>> listen_statement("work.outbox")
    'LISTEN "work.outbox"'
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine, text

from .._connect_args import listen_connect_args
from .._pooler import PROBE_NOTIFY_SQL, NotifyProbe, athrough_pooler, through_pooler
from ..ops import OutboxOps, arun, run
from ._core import LOGGER

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["DEAF_WARNING", "AsyncListener", "SyncListener", "WakePipe", "listen_statement"]

#: What a relay logs once when its LISTEN hears nothing, with its name and poll interval:
#: ``LOGGER.warning(DEAF_WARNING, relay.name, poll_seconds)``.
DEAF_WARNING = (
    "relay %s: notifications do not reach its LISTEN connection, which goes through a "
    "connection pooler (PgBouncer in transaction mode?): it publishes only when it polls, "
    "every %g s. Give it a direct connection to PostgreSQL for LISTEN: listen_url= "
    "(sa-outbox relay --listen-url, $SA_OUTBOX_LISTEN_URL; docs/pgbouncer.md)"
)


def listen_statement(channel: str) -> str:
    """``LISTEN "channel"``, quoted.

    Examples:
        >>> listen_statement('a"b')
        'LISTEN "a""b"'
    """
    return 'LISTEN "' + channel.replace('"', '""') + '"'


class WakePipe:
    """A self-pipe: `wake` (safe from a signal handler or another thread) ends a `select`.

    Examples:
        >>> pipe = WakePipe()
        >>> pipe.wake(); pipe.drain()
        True
        >>> pipe.close()
    """

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (already woken) or closed
            os.write(self._write_fd, b"x")

    def drain(self) -> bool:
        """Empty the pipe; True if it had been woken."""
        woken = False
        with contextlib.suppress(OSError):
            while os.read(self.read_fd, 512):
                woken = True
        return woken

    def close(self) -> None:
        for fd in (self.read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class _Base:
    """What `SyncListener` and `AsyncListener` share: the connection and its probe."""

    def __init__(self, connection: Any, probe: NotifyProbe | None = None) -> None:
        self._connection = connection
        self._probe = probe

    def deaf(self) -> bool:
        """True once: the connection goes through a pooler and its test notification is
        overdue (notifications cannot arrive).

        Examples:
            listener.wait(timeout, wake)   # await listener.wait(timeout, stopping)
            if listener.deaf():
                LOGGER.warning(DEAF_WARNING, relay.name, timeout)
        """
        return self._probe is not None and self._probe.expired()


class SyncListener(_Base):
    """A LISTENing psycopg connection for `Relay`; `wait` returns on a notification.

    Examples:
        listener = SyncListener.open(engine, ops)  # None when the driver is not psycopg
    """

    @classmethod
    def open(
        cls, engine: Engine, ops: OutboxOps, listen_url: URL | None = None
    ) -> SyncListener | None:
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency
            return None
        with engine.connect() as conn:
            channel = run(conn, ops.notify_channel())
        if channel is None:
            LOGGER.warning("outbox table %s not found: polling", ops.table.fullname)
            return None
        if listen_url is not None:  # a direct connection, past the engine's pooler
            args, kwargs = listen_connect_args(listen_url.get_dialect()(), listen_url)
            driver: Any = psycopg.connect(*args, **kwargs)
        else:
            raw = engine.raw_connection()
            driver = raw.driver_connection
            if not isinstance(driver, psycopg.Connection):
                raw.close()
                LOGGER.info("the driver is not psycopg 3: polling instead of LISTEN")
                return None
            raw.detach()  # ours alone from now on; closed by close()
        try:
            driver.autocommit = True
            probe = NotifyProbe() if through_pooler(driver) else None
            if probe is not None:
                driver.execute(probe.listen_sql())
            # The outbox's LISTEN goes last: pg_stat_activity then shows the connection by
            # it (its last statement) until the first notification.
            driver.execute(listen_statement(channel))
            if probe is not None:
                with engine.begin() as conn:
                    conn.execute(text(PROBE_NOTIFY_SQL), {"channel": probe.channel})
                probe.start()
        except Exception:
            driver.close()
            raise
        return cls(driver, probe)

    def wait(self, timeout: float, wake: WakePipe) -> None:
        """Until a notification, ``wake``, or ``timeout`` seconds."""
        if self._probe is not None:
            timeout = self._probe.timeout(timeout)
        readable, _, _ = select.select([self._connection.fileno(), wake.read_fd], [], [], timeout)
        if self._connection.fileno() in readable:
            for notify in self._connection.notifies(timeout=0):
                if self._probe is not None:
                    self._probe.seen(notify.channel)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.close()


class AsyncListener(_Base):
    """A LISTENing psycopg async connection for `AsyncRelay`.

    Examples:
        listener = await AsyncListener.open(async_engine, ops)
    """

    @classmethod
    async def open(
        cls, engine: AsyncEngine, ops: OutboxOps, listen_url: URL | None = None
    ) -> AsyncListener | None:
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency
            return None
        async with engine.connect() as conn:
            channel = await arun(conn, ops.notify_channel())
        if channel is None:
            LOGGER.warning("outbox table %s not found: polling", ops.table.fullname)
            return None
        if listen_url is not None:  # a direct connection, past the engine's pooler
            args, kwargs = listen_connect_args(listen_url.get_dialect()(), listen_url)
            driver: Any = await psycopg.AsyncConnection.connect(*args, **kwargs)
        else:
            raw = await engine.raw_connection()
            driver = raw.driver_connection
            if not isinstance(driver, psycopg.AsyncConnection):
                raw.close()
                LOGGER.info("the driver is not psycopg 3: polling instead of LISTEN")
                return None
            raw.detach()
        try:
            await driver.set_autocommit(True)
            probe = NotifyProbe() if await athrough_pooler(driver) else None
            if probe is not None:
                await driver.execute(probe.listen_sql())
            # The outbox's LISTEN goes last (see `SyncListener.open`).
            await driver.execute(listen_statement(channel))
            if probe is not None:
                async with engine.begin() as conn:
                    await conn.execute(text(PROBE_NOTIFY_SQL), {"channel": probe.channel})
                probe.start()
        except Exception:
            await driver.close()
            raise
        return cls(driver, probe)

    async def wait(self, timeout: float, stopping: asyncio.Event) -> None:
        """Until a notification, ``stopping``, or ``timeout`` seconds."""
        if self._probe is not None:
            timeout = self._probe.timeout(timeout)
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = self._connection.fileno()
        loop.add_reader(fd, readable.set)
        waiters = [asyncio.ensure_future(readable.wait()), asyncio.ensure_future(stopping.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(fd)
            for waiter in waiters:
                waiter.cancel()
        if readable.is_set():
            async for notify in self._connection.notifies(timeout=0):
                if self._probe is not None:
                    self._probe.seen(notify.channel)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._connection.close()
