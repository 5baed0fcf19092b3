"""The ``sa-outbox`` command line (also ``python -m sa_outbox``).

Commands:

``sa-outbox demo [--database-url URL] [--jobs N]``
    Runs the job queue and the outbox end to end in the schema ``sa_outbox_demo`` (dropped
    and created again) and prints a summary. The database is ``--database-url``, else
    ``$SA_OUTBOX_DATABASE_URL``, else an embedded PostgreSQL (``pip install
    "sa-outbox[embedded]"``).

``sa-outbox worker TARGET [--queues a,b] [--concurrency N] [--database-url URL] …``
    Runs a worker for the `JobApp` at ``TARGET`` (``module:attribute``, e.g.
    ``myapp.tasks:app``; the attribute may also be a function returning one) until SIGTERM
    or SIGINT, then shuts down gracefully. An app with ``async def`` handlers runs on
    `AsyncWorker`, any other on `Worker`. The database is ``--database-url``, else
    ``$SA_OUTBOX_DATABASE_URL``.

``sa-outbox relay TARGET [--once] [--log-level LEVEL]``
    Runs the outbox `Relay` (or `AsyncRelay`) at ``TARGET`` (``module:attribute``, e.g.
    ``myapp.outbox:relay``, or a function returning one) until SIGTERM or SIGINT: claim →
    publish → mark, in each aggregate's order. ``--once`` runs one cycle and prints what it
    did. The relay object carries its engine, outbox model and publisher.

``sa-outbox prune TARGET --older-than 7d [--failed-older-than 30d] [--outbox TARGET] …``
    Deletes finished jobs of the job model at ``TARGET`` (and, with ``--outbox``, published
    events) older than the windows, ``--batch`` rows per short transaction, one pruner at a
    time per table (`Pruner`); prints progress every ``--progress-every`` batches.

``sa-outbox health TARGET [--outbox TARGET]``
    Prints `table_health`: row counts, dead tuples, vacuum times, sizes, the oldest ready
    pending job and the sessions holding back the xmin horizon.

``sa-outbox partitions maintain --table TARGET [--ahead N] [--retention 7d]``
    Runs `maintain_partitions` on the partitioned job or outbox model at ``TARGET``:
    creates partitions ``--ahead`` intervals ahead, drops those past ``--retention`` that
    hold no unfinished work, and prints what it created, moved, dropped and kept.

Each command is a function that adds its subparser and sets ``handler`` to a function of
the parsed arguments returning the exit status: 0 on success, 1 on a runtime error (printed
as ``sa-outbox COMMAND: error: …``), 2 on a usage error (argparse's own convention).

Example:
    >>> args = build_parser().parse_args(["demo", "--jobs", "50"])
    >>> args.command, args.jobs, args.database_url
    ('demo', 50, None)
    >>> args = build_parser().parse_args(
    ...     ["worker", "myapp.tasks:app", "--queues", "default,emails", "--concurrency", "16"])
    >>> args.target, args.queues, args.concurrency
    ('myapp.tasks:app', ['default', 'emails'], 16)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from sqlalchemy import Engine, Table, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from . import __version__
from ._demo import MAX_DEMO_JOBS, format_report, run_demo
from ._embedded import embedded_database_url
from ._exceptions import InvalidArgument, SaOutboxError
from ._health import HealthReport, TableHealth, table_health
from ._loading import import_target, load_instance
from ._partitions import DEFAULT_AHEAD, PartitionReport, maintain_partitions
from ._retention import Pruner, PruneReport, Retention
from .relay import AsyncRelay, Relay, RelayReport
from .relay._loader import load_relay
from .schema import resolve_table
from .worker import AsyncWorker, JobApp, Worker

__all__ = [
    "ENV_DATABASE_URL",
    "CommandError",
    "build_parser",
    "database_url",
    "load_table",
    "load_target",
    "main",
    "parse_duration",
]

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


def _names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {value!r}")
    return names


def _not_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return number


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be more than zero, got {value}")
        return number

    return parse


def _add_worker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "worker",
        help="run the handlers of a JobApp until SIGTERM / SIGINT",
        description=(
            "Claim jobs in batches, run their handlers outside any transaction, acknowledge "
            "them in batches (fenced by their lease tokens), heartbeat, reclaim expired "
            "leases, wake up on NOTIFY. SIGTERM or SIGINT stops claiming, lets running jobs "
            "finish within --grace seconds, then releases the rest; a second signal skips "
            "the grace period."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="the JobApp, as module:attribute")
    _add_database_url(parser)
    parser.add_argument(
        "--queues", metavar="A,B", type=_names, help="queues to serve (default: all)"
    )
    parser.add_argument(
        "--kinds", metavar="A,B", type=_names, help="job kinds to claim (default: all)"
    )
    parser.add_argument(
        "--concurrency",
        metavar="N",
        type=_positive(int),
        default=10,
        help="handlers running at once (default: %(default)s)",
    )
    parser.add_argument(
        "--batch",
        metavar="N",
        type=_positive(int),
        help="most jobs per claim (default: 50, or --concurrency if larger)",
    )
    parser.add_argument(
        "--prefetch",
        metavar="N",
        type=_not_negative_int,
        help=(
            "most claimed jobs waiting for a free handler; 0 claims only for free handlers "
            "(default: adaptive, as many as the handlers finish in about 0.1 s)"
        ),
    )
    parser.add_argument(
        "--lease",
        metavar="SECONDS",
        type=_positive(float),
        default=30.0,
        help="lease of a claimed job, renewed by heartbeats (default: %(default)g)",
    )
    parser.add_argument(
        "--grace",
        metavar="SECONDS",
        type=float,
        default=10.0,
        help="time running jobs get to finish after SIGTERM (default: %(default)g)",
    )
    parser.add_argument(
        "--poll-interval",
        metavar="SECONDS",
        type=_positive(float),
        default=1.0,
        help="claim at least this often, notifications or not (default: %(default)g)",
    )
    parser.add_argument(
        "--no-listen", dest="listen", action="store_false", help="poll only, no LISTEN"
    )
    parser.add_argument(
        "--no-reclaim",
        dest="reclaim",
        action="store_false",
        help="leave expired leases to a separate reclaimer",
    )
    parser.add_argument("--worker-id", metavar="ID", help="default: host:pid:random")
    _add_log_level(parser)
    parser.set_defaults(handler=_worker)


def load_target(target: str) -> JobApp:
    """The `JobApp` at ``module:attribute`` (the current directory is importable).

    The attribute may be a dotted path, or a function of no arguments returning the app.

    Example:
        >>> load_target("json:dumps")
        Traceback (most recent call last):
        ...
        sa_outbox.cli.CommandError: json:dumps is not a JobApp (nor a function returning one)
    """
    try:
        app: JobApp = load_instance(target, JobApp, "a JobApp", example="myapp.tasks:app")
    except InvalidArgument as exc:
        raise CommandError(str(exc)) from None
    return app


def _import_target(target: str) -> object:
    try:
        return import_target(target, example="myapp.models:Job")
    except InvalidArgument as exc:
        raise CommandError(str(exc)) from None


def load_table(target: str) -> Table:
    """The table of the model (or `Table`, or `JobApp`) at ``module:attribute``.

    Example:
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
    """A duration as the commands take it: a whole number and a unit (s, m, h, d, w).

    Example:
        >>> parse_duration("7d"), parse_duration("90s")
        (datetime.timedelta(days=7), datetime.timedelta(seconds=90))
        >>> parse_duration("7 days")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a duration like 7d, 12h, 30m or 90s, got '7 days'
    """
    text = value.strip().lower()
    number, unit = text[:-1], text[-1:]
    if unit not in _UNITS or not number.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a duration like 7d, 12h, 30m or 90s, got {value!r}"
        )
    return dt.timedelta(seconds=int(number) * _UNITS[unit])


