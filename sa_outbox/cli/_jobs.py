"""``sa-outbox jobs``: the job table by hand. ``jobs enqueue`` adds one job, ``jobs list``
lists jobs with the first line of their error, ``jobs show`` prints one job whole, and
``jobs retry`` sends failed jobs back to pending (attempts kept, as River and Oban do).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any, NoReturn

from sqlalchemy import Table

from .._exceptions import SaOutboxError
from .._human import moment
from ..queue import (
    EnqueueResult,
    JobQueue,
    get_job,
    get_job_steps,
    kind_exists,
    list_jobs,
    retry_failed,
)
from ..schema import JobStatus
from ..statements import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, Unique
from ._common import (
    CommandError,
    _add_command,
    _names,
    _positive_int,
    _whole_number,
    parse_duration,
)
from ._render import as_json, format_record, format_retried, listed_ids, table
from ._targets import (
    add_job_target,
    add_json_and_target,
    add_steps_target,
    connection,
    job_id,
    job_table,
    steps_table,
)


def _add_jobs(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "jobs",
        help="work with the job table by hand: enqueue, list, show, retry, cancel",
        description="Work with the job table by hand.",
        epilog=(
            "example:\n"
            "  sa-outbox jobs list --status failed --model myapp.models:Job\n"
            "  sa-outbox jobs retry --all-failed --kind send-email --model myapp.models:Job"
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, title="actions")
    enqueue = _add_command(
        actions,
        "enqueue",
        help="add one job, as JobQueue.enqueue does, and print its id",
        description=(
            "Add one job of KIND to the job table (--model or --jobs-table), in a transaction "
            "of its own, and print its id; a job whose --dedup-key is already taken by a job "
            "of the same kind, or a unique job (--unique...) whose key another job holds, is "
            "skipped (and said so), not an error. Workers listening on the table are woken at "
            "commit. Durations: 30s, 5m, 2h, 1d, 1w."
        ),
        epilog=(
            "example:\n"
            "  sa-outbox jobs enqueue send-receipt --payload '{\"order_id\": 42}' \\\n"
            "    --dedup-key receipt:42 --delay 5m --model myapp.models:Job\n"
            "  sa-outbox jobs enqueue report --payload '{\"customer_id\": 7}' \\\n"
            "    --unique-fields customer_id --unique-period 1h --jobs-table public.jobs"
        ),
    )
    enqueue.add_argument("kind", metavar="KIND", help="the job kind, e.g. send-receipt")
    enqueue.add_argument(
        "--payload",
        metavar="JSON",
        required=True,
        help="the payload, as JSON: e.g. '{\"order_id\": 42}'",
    )
    enqueue.add_argument(
        "--queue",
        metavar="Q",
        default=DEFAULT_QUEUE,
        help="the queue (default: %(default)s)",
    )
    enqueue.add_argument(
        "--priority",
        metavar="N",
        type=_whole_number,
        default=0,
        help="higher runs first (default: %(default)s)",
    )
    when = enqueue.add_mutually_exclusive_group()
    when.add_argument(
        "--delay",
        metavar="DURATION",
        type=parse_duration,
        help="run no sooner than this long after now (default: now)",
    )
    when.add_argument(
        "--run-at",
        metavar="ISO",
        type=aware_timestamp,
        help="run no sooner than this time, with its zone: 2030-01-01T09:00:00+00:00",
    )
    enqueue.add_argument(
        "--dedup-key",
        metavar="K",
        help="deduplication key: skipped if a job of this kind already has it",
    )
    enqueue.add_argument(
        "--max-attempts",
        metavar="N",
        type=_positive_int,
        default=DEFAULT_MAX_ATTEMPTS,
        help="attempts before the job fails for good (default: %(default)s)",
    )
    enqueue.add_argument(
        "--header",
        metavar="NAME=VALUE",
        type=header_pair,
        action="append",
        dest="headers",
        help="a header of the job (repeat for more), e.g. --header tenant=acme",
    )
    enqueue.add_argument(
        "--lock-key",
        metavar="K",
        help="serial key: jobs sharing it run one at a time, in commit order (docs/limits.md)",
    )
    _add_unique(enqueue)
    add_json_and_target(
        enqueue, add_job_target, json_help='print {"id": ..., "inserted": ...} instead'
    )
    enqueue.set_defaults(handler=_enqueue, parser=enqueue)
    _add_list(actions)
    _add_show(actions)
    _add_retry(actions)
    _add_cancel(actions)


_LIST_EXAMPLE = """\
example:
  sa-outbox jobs list --model myapp.models:Job --status failed --kind send-email
  sa-outbox jobs list --jobs-table public.jobs --queue emails --limit 100 --json
