"""The parser of ``sa-outbox``, its ``demo`` command, and `main`."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from .. import __version__
from .._embedded import embedded_database_url
from .._exceptions import SaOutboxError
from ._common import (
    DATABASE_URL_ORDER,
    ENV_APP_DATABASE_URL,
    ENV_DATABASE_URL,
    CommandError,
    CommandParser,
    Handler,
    _engine,
    _whole_number,
    database_url,
    given_database_url,
)
from ._dashboard import _add_dashboard
from ._demo import MAX_DEMO_JOBS, format_report, run_demo
from ._jobs import _add_jobs
from ._maintenance import _add_health, _add_partitions, _add_prune
from ._outbox import _add_outbox
from ._relay import _add_relay
from ._status import _add_queues, _add_status
from ._targets import Preset
from ._worker import _add_worker
from ._workflows import _add_workflows


def _job_count(value: str) -> int:
    jobs = _whole_number(value)
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
            f"PostgreSQL URL (default: ${ENV_DATABASE_URL}, else ${ENV_APP_DATABASE_URL}; "
            'without any, a temporary embedded PostgreSQL from pip install "sa-outbox[embedded]", '
            "stopped and deleted at exit)"
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
    raw = given_database_url(args.database_url)
    embedded = not raw
    if not raw:
        print(
            f"no --database-url, ${ENV_DATABASE_URL} nor ${ENV_APP_DATABASE_URL}: "
            "starting a temporary embedded PostgreSQL"
        )
        with warnings.catch_warnings():
            # platformdirs warns on import when XDG_RUNTIME_DIR is unset; harmless here.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            raw = embedded_database_url()
    url = database_url(raw)
    shown = url.render_as_string(hide_password=True)
    if embedded:
        shown = (
            f"a temporary embedded PostgreSQL (socket in {url.query.get('host')}, stopped "
            "and deleted at exit)"
        )
    engine = _engine(url)
    # Said before the work starts: the one sign of life during a long run, and what a
    # script waits for before it may interrupt.
    print(f"running the demo with {args.jobs:,} jobs (Ctrl-C stops it)", flush=True)
    try:
        report = run_demo(engine, jobs=args.jobs)
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise CommandError(f"database error on {shown}: {reason}") from exc
    finally:
        engine.dispose()
    print(format_report(report, database=shown, inspectable=not embedded))
    return 0


def _add_commands(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        title="commands",
        parser_class=CommandParser,
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sa-outbox``, with one subparser per command.

    Examples:
        >>> build_parser().prog
        'sa-outbox'
    """
    parser = argparse.ArgumentParser(
        prog="sa-outbox",
        description=(
            "A job queue and a transactional outbox in your own PostgreSQL, "
            "through SQLAlchemy models and Alembic migrations. Every command finds the "
            f"database at {DATABASE_URL_ORDER} (demo, without any: a temporary embedded "
            "PostgreSQL)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = _add_commands(parser)
    _add_demo(commands)
    _add_worker(commands)
    _add_relay(commands)
    _add_prune(commands)
    _add_health(commands)
    _add_partitions(commands)
    _add_jobs(commands)
    _add_workflows(commands)
    _add_status(commands)
    _add_queues(commands)
    _add_outbox(commands)
    _add_dashboard(commands)
    return parser


def build_admin_parser(prog: str) -> argparse.ArgumentParser:
    """A parser of the commands that see and steer a queue (``status``, ``queues``,
    ``jobs``, ``outbox``) under another program's name, for `run_admin`.

    Examples:
        >>> build_admin_parser("flask").parse_args(["jobs", "list", "--status", "failed"]).status
        'failed'
    """
    parser = argparse.ArgumentParser(
        prog=prog, description="See and steer the job queue and the outbox (sa-outbox)."
    )
    commands = _add_commands(parser)
    _add_status(commands)
    _add_queues(commands)
    _add_jobs(commands)
    _add_outbox(commands)
    return parser


def run_admin(
    argv: Sequence[str],
    *,
    engine: Engine | None = None,
    jobs: object | None = None,
    outbox: object | None = None,
    prog: str = "sa-outbox",
    pauses: object | None = None,
) -> int:
    """Run ``status``, ``queues``, ``jobs …`` or ``outbox …`` inside an application that
    already has its engine and models (a Flask command group, a management script).

    ``jobs``, ``outbox`` and ``pauses`` (a `QueuePauseMixin` model) are the default models
    (``--model``, ``--outbox-model`` and ``--pause-model`` still win); ``engine`` is used
    unless ``--database-url`` is given. Returns the exit status, as `main` does.

    Examples:
        @app.cli.command("status", context_settings={"ignore_unknown_options": True})
        @click.argument("argv", nargs=-1, type=click.UNPROCESSED)
        def status(argv):
            raise SystemExit(run_admin(["status", *argv], engine=db.engine, jobs=Job))
    """
    args = build_admin_parser(prog).parse_args(list(argv))
    args.preset = Preset(engine=engine, jobs=jobs, outbox=outbox, pauses=pauses)
    return _run(args, f"{prog} {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sa-outbox`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    ``--help``, ``--version`` and usage errors exit through `SystemExit`, as argparse does.

    Examples:
        >>> main(["demo", "--database-url", "sqlite://"])
        1
    """
    args = build_parser().parse_args(argv)
    return _run(args, f"sa-outbox {args.command}")


def _run(args: argparse.Namespace, name: str) -> int:
    handler: Handler = args.handler
    try:
        return handler(args)
    except SaOutboxError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. | head: the reader has seen enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 0
