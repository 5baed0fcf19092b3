"""``sa-outbox prune``, ``health`` and ``partitions maintain``."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from sqlalchemy.exc import DBAPIError

from .._exceptions import SaOutboxError
from .._human import age as human_age
from .._human import moment, size
from ..maintenance import PartitionReport, maintain_partitions
from ..maintenance._health import HealthReport, TableHealth, table_health
from ..maintenance._retention import Pruner, PruneReport, Retention
from ..ops import DEFAULT_AHEAD
from ._common import (
    CommandError,
    _add_command,
    _add_database_url,
    _add_log_level,
    _connect,
    _database_error,
    _positive_int,
    _setup_logging,
    parse_duration,
)
from ._targets import (
    _model,
    add_inbox_target,
    add_job_target,
    add_outbox_target,
    add_steps_target,
    connection,
    database,
    inbox_table,
    job_table,
    outbox_table,
    steps_table,
)

_PRUNE_EXAMPLE = """\
example:
  sa-outbox prune --model myapp.models:Job --older-than 7d --failed-older-than 30d
  sa-outbox prune --outbox-model myapp.models:OutboxEvent --outbox-older-than 3d
  sa-outbox prune --inbox-table public.inbox --inbox-older-than 14d
"""

_HEALTH_EXAMPLE = """\
example:
  sa-outbox health --model myapp.models:Job --outbox-model myapp.models:OutboxEvent
  sa-outbox health --jobs-table public.jobs
"""

_PARTITIONS_EXAMPLE = """\
example:
  sa-outbox partitions maintain --model myapp.models:Job --ahead 3 --retention 7d
  sa-outbox partitions maintain --outbox-model myapp.models:OutboxEvent --retention 3d
