"""``sa-outbox status`` (the whole queue at a glance) and ``sa-outbox queues`` (per queue)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Table

from .._human import age, moment, span
from ..queue import QueueDepth, QueueStatus, as_plain, queue_depths, queue_status
from ..schema import JobStatus, resolve_table
from ..worker import JobApp, ScheduleStatus, schedule_status
from ._common import (
    CommandError,
    Handler,
    _add_command,
    _add_database_url,
    _positive_int,
    parse_duration,
    positive_seconds,
)
from ._pause import add_pause_actions
from ._render import as_json, table
from ._targets import (
    add_job_target,
    add_outbox_target,
    add_pause_target,
    database,
    dependencies_table,
    job_table,
    outbox_table,
    pause_table,
)
from ._worker import load_target

#: Clears a terminal and puts the cursor home: ``--watch`` redraws in place with it.
CLEAR = "\x1b[H\x1b[2J"

_STATUS_EXAMPLE = """\
example:
  sa-outbox status --model myapp.models:Job --outbox-model myapp.models:OutboxEvent
  sa-outbox status --jobs-table public.jobs --json
  sa-outbox status --model myapp.models:Job --watch 5
  sa-outbox status --app myapp.tasks:app    # the JobApp: its tables and its schedules
  sa-outbox status --jobs-table public.jobs --dependencies-table public.job_dependencies
"""

_QUEUES_EXAMPLE = """\
example:
  sa-outbox queues --model myapp.models:Job --within 15m
  sa-outbox queues --model myapp.models:Job --pause-model myapp.models:PausedQueue
  sa-outbox queues pause emails --by ana --model myapp.models:Job \
      --pause-model myapp.models:PausedQueue
  sa-outbox queues resume emails --model myapp.models:Job \
      --pause-model myapp.models:PausedQueue