def _url_of(args: argparse.Namespace) -> URL:
    raw = args.database_url or os.environ.get(ENV_DATABASE_URL)
    if not raw:
        raise CommandError(f"give the database with --database-url or ${ENV_DATABASE_URL}")
    return database_url(raw)


def _connect(args: argparse.Namespace) -> tuple[URL, Engine]:
    url = _url_of(args)
    return url, _engine(url)


def _add_database_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url", metavar="URL", help=f"PostgreSQL URL (default: ${ENV_DATABASE_URL})"
    )


def _add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="(default: %(default)s)",
    )


def _setup_logging(level: str) -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )


def _database_error(url: URL, exc: DBAPIError) -> CommandError:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    return CommandError(f"database error on {url.render_as_string(hide_password=True)}: {reason}")


def _add_prune(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "prune",
        help="delete finished jobs (and published events) older than a window, in batches",
        description=(
            "Delete succeeded jobs older than --older-than and failed jobs older than "
            "--failed-older-than (default: the same), and with --outbox published events "
            "older than --outbox-older-than (default: the same), --batch rows per short "
            "transaction, until nothing is left. Pending and running jobs, unpublished and "
            "parked events are never touched. If another pruner holds a table's lock, that "
            "table is skipped. Durations: 7d, 12h, 30m, 90s, 2w."
        ),
    )
    parser.add_argument(
        "target", metavar="TARGET", help="the job model (or its JobApp), as module:attribute"
    )
    parser.add_argument(
        "--older-than",
        metavar="DURATION",
        type=parse_duration,
        required=True,
        help="prune succeeded jobs finished longer ago than this",
    )
    parser.add_argument(
        "--failed-older-than",
        metavar="DURATION",
        type=parse_duration,
        help="prune failed jobs finished longer ago than this (default: --older-than)",
    )
    parser.add_argument("--keep-failed", action="store_true", help="never prune failed jobs")
    parser.add_argument(
        "--outbox", metavar="TARGET", help="also prune this outbox model's published events"
    )
    parser.add_argument(
        "--outbox-older-than",
        metavar="DURATION",
        type=parse_duration,
        help="prune events published longer ago than this (default: --older-than)",
    )
    parser.add_argument(
        "--batch",
        metavar="N",
        type=_positive(int),
        default=1000,
        help="rows deleted per transaction (default: %(default)s)",
    )
    parser.add_argument(
        "--progress-every",
        metavar="N",
        type=_positive(int),
        default=10,
        help="print progress every N batches (default: %(default)s)",
    )
    _add_database_url(parser)
    parser.set_defaults(handler=_prune)


