"""What every command shares: the database URL, engines, argument types, logging."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import math
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Table, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from .._connect_args import connect_args
from .._exceptions import InvalidArgument, SaOutboxError
from .._loading import import_target
from .._pooler import prepare_for_pooler
from .._sqlstate import is_not_ready
from ..metrics import JsonFormatter
from ..schema import resolve_table
from ..worker import JobApp

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

#: The environment variable commands read the database URL from when none is given.
ENV_DATABASE_URL = "SA_OUTBOX_DATABASE_URL"
#: The application's own variable, read when `ENV_DATABASE_URL` is not set either.
ENV_APP_DATABASE_URL = "DATABASE_URL"
#: Where ``worker`` and ``relay`` take a direct URL for LISTEN from, when not given one
#: (behind PgBouncer in transaction mode; docs/pgbouncer.md).
ENV_LISTEN_URL = "SA_OUTBOX_LISTEN_URL"
#: Where every command looks for the database, in this order, as ``--help`` states it.
DATABASE_URL_ORDER = f"--database-url URL, else ${ENV_DATABASE_URL}, else ${ENV_APP_DATABASE_URL}"


Handler = Callable[[argparse.Namespace], int]


# Drivers the commands (all synchronous) run on instead of an asyncio one or none at all.
_SYNC_DRIVER = {"": "psycopg", "psycopg_async": "psycopg", "asyncpg": "psycopg"}


class CommandError(SaOutboxError):
    """A command could not do its work; ``main`` prints the message and exits with 1.

    Examples:
        >>> str(CommandError("cannot connect"))
        'cannot connect'
    """

    __module__ = "sa_outbox.cli"  # its public home, as tracebacks show it


class CommandParser(argparse.ArgumentParser):
    """The parser of a command (or of an action of one): an argument it does not know is
    reported by it, with its own usage, not by the top-level parser after it returns.

    Examples:
        >>> top = argparse.ArgumentParser(prog="sa-outbox")
        >>> top.add_subparsers(parser_class=CommandParser).add_parser("health").prog
        'sa-outbox health'
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        found, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return found, extras


def database_url(raw: str) -> URL:
    """Parse a PostgreSQL URL for the commands, on psycopg 3 unless it names a sync driver.

    ``postgres://`` and ``postgresql://`` (as many hosts hand them out) and the asyncio
    drivers become ``postgresql+psycopg://``; other databases are refused.

    Examples:
        >>> database_url("postgres://app:secret@db:5432/app").render_as_string()
        'postgresql+psycopg://app:***@db:5432/app'
        >>> database_url("sqlite:///app.db")
        Traceback (most recent call last):
        ...
        sa_outbox.cli.CommandError: sa-outbox needs PostgreSQL, but the database URL is for 'sqlite'
    """
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise CommandError(_unparsable(raw)) from None
    backend, _, driver = url.drivername.partition("+")
    if backend not in ("postgresql", "postgres"):
        raise CommandError(f"sa-outbox needs PostgreSQL, but the database URL is for {backend!r}")
    if url.port is not None and not 0 < url.port < 65536:
        raise CommandError(f"the database URL's port {url.port} is not between 1 and 65535")
    url = url.set(drivername=f"postgresql+{_SYNC_DRIVER.get(driver, driver)}")
    try:
        url.get_dialect()
    except NoSuchModuleError:
        raise CommandError(
            f"the database URL names an unknown PostgreSQL driver {driver!r}; use "
            "postgresql+psycopg://user:password@host:5432/dbname (or postgresql://)"
        ) from None
    return url


def _unparsable(raw: str) -> str:
    """What is wrong with a URL SQLAlchemy could not parse, without its password.

    Examples:
        >>> _unparsable("postgresql://app:secret@db:five/app")
        "the database URL's port 'five' is not a number"
        >>> _unparsable("postgresql://app@[::1/app")
        "the database URL's host '[::1' has no closing ']' (an IPv6 address goes in [ ])"
    """
    _, scheme, rest = raw.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2] if scheme else ""
    if host.startswith("[") and "]" not in host:
        return f"the database URL's host {host!r} has no closing ']' (an IPv6 address goes in [ ])"
    port = host.rpartition("]")[2] if host.startswith("[") else host
    if ":" in port:
        given = port.rpartition(":")[2]
        if not given.isdigit():
            return f"the database URL's port {given!r} is not a number"
    return (
        "the database URL could not be parsed; expected something like "
        "postgresql+psycopg://user:password@host:5432/dbname"
    )


