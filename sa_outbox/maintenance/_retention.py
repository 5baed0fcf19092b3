"""Batched retention: `Pruner` and `AsyncPruner` delete finished jobs, published events and old
inbox entries.

Each batch is one short transaction that first tries the table's transaction-level advisory
lock (`sa_outbox.statements.prune_lock`) and then deletes at most ``batch`` rows picked with
``FOR UPDATE SKIP LOCKED`` (`sa_outbox.statements.prune_jobs` / ``prune_events`` /
``prune_inbox``). A pruner that finds the lock taken stops its round for that table (another
process is pruning it), so however many workers run a pruner, only one DELETE runs on a
table at a time. Pending and
running jobs, unpublished and parked events are never candidates. An inbox entry is a
candidate once it is older than ``Retention.inbox``, whatever it recorded.

Examples:
    pruner = Pruner(engine, jobs=Job, outbox=OutboxEvent,
                    retention=Retention(succeeded=86400, failed=30 * 86400, published=86400))
    report = pruner.run_once()
    print(report.deleted, report.batches)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from .. import statements as st
from .._clock import Clock
from .._connect_args import harden
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._pooler import prepare_for_pooler
from .._validation import count, duration
from ..ops import COMMIT, BoundOp, arun, run
from ..schema import JobStatus, resolve_table
from ..statements._inbox import inbox_table

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine
    from sqlalchemy.sql import Executable

__all__ = ["AsyncPruner", "PruneReport", "Pruner", "Retention"]

DAY = dt.timedelta(days=1)


@dataclasses.dataclass(frozen=True)
class Retention:
    """How long finished rows are kept; ``None`` keeps them forever.

    ``succeeded`` / ``failed`` / ``cancelled`` count from a job's last update (when it
    finished),
    ``published`` from an event's ``published_at``, ``inbox`` from an inbox entry's
    ``received_at`` (keep those longer than any redelivery can come: docs/inbox.md).
    ``batch`` rows are deleted per transaction; ``interval`` is how often a `Worker` given
    this policy prunes.

    Examples:
        >>> Retention(succeeded=3600, failed=None).succeeded
        datetime.timedelta(seconds=3600)
    """

    succeeded: dt.timedelta | float | None = DAY
    failed: dt.timedelta | float | None = 30 * DAY
    cancelled: dt.timedelta | float | None = 7 * DAY
    published: dt.timedelta | float | None = 7 * DAY
    batch: int = 1000
    interval: dt.timedelta | float = dt.timedelta(hours=1)
    inbox: dt.timedelta | float | None = 14 * DAY

    def __post_init__(self) -> None:
        for name in ("succeeded", "failed", "cancelled", "published", "inbox"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, duration(value, name, allow_zero=True))
        count(self.batch, "batch")
        object.__setattr__(self, "interval", duration(self.interval, "interval"))

    def window(self, name: str) -> dt.timedelta | None:
        """The window of ``"succeeded"``, ``"failed"``, ``"cancelled"``, ``"published"`` or
        ``"inbox"``.

        Examples:
            >>> Retention(published=60).window("published")
            datetime.timedelta(seconds=60)
        """
        value = getattr(self, name)
        assert value is None or isinstance(value, dt.timedelta)
        return value


@dataclasses.dataclass
class PruneReport:
    """What a pruning round deleted, per table and status; updated after every batch.

    ``skipped`` names the tables whose lock another pruner held (this round left them).

    Examples:
        >>> report = PruneReport(succeeded=3, failed=1, published=2, batches=3)
        >>> report.deleted
        6
    """

    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    published: int = 0
    batches: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)
    inbox: int = 0

    @property
    def deleted(self) -> int:
        """All rows deleted: jobs, events and inbox entries."""
        return self.succeeded + self.failed + self.cancelled + self.published + self.inbox


#: Called after every committed batch with the table, what it pruned and the report so far.
Progress = Callable[[str, str, int, PruneReport], None]


@dataclasses.dataclass(frozen=True)
class _Task:
    table: str
    what: str  # "succeeded", "failed", "cancelled", "published" or "inbox"
    lock: Executable
    delete: Callable[[], Executable]  # built per batch: a FakeClock's "now" is read then


E = TypeVar("E", "Engine", "AsyncEngine")


class _Base(Generic[E]):
    """What `Pruner` and `AsyncPruner` share: the constructor and the round, an operation
    that each drives on its own engine's connection."""

    def __init__(
        self,
        engine: E,
        *,
        jobs: object | None = None,
        outbox: object | None = None,
        retention: Retention | None = None,
        clock: Clock | None = None,
        progress: Progress | None = None,
        inbox: object | None = None,
        steps: object | None = None,
        dependencies: object | None = None,
    ) -> None:
        if jobs is None and outbox is None and inbox is None:
            raise InvalidArgument(
                "a pruner needs a job model (jobs=), an outbox (outbox=) or an inbox (inbox=)"
            )
        retention = Retention() if retention is None else retention
        if not isinstance(retention, Retention):
            raise InvalidArgumentType(
                f"retention must be a Retention, got {type(retention).__name__}"
            )
        self.jobs = None if jobs is None else resolve_table(jobs)
        self.outbox = None if outbox is None else resolve_table(outbox)
        self.inbox = None if inbox is None else inbox_table(inbox)
        #: The `JobStepMixin` table: a job's recorded steps are pruned with the job.
        self.steps = None if steps is None else resolve_table(steps)
        #: The `JobDependencyMixin` table: what a job waited for is pruned with the job.
        self.dependencies = None if dependencies is None else resolve_table(dependencies)
        self.retention = retention
        self.clock = clock
        self.progress = progress
        self.engine: E = engine
        harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements

    def _tasks(self) -> Iterator[_Task]:
        r = self.retention
        if self.jobs is not None:
            for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
                window = r.window(str(status))
                if window is None:
                    continue
                delete = functools.partial(
                    st.prune_jobs,
                    self.jobs,
                    older_than=window,
                    statuses=(status,),
                    batch=r.batch,
                    clock=self.clock,
                    steps=self.steps,
                    dependencies=self.dependencies,
                )
                yield _Task(self.jobs.fullname, str(status), st.prune_lock(self.jobs), delete)
        window = r.window("published")
        if self.outbox is not None and window is not None:
            delete = functools.partial(
                st.prune_events, self.outbox, older_than=window, batch=r.batch, clock=self.clock
            )
            yield _Task(self.outbox.fullname, "published", st.prune_lock(self.outbox), delete)
        window = r.window("inbox")
        if self.inbox is not None and window is not None:
            delete = functools.partial(
                st.prune_inbox, self.inbox, older_than=window, batch=r.batch, clock=self.clock
            )
            yield _Task(self.inbox.fullname, "inbox", st.prune_lock(self.inbox), delete)

    def _round(self) -> BoundOp[PruneReport]:
        # Each batch is a transaction of its own, committed before it is recorded: the lock
        # is transaction-level, and progress() hears only of committed batches.
        report = PruneReport()
        for task in self._tasks():
            if task.table in report.skipped:
                continue
            while True:
                if not (yield task.lock).scalar():
                    yield COMMIT
                    report.skipped.append(task.table)
                    break
                deleted = (yield task.delete()).rowcount
                yield COMMIT
                self._record(report, task, deleted)
                if deleted < self.retention.batch:
                    break
        return report

    def _record(self, report: PruneReport, task: _Task, deleted: int) -> None:
        setattr(report, task.what, getattr(report, task.what) + deleted)
        report.batches += 1
        if self.progress is not None:
            self.progress(task.table, task.what, deleted, report)