def _format_prune(report: PruneReport) -> str:
    text = (
        f"pruned {report.succeeded} succeeded and {report.failed} failed jobs, "
        f"{report.published} published events in {report.batches} batches"
    )
    if report.skipped:
        text += f"; skipped (another pruner holds the lock): {', '.join(report.skipped)}"
    return text


def _prune(args: argparse.Namespace) -> int:
    jobs = load_table(args.target)
    outbox = None if args.outbox is None else load_table(args.outbox)
    failed = None if args.keep_failed else (args.failed_older_than or args.older_than)
    try:
        retention = Retention(
            succeeded=args.older_than,
            failed=failed,
            published=args.outbox_older_than or args.older_than,
            batch=args.batch,
        )
    except SaOutboxError as exc:
        raise CommandError(str(exc)) from None

    def progress(table: str, what: str, deleted: int, report: PruneReport) -> None:
        if report.batches % args.progress_every == 0:
            print(f"... {table}: {_format_prune(report)}", file=sys.stderr, flush=True)

    url, engine = _connect(args)
    try:
        pruner = Pruner(engine, jobs=jobs, outbox=outbox, retention=retention, progress=progress)
        print(_format_prune(pruner.run_once()))
    except DBAPIError as exc:
        raise _database_error(url, exc) from exc
    finally:
        engine.dispose()
    return 0