"""


def _add_prune(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "prune",
        help="delete finished jobs, published events and old inbox entries, in batches",
        description=(
            "Delete succeeded jobs older than --older-than, failed jobs older than "
            "--failed-older-than and cancelled jobs older than --cancelled (both default to "
            "--older-than), with the outbox table published events older than "
            "--outbox-older-than (default: the same), and with the inbox table inbox "
            "entries received longer ago than --inbox-older-than (required with it: keep "
            "them longer than any redelivery can come), --batch rows per short "
            "transaction, until nothing is left. Pending and running jobs, unpublished and "
            "parked events are never touched. If another pruner holds a table's lock, that "
            "table is skipped. Give the job table, the outbox table, the inbox table, or "
            "several; with the job table, --steps-table prunes each job's durable steps with "
            "it. Durations: 7d, 12h, 30m, 90s, 2w."
        ),
        epilog=_PRUNE_EXAMPLE,
    )
    add_job_target(parser)
    add_outbox_target(parser)
    add_inbox_target(parser)
    add_steps_target(parser)
    parser.add_argument(
        "--older-than",
        metavar="DURATION",
        type=parse_duration,
        help="prune succeeded jobs finished longer ago than this (required with the job table)",
    )
    parser.add_argument(
        "--failed-older-than",
        metavar="DURATION",
        type=parse_duration,
        help="prune failed jobs finished longer ago than this (default: --older-than)",
    )
    parser.add_argument("--keep-failed", action="store_true", help="never prune failed jobs")
    parser.add_argument(
        "--cancelled",
        "--cancelled-older-than",
        dest="cancelled_older_than",
        metavar="DURATION",
        type=parse_duration,
        help="prune cancelled jobs cancelled longer ago than this (default: --older-than)",
    )
    parser.add_argument("--keep-cancelled", action="store_true", help="never prune cancelled jobs")
    parser.add_argument(
        "--outbox-older-than",
        metavar="DURATION",
        type=parse_duration,
        help="prune events published longer ago than this (default: --older-than)",
    )
    parser.add_argument(
        "--inbox-older-than",
        metavar="DURATION",
        type=parse_duration,
        help="prune inbox entries received longer ago than this (required with the inbox table)",
    )
    parser.add_argument(
        "--batch",
        metavar="N",
        type=_positive_int,
        default=1000,
        help="rows deleted per transaction (default: %(default)s)",
    )
    parser.add_argument(
        "--progress-every",
        metavar="N",
        type=_positive_int,
        default=10,
        help="print progress every N batches (default: %(default)s)",
    )
    _add_database_url(parser)
    parser.set_defaults(handler=_prune, usage_error=parser.error)


def _format_prune(report: PruneReport) -> str:
    text = (
        f"pruned {report.succeeded} succeeded, {report.failed} failed and "
        f"{report.cancelled} cancelled jobs, "
        f"{report.published} published events"
    )
    if report.inbox:
        text += f", {report.inbox} inbox entries"
    text += f" in {report.batches} batches"
    if report.skipped:
        text += f"; skipped (another pruner holds the lock): {', '.join(report.skipped)}"
    return text


def _check_prune_usage(args: argparse.Namespace) -> None:
    """What argparse alone cannot say: which windows each table needs (before any import)."""
    jobs, outbox, inbox = (
        args.model or args.jobs_table,
        args.outbox_model or args.outbox_table,
        args.inbox_model or args.inbox_table,
    )
    if not (jobs or outbox or inbox):
        args.usage_error(
            "give what to prune: the job table (--model or --jobs-table), the outbox "
            "(--outbox-model or --outbox-table), the inbox (--inbox-model or --inbox-table)"
        )
    if jobs and args.older_than is None:
        args.usage_error("the job table needs --older-than")
    if outbox and (args.outbox_older_than or args.older_than) is None:
        args.usage_error("the outbox needs --outbox-older-than (or --older-than)")
    if inbox and args.inbox_older_than is None:
        args.usage_error(
            "the inbox needs --inbox-older-than: keep entries longer than any redelivery "
            "can come (docs/inbox.md)"
        )


def _prune(args: argparse.Namespace) -> int:
    _check_prune_usage(args)
    failed = None if args.keep_failed else (args.failed_older_than or args.older_than)
    cancelled = None if args.keep_cancelled else (args.cancelled_older_than or args.older_than)
    try:
        retention = Retention(
            succeeded=args.older_than,
            failed=failed,
            cancelled=cancelled,
            published=args.outbox_older_than or args.older_than,
            inbox=args.inbox_older_than,
            batch=args.batch,
        )
    except SaOutboxError as exc:
        raise CommandError(str(exc)) from None

    def progress(table: str, what: str, deleted: int, report: PruneReport) -> None:
        if report.batches % args.progress_every == 0:
            print(f"... {table}: {_format_prune(report)}", file=sys.stderr, flush=True)

    with database(args) as engine:
        with engine.connect() as conn:
            jobs = job_table(args, conn, required=False)
            outbox = outbox_table(args, conn, required=False)
            inbox = inbox_table(args, conn, required=False)
            steps = steps_table(args, conn)
        if steps is not None and jobs is None:
            raise CommandError(
                "--steps-table is pruned with the job table: give --model or --jobs-table too"
            )
        pruner = Pruner(
            engine,
            jobs=jobs,
            outbox=outbox,
            inbox=inbox,
            steps=steps,
            retention=retention,
            progress=progress,
        )
        print(_format_prune(pruner.run_once()))
    return 0


def _add_health(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "health",
        help="row counts, dead tuples, vacuum, sizes, oldest pending job, xmin holders",
        description=(
            "Report the job table's and the outbox table's (either or both) row counts, "
            "dead tuples, last (auto)vacuum and (auto)analyze, table and index sizes, the "
            "age of the oldest ready pending job, and the sessions holding back the xmin "
            "horizon. Only reads."
        ),
        epilog=_HEALTH_EXAMPLE,
    )
    add_job_target(parser)
    add_outbox_target(parser)
    _add_database_url(parser)
    parser.set_defaults(handler=_health)


def _format_table(health: TableHealth) -> list[str]:
    def when(value: dt.datetime | None) -> str:
        return "never" if value is None else f"{moment(value)} UTC"

    rows = ", ".join(f"{name} {n}" for name, n in health.rows.items())
    lines = [
        f"{health.table}: {rows}",
        f"  live tuples {health.live_tuples}, dead tuples {health.dead_tuples}",
        f"  last vacuum {when(health.last_vacuum)}, autovacuum {when(health.last_autovacuum)}",
        f"  last analyze {when(health.last_analyze)}, autoanalyze {when(health.last_autoanalyze)}",
        f"  size {size(health.total_bytes)} (table {size(health.table_bytes)}, "
        f"indexes {size(health.index_bytes)})",
    ]
    lines += [
        f"  partition {p.table}: live tuples {p.live_tuples}, dead tuples {p.dead_tuples}, "
        f"size {size(p.total_bytes)}, last vacuum {when(p.last_vacuum)}, "
        f"autovacuum {when(p.last_autovacuum)}"
        for p in health.partitions
    ]
    if health.rows.keys() >= {"pending"}:
        age = health.oldest_pending_age
        lines.append(f"  oldest ready pending job: {'none' if age is None else human_age(age)}")
    return lines


def _utc(value: dt.datetime | None) -> str:
    return "-" if value is None else f"{moment(value)} UTC"


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
            f"transactions old, transaction open for {human_age(holder.transaction_age)}, "
            f"query started {_utc(holder.query_start)}"
        )
    return "\n".join(lines)


def _health(args: argparse.Namespace) -> int:
    with connection(args) as conn:
        jobs = job_table(args, conn, required=False)
        outbox = outbox_table(args, conn, required=False)
        if jobs is None and outbox is None:
            raise CommandError(
                "give the job table (--model myapp.models:Job or --jobs-table SCHEMA.TABLE), "
                "the outbox (--outbox-model TARGET or --outbox-table SCHEMA.TABLE), or both"
            )
        print(_format_health(table_health(conn, jobs=jobs, outbox=outbox)))
    return 0


def _add_partitions(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "partitions",
        help="maintain the partitions of a partitioned job or outbox table",
        description="Partition maintenance (docs/partitions.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, title="actions")
    maintain = _add_command(
        actions,
        "maintain",
        help="create partitions ahead, drop finished ones past retention",
        description=(
            "Create the partitions of the current interval and --ahead more, moving rows the "
            "default partition holds for them; with --retention, drop partitions whose "
            "whole range is older than that, unless they hold a pending or running job (an "
            "unpublished, unparked event): those are kept and listed. One maintainer at a "
            "time per table. Give the partitioned job model or outbox model (a model, not a "
            "table name: its partitioning is declared there). Durations: 7d, 12h, 30m, "
            "90s, 2w."
        ),
        epilog=_PARTITIONS_EXAMPLE,
    )
    which = maintain.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--model",
        metavar="TARGET",
        help="the partitioned job model (or its JobApp), as module:attribute",
    )
    which.add_argument(
        "--outbox-model",
        metavar="TARGET",
        help="or the partitioned outbox model, as module:attribute",
    )
    maintain.add_argument(
        "--ahead",
        metavar="N",
        type=_positive_int,
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
    if args.model:
        table = _model(args.model, "job", "--model")
    else:
        table = _model(args.outbox_model, "outbox", "--outbox-model")
    url, engine = _connect(args)
    try:
        report = maintain_partitions(engine, table, ahead=int(args.ahead), retention=args.retention)
    except DBAPIError as exc:
        raise _database_error(url, exc) from exc
    finally:
        engine.dispose()
    print(_format_partitions(report))
    return 0
