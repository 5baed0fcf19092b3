"""Pause and resume queues: the rows of the user's `QueuePauseMixin` table."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, delete, exists, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert

from .._clock import Clock
from .._validation import text
from ._common import now_of, table_of


def pause_queue(
    target: object, queue: str, *, paused_by: str | None = None, clock: Clock | None = None
) -> ReturningInsert[Any]:
    """Add ``queue`` to the paused queues; returns its name if it was not paused already.

    Claims given the table (``claim_jobs(..., paused=target)``) take no job of the queue once
    this commits; jobs already running finish as usual.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import QueuePauseMixin
        >>> class Base(DeclarativeBase): pass
        >>> class PausedQueue(QueuePauseMixin, Base): __tablename__ = "paused_queues"
        >>> "ON CONFLICT (queue) DO NOTHING" in str(pause_queue(PausedQueue, "emails"))
        True
    """
    name = text(queue, "queue")
    who = None if paused_by is None else text(paused_by, "paused_by")
    t = table_of(target)
    return (
        insert(t)
        .values(queue=name, paused_at=now_of(clock), paused_by=who)
        .on_conflict_do_nothing(index_elements=[t.c.queue])
        .returning(t.c.queue)
    )


def resume_queue(target: object, queue: str) -> ReturningDelete[Any]:
    """Remove ``queue`` from the paused queues; returns its name if it was paused.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import QueuePauseMixin
        >>> class Base(DeclarativeBase): pass
        >>> class PausedQueue(QueuePauseMixin, Base): __tablename__ = "paused_queues"
        >>> str(resume_queue(PausedQueue, "emails")).startswith("DELETE FROM paused_queues")
        True
    """
    name = text(queue, "queue")
    t = table_of(target)
    return delete(t).where(t.c.queue == name).returning(t.c.queue)


def select_paused_queues(target: object) -> Select[Any]:
    """The paused queues (``queue, paused_at, paused_by``), by name.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import QueuePauseMixin
        >>> class Base(DeclarativeBase): pass
        >>> class PausedQueue(QueuePauseMixin, Base): __tablename__ = "paused_queues"
        >>> "ORDER BY paused_queues.queue" in str(select_paused_queues(PausedQueue))
        True
    """
    t = table_of(target)
    return select(t.c.queue, t.c.paused_at, t.c.paused_by).order_by(t.c.queue)


def not_paused(target: object, queue_column: Any) -> Any:
    """The claim's filter: no row of ``target`` names the job's queue."""
    t = table_of(target)
    # Correlated to whatever names the queue (the job row, a branch's name), never to itself.
    return ~exists().where(t.c.queue == queue_column).correlate_except(t)