def _add_health(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "health",
        help="row counts, dead tuples, vacuum, sizes, oldest pending job, xmin holders",
        description=(
            "Report the job table's (and with --outbox the outbox's) row counts, dead "
            "tuples, last (auto)vacuum and (auto)analyze, table and index sizes, the age of "
            "the oldest ready pending job, and the sessions holding back the xmin horizon."
        ),
    )
    parser.add_argument(
        "target", metavar="TARGET", help="the job model (or its JobApp), as module:attribute"
    )
    parser.add_argument("--outbox", metavar="TARGET", help="also report this outbox model")
    _add_database_url(parser)
    parser.set_defaults(handler=_health)


def _format_table(health: TableHealth) -> list[str]:
    def when(value: dt.datetime | None) -> str:
        return "never" if value is None else value.isoformat(timespec="seconds")

    rows = ", ".join(f"{name} {n}" for name, n in health.rows.items())
    lines = [
        f"{health.table}: {rows}",
        f"  live tuples {health.live_tuples}, dead tuples {health.dead_tuples}",
        f"  last vacuum {when(health.last_vacuum)}, autovacuum {when(health.last_autovacuum)}",
        f"  last analyze {when(health.last_analyze)}, autoanalyze {when(health.last_autoanalyze)}",
        f"  size {health.total_bytes} bytes (table {health.table_bytes}, "
        f"indexes {health.index_bytes})",
    ]
    if health.rows.keys() >= {"pending"}:
        age = health.oldest_pending_age
        lines.append(f"  oldest ready pending job: {'none' if age is None else age}")
    return lines


def _format_health(report: HealthReport) -> str:
    lines: list[str] = []
    for health in (report.jobs, report.outbox):
        if health is not None:
            lines += _format_table(health)
    holder = report.oldest_xmin
    if holder is None:
        lines.append("xmin horizon: no other session holds a snapshot")
    else:
        lines.append(
            f"xmin horizon held by pid {holder.pid} ({holder.state}): {holder.xmin_age} "
            f"transactions old, transaction open for {holder.transaction_age}, "
            f"query started {holder.query_start}"
        )
    return "\n".join(lines)


def _health(args: argparse.Namespace) -> int:
    jobs = load_table(args.target)
    outbox = None if args.outbox is None else load_table(args.outbox)
    url, engine = _connect(args)
    try:
        with engine.connect() as conn:
            print(_format_health(table_health(conn, jobs=jobs, outbox=outbox)))
    except DBAPIError as exc:
        raise _database_error(url, exc) from exc
    finally:
        engine.dispose()
    return 0