"""

_SHOW_EXAMPLE = """\
example:
  sa-outbox jobs show 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e --model myapp.models:Job
  sa-outbox jobs show 0b0e6c1e-… --jobs-table public.jobs --steps-table public.job_steps
"""

_RETRY_EXAMPLE = """\
example:
  sa-outbox jobs retry 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e --model myapp.models:Job
  sa-outbox jobs retry --all-failed --kind send-email --model myapp.models:Job

A retried job keeps its attempts (the history stays true); a job that used them all gets
one more (max_attempts is raised to attempts + 1), as River and Oban retry. --reset-attempts
gives it every attempt again instead. Only failed jobs change: never a running one.
"""


def _add_list(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        actions,
        "list",
        help="list jobs, most recently updated first, with their error's first line",
        description="List jobs, most recently updated first. Filters combine. Only reads.",
        epilog=_LIST_EXAMPLE,
    )
    parser.add_argument(
        "--status",
        metavar="S",
        choices=_STATUSES,
        help=f"only jobs in this status: {', '.join(_STATUSES)} (default: any)",
    )
    parser.add_argument("--kind", metavar="K", help="only jobs of this kind")
    parser.add_argument("--queue", metavar="Q", help="only jobs of this queue")
    parser.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=50,
        help="at most N jobs (default: %(default)s)",
    )
    add_json_and_target(parser, add_job_target, json_help="print a JSON list instead")
    parser.set_defaults(handler=_list)


def _add_show(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        actions,
        "show",
        help="print one job: every column, the payload and the whole last error",
        description=(
            "Print every column of one job, its payload and its whole last error; with "
            "--steps-table, its durable steps, its result, sleeps and signals too."
        ),
        epilog=_SHOW_EXAMPLE,
    )
    parser.add_argument("id", metavar="ID", type=job_id, help="the job's id")
    add_steps_target(parser)
    add_json_and_target(parser, add_job_target, json_help="print a JSON object instead")
    parser.set_defaults(handler=_show)


def _add_retry(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        actions,
        "retry",
        help="send failed jobs back to pending now (by id, or --all-failed)",
        description=(
            "Send failed jobs back to pending, ready now, and wake the workers. By id: all "
            "or nothing (an unknown id, or a job that is not failed, changes nothing)."
        ),
        epilog=_RETRY_EXAMPLE,
    )
    parser.add_argument("ids", metavar="ID", nargs="*", type=job_id, help="the jobs' ids")
    parser.add_argument(
        "--all-failed", action="store_true", help="every failed job (narrowed by --kind, --queue)"
    )
    parser.add_argument("--kind", metavar="K", help="with --all-failed: only this kind")
    parser.add_argument("--queue", metavar="Q", help="with --all-failed: only this queue")
    parser.add_argument(
        "--reset-attempts", action="store_true", help="start the attempts again from zero"
    )
    add_json_and_target(parser, add_job_target, json_help='print {"retried": [...]} instead')
    parser.set_defaults(handler=_retry, parser=parser)


_CANCEL_EXAMPLE = """\
example:
  sa-outbox jobs cancel 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e --model myapp.models:Job