"""


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "status",
        help="the queue at a glance: counts, oldest ready job, failures, leases, workers",
        description=(
            "Print the jobs by queue, kind and status, how long the oldest ready job has "
            "waited, the jobs failed in the last hour, the running jobs whose lease expired, "
            "the outbox backlog and parked events, the workflows, and the workers "
            "connected now. Give the job table, the outbox table, or both. Only reads."
        ),
        epilog=_STATUS_EXAMPLE,
    )
    add_job_target(parser)
    add_outbox_target(parser)
    add_pause_target(parser)
    parser.add_argument(
        "--app",
        metavar="TARGET",
        help="the JobApp, as module:attribute (what sa-outbox worker takes): list its "
        "schedules of periodic jobs, their next tick and the last one enqueued; its model "
        "is the job table unless --model or --jobs-table names another",
    )
    parser.add_argument(
        "--dependencies-table",
        metavar="TABLE",
        help="the dependencies table (JobDependencyMixin), e.g. public.job_dependencies: "
        "count the jobs waiting for others and the workflows by state (the JobApp's of "
        "--app when it has one)",
    )
    parser.add_argument(
        "--failed-within",
        metavar="DURATION",
        type=parse_duration,
        default=dt.timedelta(hours=1),
        help="count the jobs failed within this long (default: 1h)",
    )
    _add_output_and_database(parser, _status)


def _add_output_and_database(parser: argparse.ArgumentParser, handler: Handler) -> None:
    """``--json``, ``--watch``, ``--count`` and ``--database-url``; ``handler`` runs it."""
    parser.add_argument("--json", action="store_true", help="print JSON (one line per frame)")
    parser.add_argument(
        "--watch",
        metavar="SECONDS",
        nargs="?",
        const=2.0,
        type=positive_seconds,
        help="print again every SECONDS (default 2), in place on a terminal, until Ctrl-C",
    )
    parser.add_argument(
        "--count",
        metavar="N",
        type=_positive_int,
        help="with --watch: stop after N frames",
    )
    _add_database_url(parser)
    parser.set_defaults(handler=handler)


def _add_queues(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "queues",
        help="each queue's jobs by status and its throughput of the last minutes",
        description=(
            "Print each queue's jobs by status and how many finished (succeeded or failed, "
            "by updated_at) within --within, per minute, and with the pause table whether "
            "it is paused. Only reads. The actions pause and resume a queue."
        ),
        epilog=_QUEUES_EXAMPLE,
    )
    add_pause_actions(parser)
    add_job_target(parser)
    add_pause_target(parser)
    parser.add_argument(
        "--within",
        metavar="DURATION",
        type=parse_duration,
        default=dt.timedelta(minutes=5),
        help="the window of the throughput (default: 5m)",
    )
    _add_output_and_database(parser, _queues)


def _statuses(found: set[str]) -> list[str]:
    """Every status of `JobStatus` in its order, then any other the table holds."""
    known = [str(s) for s in JobStatus]
    return known + sorted(found - set(known))


def format_status(status: QueueStatus, schedules: list[ScheduleStatus] | None = None) -> str:
    """``sa-outbox status``'s readable report."""
    lines = [f"sa-outbox status at {moment(status.taken_at)} UTC"]
    jobs = status.jobs
    if jobs is not None:
        columns = _statuses({c.status for c in jobs.counts})
        grid: dict[tuple[str, str], dict[str, int]] = {}
        for c in jobs.counts:
            grid.setdefault((c.queue, c.kind), {})[c.status] = c.jobs
        rows: list[list[object]] = [
            [queue, kind, *(found.get(s, 0) for s in columns)]
            for (queue, kind), found in grid.items()
        ]
        rows.append(["total", "", *(jobs.by_status.get(s, 0) for s in columns)])
        lines += ["", f"jobs ({jobs.table})"]
        lines.append(table(["queue", "kind", *columns], rows, right=len(columns)))
        within = f"failed, last {span(jobs.failed_within)}"
        lines += [
            "",
            f"oldest ready job   {_waiting(jobs.oldest_ready_age)}",
            f"{within:<18} {jobs.failed_recently}",
            f"expired leases     {jobs.expired_leases} running job(s) past their lease",
        ]
    outbox = status.outbox
    if outbox is not None:
        oldest = (
            ""
            if outbox.oldest_backlog_age is None
            else f", oldest {age(outbox.oldest_backlog_age)}"
        )
        lines += [
            "",
            f"outbox ({outbox.table})",
            f"backlog            {outbox.backlog} unpublished{oldest}",
            f"parked             {outbox.parked}",
        ]
    workflows = status.workflows
    if workflows is not None:
        states = ", ".join(f"{n} {state}" for state, n in workflows.by_state.items())
        lines += [
            "",
            f"workflows ({workflows.table})",
            f"waiting jobs       {workflows.waiting} in {workflows.waiting_workflows} workflow(s)",
            f"workflows          {states or 'not counted'}",
        ]
    if status.paused is not None:
        lines += ["", f"paused queues      {len(status.paused)}"]
        paused_rows = [[p.queue, moment(p.paused_at), p.paused_by or ""] for p in status.paused]
        if paused_rows:
            lines.append(_indent(table(["queue", "since", "by"], paused_rows)))
    if schedules is not None:
        lines += ["", f"schedules          {len(schedules)}"]
        schedule_rows = [
            [
                s.name,
                s.kind,
                s.when,
                moment(s.next_tick),
                "none in the table" if s.last_enqueued is None else moment(s.last_enqueued),
            ]
            for s in schedules
        ]
        if schedule_rows:
            headers = ["schedule", "kind", "when", "next tick (UTC)", "last enqueued (UTC)"]
            lines.append(_indent(table(headers, schedule_rows)))
    lines += ["", f"workers connected  {len(status.workers)}"]
    if status.workers:
        worker_rows = [
            [w.worker_id, w.connections, moment(w.connected_since), w.client_addr or "local"]
            for w in status.workers
        ]
        lines.append(_indent(table(["worker", "connections", "since", "from"], worker_rows)))
    if jobs is not None and jobs.holders:
        lines.append(f"workers with jobs  {len(jobs.holders)}")
        holder_rows = [
            [h.worker_id, h.running, h.expired, moment(h.lease_until)] for h in jobs.holders
        ]
        lines.append(_indent(table(["worker", "running", "expired", "lease until"], holder_rows)))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _waiting(value: dt.timedelta | None) -> str:
    return "none ready" if value is None else f"waiting {age(value)}"


