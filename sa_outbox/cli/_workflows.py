"""``sa-outbox workflows``: jobs linked by ``after=`` seen whole. ``workflows list`` counts
each workflow's jobs by state, ``workflows show`` prints one as a graph of its jobs,
``workflows cancel`` cancels every job of one that has not finished, and ``workflows retry``
runs again what failed or was cancelled in one.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from sqlalchemy import Connection, Table

from .._human import moment
from ..queue import JobQueue, WorkflowJob, get_workflow, list_workflows, workflow_depths
from ._common import CommandError, _add_command, _positive_int
from ._render import as_json, listed_ids, table
from ._targets import (
    add_job_target,
    add_json_and_target,
    connection,
    dependencies_table,
    job_id,
    job_table,
)

_TABLE_HELP = "the dependencies table (JobDependencyMixin), e.g. public.job_dependencies"
_EXAMPLE = (
    "example:\n"
    "  sa-outbox workflows list --jobs-table public.jobs "
    "--dependencies-table public.job_dependencies\n"
    "  sa-outbox workflows show 0192f0c4-… --model myapp.models:Job "
    "--dependencies-table public.job_dependencies"
)


def _add_workflows(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "workflows",
        help="jobs that wait for jobs, seen whole: list, show, cancel, retry",
        description=(
            "Workflows: a job and the jobs enqueued after it (after=), and after those, in "
            "the dependencies table."
        ),
        epilog=_EXAMPLE,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, title="actions")
    listing = _add_command(
        actions,
        "list",
        help="each workflow, most recently active first, with its jobs counted by state",
        description="List workflows, most recently active first. Only reads.",
        epilog=_EXAMPLE,
    )
    listing.add_argument(
        "--limit", metavar="N", type=_positive_int, default=20, help="at most N (default: 20)"
    )
    _add_targets(listing, "print a JSON list instead")
    listing.set_defaults(handler=_list)
    show = _add_command(
        actions,
        "show",
        help="one workflow: each job, what it waits for, its state and times",
        description=(
            "Print the workflow a job belongs to (any of its jobs' ids will do): each job, "
            "indented by how deep it sits, with the jobs it waits for. Only reads."
        ),
        epilog=_EXAMPLE,
    )
    show.add_argument("id", metavar="ID", type=job_id, help="the id of any job of the workflow")
    _add_targets(show, "print a JSON object instead")
    show.set_defaults(handler=_show)
    cancel = _add_command(
        actions,
        "cancel",
        help="cancel every job of a workflow that has not finished",
        description=(
            "Cancel every job of the workflow a job belongs to that has not finished: waiting "
            "and pending ones never run, running ones stop at their worker's next heartbeat."
        ),
        epilog=_EXAMPLE,
    )
    cancel.add_argument("id", metavar="ID", type=job_id, help="the id of any job of the workflow")
    _add_targets(cancel, 'print {"cancelled": [...], "cancelling": [...]} instead')
    cancel.set_defaults(handler=_cancel)
    retry = _add_command(
        actions,
        "retry",
        help="run again what failed or was cancelled in a workflow",
        description=(
            "Run again what failed or was cancelled in the workflow a job belongs to: each "
            "such job whose parents all succeeded goes back to pending with all its "
            "attempts; the others wait again for their parents. Jobs that succeeded are "
            "never run again."
        ),
        epilog=_EXAMPLE,
    )
    retry.add_argument("id", metavar="ID", type=job_id, help="the id of any job of the workflow")
    _add_targets(retry, 'print {"requeued": [...], "waiting": [...], "skipped": [...]} instead')
    retry.set_defaults(handler=_retry)


def _add_targets(parser: argparse.ArgumentParser, json_help: str) -> None:
    parser.add_argument("--dependencies-table", metavar="TABLE", required=True, help=_TABLE_HELP)
    add_json_and_target(parser, add_job_target, json_help=json_help)


def _tables(args: argparse.Namespace, conn: Connection) -> tuple[Table, Table]:
    jobs = job_table(args, conn)
    assert jobs is not None
    return jobs, dependencies_table(args, conn)


def _list(args: argparse.Namespace) -> int:
    with connection(args) as conn:
        jobs, deps = _tables(args, conn)
        found = list_workflows(conn, jobs, deps, limit=args.limit)
    if args.json:
        print(as_json(found))
        return 0
    if not found:
        print("no workflows")
        return 0
    rows = [
        [
            flow.id,
            flow.jobs,
            ", ".join(f"{n} {state}" for state, n in flow.states.items()),
            moment(flow.started),
            moment(flow.updated),
        ]
        for flow in found
    ]
    print(table(["workflow", "jobs", "states", "started (UTC)", "updated (UTC)"], rows))
    return 0


def _members(args: argparse.Namespace) -> tuple[uuid.UUID, list[WorkflowJob], Table]:
    with connection(args) as conn:
        jobs, deps = _tables(args, conn)
        workflow_id, members = get_workflow(conn, jobs, deps, args.id)
    if not members:
        raise CommandError(f"no job {args.id} in {jobs.fullname} or {deps.fullname}")
    return workflow_id, members, jobs


def _show(args: argparse.Namespace) -> int:
    workflow_id, members, _ = _members(args)
    if args.json:
        print(as_json({"id": workflow_id, "jobs": members}))
        return 0
    depth = workflow_depths(members)
    rows = [
        [
            str(job.id)[-8:],
            "  " * depth[job.id] + job.kind,
            job.status,
            f"{job.attempts}/{job.max_attempts}" if job.max_attempts else "",
            ", ".join(str(parent)[-8:] for parent in job.parents),
            moment(job.updated_at or job.created_at),
        ]
        for job in members
    ]
    print(f"workflow {workflow_id}: {len(members)} jobs")
    print(table(["id", "kind", "status", "attempts", "waits for", "updated (UTC)"], rows))
    errors = [job for job in members if job.last_error and job.status in ("failed", "pending")]
    for job in errors:
        print(f"{str(job.id)[-8:]}: {job.last_error.splitlines()[0] if job.last_error else ''}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    workflow_id, members, jobs = _members(args)
    open_ids = [job.id for job in members if job.status in ("waiting", "pending", "running")]
    result: Any = None
    if open_ids:
        with connection(args, write=True) as conn:
            _, deps = _tables(args, conn)
            result = JobQueue(jobs, dependencies=deps).cancel(conn, open_ids)
    cancelled = [] if result is None else result.cancelled
    cancelling = [] if result is None else result.cancelling
    if args.json:
        print(as_json({"id": workflow_id, "cancelled": cancelled, "cancelling": cancelling}))
        return 0
    if not open_ids:
        print(f"workflow {workflow_id}: every job has finished; nothing to cancel")
        return 0
    lines = [f"workflow {workflow_id}:"]
    if cancelled:
        lines += [f"cancelled {len(cancelled)} waiting job(s):", listed_ids(cancelled)]
    if cancelling:
        lines += [
            f"cancelling {len(cancelling)} running job(s), stopped at their worker's next "
            "heartbeat:",
            listed_ids(cancelling),
        ]
    print("\n".join(lines))
    return 0


def _retry(args: argparse.Namespace) -> int:
    workflow_id, _, jobs = _members(args)
    with connection(args, write=True) as conn:
        _, deps = _tables(args, conn)
        done = JobQueue(jobs, dependencies=deps).retry_workflow(conn, workflow_id)
    if args.json:
        print(as_json(done))
        return 0
    if not done.requeued and not done.waiting and not done.skipped:
        print(f"workflow {workflow_id}: nothing failed or was cancelled; nothing to retry")
        return 0
    lines = [f"workflow {workflow_id}:"]
    if done.requeued:
        lines += [f"requeued {len(done.requeued)} job(s), pending now:", listed_ids(done.requeued)]
    if done.waiting:
        lines += [
            f"{len(done.waiting)} job(s) wait again for the jobs they wait for:",
            listed_ids(done.waiting),
        ]
    if done.skipped:
        lines += [
            f"skipped {len(done.skipped)} unique job(s) whose key another job holds:",
            listed_ids(done.skipped),
        ]
    print("\n".join(lines))
    return 0