def _engine(url: URL, application_name: str | None = None) -> Engine:
    args = connect_args()
    if application_name is not None and "application_name" not in url.query:
        args["application_name"] = application_name  # the URL's own name wins
    try:
        engine = create_engine(url, connect_args=args)
        prepare_for_pooler(engine)  # PgBouncer in transaction mode
        return engine
    except ImportError as exc:
        raise CommandError(
            f"the PostgreSQL driver for {url.drivername} could not be loaded ({exc}); "
            'install psycopg with its binary build: pip install "sa-outbox[binary]"'
        ) from exc


def _names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {value!r}")
    return names


def _whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def _not_negative_int(value: str) -> int:
    number = _whole_number(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return number


def _positive_int(value: str) -> int:
    number = _whole_number(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be more than zero, got {value}")
    return number


def _seconds(value: str, *, allow_zero: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "more than zero"
        raise argparse.ArgumentTypeError(f"must be {bound} seconds, got {value}")
    try:
        dt.timedelta(seconds=number)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"is too large, got {value} seconds") from None
    return number


def positive_seconds(value: str) -> float:
    """A command's number of seconds: finite and more than zero (``nan``, ``inf`` refused).

    Examples:
        >>> positive_seconds("2.5")
        2.5
        >>> positive_seconds("inf")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: must be a finite number of seconds, got 'inf'
    """
    return _seconds(value, allow_zero=False)


def seconds_or_zero(value: str) -> float:
    """A command's number of seconds where 0 means "none at all": finite and not negative.

    Examples:
        >>> seconds_or_zero("0")
        0.0
        >>> seconds_or_zero("nan")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: must be a finite number of seconds, got 'nan'
    """
    return _seconds(value, allow_zero=True)


def _import_target(target: str) -> object:
    try:
        return import_target(target, example="myapp.models:Job")
    except InvalidArgument as exc:
        raise CommandError(str(exc)) from None
    except Exception as exc:  # the module itself is broken: say where, in one line
        module = target.partition(":")[0]
        where = ""
        if isinstance(exc, SyntaxError):
            where = f" ({exc.filename}, line {exc.lineno})"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CommandError(
            f"importing {module!r} failed: {type(exc).__name__}: {reason}{where}"
        ) from None


def load_table(target: str) -> Table:
    """The table of the model (or `Table`, or `JobApp`) at ``module:attribute``.

    Examples:
        >>> load_table("json:dumps")
        Traceback (most recent call last):
        ...
        sa_outbox.cli.CommandError: json:dumps is not a job or outbox model, a Table nor a JobApp
    """
    found = _import_target(target)
    if isinstance(found, JobApp):
        found = found.model
    try:
        return resolve_table(found)
    except SaOutboxError:
        raise CommandError(f"{target} is not a job or outbox model, a Table nor a JobApp") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> dt.timedelta:
    """A duration as the commands take it: a whole number above 0 and a unit (s, m, h, d, w).

    Examples:
        >>> parse_duration("7d"), parse_duration("90s")
        (datetime.timedelta(days=7), datetime.timedelta(seconds=90))
        >>> parse_duration("7 days")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a duration like 7d, 12h, 30m or 90s, got '7 days'
        >>> parse_duration("0d")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: must be more than zero, got '0d'
    """
    text = value.strip().lower()
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not (number.isascii() and number.isdigit()):
        raise argparse.ArgumentTypeError(
            f"expected a duration like 7d, 12h, 30m or 90s, got {value!r}"
        )
    if int(number) == 0:
        raise argparse.ArgumentTypeError(f"must be more than zero, got {value!r}")
    try:
        return dt.timedelta(seconds=int(number) * _UNITS[unit])
    except OverflowError:
        raise argparse.ArgumentTypeError(f"is too large, got {value!r}") from None


def given_database_url(given: str | None) -> str | None:
    """The URL a command uses: ``given`` (its ``--database-url``), else the environment's.

    The order is `DATABASE_URL_ORDER`: ``--database-url``, else ``$SA_OUTBOX_DATABASE_URL``,
    else ``$DATABASE_URL`` (the variable applications and the README's code read). ``None``
    when there is none (``demo`` then starts an embedded PostgreSQL; the others refuse).

    Examples:
        >>> given_database_url("postgresql://app@db/app")
        'postgresql://app@db/app'
    """
    for raw in (given, os.environ.get(ENV_DATABASE_URL), os.environ.get(ENV_APP_DATABASE_URL)):
        if raw:
            return raw
    return None


def given_listen_url(given: str | None) -> str | None:
    """The direct URL ``worker`` and ``relay`` LISTEN on: ``given`` (``--listen-url``), else
    ``$SA_OUTBOX_LISTEN_URL``; ``None``: they LISTEN through the database URL. Checked and
    named with its driver as `database_url` does.

    Examples:
        >>> given_listen_url("postgresql://app@db-direct:5432/app")
        'postgresql+psycopg://app@db-direct:5432/app'
    """
    for raw in (given, os.environ.get(ENV_LISTEN_URL)):
        if raw:
            return database_url(raw).render_as_string(hide_password=False)
    return None


def _add_listen_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen-url",
        metavar="URL",
        help=(
            "a direct PostgreSQL URL used only for LISTEN, when the database URL goes "
            f"through PgBouncer in transaction mode (default: ${ENV_LISTEN_URL})"
        ),
    )


def _url_of(args: argparse.Namespace) -> URL:
    return _resolve_url(args.database_url)


def _resolve_url(given: str | None) -> URL:
    raw = given_database_url(given)
    if not raw:
        raise CommandError(
            f"give the database with --database-url, ${ENV_DATABASE_URL} or ${ENV_APP_DATABASE_URL}"
        )
    return database_url(raw)


def _connect(args: argparse.Namespace) -> tuple[URL, Engine]:
    url = _url_of(args)
    return url, _engine(url)


def _add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str,
    epilog: str,
) -> argparse.ArgumentParser:
    """A command (or an action of one) whose examples print as written, after its
    description wrapped as argparse would."""
    return commands.add_parser(
        name,
        help=help,
        description=textwrap.fill(
            description, width=79, break_on_hyphens=False, break_long_words=False
        ),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_database_url(parser: argparse.ArgumentParser, what: str = "PostgreSQL URL") -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help=f"{what} (default: ${ENV_DATABASE_URL}, else ${ENV_APP_DATABASE_URL})",
    )


