"""``sa-outbox outbox``: the outbox by hand. ``outbox list`` lists the relay's backlog or the
parked events, ``outbox show`` prints one event whole, ``outbox retry`` un-parks events."""

from __future__ import annotations

import argparse

from .._human import moment
from ..queue import get_event, list_events, retry_parked
from ._common import CommandError, _add_command, _positive_int
from ._render import as_json, format_record, format_retried, table
from ._targets import add_json_and_target, add_outbox_target, connection, job_id, outbox_table

_LIST_EXAMPLE = """\
example:
  sa-outbox outbox list --parked --outbox-model myapp.models:OutboxEvent
  sa-outbox outbox list --outbox-table public.outbox --limit 10 --json
"""

_SHOW_EXAMPLE = """\
example:
  sa-outbox outbox show 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e \\
    --outbox-model myapp.models:OutboxEvent
"""

_RETRY_EXAMPLE = """\
example:
  sa-outbox outbox retry 0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e \\
    --outbox-model myapp.models:OutboxEvent
  sa-outbox outbox retry --all-parked --outbox-model myapp.models:OutboxEvent

A retried event's attempts start again from zero; relays take it again at once, in its
aggregate's order (the events after it, held back while it was parked, follow it).
"""


def _add_outbox(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _add_command(
        commands,
        "outbox",
        help="work with the outbox by hand: list, show and retry parked events",
        description="Work with the outbox table by hand.",
        epilog=(
            "example:\n"
            "  sa-outbox outbox list --parked --outbox-model myapp.models:OutboxEvent\n"
            "  sa-outbox outbox retry --all-parked --outbox-model myapp.models:OutboxEvent"
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, title="actions")
    listing = _add_command(
        actions,
        "list",
        help="list the unpublished events (the relay's backlog), or --parked ones",
        description="List unpublished events in seq order, with their error's first line.",
        epilog=_LIST_EXAMPLE,
    )
    listing.add_argument("--parked", action="store_true", help="the parked events instead")
    listing.add_argument(
        "--limit", metavar="N", type=_positive_int, default=50, help="(default: %(default)s)"
    )
    add_json_and_target(listing, add_outbox_target, json_help="print a JSON list instead")
    listing.set_defaults(handler=_list)

    show = _add_command(
        actions,
        "show",
        help="print one event: every column, the payload and the whole last error",
        description="Print every column of one outbox event, with its payload and last error.",
        epilog=_SHOW_EXAMPLE,
    )
    show.add_argument("id", metavar="ID", type=job_id, help="the event's id")
    add_json_and_target(show, add_outbox_target, json_help="print a JSON object instead")
    show.set_defaults(handler=_show)

    retry = _add_command(
        actions,
        "retry",
        help="un-park parked events (by id, or --all-parked) so relays publish them again",
        description=(
            "Un-park parked events and wake the relays. By id: all or nothing (an unknown "
            "id, or an event that is not parked, changes nothing)."
        ),
        epilog=_RETRY_EXAMPLE,
    )
    retry.add_argument("ids", metavar="ID", nargs="*", type=job_id, help="the events' ids")
    retry.add_argument("--all-parked", action="store_true", help="every parked event")
    add_json_and_target(retry, add_outbox_target, json_help='print {"retried": [...]} instead')
    retry.set_defaults(handler=_retry, parser=retry)


def _list(args: argparse.Namespace) -> int:
    with connection(args) as conn:
        outbox = outbox_table(args, conn)
        found = list_events(conn, outbox, parked=args.parked, limit=args.limit)
    if args.json:
        print(as_json(found))
        return 0
    if not found:
        print("no parked events" if args.parked else "no unpublished events")
        return 0
    when = "parked (UTC)" if args.parked else "created (UTC)"
    rows = [
        [
            e.id,
            e.seq,
            e.event_type,
            f"{e.aggregate_type}:{e.aggregate_id}",
            e.attempts,
            moment(e.parked_at if args.parked else e.created_at),
            e.error_line or "",
        ]
        for e in found
    ]
    print(table(["id", "seq", "type", "aggregate", "attempts", when, "error"], rows))
    return 0


def _show(args: argparse.Namespace) -> int:
    with connection(args) as conn:
        outbox = outbox_table(args, conn)
        assert outbox is not None
        found = get_event(conn, outbox, args.id)
    if found is None:
        raise CommandError(f"no event {args.id} in {outbox.fullname}")
    long = ("payload", "headers", "last_error")
    print(as_json(found) if args.json else format_record(found, long=long))
    return 0


def _retry(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    if bool(args.ids) == bool(args.all_parked):
        parser.error("give the ids of the events to retry, or --all-parked (not both)")
    with connection(args, write=True) as conn:
        outbox = outbox_table(args, conn)
        retried = retry_parked(conn, outbox, ids=args.ids or None)
    print(
        format_retried(
            retried,
            in_json=args.json,
            nothing="no parked events to retry",
            done=f"retried {len(retried)} event(s), unparked:",
        )
    )
    return 0