def format_queues(depths: list[QueueDepth], within: dt.timedelta) -> str:
    """``sa-outbox queues``'s readable table."""
    if not depths:
        return "no jobs"
    columns = _statuses({s for d in depths for s in d.counts})
    window = span(within)
    rows: list[list[object]] = [
        [d.queue, *(d.counts.get(s, 0) for s in columns), d.succeeded + d.failed, d.per_minute]
        for d in depths
    ]
    headers = ["queue", *columns, f"done {window}", "per min"]
    numbers = len(columns) + 2  # the counts, the done and the per-minute columns
    if any(d.paused is not None for d in depths):
        headers.append("paused")
        for row, d in zip(rows, depths, strict=True):
            row.append("paused" if d.paused else "")
        numbers += 1  # its cells are all "paused" or blank: aligned either way
    return table(headers, rows, right=numbers)


def _watch(args: argparse.Namespace, render: Callable[[], str]) -> int:
    """Print ``render()`` once, or every ``--watch`` seconds (``--count`` times at most)."""
    if args.watch is None:
        if args.count is not None:
            raise CommandError("--count goes with --watch: e.g. --watch 5 --count 3")
        print(render())
        return 0
    in_place = not args.json and sys.stdout.isatty()
    shown = 0
    try:
        while True:
            text = render()
            if in_place:
                sys.stdout.write(CLEAR)
            elif shown and not args.json:
                print()
            print(text, flush=True)
            shown += 1
            if args.count is not None and shown >= args.count:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _status(args: argparse.Namespace) -> int:
    app: JobApp | None = None if args.app is None else load_target(args.app)
    with database(args) as engine:
        tables: list[Table | None] = []  # found at the first frame, kept for the next ones

        def frame() -> str:
            with engine.connect() as conn:
                if not tables:
                    tables.extend(
                        (
                            job_table(args, conn, required=False),
                            outbox_table(args, conn, required=False),
                            pause_table(args, conn, required=False),
                            _dependencies(args, conn, app),
                        )
                    )
                jobs, outbox, pauses, dependencies = tables
                if jobs is None and app is not None:
                    jobs = tables[0] = resolve_table(app.model)
                if dependencies is not None and jobs is None:
                    raise CommandError(
                        "--dependencies-table goes with the job table: add --model "
                        "myapp.models:Job or --jobs-table SCHEMA.TABLE"
                    )
                if jobs is None and outbox is None:
                    raise CommandError(
                        "give the job table (--model myapp.models:Job or --jobs-table "
                        "SCHEMA.TABLE), the outbox (--outbox-model TARGET or --outbox-table "
                        "SCHEMA.TABLE), or both"
                    )
                found = queue_status(
                    conn,
                    jobs=jobs,
                    outbox=outbox,
                    failed_within=args.failed_within,
                    pauses=pauses,
                    dependencies=dependencies,
                )
                schedules = None
                if app is not None and found.taken_at is not None:
                    schedules = schedule_status(conn, app.schedules, jobs, now=found.taken_at)
            if args.json:
                plain = found.as_dict()
                if schedules is not None:
                    plain["schedules"] = as_plain(schedules)
                return as_json(plain)
            return format_status(found, schedules)

        return _watch(args, frame)


def _dependencies(args: argparse.Namespace, conn: Any, app: JobApp | None) -> Table | None:
    """The dependencies table: ``--dependencies-table``'s, else the ``--app``'s, if any."""
    if args.dependencies_table is not None:
        return dependencies_table(args, conn)
    return None if app is None else app.dependencies_table


def _queues(args: argparse.Namespace) -> int:
    with database(args) as engine:
        tables: list[Table | None] = []

        def frame() -> str:
            with engine.connect() as conn:
                if not tables:
                    found = job_table(args, conn)
                    assert found is not None
                    tables.extend((found, pause_table(args, conn, required=False)))
                jobs, pauses = tables
                depths = queue_depths(conn, jobs, within=args.within, pauses=pauses)
            if args.json:
                return as_json(
                    [
                        {
                            "queue": d.queue,
                            "counts": d.counts,
                            "succeeded": d.succeeded,
                            "failed": d.failed,
                            "within": d.within,
                            "per_minute": d.per_minute,
                            "paused": d.paused,
                        }
                        for d in depths
                    ]
                )
            return format_queues(depths, args.within)

        return _watch(args, frame)