A waiting job (pending, scheduled or waiting to retry) is cancelled at once and never runs;
a running one is cancelled too, and its worker stops the handler at its next heartbeat.
Finished jobs are left alone. All or nothing: an unknown id changes nothing.
"""


def _add_cancel(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        actions,
        "cancel",
        help="cancel jobs by id: waiting ones never run, running ones stop at a heartbeat",
        description=(
            "Cancel jobs: they end in the cancelled state. By id, all or nothing (an unknown "
            "id changes nothing)."
        ),
        epilog=_CANCEL_EXAMPLE,
    )
    parser.add_argument("ids", metavar="ID", nargs="+", type=job_id, help="the jobs' ids")
    add_json_and_target(
        parser,
        add_job_target,
        json_help='print {"cancelled": [...], "cancelling": [...], "finished": [...]} instead',
    )
    parser.set_defaults(handler=_cancel)


def _cancel(args: argparse.Namespace) -> int:
    with connection(args, write=True) as conn:
        jobs = job_table(args, conn)
        assert jobs is not None
        result = JobQueue(jobs).cancel(conn, args.ids)
        if result.unknown:  # raised inside the transaction: it is rolled back
            missing = ", ".join(str(i) for i in result.unknown)
            raise CommandError(f"no job {missing} in {jobs.fullname}; nothing was cancelled")
    if args.json:
        print(
            as_json(
                {
                    "cancelled": result.cancelled,
                    "cancelling": result.cancelling,
                    "finished": result.finished,
                }
            )
        )
        return 0
    lines = []
    if result.cancelled:
        lines.append(f"cancelled {len(result.cancelled)} waiting job(s):")
        lines.append(listed_ids(result.cancelled))
    if result.cancelling:
        lines.append(
            f"cancelling {len(result.cancelling)} running job(s), stopped at their worker's "
            "next heartbeat:"
        )
        lines.append(listed_ids(result.cancelling))
    if result.finished:
        lines.append(f"left {len(result.finished)} finished job(s) alone:")
        lines.append(listed_ids(result.finished))
    print("\n".join(lines))
    return 0


def _add_unique(parser: argparse.ArgumentParser) -> None:
    """The options of a unique job (`Unique`, docs/unique.md); any of them makes it one."""
    group = parser.add_argument_group(
        "unique job",
        "skipped while another job of the kind with the same key is in one of the states "
        "(docs/unique.md); any --unique-... option makes the job unique",
    )
    group.add_argument(
        "--unique", action="store_true", help="unique by the kind and the whole payload"
    )
    made_of = group.add_mutually_exclusive_group()
    made_of.add_argument(
        "--unique-fields",
        metavar="A,B",
        type=_names,
        help="the key is made of these top-level fields of the payload",
    )
    made_of.add_argument(
        "--unique-key", metavar="K", help="the key is this string (the payload plays no part)"
    )
    group.add_argument("--unique-by-queue", action="store_true", help="the queue is in the key")
    group.add_argument(
        "--unique-period",
        metavar="DURATION",
        type=parse_duration,
        help="hold the key only within fixed windows this long, e.g. 1h",
    )
    group.add_argument(
        "--unique-states",
        metavar="A,B",
        type=_names,
        help="the states in which a job holds its key; must include pending and running "
        "(default: pending,running,succeeded)",
    )


def _unique(args: argparse.Namespace) -> Unique | None:
    """The `Unique` the ``--unique...`` options describe (``None``: none given)."""
    given = (
        args.unique
        or args.unique_fields is not None
        or args.unique_key is not None
        or args.unique_by_queue
        or args.unique_period is not None
        or args.unique_states is not None
    )
    if not given:
        return None
    options: dict[str, Any] = {
        "fields": args.unique_fields,
        "key": args.unique_key,
        "by_queue": args.unique_by_queue,
        "period": args.unique_period,
    }
    if args.unique_states is not None:
        options["states"] = args.unique_states
    try:
        return Unique(**options)
    except SaOutboxError as exc:
        _usage_error(args, str(exc))


def _usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    """Exit with 2, as argparse does on a usage error, but with the one line alone: the
    usage would bury the message (a payload's JSON is checked after parsing)."""
    parser: argparse.ArgumentParser = args.parser
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_payload(value: str) -> Any:
    """A job payload given on the command line: a JSON text (``NaN``, ``Infinity`` refused).

    Examples:
        >>> json_payload('{"order_id": 42}')
        {'order_id': 42}
        >>> json_payload("{order_id: 42}")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)): '{order_id: 42}'
    """  # noqa: E501 - a doctest's expected output is one line
    try:
        return json.loads(value, parse_constant=_not_json_constant)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {value!r}") from None


def header_pair(value: str) -> tuple[str, str]:
    """A ``--header`` given on the command line: ``NAME=VALUE`` (the value may hold ``=``).

    Examples:
        >>> header_pair("tenant=acme"), header_pair("q=a=b")
        (('tenant', 'acme'), ('q', 'a=b'))
        >>> header_pair("tenant")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected NAME=VALUE, got 'tenant'
    """
    name, sep, header_value = value.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    return name, header_value


def aware_timestamp(value: str) -> dt.datetime:
    """An ISO 8601 time with its zone (``Z`` or ``+02:00``), as ``--run-at`` takes it.

    Examples:
        >>> aware_timestamp("2030-01-01T09:00:00Z")
        datetime.datetime(2030, 1, 1, 9, 0, tzinfo=datetime.timezone.utc)
        >>> aware_timestamp("2030-01-01T09:00:00")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: needs a time zone, e.g. 2030-01-01T09:00:00+00:00 or 2030-01-01T09:00:00Z, got '2030-01-01T09:00:00'
    """  # noqa: E501 - a doctest's expected output is one line
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time like 2030-01-01T09:00:00+00:00, got {value!r}"
        ) from None
    if moment.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"needs a time zone, e.g. {moment.isoformat()}+00:00 or {moment.isoformat()}Z, "
            f"got {value!r}"
        )
    return moment