class Pruner(_Base["Engine"]):
    """Prune finished jobs, published events and old inbox entries in small transactions,
    one pruner per table at a time.

    `run_once` deletes batch after batch until one deletes fewer than ``retention.batch``
    rows, for each of succeeded, failed and cancelled jobs, published events and inbox
    entries whose window is not ``None``. ``progress(table, what, deleted, report)`` is
    called after every batch. Give any of ``jobs``, ``outbox`` and ``inbox`` (an
    `InboxMixin` model); with ``jobs``, ``steps`` (a `JobStepMixin` model) prunes each job's
    recorded steps with it.

    Examples:
        pruner = Pruner(engine, jobs=Job, retention=Retention(succeeded=86400, failed=None))
        report = pruner.run_once()   # PruneReport(succeeded=..., batches=...)
        Pruner(engine, inbox=InboxEntry, retention=Retention(inbox=14 * 86400)).run_once()
    """

    def run_once(self) -> PruneReport:
        """One round: every batch due now; returns what was deleted."""
        with self.engine.connect() as conn:
            return run(conn, self._round())


class AsyncPruner(_Base["AsyncEngine"]):
    """`Pruner` for asyncio, on an `AsyncEngine`.

    Examples:
        pruner = AsyncPruner(async_engine, jobs=Job, outbox=OutboxEvent, inbox=InboxEntry)
        report = await pruner.run_once()
    """

    async def run_once(self) -> PruneReport:
        """See `Pruner.run_once`."""
        async with self.engine.connect() as conn:
            return await arun(conn, self._round())
