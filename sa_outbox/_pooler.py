"""Connection poolers (PgBouncer, managed poolers): how to tell one is there, and what breaks.

A pooler in *transaction* mode gives each transaction whichever server connection is free.
Two things a session keeps then stop working:

- psycopg's prepared statements: prepared on one server connection, used on another
  (``DuplicatePreparedStatement: prepared statement "_pg3_0" already exists``).
  PgBouncer 1.21+ with ``max_prepared_statements`` > 0 handles them; before that,
  ``connect_args(transaction_pooler=True)`` turns them off, and so does
  `prepare_for_pooler`, which every runtime calls on the engine it is handed: it checks
  each connection once and turns them off on those that go through a pooler. Should one
  still fail (a pooler that passes the server's pid on), `note_prepared_statement_error`
  turns them off on all the engine's connections, and the runtime retries.
- ``LISTEN``: it stays on the server connection that ran it, and notifications for it never
  reach the client. A worker or relay then only polls. ``listen_url=`` gives it a direct
  connection to PostgreSQL, used only for LISTEN.

`through_pooler` tells a pooled connection from a direct one: at connect PostgreSQL tells the
client its backend's process id, and a pooler (PgBouncer in any mode) hands out a made-up
one. On a pooled listening
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

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event

from ._exceptions import InvalidArgumentType

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "PREPARED_STATEMENT_STATES",
    "PROBE_SECONDS",
    "NotifyProbe",
    "PoolerGuard",
    "athrough_pooler",
    "is_prepared_statement_error",
    "note_prepared_statement_error",
    "pooler_guard",
    "prepare_for_pooler",
    "through_pooler",
]

log = logging.getLogger("sa_outbox")

#: How long a listener behind a pooler waits for its test notification before it warns.
PROBE_SECONDS = 3.0

#: ``pg_notify(channel, '')``: what a probe sends, through the engine.
PROBE_NOTIFY_SQL = "SELECT pg_notify(:channel, '')"

#: SQLSTATEs of psycopg's prepared statements moved between server connections by a pooler:
#: 42P05 duplicate_prepared_statement, 26000 invalid_sql_statement_name ("does not exist").
PREPARED_STATEMENT_STATES = frozenset({"42P05", "26000"})

#: The `PoolerGuard` of each engine `prepare_for_pooler` was given (its sync engine).
_GUARDS: weakref.WeakKeyDictionary[Engine, PoolerGuard] = weakref.WeakKeyDictionary()
_GUARDS_LOCK = threading.Lock()
#: ``record.info`` key: the driver connection checked on that pool record (direct).
_CHECKED = "sa_outbox_pooler_checked"


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


def prepare_for_pooler(engine: object) -> None:
    """Make ``engine`` safe behind a transaction pooler: every connection it hands out is
    checked once (`through_pooler`, one ``SELECT pg_backend_pid()`` the first time it is
    checked out, so the first connection a runtime takes is its probe at start), and psycopg
    prepares nothing on one that goes through a pooler (``prepare_threshold = None``).

    Every runtime that is handed an engine (`Worker`, `AsyncWorker`, the relays, the
    reclaimers, the maintenance tasks, ``JobQueue.enqueue(engine, …)``) calls it, so a plain
    ``create_engine(pgbouncer_url)`` works as it is, for the application's sessions on that
    engine too; an engine the library never sees needs
    ``connect_args(transaction_pooler=True)``. Calling it again on the same engine does
    nothing; a direct connection keeps its prepared statements. It adds a pool event
    listener (``checkout``), not a statement one: the worker's statements stay on psycopg's
    cursor (`sa_outbox.worker._direct`). Anything but an engine is left alone.

    Examples:
        >>> from sqlalchemy import create_engine
        >>> engine = create_engine("postgresql+psycopg://app@pgbouncer:6432/app")
        >>> prepare_for_pooler(engine); prepare_for_pooler(engine)  # once is enough
        >>> pooler_guard(engine).forced
        False
    """
    _guard(engine)


def _guard(engine: object) -> PoolerGuard | None:
    sync = getattr(engine, "sync_engine", engine)
    if not isinstance(sync, Engine):
        return None  # not an engine: its receiver says so
    guard = _GUARDS.get(sync)
    if guard is not None:
        return guard
    with _GUARDS_LOCK:
        guard = _GUARDS.get(sync)
        if guard is None:
            guard = _GUARDS[sync] = PoolerGuard()
            event.listen(sync, "checkout", guard.on_checkout)
    return guard


def pooler_guard(engine: Engine | AsyncEngine) -> PoolerGuard:
    """The `PoolerGuard` `prepare_for_pooler` put on ``engine`` (installing it if needed).

    Examples:
        >>> from sqlalchemy import create_engine
        >>> pooler_guard(create_engine("postgresql+psycopg://")).pooled
        0
    """
    guard = _guard(engine)
    if guard is None:
        raise InvalidArgumentType(f"expected an Engine or an AsyncEngine, got {engine!r}")
    return guard


def is_prepared_statement_error(error: BaseException) -> bool:
    """Whether ``error`` is psycopg's prepared statements meeting a transaction pooler:
    ``prepared statement "_pg3_0" already exists`` (42P05) or ``does not exist`` (26000),
    raised by psycopg or wrapped by SQLAlchemy.

    Examples:
        >>> is_prepared_statement_error(ValueError("no"))
        False
    """
    original = getattr(error, "orig", None) or error
    return getattr(original, "sqlstate", None) in PREPARED_STATEMENT_STATES


def note_prepared_statement_error(engine: object, error: BaseException) -> bool:
    """After ``error``: if it is `is_prepared_statement_error` (a pooler that the check at
    checkout did not see), psycopg prepares nothing any more on any connection of
    ``engine`` (from their next checkout), and it says so once in the log. Returns whether
    it was such an error: the caller then retries what failed (its connection was
    discarded, or goes back to the pool and comes out of it without prepares).

    Examples:
        >>> from sqlalchemy import create_engine
        >>> note_prepared_statement_error(create_engine("postgresql+psycopg://"), OSError())
        False
    """
    if not is_prepared_statement_error(error):
        return False
    guard = _guard(engine)
    if guard is not None and not guard.forced:
        guard.forced = True
        log.warning(
            "prepared statement error through a connection pooler (%s): psycopg prepares "
            "nothing more on this engine's connections; pass "
            "connect_args=sa_outbox.connect_args(transaction_pooler=True) to create_engine "
            "to start that way (docs/pgbouncer.md)",
            str(error).strip().splitlines()[0] if str(error) else type(error).__name__,
        )
    return True


class PoolerGuard:
    """What `prepare_for_pooler` keeps per engine: its ``checkout`` listener, how many
    connections it found going through a pooler (``pooled``), and ``forced``: a prepared
    statement error was met (`note_prepared_statement_error`), so no connection of the
    engine prepares anything, pooled-looking or not.

    Examples:
        >>> guard = PoolerGuard()
        >>> guard.pooled, guard.forced
        (0, False)
    """

    def __init__(self) -> None:
        self.pooled = 0
        self.forced = False

    def on_checkout(self, dbapi_connection: Any, record: Any, _proxy: object) -> None:
        """The ``checkout`` listener: check each connection once (see `prepare_for_pooler`)."""
        driver = getattr(dbapi_connection, "driver_connection", None) or dbapi_connection
        if getattr(driver, "prepare_threshold", None) is None:
            return  # not psycopg, or prepares nothing already
        if self.forced:
            driver.prepare_threshold = None
            return
        info = record.info
        if info.get(_CHECKED) is driver:
            return  # a direct connection, checked before
        if _pooled(dbapi_connection, driver):
            driver.prepare_threshold = None
            self.pooled += 1
        info[_CHECKED] = driver


def _pooled(dbapi_connection: Any, driver: Any) -> bool:
    # `through_pooler` through the DBAPI connection (the async adapter's cursor awaits for
    # us), then rolled back: the connection goes to its user as the pool gave it.
    told = getattr(getattr(driver, "info", None), "backend_pid", None)
    if not isinstance(told, int):
        return False
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_connection.rollback()
    return row is not None and row[0] != told


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
