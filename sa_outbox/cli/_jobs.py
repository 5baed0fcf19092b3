"""``sa-outbox jobs``: the job table by hand. ``jobs enqueue`` adds one job.

One module for the group, so that ``jobs list``, ``show`` and ``retry`` can join it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from sqlalchemy import Table
from sqlalchemy.exc import DBAPIError

from ..queue._job_queue import JobQueue
from ..queue._results import EnqueueResult
from ..schema import TABLE_KIND_INFO_KEY
from ..statements import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from ._common import (
    CommandError,
    _add_database_url,
    _connect,
    _database_error,
    _positive_int,
    load_table,
    parse_duration,
)


def _add_jobs(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "jobs",
        help="work with the job table by hand: enqueue a job",
        description="Work with the job table by hand.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, title="actions")
    enqueue = actions.add_parser(
        "enqueue",
        help="add one job, as JobQueue.enqueue does, and print its id",
        description=(
            "Add one job of KIND to the job table of --model, in a transaction of its own, "
            "and print its id; a job whose --dedup-key is already taken by a job of the same "
            "kind is skipped (and said so), not an error. Workers listening on the table "
            "are woken at commit. Durations: 30s, 5m, 2h, 1d, 1w."
        ),
    )
    enqueue.add_argument("kind", metavar="KIND", help="the job kind, e.g. send-receipt")
    enqueue.add_argument(
        "--payload",
        metavar="JSON",
        type=json_payload,
        required=True,
        help="the payload, as JSON: e.g. '{\"order_id\": 42}'",
    )
    enqueue.add_argument(
        "--model",
        metavar="TARGET",
        required=True,
        help="the job model (or its JobApp), as module:attribute, e.g. myapp.models:Job",
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
        "--json", action="store_true", help='print {"id": ..., "inserted": ...} instead'
    )
    _add_database_url(enqueue)
    enqueue.set_defaults(handler=_enqueue)


def _whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_payload(value: str) -> Any:
    """A job payload given on the command line: a JSON text (``NaN``, ``Infinity`` refused).

    Example:
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


def aware_timestamp(value: str) -> dt.datetime:
    """An ISO 8601 time with its zone (``Z`` or ``+02:00``), as ``--run-at`` takes it.

    Example:
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


def _job_table(target: str) -> Table:
    table = load_table(target)
    if table.info.get(TABLE_KIND_INFO_KEY) == "outbox":
        raise CommandError(f"{target} is an outbox model; jobs enqueue needs the job model")
    return table


def _format_enqueued(result: EnqueueResult, args: argparse.Namespace) -> str:
    if args.json:
        return json.dumps(
            {"id": None if result.id is None else str(result.id), "inserted": result.inserted}
        )
    if result.inserted:
        return f"enqueued job {result.id} ({args.kind}, queue {args.queue})"
    return (
        f"skipped: a job of kind {args.kind!r} with deduplication key {args.dedup_key!r} "
        "already exists"
    )


def _enqueue(args: argparse.Namespace) -> int:
    queue = JobQueue(_job_table(args.model))
    url, engine = _connect(args)
    try:
        with engine.begin() as conn:
            result = queue.enqueue(
                conn,
                args.kind,
                args.payload,
                queue=args.queue,
                priority=args.priority,
                run_at=args.run_at,
                delay=args.delay,
                max_attempts=args.max_attempts,
                deduplication_key=args.dedup_key,
            )
    except DBAPIError as exc:
        raise _database_error(url, exc) from exc
    finally:
        engine.dispose()
    print(_format_enqueued(result, args))
    return 0
