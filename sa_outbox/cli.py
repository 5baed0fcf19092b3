"""The ``sa-outbox`` command line (also ``python -m sa_outbox``).

Commands:

``sa-outbox demo [--database-url URL] [--jobs N]``
    Runs the job queue and the outbox end to end in the schema ``sa_outbox_demo`` (dropped
    and created again) and prints a summary. The database is ``--database-url``, else
    ``$SA_OUTBOX_DATABASE_URL``, else an embedded PostgreSQL (``pip install
    "sa-outbox[embedded]"``).

Each command is a function that adds its subparser and sets ``handler`` to a function of
the parsed arguments returning the exit status: 0 on success, 1 on a runtime error (printed
as ``sa-outbox COMMAND: error: …``), 2 on a usage error (argparse's own convention).

Example:
    >>> args = build_parser().parse_args(["demo", "--jobs", "50"])
    >>> args.command, args.jobs, args.database_url
    ('demo', 50, None)
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from . import __version__
from ._demo import MAX_DEMO_JOBS, format_report, run_demo
from ._embedded import embedded_database_url
from ._exceptions import SaOutboxError

__all__ = ["ENV_DATABASE_URL", "CommandError", "build_parser", "database_url", "main"]

#: The environment variable commands read the database URL from when none is given.
ENV_DATABASE_URL = "SA_OUTBOX_DATABASE_URL"

Handler = Callable[[argparse.Namespace], int]

# Drivers the commands (all synchronous) run on instead of an asyncio one or none at all.
_SYNC_DRIVER = {"": "psycopg", "psycopg_async": "psycopg", "asyncpg": "psycopg"}


class CommandError(SaOutboxError):
    """A command could not do its work; ``main`` prints the message and exits with 1.

    Example:
        >>> str(CommandError("cannot connect"))
        'cannot connect'
    """


def database_url(raw: str) -> URL:
    """Parse a PostgreSQL URL for the commands, on psycopg 3 unless it names a sync driver.

    ``postgres://`` and ``postgresql://`` (as many hosts hand them out) and the asyncio
    drivers become ``postgresql+psycopg://``; other databases are refused.

    Example:
        >>> database_url("postgres://app:secret@db:5432/app").render_as_string()
        'postgresql+psycopg://app:***@db:5432/app'
        >>> database_url("sqlite:///app.db")
        Traceback (most recent call last):
        ...
        sa_outbox.cli.CommandError: sa-outbox needs PostgreSQL, but the database URL is for 'sqlite'
    """
    try:
        url = make_url(raw)
    except ArgumentError:
        raise CommandError(
            "the database URL could not be parsed; expected something like "
            "postgresql+psycopg://user:password@host:5432/dbname"
        ) from None
    backend, _, driver = url.drivername.partition("+")
    if backend not in ("postgresql", "postgres"):
        raise CommandError(f"sa-outbox needs PostgreSQL, but the database URL is for {backend!r}")
    return url.set(drivername=f"postgresql+{_SYNC_DRIVER.get(driver, driver)}")


def _engine(url: URL) -> Engine:
    try:
        return create_engine(url)
    except ImportError as exc:
        raise CommandError(
            f"the PostgreSQL driver for {url.drivername} could not be loaded ({exc}); "
            'install psycopg with its binary build: pip install "sa-outbox[binary]"'
        ) from exc


def _job_count(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not 1 <= jobs <= MAX_DEMO_JOBS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_DEMO_JOBS:,}, got {jobs}")
    return jobs


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the job queue and the outbox end to end, then print a summary",
        description=(
            "Enqueue jobs and an outbox event in one transaction, work the jobs in claimed "
            "batches with batched acknowledgements, relay the event (claim, publish to an "
            "in-process list, mark published), and print the counts read back from the "
            "database. Uses the schema sa_outbox_demo, which it drops and creates again."
        ),
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help=(
            f"PostgreSQL URL (default: ${ENV_DATABASE_URL}; without either, an embedded "
            'PostgreSQL from pip install "sa-outbox[embedded]")'
        ),
    )
    parser.add_argument(
        "--jobs",
        metavar="N",
        type=_job_count,
        default=1000,
        help="how many jobs to enqueue and work, besides the duplicate and the bad one "
        "(default: %(default)s)",
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    raw = args.database_url or os.environ.get(ENV_DATABASE_URL)
    embedded = not raw
    if not raw:
        print(f"no --database-url nor ${ENV_DATABASE_URL}: starting an embedded PostgreSQL")
        with warnings.catch_warnings():
            # platformdirs warns on import when XDG_RUNTIME_DIR is unset; harmless here.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            raw = embedded_database_url()
    url = database_url(raw)
    shown = url.render_as_string(hide_password=True)
    if embedded:
        shown = f"an embedded PostgreSQL (socket in {url.query.get('host')}, gone at exit)"
    engine = _engine(url)
    try:
        report = run_demo(engine, jobs=args.jobs)
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise CommandError(f"database error on {shown}: {reason}") from exc
    finally:
        engine.dispose()
    print(format_report(report, database=shown, inspectable=not embedded))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sa-outbox``, with one subparser per command.

    Example:
        >>> build_parser().prog
        'sa-outbox'
    """
    parser = argparse.ArgumentParser(
        prog="sa-outbox",
        description=(
            "A job queue and a transactional outbox in your own PostgreSQL, "
            "through SQLAlchemy models and Alembic migrations."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, title="commands"
    )
    _add_demo(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sa-outbox`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    ``--help``, ``--version`` and usage errors exit through `SystemExit`, as argparse does.

    Example:
        >>> main(["demo", "--database-url", "sqlite://"])
        1
    """
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except SaOutboxError as exc:
        print(f"sa-outbox {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"sa-outbox {args.command}: interrupted", file=sys.stderr)
        return 130
