"""`QueueControl` / `AsyncQueueControl`: pause and resume queues across all workers."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table

from .. import statements as st
from .._clock import Clock
from .._validation import text
from ..ops import Op, SyncConn, arun, run
from ..statements._common import table_of

if TYPE_CHECKING:
    from ..ops import AsyncConn


@dataclasses.dataclass(frozen=True, slots=True)
class PausedQueue:
    """A paused queue, as `QueueControl.paused` lists it.

    Examples:
        >>> PausedQueue("emails", dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None).queue
        'emails'
    """

    queue: str
    paused_at: dt.datetime
    paused_by: str | None


class _ControlOps:
    def __init__(self, pauses: object, jobs: object, clock: Clock | None) -> None:
        self.pauses = table_of(pauses)
        self.jobs = table_of(jobs)
        self.clock = clock

    def pause(self, queue: str, paused_by: str | None) -> Op[bool]:
        stmt = st.pause_queue(self.pauses, queue, paused_by=paused_by, clock=self.clock)
        return (yield stmt).first() is not None

    def resume(self, queue: str) -> Op[bool]:
        resumed = (yield st.resume_queue(self.pauses, queue)).first() is not None
        if resumed:
            # Idle workers sleep until a notification or their poll: wake them at commit.
            yield st.notify_jobs(self.jobs, [queue])
        return resumed

    def paused(self) -> Op[list[PausedQueue]]:
        rows = (yield st.select_paused_queues(self.pauses)).all()
        return [PausedQueue(*row) for row in rows]


class _Base:
    def __init__(self, pauses: object, *, jobs: object, clock: Clock | None = None) -> None:
        self._ops = _ControlOps(pauses, jobs, clock)

    @property
    def table(self) -> Table:
        """The table of paused queues (a `QueuePauseMixin` model's)."""
        return self._ops.pauses

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.fullname!r}, jobs={self._ops.jobs.fullname!r})"


def _queue(queue: Any) -> str:
    return text(queue, "queue")


class QueueControl(_Base):
    """Pause and resume queues of the job table ``jobs``, on a sync `Connection` or `Session`.

    ``pauses`` is the user's `QueuePauseMixin` model. A worker started with ``pauses=`` the
    same model never claims a job of a paused queue; the caller owns the transaction, and
    the change takes effect when it commits. See docs/worker.md, "Pausing a queue".

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, QueuePauseMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class PausedQueue(QueuePauseMixin, Base): __tablename__ = "paused_queues"
        >>> QueueControl(PausedQueue, jobs=Job)
        QueueControl('paused_queues', jobs='jobs')
    """

    def pause(self, conn: SyncConn, queue: str, *, paused_by: str | None = None) -> bool:
        """Pause ``queue``: True if it was running, False if it was paused already.

        Any name may be paused, one with no job yet included (its jobs wait from the first).

        Examples:
            control.pause(conn, "emails", paused_by="ana")
            # -> True
        """
        return run(conn, self._ops.pause(_queue(queue), paused_by))

    def resume(self, conn: SyncConn, queue: str) -> bool:
        """Resume ``queue``: True if it was paused (its workers are notified at commit).

        Examples:
            control.resume(conn, "emails")
            # -> True
        """
        return run(conn, self._ops.resume(_queue(queue)))

    def paused(self, conn: SyncConn) -> list[PausedQueue]:
        """The paused queues, by name.

        Examples:
            [p.queue for p in control.paused(conn)]
            # -> ['emails']
        """
        return run(conn, self._ops.paused())


class AsyncQueueControl(_Base):
    """`QueueControl` on an `AsyncConnection` or `AsyncSession`.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin, QueuePauseMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class PausedQueue(QueuePauseMixin, Base): __tablename__ = "paused_queues"
        >>> AsyncQueueControl(PausedQueue, jobs=Job).table.name
        'paused_queues'
    """

    async def pause(self, conn: AsyncConn, queue: str, *, paused_by: str | None = None) -> bool:
        """See `QueueControl.pause`."""
        return await arun(conn, self._ops.pause(_queue(queue), paused_by))

    async def resume(self, conn: AsyncConn, queue: str) -> bool:
        """See `QueueControl.resume`."""
        return await arun(conn, self._ops.resume(_queue(queue)))

    async def paused(self, conn: AsyncConn) -> list[PausedQueue]:
        """See `QueueControl.paused`."""
        return await arun(conn, self._ops.paused())
