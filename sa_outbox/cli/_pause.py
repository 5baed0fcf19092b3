"""``sa-outbox queues pause QUEUE`` and ``sa-outbox queues resume QUEUE``.

They write the user's `QueuePauseMixin` table through `QueueControl`, in one transaction
each; the workers started with that table (``pauses=``) stop claiming the queue's jobs at
commit, and a resume wakes them (docs/control.md).
"""

from __future__ import annotations

import argparse

from .._exceptions import SaOutboxError
from .._human import moment
from .._validation import text
from ..queue import QueueControl, queue_exists
from ._common import CommandError, _add_command, _add_database_url
from ._targets import add_job_target, add_pause_target, connection, job_table, pause_table

_PAUSE_EXAMPLE = """\
example:
  sa-outbox queues pause emails --by "ana: SMTP provider down" \\
      --model myapp.models:Job --pause-model myapp.models:PausedQueue
  sa-outbox queues resume emails --jobs-table public.jobs --pause-table public.paused_queues
"""


def add_pause_actions(parser: argparse.ArgumentParser) -> None:
    """``pause`` and ``resume`` under ``sa-outbox queues`` (which still lists without one)."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title="actions")
    pause = _add_command(
        actions,
        "pause",
        help="pause a queue: no worker given the pause table claims its jobs",
        description=(
            "Pause QUEUE for every worker started with the pause table: its jobs stay "
            "pending (enqueueing goes on), the running ones finish. A name no job has yet "
            "is refused as a likely typo, unless --new. Give the job table and the pause "
            "table (before or after the action)."
        ),
        epilog=_PAUSE_EXAMPLE,
    )
    # An option the action is not given keeps the value ``queues`` parsed before it
    # (``sa-outbox queues --model m:Job pause emails``) instead of resetting it to None.
    pause.argument_default = argparse.SUPPRESS
    pause.add_argument("queue", metavar="QUEUE", help="the queue's name")
    pause.add_argument("--by", metavar="WHO", help="who paused it, and why (free text)")
    pause.add_argument(
        "--new", action="store_true", help="pause a queue no job has yet (before its first)"
    )
    resume = _add_command(
        actions,
        "resume",
        help="resume a paused queue (its workers are woken at once)",
        description="Resume QUEUE: the workers claim its jobs again, woken by a notification.",
        epilog=_PAUSE_EXAMPLE,
    )
    resume.argument_default = argparse.SUPPRESS
    resume.add_argument("queue", metavar="QUEUE", help="the queue's name")
    for action, handler in ((pause, _pause), (resume, _resume)):
        add_job_target(action)
        add_pause_target(action)
        _add_database_url(action)
        action.set_defaults(handler=handler)


def _text(value: str, what: str) -> str:
    """A non-blank argument, checked before anything connects."""
    try:
        return text(value.strip() and value, what)
    except SaOutboxError as exc:
        raise CommandError(str(exc)) from None


def _pause(args: argparse.Namespace) -> int:
    queue = _text(args.queue, "QUEUE")
    by = getattr(args, "by", None)
    who = None if by is None else _text(by, "--by")
    with connection(args, write=True) as conn:
        jobs = job_table(args, conn)
        pauses = pause_table(args, conn)
        assert jobs is not None
        assert pauses is not None
        if not getattr(args, "new", False) and not queue_exists(conn, jobs, queue):
            raise CommandError(
                f"no job has queue {queue!r} in {jobs.fullname}: check the name, or pass "
                "--new to pause it before its first job"
            )
        control = QueueControl(pauses, jobs=jobs)
        if control.pause(conn, queue, paused_by=who):
            print(f"paused {queue}" + ("" if who is None else f" (by {who})"))
            return 0
        found = next(p for p in control.paused(conn) if p.queue == queue)
    by = "" if found.paused_by is None else f" by {found.paused_by}"
    print(f"{queue} was paused already, since {moment(found.paused_at)} UTC{by}")
    return 0


def _resume(args: argparse.Namespace) -> int:
    queue = _text(args.queue, "QUEUE")
    with connection(args, write=True) as conn:
        jobs = job_table(args, conn)
        pauses = pause_table(args, conn)
        assert jobs is not None
        assert pauses is not None
        if not QueueControl(pauses, jobs=jobs).resume(conn, queue):
            raise CommandError(f"queue {queue!r} is not paused (in {pauses.fullname})")
    print(f"resumed {queue}")
    return 0
