"""Connection poolers (PgBouncer, managed poolers): how to tell one is there, and what breaks.

A pooler in *transaction* mode gives each transaction whichever server connection is free.
Two things a session keeps then stop working:

- psycopg's prepared statements: prepared on one server connection, used on another
  (``DuplicatePreparedStatement: prepared statement "_pg3_0" already exists``).
  PgBouncer 1.21+ with ``max_prepared_statements`` > 0 handles them; before that,
  ``connect_args(transaction_pooler=True)`` turns them off.
- ``LISTEN``: it stays on the server connection that ran it, and notifications for it never
  reach the client. A worker or relay then only polls. ``listen_url=`` gives it a direct
  connection to PostgreSQL, used only for LISTEN.

`through_pooler` tells a pooled connection from a direct one: at connect PostgreSQL tells the
client its backend's process id, and a pooler hands out a made-up one. On a pooled listening
connection, `NotifyProbe` checks that a notification sent through the engine arrives; a
listener warns once when it does not.

Examples:
    >>> probe = NotifyProbe(timer=lambda: 0.0)
    >>> probe.listen_sql().startswith('LISTEN "sa_outbox_probe_')
    True
    >>> probe.start(); probe.timeout(30.0), probe.expired()
    (3.0, False)
    >>> probe.seen(probe.channel), probe.passed
    (True, True)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event

__all__ = [
    "PROBE_SECONDS",
    "NotifyProbe",
    "athrough_pooler",
    "prepare_nothing_behind_a_pooler",
    "through_pooler",
]

#: How long a listener behind a pooler waits for its test notification before it warns.
PROBE_SECONDS = 3.0

#: ``pg_notify(channel, '')``: what a probe sends, through the engine.
PROBE_NOTIFY_SQL = "SELECT pg_notify(:channel, '')"


def through_pooler(connection: Any) -> bool:
    """Whether a psycopg connection reaches PostgreSQL through a pooler.

    PostgreSQL sends the client its backend's pid at connect (``connection.info.backend_pid``);
    a pooler sends one of its own making, which ``pg_backend_pid()`` then contradicts. One
    round trip; run it on a connection in autocommit mode or in a transaction of its own.

    Examples:
        conn = psycopg.connect(url, autocommit=True)
        if through_pooler(conn):
            print("PgBouncer or another pooler is in between")
    """
    info = getattr(connection, "info", None)
    told = getattr(info, "backend_pid", None)
    if not isinstance(told, int):
        return False
    row = connection.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and row[0] != told


async def athrough_pooler(connection: Any) -> bool:
    """`through_pooler` for a psycopg ``AsyncConnection``.

    Examples:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        if await athrough_pooler(conn):
            print("PgBouncer or another pooler is in between")
    """
    told = getattr(getattr(connection, "info", None), "backend_pid", None)
    if not isinstance(told, int):
        return False
    cursor = await connection.execute("SELECT pg_backend_pid()")
    row = await cursor.fetchone()
    return row is not None and row[0] != told


def prepare_nothing_behind_a_pooler(engine: Engine) -> None:
    """Turn psycopg's prepared statements off on each new connection of ``engine`` that
    goes through a pooler (`through_pooler`): what the engines the CLI and the worker
    supervisor make do, so that they run behind PgBouncer in transaction mode as they are.

    Costs one ``SELECT pg_backend_pid()`` per new connection. For an async engine, pass
    its ``sync_engine``.

    Examples:
        engine = create_engine(url, connect_args=connect_args())
        prepare_nothing_behind_a_pooler(engine)
    """

    @event.listens_for(engine, "connect")
    def _check(dbapi_connection: Any, _record: object) -> None:
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        told = getattr(getattr(driver, "info", None), "backend_pid", None)
        if not isinstance(told, int) or getattr(driver, "prepare_threshold", None) is None:
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT pg_backend_pid()")
            row = cursor.fetchone()
        finally:
            cursor.close()
        dbapi_connection.rollback()
        if row is not None and row[0] != told:
            driver.prepare_threshold = None


class NotifyProbe:
    """A test notification on a channel of its own, and whether it came back in time.

    The listener runs `listen_sql` on its connection, sends ``pg_notify(channel, '')``
    through the engine (`PROBE_NOTIFY_SQL`), calls `start`, bounds its waits with `timeout`,
    hands every notification's channel to `seen`, and checks `expired` after each wait.

    Examples:
        >>> now = [0.0]
        >>> probe = NotifyProbe(timer=lambda: now[0])
        >>> probe.start(); now[0] = 5.0
        >>> probe.expired(), probe.expired()  # True once: warn once
        (True, False)
    """

    def __init__(
        self, *, seconds: float = PROBE_SECONDS, timer: Callable[[], float] = time.monotonic
    ) -> None:
        self.channel = f"sa_outbox_probe_{uuid.uuid4().hex}"
        self.seconds = seconds
        self._timer = timer
        self._deadline: float | None = None
        #: The test notification arrived.
        self.passed = False
        #: It did not arrive within ``seconds``.
        self.failed = False

    def listen_sql(self) -> str:
        """``LISTEN`` on the probe's channel.

        Examples:
            >>> NotifyProbe().listen_sql().startswith('LISTEN "sa_outbox_probe_')
            True
        """
        return f'LISTEN "{self.channel}"'

    def start(self) -> None:
        """The test notification was sent: its time starts now.

        Examples:
            >>> probe = NotifyProbe(seconds=3.0, timer=lambda: 10.0)
            >>> probe.start(); probe.timeout(30.0)
            3.0
        """
        self._deadline = self._timer() + self.seconds

    def seen(self, channel: str) -> bool:
        """Whether a notification on ``channel`` is the probe's (then not the caller's).

        Examples:
            >>> probe = NotifyProbe()
            >>> probe.seen("public.outbox"), probe.seen(probe.channel), probe.passed
            (False, True, True)
        """
        if channel != self.channel:
            return False
        self.passed = True
        return True

    def timeout(self, default: float) -> float:
        """How long the next wait may last: ``default``, or less while the probe waits.

        Examples:
            >>> now = [0.0]
            >>> probe = NotifyProbe(seconds=3.0, timer=lambda: now[0])
            >>> probe.timeout(30.0)  # not started: no bound
            30.0
            >>> probe.start(); now[0] = 1.0; probe.timeout(30.0)
            2.0
        """
        if self.passed or self.failed or self._deadline is None:
            return default
        return max(0.0, min(default, self._deadline - self._timer()))

    def expired(self) -> bool:
        """True once, the first time it is asked after the deadline with nothing arrived.

        Examples:
            >>> now = [0.0]
            >>> probe = NotifyProbe(seconds=3.0, timer=lambda: now[0])
            >>> probe.start(); now[0] = 3.0
            >>> probe.expired(), probe.expired(), probe.failed
            (True, False, True)
        """
        if self.passed or self.failed or self._deadline is None:
            return False
        if self._timer() < self._deadline:
            return False
        self.failed = True
        return True
