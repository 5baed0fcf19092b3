"""Client-side timeouts for the connections a queue depends on: `connect_args`.

A worker or a relay waits on the network in three places: connecting, sending, and waiting
for an answer. Without client-side limits a dropped network (a firewall that discards
packets, a host that vanished) holds each of those for as long as the operating system
allows — minutes, during which heartbeats stop and handlers run past their lease. libpq's
parameters bound them: ``connect_timeout`` the connection, ``tcp_user_timeout`` a send that
is never acknowledged, TCP keepalives a wait for an answer that never comes. The server
knows nothing of a dead client either, so ``statement_timeout`` / ``lock_timeout`` (sent as
``options``) bound what a session may hold.

An engine handed to the worker, the relay or the maintenance runners gets these defaults
without asking (`harden`): its new connections take whichever of them the engine's URL and
``connect_args`` leave unset, and the ones already in its pool get the same TCP settings on
their socket at their next checkout. Each also gives its session the server's TCP settings
of the same meaning (`server_side`): without them a backend whose client vanished inside a
transaction keeps its row locks for the operating system's two hours.

Behind a transaction pooler (PgBouncer in ``pool_mode = transaction``, managed poolers)
``transaction_pooler=True`` also turns off psycopg's prepared statements, which such a
pooler moves between server connections (docs/pgbouncer.md).

Examples:
    >>> args = connect_args()
    >>> args["connect_timeout"], args["keepalives_idle"], args["tcp_user_timeout"]
    (10, 10, 30000)
    >>> connect_args(statement_timeout=60)["options"]
    '-c statement_timeout=60000'
    >>> connect_args(transaction_pooler=True)["prepare_threshold"] is None
    True
"""

from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Collection
from typing import Any

from sqlalchemy import URL, Engine, event, make_url
from sqlalchemy.exc import ArgumentError

from ._exceptions import InvalidArgument, InvalidArgumentType
from ._validation import duration

_log = logging.getLogger("sa_outbox")

__all__ = [
    "check_listen_url",
    "connect_args",
    "describe",
    "harden",
    "in_use",
    "interrupt",
    "listen_connect_args",
    "server_side",
    "unprotected",
]


def _ms(value: dt.timedelta | float, what: str) -> int:
    return int(duration(value, what).total_seconds() * 1000)


def _whole_seconds(value: dt.timedelta | float, what: str) -> int:
    return max(1, round(duration(value, what).total_seconds()))


def connect_args(
    *,
    connect_timeout: dt.timedelta | float = 10,
    keepalives_idle: dt.timedelta | float = 10,
    keepalives_interval: dt.timedelta | float = 5,
    keepalives_count: int = 3,
    tcp_user_timeout: dt.timedelta | float = 30,
    statement_timeout: dt.timedelta | float | None = None,
    lock_timeout: dt.timedelta | float | None = None,
    transaction_pooler: bool = False,
) -> dict[str, object]:
    """libpq parameters for ``create_engine(url, connect_args=connect_args())``.

    With the defaults a connection attempt gives up after 10 s, a silent peer is found dead
    after about 25 s of waiting (10 s idle, then 3 probes 5 s apart), and a send nobody
    acknowledges fails after 30 s. ``statement_timeout`` / ``lock_timeout`` (seconds), when
    given, apply to every session of the engine: leave them unset if the same engine runs
    your own long statements.

    ``transaction_pooler=True``: the URL points at a pooler in transaction mode (PgBouncer
    before 1.21, or without ``max_prepared_statements``; most managed poolers). psycopg then
    prepares no statement (``prepare_threshold=None``), and ``statement_timeout`` /
    ``lock_timeout`` are refused: a pooler rejects the ``options`` startup parameter (or
    drops it), so set them on the role instead (``ALTER ROLE app SET statement_timeout =
    '60s'``). LISTEN needs a direct connection then: give the worker and the relay
    ``listen_url=`` (docs/pgbouncer.md).

    Examples:
        engine = create_engine(os.environ["DATABASE_URL"], connect_args=sa_outbox.connect_args())
        Worker(app, engine).run()

        # behind PgBouncer in transaction mode
        pooled = create_engine(
            os.environ["DATABASE_URL"],
            connect_args=sa_outbox.connect_args(transaction_pooler=True),
        )
        Worker(app, pooled, listen_url=os.environ["DIRECT_DATABASE_URL"]).run()
    """
    if isinstance(keepalives_count, bool) or not isinstance(keepalives_count, int):
        raise InvalidArgumentType(f"keepalives_count must be an int, got {keepalives_count!r}")
    if not isinstance(transaction_pooler, bool):
        raise InvalidArgumentType(f"transaction_pooler must be a bool, got {transaction_pooler!r}")
    if transaction_pooler and (statement_timeout is not None or lock_timeout is not None):
        raise InvalidArgument(
            "statement_timeout and lock_timeout cannot pass through a transaction pooler "
            "(it refuses or drops the startup 'options'); set them on the role instead: "
            "ALTER ROLE app SET statement_timeout = '60s'"
        )
    args: dict[str, object] = {
        "connect_timeout": _whole_seconds(connect_timeout, "connect_timeout"),
        "keepalives": 1,
        "keepalives_idle": _whole_seconds(keepalives_idle, "keepalives_idle"),
        "keepalives_interval": _whole_seconds(keepalives_interval, "keepalives_interval"),
        "keepalives_count": keepalives_count,
        "tcp_user_timeout": _ms(tcp_user_timeout, "tcp_user_timeout"),
    }
    options = []
    if statement_timeout is not None:
        options.append(f"-c statement_timeout={_ms(statement_timeout, 'statement_timeout')}")
    if lock_timeout is not None:
        options.append(f"-c lock_timeout={_ms(lock_timeout, 'lock_timeout')}")
    if options:
        args["options"] = " ".join(options)
    if transaction_pooler:
        args["prepare_threshold"] = None
    return args