def _add_partitions(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "partitions",
        help="maintain the partitions of a partitioned job or outbox table",
        description="Partition maintenance (docs/partitions.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, title="actions")
    maintain = actions.add_parser(
        "maintain",
        help="create partitions ahead, drop finished ones past retention",
        description=(
            "Create the partitions of the current interval and --ahead more, moving rows the "
            "default partition holds for them; with --retention, drop partitions whose "
            "whole range is older than that, unless they hold a pending or running job (an "
            "unpublished, unparked event): those are kept and listed. One maintainer at a "
            "time per table. Durations: 7d, 12h, 30m, 90s, 2w."
        ),
    )
    maintain.add_argument(
        "--table",
        metavar="TARGET",
        required=True,
        help="the partitioned job or outbox model (or JobApp), as module:attribute",
    )
    maintain.add_argument(
        "--ahead",
        metavar="N",
        type=_positive(int),
        default=DEFAULT_AHEAD,
        help="partitions kept ready beyond the current one (default: %(default)s)",
    )
    maintain.add_argument(
        "--retention",
        metavar="DURATION",
        type=parse_duration,
        help="drop partitions older than this (default: drop none)",
    )
    _add_database_url(maintain)
    _add_log_level(maintain)
    maintain.set_defaults(handler=_maintain_partitions)


def _format_partitions(report: PartitionReport) -> str:
    if report.skipped:
        return f"{report.table}: skipped, another maintainer holds the table's lock"

    def names(found: list[str]) -> str:
        return ", ".join(found) if found else "none"

    created = [
        f"{name} ({report.moved[name]} rows moved from the default partition)"
        if name in report.moved
        else name
        for name in report.created
    ]
    lines = [
        f"{report.table}: created {names(created)}",
        f"  dropped {names(report.dropped)}",
        f"  kept (unfinished work inside) {names(report.kept)}",
    ]
    if report.busy:
        lines.append(f"  left for the next run (lock not granted) {names(report.busy)}")
    return "\n".join(lines)


def _maintain_partitions(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    table = load_table(args.table)
    url, engine = _connect(args)
    try:
        report = maintain_partitions(engine, table, ahead=int(args.ahead), retention=args.retention)
    except DBAPIError as exc:
        raise _database_error(url, exc) from exc
    finally:
        engine.dispose()
    print(_format_partitions(report))
    return 0


def _worker(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    app = load_target(args.target)
    url = _url_of(args)
    options = dict(
        queues=args.queues,
        kinds=args.kinds,
        concurrency=args.concurrency,
        batch=args.batch,
        prefetch=args.prefetch,
        lease=args.lease,
        grace=args.grace,
        poll_interval=args.poll_interval,
        listen=args.listen,
        reclaim=args.reclaim,
        worker_id=args.worker_id,
    )
    try:
        if any(app[kind].is_async for kind in app.kinds):
            asyncio.run(_run_async(app, url, options))
        else:
            engine = _engine(url)
            try:
                Worker(app, engine, **options).run()
            finally:
                engine.dispose()
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        shown = url.render_as_string(hide_password=True)
        raise CommandError(f"database error on {shown}: {reason}") from exc
    return 0


async def _run_async(app: JobApp, url: URL, options: dict[str, object]) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        await AsyncWorker(app, engine, **options).run()  # type: ignore[arg-type]
    finally:
        await engine.dispose()


def _add_relay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "relay",
        help="publish committed outbox events until SIGTERM / SIGINT",
        description=(
            "Claim committed outbox events in batches (aggregate by aggregate), publish them "
            "through the relay's publisher in each aggregate's order, mark what the broker "
            "took, back off and park what it keeps rejecting; wake up on NOTIFY. SIGTERM or "
            "SIGINT finishes the current batch, then stops."
        ),
    )
    parser.add_argument(
        "target", metavar="TARGET", help="the Relay or AsyncRelay, as module:attribute"
    )
    parser.add_argument("--once", action="store_true", help="run one cycle, print it, exit")
    _add_log_level(parser)
    parser.set_defaults(handler=_relay)


def _format_relay_report(report: RelayReport) -> str:
    text = (
        f"relay {report.relay}: {report.claimed} claimed, {report.published} published, "
        f"{report.rejected} rejected ({report.parked} parked), {report.released} released"
    )
    return text + (f"; broker unavailable: {report.unavailable}" if report.unavailable else "")


def _relay(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    relay = load_relay(args.target)
    try:
        if isinstance(relay, AsyncRelay):
            asyncio.run(_run_async_relay(relay, once=args.once))
        else:
            _run_relay(relay, once=args.once)
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise CommandError(f"database error: {reason}") from exc
    return 0


def _run_relay(relay: Relay, *, once: bool) -> None:
    import signal

    previous = {
        signum: signal.signal(signum, lambda *_: relay.stop())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        if once:
            print(_format_relay_report(relay.run_once()))
        else:
            relay.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        relay.close()
        relay.engine.dispose()  # the command owns the process: close its connections


async def _run_async_relay(relay: AsyncRelay, *, once: bool) -> None:
    import signal

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stop)
    try:
        if once:
            print(_format_relay_report(await relay.run_once()))
        else:
            await relay.run()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await relay.aclose()
        await relay.engine.dispose()


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
    _add_worker(commands)
    _add_relay(commands)
    _add_prune(commands)
    _add_health(commands)
    _add_partitions(commands)
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