def _add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="(default: %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="json: one JSON object a line, with each job outcome's fields (default: text)",
    )


def _setup_logging(level: str, log_format: str = "text") -> None:
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            JsonFormatter()
            if log_format == "json"
            else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        logging.basicConfig(level=level, handlers=[handler])


def _first_line(exc: DBAPIError) -> str:
    return str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)


def _cannot_connect(url: URL, exc: DBAPIError) -> CommandError:
    reason = _first_line(exc)
    return CommandError(f"cannot connect to {url.render_as_string(hide_password=True)}: {reason}")


#: How long ``worker`` and ``relay`` wait at start for a server that answers but cannot take
#: them yet: a failover under way (only a standby up), a server starting up or in recovery.
STARTUP_WAIT = 60.0


class _StartupWait:
    """The waits of `connect_once`: short, growing, within `STARTUP_WAIT`; only for a server
    that is there but not ready, never for a URL that cannot work."""

    def __init__(self, url: URL, wait: float) -> None:
        self.url = url
        self.deadline = time.monotonic() + wait
        self.attempt = 0

    def delay(self, exc: DBAPIError) -> float:
        """Seconds to wait before the next attempt; `CommandError` when there is none."""
        left = self.deadline - time.monotonic()
        if not is_not_ready(exc) or left <= 0:
            raise _cannot_connect(self.url, exc) from exc
        self.attempt += 1
        logging.getLogger("sa_outbox.cli").warning(
            "%s cannot take connections yet (%s); waiting up to %.0f s more",
            self.url.render_as_string(hide_password=True),
            _first_line(exc),
            left,
        )
        return min(0.1 * 2.0**self.attempt, 2.0, left)


def connect_once(engine: Engine, *, wait: float = STARTUP_WAIT) -> None:
    """Open one connection and close it: ``worker`` and ``relay`` do it before they start,
    so that a wrong URL (a host that does not resolve, a refused port, a wrong password)
    ends the command at once, in one line, instead of being retried as an outage is.

    A server that answers but cannot take the session yet (only a read-only standby up while
    the URL asks for ``target_session_attrs=read-write``, mid-failover; starting up; in
    recovery; out of connection slots) is waited for, up to ``wait`` seconds, with a
    warning each attempt.

    Examples:
        connect_once(engine)  # CommandError: cannot connect to postgresql+psycopg://…: …
    """
    waiting = _StartupWait(engine.url, wait)
    while True:
        try:
            with engine.connect():
                return
        except DBAPIError as exc:
            time.sleep(waiting.delay(exc))


async def connect_once_async(engine: AsyncEngine, *, wait: float = STARTUP_WAIT) -> None:
    """`connect_once` on an `AsyncEngine`.

    Examples:
        await connect_once_async(engine)
    """
    waiting = _StartupWait(engine.url, wait)
    while True:
        try:
            async with engine.connect():
                return
        except DBAPIError as exc:
            await asyncio.sleep(waiting.delay(exc))


def _database_error(url: URL, exc: DBAPIError) -> CommandError:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    return CommandError(f"database error on {url.render_as_string(hide_password=True)}: {reason}")
