"""`DependencyOps`: jobs that wait for other jobs, as operations (`sa_outbox.ops`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Table

from .. import statements as st
from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import as_uuid
from ..schema import JobStatus
from ._drive import Op
from ._jobs import JobOps
from ._results import CancelResult, EnqueueResult, WorkflowRetry

__all__ = ["MAX_PARENTS", "DependencyOps", "check_parents"]

#: The most jobs one job may wait for.
MAX_PARENTS = 10_000
#: Waiting rows a sweep looks at per statement.
SWEEP_PAGE = 1000

Released = list[tuple[uuid.UUID, JobStatus]]


def check_parents(after: object) -> list[uuid.UUID]:
    """``after=``: the ids of the jobs to wait for, checked, duplicates dropped, in order.

    Examples:
        >>> check_parents([uuid.UUID(int=1), str(uuid.UUID(int=1))])
        [UUID('00000000-0000-0000-0000-000000000001')]
    """
    if isinstance(after, str | uuid.UUID) or not isinstance(after, Iterable):
        raise InvalidArgumentType(f"after must be a list of job ids, got {after!r}")
    parents = list(dict.fromkeys(as_uuid(job_id, "after= job id") for job_id in after))
    if not parents:
        raise InvalidArgument("after must name at least one job to wait for")
    if len(parents) > MAX_PARENTS:
        raise InvalidArgument(f"after names {len(parents)} jobs; at most {MAX_PARENTS}")
    return parents


class DependencyOps:
    """Enqueue jobs that wait for others, release them, read their parents' results.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobDependencyMixin, JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> class JobDependency(JobDependencyMixin, Base): __tablename__ = "job_dependencies"
        >>> DependencyOps(Job.__table__, JobDependency.__table__).deps.name
        'job_dependencies'
    """

    def __init__(self, jobs: Table, deps: Table, *, clock: Clock | None = None) -> None:
        self.jobs = jobs
        self.deps = deps
        self.clock = clock

    def enqueue(
        self, values: dict[str, Any], parents: Sequence[uuid.UUID], on_failure: str
    ) -> Op[EnqueueResult]:
        """A job (its checked ``values``) that runs once ``parents`` have succeeded.

        The parents are locked ``FOR SHARE`` first (the waiting ones in the dependencies
        table, then the others in the job table): a worker finishing one of them waits for
        this transaction, and then sees the new dependant. An id that is neither is refused.
        The job is then decided at once if its parents already decide it."""
        if values.get("job_deduplication_key") is not None or "job_unique_digest" in values:
            raise InvalidArgument(
                f"job kind {values['job_kind']!r} with after=: a job that waits for others "
                "cannot have a deduplication_key or unique= (it is inserted when released)"
            )
        waiting = {row[0] for row in (yield st.lock_waiting_parents(self.deps, parents))}
        found = set(waiting)
        rest = [p for p in parents if p not in waiting]
        if rest:
            found.update(row[0] for row in (yield st.lock_parent_jobs(self.jobs, rest)))
        unknown = [str(p) for p in parents if p not in found]
        if unknown:
            shown = ", ".join(unknown[:3]) + (", …" if len(unknown) > 3 else "")
            raise InvalidArgument(f"after= names jobs that do not exist: {shown}")
        yield st.insert_dependant(self.deps, values, parents, on_failure, clock=self.clock)
        yield from self.release(job_ids=[values["job_id"]])
        return EnqueueResult(id=values["job_id"], inserted=True)

    def release(
        self,
        *,
        parents: Sequence[uuid.UUID] | None = None,
        job_ids: Sequence[uuid.UUID] | None = None,
        cancel: bool = False,
        skip_locked: bool = False,
    ) -> Op[Released]:
        """Release the waiting jobs these parents (or these ids) now decide, then the ones
        their release decides in turn (a dependant released ``cancelled`` or ``failed``
        decides its own dependants); returns each job released and its status. By
        ``parents``, their dependants are first found through the GIN index (none
        waiting: no more statement), then released by id."""
        if parents is not None:
            found = yield st.select_dependants(self.deps, parents)
            job_ids = [job_id for job_id, released_at in found if released_at is None]
            if not job_ids:
                return []
            parents = None
        stmt = st.release_dependants(
            self.jobs,
            self.deps,
            parents=parents,
            job_ids=job_ids,
            cancel=cancel,
            skip_locked=skip_locked,
            clock=self.clock,
        )
        released: Released = [(row[0], JobStatus(row[1])) for row in (yield stmt)]
        ended = [job_id for job_id, status in released if status is not JobStatus.PENDING]
        if ended:  # what waits for these, and so on down (a call per level)
            released.extend((yield from self.release(parents=ended)))
        return released

    def sweep_page(self, after: uuid.UUID | None) -> Op[tuple[Released, uuid.UUID | None]]:
        """One page of the sweep: the next `SWEEP_PAGE` waiting rows after ``after`` (rows
        locked elsewhere are skipped), released if their parents decide them now; returns
        what was released and where the next page starts (``None``: the sweep is over)."""
        page = [row[0] for row in (yield st.waiting_page(self.deps, after=after, limit=SWEEP_PAGE))]
        if not page:
            return [], None
        released = yield from self.release(job_ids=page, skip_locked=True)
        return released, (page[-1] if len(page) == SWEEP_PAGE else None)

    def cancel(self, jobs: JobOps, ids: object, *, notify_done: bool) -> Op[CancelResult]:
        """`JobOps.cancel`, and the jobs among ``ids`` still waiting (released
        ``cancelled``), and then the dependants of every job cancelled here, by their
        ``on_failure``. ``notify_done``: announce the jobs that finished here."""
        wanted = st.job_ids([ids] if isinstance(ids, uuid.UUID | str) else ids)
        released = yield from self.release(job_ids=wanted, cancel=True)
        named = set(wanted)
        was_waiting = {job_id for job_id, _ in released if job_id in named}
        rest = [job_id for job_id in wanted if job_id not in was_waiting]
        result = CancelResult([], [], [], [])
        if rest:
            result = yield from jobs.cancel(rest, notify_done=notify_done)
            changed = result.cancelled + result.cancelling
            if changed:
                released.extend((yield from self.release(parents=changed)))
        ended = [job_id for job_id, status in released if status is not JobStatus.PENDING]
        if notify_done and ended:
            yield from jobs.notify_done(ended)
        cancelled = set(result.cancelled) | was_waiting
        return CancelResult(
            cancelled=[job_id for job_id in wanted if job_id in cancelled],
            cancelling=result.cancelling,
            finished=result.finished,
            unknown=result.unknown,
        )

    def retry_workflow(self, jobs: JobOps, job_id: uuid.UUID) -> Op[WorkflowRetry]:
        """Run again what failed or was cancelled in ``job_id``'s workflow: each such job
        whose parents all succeeded goes back to ``pending`` (all its attempts back; a
        unique one through the guard of `JobOps.requeue_failed`); the others wait again,
        out of the job table, and are decided anew when their parents finish. Jobs that
        succeeded, and jobs a worker still holds, are left alone. Rows locked first."""
        workflow_id = (yield st.select_workflow_of(self.deps, job_id)).scalar_one()
        rows = (yield st.lock_workflow_retries(self.jobs, self.deps, workflow_id)).all()
        again = [row.id for row in rows if not row.parents_succeeded]
        plain = [row.id for row in rows if row.parents_succeeded and not row.unique]
        unique = [row for row in rows if row.parents_succeeded and row.unique]
        if again:
            yield st.delete_released_jobs(self.jobs, again)
            yield st.wait_again(self.deps, again)
        requeued: set[uuid.UUID] = set()
        queues: set[str] = set()
        if plain:
            stmt = st.requeue_workflow_jobs(self.jobs, plain, clock=self.clock)
            for job, queue in (yield stmt):
                requeued.add(job)
                queues.add(queue)
        failed = [row.id for row in unique if row.status == JobStatus.FAILED]
        retried = (yield from jobs.requeue_failed(failed, None, None, True)) if failed else []
        requeued.update(retried)
        if requeued:  # wake the workers; any of them when a unique job's queue was not read
            yield st.notify_jobs(self.jobs, None if retried else queues)
        return WorkflowRetry(
            id=workflow_id,
            requeued=[row.id for row in rows if row.id in requeued],
            waiting=again,
            skipped=[row.id for row in unique if row.id not in requeued],
        )

    def lock_batch(self, batch: uuid.UUID) -> Op[None]:
        """Lock batch ``batch``'s callback row while it still waits (until commit: it cannot
        be released meanwhile); else a one-line error: the batch is over."""
        if not (yield st.lock_waiting(self.deps, batch)).first():
            raise InvalidArgument(
                f"batch {batch} is over (its callback was released when its last job "
                "finished) or unknown: no job can join it"
            )

    def add_to_batch(self, batch: uuid.UUID, jobs: Sequence[uuid.UUID]) -> Op[None]:
        """Make batch ``batch``'s callback wait for ``jobs`` too, if it still waits
        (`lock_batch` first)."""
        yield from self.lock_batch(batch)
        if jobs:
            yield st.add_parents(self.deps, batch, jobs)

    def parent_statuses(self, job_id: uuid.UUID) -> Op[dict[uuid.UUID, JobStatus]]:
        """The status of each job a dependant waited for."""
        rows = yield st.select_parent_statuses(self.jobs, self.deps, job_id)
        return {parent: JobStatus(status) for parent, status in rows}

    def waiting(self, ids: Sequence[uuid.UUID]) -> Op[set[uuid.UUID]]:
        """Which of these ids are jobs still waiting for others."""
        return {row[0] for row in (yield st.select_waiting(self.deps, ids))}

    def parent_results(self, steps: Table, job_id: uuid.UUID) -> Op[dict[uuid.UUID, Any]]:
        """A dependant's parents and what each returned (``None``: nothing recorded), in
        the order it named them; empty for a job that waited for none."""
        rows = yield st.select_parent_results(self.deps, steps, job_id)
        return {parent: result for parent, result in rows}
