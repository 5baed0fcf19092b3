"""Client-side timeouts for the connections a queue depends on: `connect_args`.

A worker or a relay waits on the network in three places: connecting, sending, and waiting
for an answer. Without client-side limits a dropped network (a firewall that discards
packets, a host that vanished) holds each of those for as long as the operating system
allows — minutes, during which heartbeats stop and handlers run past their lease. libpq's
parameters bound them: ``connect_timeout`` the connection, ``tcp_user_timeout`` a send that
is never acknowledged, TCP keepalives a wait for an answer that never comes. The server
knows nothing of a dead client either, so ``statement_timeout`` / ``lock_timeout`` (sent as
``options``) bound what a session may hold.

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

import datetime as dt
from typing import Any

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from ._exceptions import InvalidArgument, InvalidArgumentType
from ._validation import duration

__all__ = ["check_listen_url", "connect_args", "listen_connect_args"]


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
