"""Client-side timeouts for the connections a queue depends on: `connect_args`.

A worker or a relay waits on the network in three places: connecting, sending, and waiting
for an answer. Without client-side limits a dropped network (a firewall that discards
packets, a host that vanished) holds each of those for as long as the operating system
allows — minutes, during which heartbeats stop and handlers run past their lease. libpq's
parameters bound them: ``connect_timeout`` the connection, ``tcp_user_timeout`` a send that
is never acknowledged, TCP keepalives a wait for an answer that never comes. The server
knows nothing of a dead client either, so ``statement_timeout`` / ``lock_timeout`` (sent as
``options``) bound what a session may hold.

Example:
    >>> args = connect_args()
    >>> args["connect_timeout"], args["keepalives_idle"], args["tcp_user_timeout"]
    (10, 10, 30000)
    >>> connect_args(statement_timeout=60)["options"]
    '-c statement_timeout=60000'
"""

from __future__ import annotations

import datetime as dt

from ._exceptions import InvalidArgumentType
from ._validation import duration

__all__ = ["connect_args"]


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
) -> dict[str, object]:
    """libpq parameters for ``create_engine(url, connect_args=connect_args())``.

    With the defaults a connection attempt gives up after 10 s, a silent peer is found dead
    after about 25 s of waiting (10 s idle, then 3 probes 5 s apart), and a send nobody
    acknowledges fails after 30 s. ``statement_timeout`` / ``lock_timeout`` (seconds), when
    given, apply to every session of the engine: leave them unset if the same engine runs
    your own long statements.

    Example:
        engine = create_engine(os.environ["DATABASE_URL"], connect_args=sa_outbox.connect_args())
        Worker(app, engine).run()
    """
    if isinstance(keepalives_count, bool) or not isinstance(keepalives_count, int):
        raise InvalidArgumentType(f"keepalives_count must be an int, got {keepalives_count!r}")
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
    return args
