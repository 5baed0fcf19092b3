"""Workflows seen whole, for people: `list_workflows` and `get_workflow` (what ``sa-outbox
workflows`` prints)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from sqlalchemy import Connection

from .. import statements as st
from .._validation import as_uuid, count
from ..schema import resolve_table

__all__ = ["WorkflowJob", "WorkflowSummary", "get_workflow", "list_workflows", "workflow_depths"]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """One workflow: the job that started it (``id``), how many jobs it has and how many of
    them are in each state (``waiting``: not in the job table yet), when it started and
    last moved.

    Examples:
        >>> WorkflowSummary(uuid.UUID(int=1), 4, {"succeeded": 3, "running": 1}, None, None).done
        False
    """

    id: uuid.UUID
    jobs: int
    states: dict[str, int]
    started: dt.datetime | None
    updated: dt.datetime | None

    @property
    def done(self) -> bool:
        """True once every job of it has finished."""
        unfinished = ("waiting", "pending", "running")
        return not any(self.states.get(state) for state in unfinished)

    @property
    def state(self) -> str:
        """``running`` until `done`; then ``failed`` if a job of it failed, ``cancelled`` if
        one was cancelled, else ``succeeded`` (`WORKFLOW_OUTCOMES
        <sa_outbox.statements.WORKFLOW_OUTCOMES>`, as ``sa-outbox status`` counts them).

        Examples:
            >>> WorkflowSummary(uuid.UUID(int=1), 2, {"succeeded": 1, "cancelled": 1}, None,
            ...                 None).state
            'cancelled'
        """
        if not self.done:
            return "running"
        for state in ("failed", "cancelled"):
            if self.states.get(state):
                return state
        return "succeeded"


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowJob:
    """One job of a workflow: what it waits for (``parents``), its state (``waiting`` until
    it is released into the job table) and its times.

    Examples:
        >>> WorkflowJob(uuid.UUID(int=2), (uuid.UUID(int=1),), "ship", "waiting", 0, 8,
        ...             None, None, None, None).status
        'waiting'
    """

    id: uuid.UUID
    parents: tuple[uuid.UUID, ...]
    kind: str
    status: str
    attempts: int
    max_attempts: int | None
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    released_at: dt.datetime | None
    last_error: str | None


def list_workflows(
    conn: Connection, jobs: object, dependencies: object, *, limit: int = 50
) -> list[WorkflowSummary]:
    """The workflows (jobs linked by ``after=``), the most recently active first.

    Examples:
        with engine.connect() as conn:
            for flow in list_workflows(conn, Job, JobDependency):
                print(flow.id, flow.states)
    """
    stmt = st.select_workflows(
        resolve_table(jobs), resolve_table(dependencies), limit=count(limit, "limit")
    )
    found = []
    for row in conn.execute(stmt).mappings():
        states = {state: int(row[state]) for state in st.WORKFLOW_STATES if row[state]}
        found.append(
            WorkflowSummary(
                row["workflow_id"], int(row["jobs"]), states, row["started"], row["updated"]
            )
        )
    return found


def get_workflow(
    conn: Connection, jobs: object, dependencies: object, job_id: uuid.UUID | str
) -> tuple[uuid.UUID, list[WorkflowJob]]:
    """The workflow job ``job_id`` belongs to: its id (the job that started it) and its
    jobs, that one first, then in the order they were added.

    Examples:
        with engine.connect() as conn:
            workflow_id, members = get_workflow(conn, Job, JobDependency, job_id)
    """
    deps = resolve_table(dependencies)
    wanted = as_uuid(job_id, "job id")
    workflow_id: uuid.UUID = conn.execute(st.select_workflow_of(deps, wanted)).scalar_one()
    rows = conn.execute(st.select_workflow(resolve_table(jobs), deps, workflow_id)).mappings()
    members = [_member(row) for row in rows]
    if len(members) == 1 and members[0].kind == "?":
        return workflow_id, []  # neither a job nor a dependant: unknown
    return workflow_id, members


def _member(row: Any) -> WorkflowJob:
    status = "waiting" if row["status"] is None else str(row["status"])
    if row["status"] is None and (row["released_at"] is not None or not row["parents"]):
        status = "pruned"  # released (or the first job), and no longer in the job table
    return WorkflowJob(
        id=row["id"],
        parents=tuple(row["parents"] or ()),
        kind=row["kind"],
        status=status,
        attempts=row["attempts"] or 0,
        max_attempts=row["max_attempts"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        released_at=row["released_at"],
        last_error=row["last_error"],
    )


def workflow_depths(members: list[WorkflowJob]) -> dict[uuid.UUID, int]:
    """How deep each job of a workflow (`get_workflow`'s members) sits: 0 for the job that
    started it, else one more than its deepest parent.

    Examples:
        >>> a, b = uuid.UUID(int=1), uuid.UUID(int=2)
        >>> def job(i, parents):
        ...     return WorkflowJob(i, parents, "node", "pending", 0, 8, None, None, None, None)
        >>> workflow_depths([job(a, ()), job(b, (a,))])[b]
        1
    """
    depth: dict[uuid.UUID, int] = {}
    for job in members:  # parents come first: they were added first
        depth[job.id] = 1 + max((depth.get(p, 0) for p in job.parents), default=-1)
    return depth
