"""What `JobQueue` and `AsyncJobQueue` share: the job table, its operations, the enqueue pair.

`AsyncJobQueue` (``_job_queue_async.py``) is written by hand; `JobQueue`
(``_job_queue_sync.py``) is generated from it by ``tools/async_to_sync.py``. What must
differ between the two lives here as a pair of the same shape (`enqueue_on`/`aenqueue_on`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine, Table

from .. import statements as st
from .._asyncio_ext import is_async_engine
from .._backoff import Backoff
from .._clock import Clock
from .._exceptions import InvalidArgument
from ..ops import DependencyOps, JobOps, SyncConn, arun, run
from ..ops._cursor import NOT_RUN
from ..ops._results import EnqueueResult
from ..schema import JobStatus, resolve_table
from ..statements._common import Dumps

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..ops import AsyncConn

Pairs = Sequence[tuple[uuid.UUID, uuid.UUID]]
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class JobQueueBase:
    """The job table and its operations (`JobOps`), for `JobQueue` and `AsyncJobQueue`."""

    def __init__(
        self,
        model: object,
        *,
        clock: Clock | None = None,
        backoff: Backoff | None = None,
        dumps: Dumps | None = None,
        max_payload_bytes: int = st.DEFAULT_MAX_PAYLOAD_BYTES,
        steps: object | None = None,
        dependencies: object | None = None,
    ) -> None:
        self._ops = JobOps(
            model, clock=clock, backoff=backoff, dumps=dumps, max_payload_bytes=max_payload_bytes
        )
        self._steps = None if steps is None else resolve_table(steps)
        self._deps = (
            None
            if dependencies is None
            else DependencyOps(self._ops.table, resolve_table(dependencies), clock=clock)
        )

    def _dependency_ops(self, called: str) -> DependencyOps:
        """The operations on the `JobDependencyMixin` table (``dependencies=``), or a one-line
        error naming the method ``called``."""
        if self._deps is None:
            raise InvalidArgument(
                f"{called} needs the dependencies table: JobQueue(Job, dependencies="
                "JobDependency), with JobDependency a model on "
                "sa_outbox.schema.JobDependencyMixin"
            )
        return self._deps

    def _steps_table(self, called: str) -> Table:
        """The `JobStepMixin` table of signals and results (``steps=``), or a one-line error
        naming the method ``called``."""
        if self._steps is None:
            raise InvalidArgument(
                f"{called} needs the steps table: JobQueue(Job, steps=JobStep), with JobStep "
                "a model on sa_outbox.schema.JobStepMixin"
            )
        return self._steps

    @property
    def table(self) -> Table:
        """The job table this queue works on."""
        return self._ops.table

    @property
    def clock(self) -> Clock | None:
        """The clock statements take "now" from (``None``: the database's ``now()``)."""
        return self._ops.clock

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.fullname!r})"


def in_transaction(conn: SyncConn | Engine, what: str) -> SyncConn:
    """``conn``, refused in one line when it is the engine itself: ``what`` runs in the
    caller's transaction."""
    if isinstance(conn, Engine):
        raise InvalidArgument(
            f"{what} runs in your transaction: give it a connection or a session, not the engine"
        )
    return conn


def ain_transaction(conn: AsyncConn | AsyncEngine, what: str) -> AsyncConn:
    """`in_transaction` for asyncio."""
    if is_async_engine(conn):
        raise InvalidArgument(
            f"{what} runs in your transaction: give it a connection or a session, not the engine"
        )
    return cast("AsyncConn", conn)


def enqueue_on(conn: SyncConn | Engine, ops: JobOps, values: dict[str, Any]) -> EnqueueResult:
    """One job's ``INSERT`` on ``conn``; given the `Engine`, in autocommit.

    On psycopg's own cursor when it can (`JobOps.enqueue_on_cursor`), the shortest path.
    """
    result = ops.enqueue_on_cursor(conn, values)
    if result is not NOT_RUN:
        return cast(EnqueueResult, result)
    return run(conn, ops.enqueue(values), autocommit=isinstance(conn, Engine))


async def aenqueue_on(
    conn: AsyncConn | AsyncEngine, ops: JobOps, values: dict[str, Any]
) -> EnqueueResult:
    """`enqueue_on` for asyncio; given the `AsyncEngine`, in autocommit."""
    if is_async_engine(conn):
        return await arun(conn, ops.enqueue(values), autocommit=True)
    return await arun(cast("AsyncConn", conn), ops.enqueue(values))