def _format_enqueued(result: EnqueueResult, args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(
            {"id": None if result.id is None else str(result.id), "inserted": result.inserted}
        )
    if result.inserted:
        return f"enqueued job {result.id} ({args.kind}, queue {args.queue})"
    if args.dedup_key is None:
        return f"skipped: a job of kind {args.kind!r} holds the same unique key"
    unique = " or the same unique key" if _unique(args) is not None else ""
    return (
        f"skipped: a job of kind {args.kind!r} with deduplication key {args.dedup_key!r}"
        f"{unique} already exists"
    )


def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json_payload(args.payload)
    except argparse.ArgumentTypeError as exc:
        _usage_error(args, f"argument --payload: {exc}")
    unique = _unique(args)
    with connection(args, write=True) as conn:
        jobs = job_table(args, conn)
        assert jobs is not None
        result = JobQueue(jobs).enqueue(
            conn,
            args.kind,
            payload,
            queue=args.queue,
            priority=args.priority,
            run_at=args.run_at,
            delay=args.delay,
            max_attempts=args.max_attempts,
            deduplication_key=args.dedup_key,
            headers=None if not args.headers else dict(args.headers),
            lock_key=args.lock_key,
            unique=unique,
        )
    print(_format_enqueued(result, args))
    return 0


_STATUSES = tuple(str(s) for s in JobStatus)


def _check_kind(conn: Any, jobs: Table, kind: str | None) -> None:
    if kind is not None and not kind_exists(conn, jobs, kind):
        raise CommandError(f"unknown kind {kind!r}: no job of that kind in {jobs.fullname}")


def _list(args: argparse.Namespace) -> int:
    with connection(args) as conn:
        jobs = job_table(args, conn)
        assert jobs is not None
        _check_kind(conn, jobs, args.kind)
        found = list_jobs(
            conn, jobs, statuses=args.status, kinds=args.kind, queues=args.queue, limit=args.limit
        )
    if args.json:
        print(as_json(found))
        return 0
    if not found:
        print("no jobs match")
        return 0
    rows = [
        [
            j.id,
            j.queue,
            j.kind,
            j.status,
            f"{j.attempts}/{j.max_attempts}",
            moment(j.updated_at),
            _clip(j.error_line),
        ]
        for j in found
    ]
    print(table(["id", "queue", "kind", "status", "attempts", "updated (UTC)", "error"], rows))
    return 0


def _clip(text: str | None, width: int = 80) -> str:
    if not text:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def _show(args: argparse.Namespace) -> int:
    with connection(args) as conn:
        jobs = job_table(args, conn)
        assert jobs is not None
        found = get_job(conn, jobs, args.id)
        steps_of = steps_table(args, conn)
        steps = None if steps_of is None else get_job_steps(conn, steps_of, args.id)
    if found is None:
        raise CommandError(f"no job {args.id} in {jobs.fullname}")
    if args.json:
        print(as_json(found if steps is None else {**found, "steps": steps}))
        return 0
    print(format_record(found, long=("payload", "headers", "last_error")))
    if steps is not None:
        print(f"\nsteps ({len(steps)})")
        if steps:
            rows = [[step.name, moment(step.created_at), _short(step.result)] for step in steps]
            print(table(["name", "recorded (UTC)", "result"], rows))
    return 0


def _short(value: object, width: int = 60) -> str:
    """A step's result as one line of JSON, cut at ``width`` characters."""
    text = as_json(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _retry(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    if args.ids and args.all_failed:
        parser.error("give job ids or --all-failed, not both")
    if not args.ids and not args.all_failed:
        parser.error("give the ids of the jobs to retry, or --all-failed")
    if args.ids and (args.kind or args.queue):
        parser.error("--kind and --queue go with --all-failed, not with ids")
    with connection(args, write=True) as conn:
        jobs = job_table(args, conn)
        assert jobs is not None
        _check_kind(conn, jobs, args.kind)
        retried = retry_failed(
            conn,
            jobs,
            ids=args.ids or None,
            kinds=args.kind,
            queues=args.queue,
            reset_attempts=args.reset_attempts,
        )
    print(
        format_retried(
            retried,
            in_json=args.json,
            nothing="no job retried" if retried.skipped else "no failed jobs to retry",
            done=f"retried {len(retried)} job(s), pending now:",
            skipped=retried.skipped,
        )
    )
    return 0