def listen_connect_args(dialect: Any, url: str | URL) -> tuple[list[Any], dict[str, Any]]:
    """``psycopg.connect(*args, **kwargs)`` for a ``listen_url``: its parameters, and the
    client-side timeouts of `connect_args` where the URL sets none.

    Examples:
        >>> from sqlalchemy.dialects.postgresql import psycopg
        >>> args, kwargs = listen_connect_args(
        ...     psycopg.dialect(), "postgresql+psycopg://app@db:5432/app?connect_timeout=3"
        ... )
        >>> kwargs["host"], kwargs["connect_timeout"], kwargs["keepalives_idle"]
        ('db', '3', 10)
    """
    args, kwargs = dialect.create_connect_args(make_url(url))
    merged: dict[str, Any] = connect_args()
    merged.update(kwargs)
    return list(args), merged


def check_listen_url(listen_url: str | URL | None) -> URL | None:
    """``listen_url`` parsed: a PostgreSQL URL (on psycopg 3, which LISTEN needs), or ``None``.

    Examples:
        >>> check_listen_url("postgresql+psycopg://app@db:5432/app").host
        'db'
        >>> check_listen_url("sqlite://")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: listen_url must be a PostgreSQL URL, got 'sqlite://'
    """
    if listen_url is None:
        return None
    if not isinstance(listen_url, str | URL):
        raise InvalidArgumentType(f"listen_url must be a str or a URL, got {listen_url!r}")
    try:
        url = make_url(listen_url)
    except ArgumentError:
        raise InvalidArgument("listen_url could not be parsed as a database URL") from None
    backend, _, driver = url.drivername.partition("+")
    if backend not in ("postgresql", "postgres"):
        shown = url.render_as_string(hide_password=True)
        raise InvalidArgument(f"listen_url must be a PostgreSQL URL, got {shown!r}")
    # LISTEN runs on psycopg 3 whatever the engine's driver: the URL names only where to go.
    return url.set(drivername="postgresql+psycopg") if driver != "psycopg" else url


# -- engines handed to the library ----------------------------------------------------------

#: The drivers whose connect() takes libpq's parameters (the async psycopg dialect's too).
_LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg2"})
#: `connection_record.info` key: the connection has the client-side TCP limits (libpq's
#: parameters at connect, or socket options set by `harden` on one made before).
_GUARDED = "sa_outbox.guarded"
#: The names `unprotected` looks for among a connection's libpq parameters.
_WATCHED = ("connect_timeout", "keepalives_idle", "tcp_user_timeout")


class _CheckedOut:
    """The connections of one engine's pool checked out now, with the thread that took
    each (the worker breaks those of its own threads when its grace period is over)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_record: dict[int, tuple[int, Any]] = {}


_hardened: weakref.WeakKeyDictionary[Any, _CheckedOut] = weakref.WeakKeyDictionary()
_install_lock = threading.Lock()


def _sync_engine(engine: object) -> Engine | None:
    target = getattr(engine, "sync_engine", engine)  # an AsyncEngine's sync engine
    return target if isinstance(target, Engine) else None


def harden(engine: object) -> bool:
    """Give ``engine``'s connections the client-side timeouts of `connect_args` that its
    URL and ``connect_args`` leave unset; the worker, the relay and the maintenance
    runners call it on the engine they are handed. Returns whether the engine is guarded
    (a PostgreSQL engine on psycopg or psycopg2; another driver is left as it is).

    New connections get the parameters at connect (a ``do_connect`` listener that fills
    in only what is missing: a value the user set wins); the connections already in the
    pool get the same TCP settings on their socket at their next checkout (keepalives
    after 10 s idle, 3 probes 5 s apart; unacknowledged sends given up after 30 s).
    Installed once per engine (and the engines made from it with ``execution_options``);
    SQLAlchemy still sees the statements as before: no statement listener is added.

    Examples:
        >>> from sqlalchemy import create_engine
        >>> engine = create_engine("postgresql+psycopg://app@db/app")
        >>> harden(engine), harden(engine)  # once: the second call finds it done
        (True, True)
        >>> harden(create_engine("sqlite://"))
        False
    """
    sync = _sync_engine(engine)
    if sync is None:
        return False
    dialect = sync.dialect
    if dialect.name != "postgresql" or dialect.driver not in _LIBPQ_DRIVERS:
        return False
    with _install_lock:
        if dialect in _hardened:
            return True
        checked_out = _hardened[dialect] = _CheckedOut()
    defaults = {name: value for name, value in connect_args().items() if name not in ("options",)}

    def do_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        for name, value in defaults.items():
            cparams.setdefault(name, value)
        if record is not None:
            record.info[_GUARDED] = True
            record.info[_SERVER_SIDE] = server_side(cparams)

    def connect(dbapi_connection: Any, record: Any) -> None:
        settings = record.info.pop(_SERVER_SIDE, None)
        if settings is not None:
            _set_server_side(dbapi_connection, settings)

    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        info = record.info
        if not info.get(_GUARDED):
            info[_GUARDED] = True  # tried once: a socket that refuses is left as it is
            if _guard_socket(record.driver_connection):
                _set_server_side(dbapi_connection, server_side(connect_args()))
        with checked_out.lock:
            checked_out.by_record[id(record)] = (threading.get_ident(), record)

    def checkin(dbapi_connection: Any, record: Any) -> None:
        with checked_out.lock:
            checked_out.by_record.pop(id(record), None)

    event.listen(sync, "do_connect", do_connect)
    event.listen(sync.pool, "connect", connect)
    event.listen(sync.pool, "checkout", checkout)
    event.listen(sync.pool, "checkin", checkin)
    event.listen(sync.pool, "detach", checkin)
    return True


#: `connection_record.info` key: the server-side settings `harden`'s ``connect`` listener
#: gives a connection just made.
_SERVER_SIDE = "sa_outbox.server_side"
#: The server's own TCP settings for a session, from libpq's parameter of the same meaning.
_SERVER_NAMES = {
    "keepalives_idle": "tcp_keepalives_idle",
    "keepalives_interval": "tcp_keepalives_interval",
    "keepalives_count": "tcp_keepalives_count",
    "tcp_user_timeout": "tcp_user_timeout",
}
#: Sets each only where nothing but the built-in default decides it: a value from
#: postgresql.conf, ``ALTER ROLE/DATABASE ... SET`` or the startup ``options`` wins (its
#: ``source`` is not ``default``); a server without one of them (tcp_user_timeout came in
#: PostgreSQL 12) has no row for it.
_SET_SERVER_SIDE = (
    "SELECT set_config(s.name, v.value, false) FROM pg_catalog.pg_settings AS s "
    "JOIN (VALUES {values}) AS v(name, value) ON v.name = s.name WHERE s.source = 'default'"
)


def server_side(params: dict[str, Any]) -> dict[str, int]:
    """The server's TCP settings for a session whose client uses libpq ``params``: the same
    keepalives and unacknowledged-send limit, so that the server also finds a silent client
    dead (and ends its transaction, freeing its row locks) instead of waiting for the
    operating system's two hours.

    Examples:
        >>> server_side(connect_args())["tcp_keepalives_idle"]
        10
        >>> server_side({"keepalives": "0", "tcp_user_timeout": "3000"})
        {'tcp_user_timeout': 3000}
    """
    settings = {}
    for name, setting in _SERVER_NAMES.items():
        if name != "tcp_user_timeout" and str(params.get("keepalives", "1")) == "0":
            continue
        try:
            value = int(params[name])
        except (KeyError, TypeError, ValueError):
            continue
        if value > 0:
            settings[setting] = value
    return settings


def _set_server_side(dbapi_connection: Any, settings: dict[str, int]) -> None:
    """Give the session ``settings`` (`server_side`) in autocommit: one round trip when the
    connection is made. A server or a pooler that refuses is left as it is: these only
    bound how long the server keeps a dead client."""
    if not settings:
        return
    values = ", ".join(f"('{name}', '{value}')" for name, value in settings.items())
    try:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(_SET_SERVER_SIDE.format(values=values))
            finally:
                cursor.close()
        finally:
            dbapi_connection.autocommit = autocommit
    except Exception as exc:
        _log.debug("the server's TCP settings were not set: %s", exc)


def _guard_socket(driver_connection: Any) -> bool:
    """Set `connect_args`' TCP settings on the socket of a connection made without them
    (before `harden`); a connection that has its own libpq parameters is left alone."""
    if driver_connection is None or _given(driver_connection).intersection(_WATCHED):
        return False
    try:
        sock = _socket_of(driver_connection)
    except (AttributeError, OSError, ValueError):
        return False
    with sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        defaults = connect_args()
        options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, key in (
            ("TCP_KEEPIDLE", "keepalives_idle"),
            ("TCP_KEEPINTVL", "keepalives_interval"),
            ("TCP_KEEPCNT", "keepalives_count"),
            ("TCP_USER_TIMEOUT", "tcp_user_timeout"),
        ):
            if hasattr(socket, name):  # Linux has them all; other systems some
                value = defaults[key]
                assert isinstance(value, int)
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
        try:
            for level, option, value in options:
                sock.setsockopt(level, option, value)
        except OSError:
            return False
    return True


def _socket_of(driver_connection: Any) -> socket.socket:
    """A socket object on a duplicate of the connection's descriptor (its family and type
    read from it): options and shutdown reach the connection's socket, closing it does
    not close the connection."""
    duplicate = os.dup(driver_connection.fileno())
    try:
        return socket.socket(fileno=duplicate)
    except OSError:
        os.close(duplicate)
        raise


def _given(driver_connection: Any) -> set[str]:
    """The libpq parameters a psycopg 3 connection was made with (empty if unknown)."""
    get = getattr(getattr(driver_connection, "info", None), "get_parameters", None)
    if get is None:
        return set()
    try:
        return set(get())
    except Exception:  # a closed connection
        return set()


def unprotected(pool_connection: Any) -> list[str]:
    """Which of ``connect_timeout``, ``keepalives_idle``, ``tcp_user_timeout`` a pooled
    connection (``conn.connection``) lacks, when neither its parameters nor `harden` gave
    them: empty when it is guarded, all three for a driver that cannot tell (asyncpg).

    Examples:
        >>> unprotected(None)
        []
    """
    if pool_connection is None:
        return []
    info = getattr(pool_connection, "info", None)
    if isinstance(info, dict) and info.get(_GUARDED):
        return []
    driver = getattr(pool_connection, "driver_connection", None)
    if getattr(getattr(driver, "info", None), "get_parameters", None) is None:
        return list(_WATCHED)
    given = _given(driver)
    return [name for name in _WATCHED if name not in given]


def in_use(engine: object, threads: Collection[int]) -> list[Any]:
    """The driver connections of ``engine``'s pool checked out now by ``threads`` (thread
    idents), for a hardened engine (`harden`); empty otherwise.

    Examples:
        >>> from sqlalchemy import create_engine
        >>> in_use(create_engine("sqlite://"), [threading.get_ident()])
        []
    """
    sync = _sync_engine(engine)
    checked_out = None if sync is None else _hardened.get(sync.dialect)
    if checked_out is None:
        return []
    with checked_out.lock:
        records = [record for ident, record in checked_out.by_record.values() if ident in threads]
    return [conn for record in records if (conn := record.driver_connection) is not None]


def interrupt(driver_connection: Any, *, cancel_timeout: float = 1.0) -> str:
    """Break a statement that a connection waits on: ask the server to cancel it (psycopg
    3.2's ``cancel_safe``, bounded by ``cancel_timeout``: a dead network never answers),
    then shut the socket down, which returns a thread blocked reading it at once. Returns
    what was done, for the log.

    Examples:
        >>> interrupt(None)
        'nothing to interrupt'
    """
    if driver_connection is None:
        return "nothing to interrupt"
    done = []
    cancel_safe = getattr(driver_connection, "cancel_safe", None)
    if inspect.iscoroutinefunction(cancel_safe):  # an AsyncConnection: asyncio cancels it
        cancel_safe = None
    if cancel_safe is not None and cancel_timeout > 0:
        started = time.monotonic()
        try:
            cancel_safe(timeout=cancel_timeout)
        except Exception as exc:
            spent = time.monotonic() - started
            done.append(f"cancel failed after {spent:.1f} s ({type(exc).__name__})")
        else:
            done.append("cancel sent")
    try:
        sock = _socket_of(driver_connection)
    except Exception:  # closed already
        done.append("socket already closed")
    else:
        with sock, contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
            done.append("socket shut down")
    return ", ".join(done)


def describe(driver_connection: Any) -> str:
    """``host:port (backend pid N)`` of a psycopg connection, for the log.

    Examples:
        >>> describe(None)
        'a connection'
    """
    info = getattr(driver_connection, "info", None)
    if info is None:
        return "a connection"
    try:
        where = f"{info.host}:{info.port}"
        pid = info.backend_pid
    except Exception:
        return "a connection"
    return f"{where} (backend pid {pid})" if pid else where
