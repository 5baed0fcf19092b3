"""See and steer a running queue: `queue_status`, listings, and retries by hand.

The typed answers of the read-only statements of ``sa_outbox.statements._inspect``, for
``sa-outbox status`` / ``jobs`` / ``outbox`` / ``queues`` and for whatever else shows a
queue (a dashboard, metrics gauges). Synchronous, on a `Connection` the caller opens; on an
`AsyncConnection`: ``await conn.run_sync(lambda c: queue_status(c, jobs=Job))``.

It stays whole because it is a catalogue, not a mechanism: each entry is a record and the
short function (none over 70 lines) that fills it from the statements of
``sa_outbox.statements._inspect``, which it mirrors, and the CLI and the dashboard use them
as one set, looked up by name.

Examples:
    with engine.connect() as conn:
        status = queue_status(conn, jobs=Job, outbox=OutboxEvent)
    status.jobs.by_status["failed"], status.outbox.backlog
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError

from .. import statements as st
from .._clock import Clock
from .._exceptions import InvalidArgument
from .._validation import as_uuid
from ..ops._results import RetriedJobs
from ..schema import JobStatus, resolve_table
from ._control import PausedQueue
from ._outbox_sync import Outbox

if TYPE_CHECKING:
    from sqlalchemy import Connection, Table

__all__ = [
    "ConnectedWorker",
    "EventRow",
    "JobCount",
    "JobRow",
    "JobStepRow",
    "JobsStatus",
    "OutboxStatus",
    "QueueDepth",
    "QueueStatus",
    "RunningJob",
    "ThroughputMinute",
    "WorkerJobs",
    "WorkflowsStatus",
    "as_plain",
    "get_event",
    "get_job",
    "get_job_steps",
    "kind_exists",
    "list_events",
    "list_jobs",
    "list_running_jobs",
    "queue_depths",
    "queue_exists",
    "queue_status",
    "retry_failed",
    "retry_parked",
    "throughput_by_minute",
]


def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _plain(value: Any) -> Any:
    """A value as JSON has it: times in ISO 8601, ages in seconds, UUIDs as text."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value) if hasattr(value, "value") and isinstance(value, str) else value


def as_plain(value: Any) -> Any:
    """A result of this module as plain JSON-ready data (dicts, lists, str, numbers, None).

    Times become ISO 8601 text, ages (`timedelta`) seconds, ids text.

    Examples:
        >>> as_plain(WorkerJobs("w1", 2, 0, None))
        {'worker_id': 'w1', 'running': 2, 'expired': 0, 'lease_until': None}
    """
    return _plain(value)


@dataclasses.dataclass(frozen=True)
class JobCount:
    """How many jobs of one ``kind`` in one ``queue`` are in one ``status``.

    Examples:
        >>> JobCount("emails", "send-email", "failed", 3).jobs
        3
    """

    queue: str
    kind: str
    status: str
    jobs: int


@dataclasses.dataclass(frozen=True)
class WorkerJobs:
    """A worker holding ``running`` jobs: how many, how many of their leases expired, and
    the latest ``lease_until``.

    Examples:
        >>> WorkerJobs("host:42:ab12", 4, 1, None).expired
        1
    """

    worker_id: str | None
    running: int
    expired: int
    lease_until: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class ConnectedWorker:
    """A worker connected now, seen in ``pg_stat_activity`` by its ``application_name``.

    Examples:
        >>> ConnectedWorker("host:42:ab12", 2, None, "10.0.0.5").connections
        2
    """

    worker_id: str
    connections: int
    connected_since: dt.datetime | None
    client_addr: str | None


@dataclasses.dataclass(frozen=True)
class JobsStatus:
    """The job table's part of `QueueStatus`.

    ``by_status`` sums ``counts`` over queues and kinds (every status of `JobStatus` is
    there, zero included); ``oldest_ready_age`` is ``None`` when no job is ready;
    ``failed_recently`` counts the jobs failed within ``failed_within``; ``expired_leases``
    the running jobs whose lease expired; ``holders`` the workers holding running jobs.

    Examples:
        >>> s = JobsStatus("jobs", [], {"failed": 0}, None, 0, dt.timedelta(hours=1), 0, [])
        >>> s.by_status["failed"]
        0
    """

    table: str
    counts: list[JobCount]
    by_status: dict[str, int]
    oldest_ready_age: dt.timedelta | None
    failed_recently: int
    failed_within: dt.timedelta
    expired_leases: int
    holders: list[WorkerJobs]


@dataclasses.dataclass(frozen=True)
class OutboxStatus:
    """The outbox's part of `QueueStatus`: the relays' ``backlog`` (unpublished, not
    parked), the age of its oldest event, and the ``parked`` events.

    Examples:
        >>> OutboxStatus("outbox", 12, dt.timedelta(seconds=3), 1).parked
        1
    """

    table: str
    backlog: int
    oldest_backlog_age: dt.timedelta | None
    parked: int


@dataclasses.dataclass(frozen=True)
class WorkflowsStatus:
    """The dependencies table's part of `QueueStatus`: the jobs ``waiting`` for others
    (not released into the job table yet), how many workflows have one, and the workflows
    by state (`WORKFLOW_OUTCOMES <sa_outbox.statements.WORKFLOW_OUTCOMES>`: running,
    succeeded, failed, cancelled; zero included).

    Examples:
        >>> WorkflowsStatus("job_dependencies", 3, 1, {"running": 1, "succeeded": 9}).waiting
        3
    """

    table: str
    waiting: int
    waiting_workflows: int
    by_state: dict[str, int]


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """`queue_status`'s answer: the database's time, each table asked for, the workers.

    ``workers`` lists the workers connected now (``application_name``; workers started by
    ``sa-outbox worker`` set it); a worker of your own process that does not set it shows
    only in ``jobs.holders``, while it holds jobs. ``paused`` lists the paused queues when
    `queue_status` was given the pause table (``pauses=``), else it is ``None``;
    ``workflows`` the same for the dependencies table (``dependencies=``).

    Examples:
        >>> QueueStatus(None, None, None, []).as_dict()  # doctest: +NORMALIZE_WHITESPACE
        {'taken_at': None, 'jobs': None, 'outbox': None, 'workers': [], 'paused': None,
         'workflows': None}
    """

    taken_at: dt.datetime | None
    jobs: JobsStatus | None
    outbox: OutboxStatus | None
    workers: list[ConnectedWorker]
    paused: list[PausedQueue] | None = None
    workflows: WorkflowsStatus | None = None

    def as_dict(self) -> dict[str, Any]:
        """The status as JSON-ready data (see `as_plain`)."""
        plain: dict[str, Any] = as_plain(self)
        return plain


def queue_status(
    conn: Connection,
    *,
    jobs: object | None = None,
    outbox: object | None = None,
    failed_within: dt.timedelta | float = 3600,
    clock: Clock | None = None,
    pauses: object | None = None,
    dependencies: object | None = None,
    workflow_states: bool = True,
) -> QueueStatus:
    """Read the status of the job table and/or the outbox, and the connected workers.

    Only reads. The counts by queue, kind and status read the whole job table; the rest
    walks partial indexes. Given ``pauses`` (a `QueuePauseMixin` model), ``paused`` lists
    the paused queues. Given ``dependencies`` (a `JobDependencyMixin` model, with
    ``jobs``), ``workflows`` counts the jobs waiting for others and the workflows by state;
    the states read the whole dependencies table: ``workflow_states=False`` leaves them out
    (``by_state`` empty), for a frequent scrape.

    Examples:
        with engine.connect() as conn:
            status = queue_status(conn, jobs=Job, outbox=OutboxEvent, pauses=PausedQueue)
        status.jobs.oldest_ready_age, status.outbox.parked, status.workers, status.paused
    """
    if jobs is None and outbox is None:
        raise InvalidArgument("queue_status needs a job model (jobs=) or an outbox (outbox=)")
    if dependencies is not None and jobs is None:
        raise InvalidArgument("queue_status(dependencies=) needs the job model too (jobs=)")
    taken_at: Any = conn.execute(st.select_now(clock)).scalar_one()
    jobs_status = None
    if jobs is not None:
        window = st.job_alarms(jobs, failed_within=failed_within, clock=clock)
        counts = [JobCount(*row) for row in conn.execute(st.count_jobs_by_queue_kind_status(jobs))]
        by_status = {str(s): 0 for s in JobStatus}
        for c in counts:
            by_status[c.status] = by_status.get(c.status, 0) + c.jobs
        alarms = conn.execute(window).one()
        holders = [
            WorkerJobs(*row) for row in conn.execute(st.workers_holding_jobs(jobs, clock=clock))
        ]
        jobs_status = JobsStatus(
            table=resolve_table(jobs).fullname,
            counts=counts,
            by_status=by_status,
            oldest_ready_age=alarms.oldest_ready_age,
            failed_recently=alarms.failed_recently,
            failed_within=_window(failed_within),
            expired_leases=alarms.expired_leases,
            holders=holders,
        )
    outbox_status = None
    if outbox is not None:
        row = conn.execute(st.outbox_alarms(outbox, clock=clock)).one()
        outbox_status = OutboxStatus(
            table=resolve_table(outbox).fullname,
            backlog=row.backlog,
            oldest_backlog_age=row.oldest_backlog_age,
            parked=row.parked,
        )
    workers = [ConnectedWorker(*row) for row in conn.execute(st.connected_workers())]
    paused = None if pauses is None else _paused(conn, pauses)
    workflows = None
    if dependencies is not None:
        workflows = _workflows(conn, jobs, dependencies, states=workflow_states)
    return QueueStatus(taken_at, jobs_status, outbox_status, workers, paused, workflows)


def _workflows(conn: Connection, jobs: object, deps: object, *, states: bool) -> WorkflowsStatus:
    waiting = conn.execute(st.count_waiting_dependants(deps)).one()
    by_state: dict[str, int] = {}
    if states:
        by_state = {state: 0 for state in st.WORKFLOW_OUTCOMES}
        for state, workflows in conn.execute(st.count_workflows_by_state(jobs, deps)):
            by_state[state] = workflows
    return WorkflowsStatus(
        table=resolve_table(deps).fullname,
        waiting=waiting.jobs,
        waiting_workflows=waiting.workflows,
        by_state=by_state,
    )


def _paused(conn: Connection, pauses: object) -> list[PausedQueue]:
    return [PausedQueue(*row) for row in conn.execute(st.select_paused_queues(pauses))]


def _window(value: dt.timedelta | float) -> dt.timedelta:
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=value)


@dataclasses.dataclass(frozen=True)
class JobRow:
    """A job as `list_jobs` shows it: its main columns and the first line of its error.

    Examples:
        >>> row = JobRow(uuid.UUID(int=1), "default", "ping", "failed", 0, 8, 8, None,
        ...              None, None, None, None, "boom")
        >>> row.error_line
        'boom'
    """

    id: uuid.UUID
    queue: str
    kind: str
    status: str
    priority: int
    attempts: int
    max_attempts: int
    run_at: dt.datetime | None
    lease_until: dt.datetime | None
    worker_id: str | None
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    error_line: str | None


def list_jobs(
    conn: Connection,
    jobs: object,
    *,
    statuses: Sequence[str] | str | None = None,
    kinds: Sequence[str] | str | None = None,
    queues: Sequence[str] | str | None = None,
    limit: int = 50,
) -> list[JobRow]:
    """Up to ``limit`` jobs, most recently updated first, filtered (AND) as asked.

    Examples:
        with engine.connect() as conn:
            failed = list_jobs(conn, Job, statuses="failed", kinds="send-email")
    """
    stmt = st.select_jobs(
        jobs,
        statuses=_names(statuses),
        kinds=_names(kinds),
        queues=_names(queues),
        limit=limit,
    )
    return [JobRow(**{**row._asdict(), "status": str(row.status)}) for row in conn.execute(stmt)]


def _names(value: Sequence[str] | str | None) -> Any:
    return value if value is None or isinstance(value, str) else list(value)


def get_job(conn: Connection, jobs: object, job_id: object) -> dict[str, Any] | None:
    """Every column of one job, by name, or ``None`` when there is no job with that id.

    Examples:
        with engine.connect() as conn:
            job = get_job(conn, Job, "0b0e6c1e-…")
        print(job["last_error"])
    """
    row = conn.execute(st.select_job(jobs, job_id)).one_or_none()
    if row is None:
        return None
    found = dict(row._mapping)
    if "status" in found:
        found["status"] = str(found["status"])
    if found.get("unique_states") is not None:  # a unique job's states, as their names
        found["unique_states"] = [str(state) for state in found["unique_states"]]
    return found


@dataclasses.dataclass(frozen=True)
class JobStepRow:
    """One row a job has in the steps table: a durable step's ``name`` and what it
    returned, or the library's own (``@result``, a sleep, a signal), and when it was
    recorded.

    Examples:
        >>> JobStepRow("charge", {"charge_id": "ch_1"}, None).name
        'charge'
    """

    name: str
    result: Any
    created_at: dt.datetime | None


def get_job_steps(conn: Connection, steps: object, job_id: object) -> list[JobStepRow]:
    """A job's rows in the steps table (`JobStepMixin`), in the order they were recorded.

    Examples:
        with engine.connect() as conn:
            for step in get_job_steps(conn, JobStep, job_id):
                print(step.name, step.result)
    """
    wanted = as_uuid(job_id, "job id")
    return [JobStepRow(*row) for row in conn.execute(st.list_job_steps(steps, wanted))]


def kind_exists(conn: Connection, jobs: object, kind: str) -> bool:
    """Whether any job of ``kind`` is in the table (in any status).

    Examples:
        with engine.connect() as conn:
            kind_exists(conn, Job, "send-email")
    """
    return bool(conn.execute(st.job_kind_exists(jobs, kind)).scalar())


def queue_exists(conn: Connection, jobs: object, queue: str) -> bool:
    """Whether any job of ``queue`` is in the table (in any status).

    Examples:
        with engine.connect() as conn:
            queue_exists(conn, Job, "emails")
    """
    return bool(conn.execute(st.job_queue_exists(jobs, queue)).scalar())


def retry_failed(
    conn: Connection,
    jobs: object,
    *,
    ids: Sequence[object] | None = None,
    kinds: str | Sequence[str] | None = None,
    queues: str | Sequence[str] | None = None,
    reset_attempts: bool = False,
) -> RetriedJobs:
    """Send failed jobs back to ``pending`` now and wake the workers; returns their ids.

    As River and Oban do, ``attempts`` is kept and ``max_attempts`` raised to give an
    exhausted job one more attempt (`retry_failed_jobs`); ``reset_attempts=True`` starts
    them again from zero instead (`requeue_failed_jobs`). Only ``failed`` jobs change: a
    running job is never touched. With ``ids``, all or nothing: when one of them does not
    exist or is not ``failed``, `InvalidArgument` says which, and the caller's transaction
    should roll back (``engine.begin()`` does) — nothing is retried.

    A unique job (docs/unique.md) whose key another job holds is not an error: it stays
    ``failed``, and the result's ``skipped`` maps it to the job holding its key
    (`RetriedJobs`). A unique job enqueued by another transaction at the very moment of the
    retry can still make the ``UPDATE`` meet the unique index: then it runs again, in a
    savepoint, and skips that job too.

    Examples:
        with engine.begin() as conn:
            retried = retry_failed(conn, Job, kinds="send-email")
    """
    chosen = None if ids is None else [as_uuid(i, "job id") for i in ids]
    if chosen is not None and not chosen:
        raise InvalidArgument("ids must name at least one job, or be None for all failed")
    options: dict[str, Any] = {"ids": chosen, "kinds": kinds, "queues": queues}
    table = resolve_table(jobs)
    stmt: Any
    if reset_attempts:
        stmt = st.requeue_failed_jobs(jobs, **options).returning(table.c.queue)
    else:
        stmt = st.retry_failed_jobs(jobs, **options)
    unique = st.has_unique_columns(table)
    rows = _retry_rows(conn, table, stmt) if unique else conn.execute(stmt).all()
    retried = [row[0] for row in rows]
    skipped: dict[uuid.UUID, uuid.UUID] = {}
    if unique:
        held = st.select_unique_held_failed_jobs(jobs, **options)
        skipped = {row.id: row.held_by for row in conn.execute(held)}
    if chosen is not None:
        done = set(retried) | skipped.keys()
        missing = [i for i in dict.fromkeys(chosen) if i not in done]
        if missing:
            found: dict[uuid.UUID, str] = {
                r.id: r.status for r in conn.execute(st.select_job_statuses(jobs, missing))
            }
            first = missing[0]
            if first not in found:
                raise InvalidArgument(
                    f"no job {first} in {resolve_table(jobs).fullname}; nothing retried"
                )
            raise InvalidArgument(f"job {first} is {found[first]}, not failed; nothing retried")
    if retried:
        conn.execute(st.notify_jobs(jobs, sorted({row[-1] for row in rows})))
    return RetriedJobs(retried, skipped)


#: How many times `retry_failed` runs its UPDATE when concurrent enqueues take the keys.
_RETRY_RACES = 3


def _retry_rows(conn: Connection, table: Table, stmt: Any) -> Sequence[Any]:
    """The rows of a retry by hand on a table with unique jobs, run in a savepoint: if a
    unique job committed since the statement began holds the key of a job it retries (the
    guard could not see it), the savepoint is rolled back and the statement runs again,
    and then skips that job."""
    index = f"{table.name}_unique_idx"
    races = 0
    while True:
        try:
            with conn.begin_nested():
                return conn.execute(stmt).all()
        except IntegrityError as exc:
            constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
            races += 1
            if constraint != index or races == _RETRY_RACES:
                raise


@dataclasses.dataclass(frozen=True)
class QueueDepth:
    """One queue: its jobs by status, and the jobs that finished within ``within``.

    ``paused`` says whether the queue is paused, when `queue_depths` was given the pause
    table (else ``None``).

    Examples:
        >>> q = QueueDepth("emails", {"pending": 5}, 120, 2, dt.timedelta(minutes=5))
        >>> q.per_minute
        24.4
    """

    queue: str
    counts: dict[str, int]
    succeeded: int
    failed: int
    within: dt.timedelta
    paused: bool | None = None

    @property
    def per_minute(self) -> float:
        """Jobs finished (succeeded or failed) per minute over ``within``."""
        minutes = self.within.total_seconds() / 60
        return round((self.succeeded + self.failed) / minutes, 1) if minutes else 0.0


def queue_depths(
    conn: Connection,
    jobs: object,
    *,
    within: dt.timedelta | float = 300,
    clock: Clock | None = None,
    pauses: object | None = None,
) -> list[QueueDepth]:
    """Each queue's depth by status and its throughput over the last ``within``, by name.

    Given ``pauses`` (a `QueuePauseMixin` model), each says whether it is paused, and a
    paused queue with no job yet is listed too.

    Examples:
        with engine.connect() as conn:
            for q in queue_depths(conn, Job, pauses=PausedQueue):
                print(q.queue, q.counts.get("pending", 0), q.per_minute, q.paused)
    """
    window = _window(within)
    done = {
        row.queue: (row.succeeded, row.failed)
        for row in conn.execute(st.queue_throughput(jobs, within=window, clock=clock))
    }
    counts: dict[str, dict[str, int]] = {}
    for queue, _kind, status, n in conn.execute(st.count_jobs_by_queue_kind_status(jobs)):
        by_status = counts.setdefault(queue, {})
        by_status[status] = by_status.get(status, 0) + n
    if pauses is None:
        return [
            QueueDepth(name, counts.get(name, {}), *done.get(name, (0, 0)), window)
            for name in sorted(counts.keys() | done.keys())
        ]
    paused = {p.queue for p in _paused(conn, pauses)}
    return [
        QueueDepth(name, counts.get(name, {}), *done.get(name, (0, 0)), window, name in paused)
        for name in sorted(counts.keys() | done.keys() | paused)
    ]


@dataclasses.dataclass(frozen=True)
class ThroughputMinute:
    """The jobs that finished in one minute (``minute`` is its start), by outcome.

    Examples:
        >>> ThroughputMinute(dt.datetime(2030, 1, 1, 12, 5, tzinfo=dt.UTC), 40, 2).finished
        42
    """

    minute: dt.datetime
    succeeded: int
    failed: int

    @property
    def finished(self) -> int:
        """Succeeded and failed together."""
        return self.succeeded + self.failed


def throughput_by_minute(
    conn: Connection, jobs: object, *, minutes: int = 30, clock: Clock | None = None
) -> list[ThroughputMinute]:
    """The jobs finished in each of the last ``minutes`` minutes, oldest first, one entry
    per minute (zeros included); the last is the minute now is in (`job_throughput_by_minute`).

    Examples:
        with engine.connect() as conn:
            for m in throughput_by_minute(conn, Job, minutes=10):
                print(m.minute.strftime("%H:%M"), m.succeeded, m.failed)
    """
    stmt = st.job_throughput_by_minute(jobs, minutes=minutes, clock=clock)
    return [ThroughputMinute(*row) for row in conn.execute(stmt)]


@dataclasses.dataclass(frozen=True)
class RunningJob:
    """A ``running`` job and its lease, as `list_running_jobs` shows it.

    ``lease_left`` is how long its lease still runs, negative once it expired.

    Examples:
        >>> job = RunningJob(uuid.UUID(int=1), "default", "ping", "w1", 1, 8, None,
        ...                  dt.timedelta(seconds=-5))
        >>> job.expired
        True
    """

    id: uuid.UUID
    queue: str
    kind: str
    worker_id: str | None
    attempts: int
    max_attempts: int
    lease_until: dt.datetime | None
    lease_left: dt.timedelta | None

    @property
    def expired(self) -> bool:
        """Whether the lease has run out (the reclaimer will take the job)."""
        return self.lease_left is not None and self.lease_left < dt.timedelta(0)


def list_running_jobs(
    conn: Connection, jobs: object, *, limit: int = 50, clock: Clock | None = None
) -> list[RunningJob]:
    """Up to ``limit`` running jobs, the soonest lease end first, so expired leases lead
    (`select_running_jobs`: an index walk, cheap on a large table).

    Examples:
        with engine.connect() as conn:
            for job in list_running_jobs(conn, Job, limit=20):
                print(job.id, job.worker_id, job.lease_left, job.expired)
    """
    stmt = st.select_running_jobs(jobs, limit=limit, clock=clock)
    return [RunningJob(*row) for row in conn.execute(stmt)]


@dataclasses.dataclass(frozen=True)
class EventRow:
    """An unpublished outbox event as `list_events` shows it, with its error's first line.

    Examples:
        >>> EventRow(uuid.UUID(int=1), 7, "order", "42", "OrderPlaced", 10, None, None,
        ...          None, None, "refused").error_line
        'refused'
    """

    id: uuid.UUID
    seq: int
    aggregate_type: str
    aggregate_id: str
    event_type: str
    attempts: int
    relay_until: dt.datetime | None
    published_at: dt.datetime | None
    parked_at: dt.datetime | None
    created_at: dt.datetime | None
    error_line: str | None


def list_events(
    conn: Connection, outbox: object, *, parked: bool = False, limit: int = 50
) -> list[EventRow]:
    """Up to ``limit`` unpublished events in ``seq`` order: the backlog, or the parked ones.

    Examples:
        with engine.connect() as conn:
            parked = list_events(conn, OutboxEvent, parked=True)
    """
    stmt = st.select_events(outbox, parked=parked, limit=limit)
    return [EventRow(**row._asdict()) for row in conn.execute(stmt)]


def get_event(conn: Connection, outbox: object, event_id: object) -> dict[str, Any] | None:
    """Every column of one outbox event, by name, or ``None`` when there is none.

    Examples:
        with engine.connect() as conn:
            event = get_event(conn, OutboxEvent, "0b0e6c1e-…")
    """
    row = conn.execute(st.select_event(outbox, event_id)).one_or_none()
    return None if row is None else dict(row._mapping)


def retry_parked(
    conn: Connection, outbox: object, *, ids: Sequence[object] | None = None
) -> list[uuid.UUID]:
    """Un-park parked events (all, or ``ids``) and wake the relays; returns their ids.

    Their attempts start again from zero (`requeue_parked_events`). With ``ids``, all or
    nothing, as `retry_failed`: an id that does not exist, or names an event that is not
    parked, raises `InvalidArgument` and the caller's transaction should roll back.

    Examples:
        with engine.begin() as conn:
            retry_parked(conn, OutboxEvent)
    """
    chosen = None if ids is None else [as_uuid(i, "event id") for i in ids]
    retried = Outbox(outbox).requeue_parked(conn, ids=chosen)
    if chosen is not None:
        missing = [i for i in dict.fromkeys(chosen) if i not in set(retried)]
        if missing:
            found = {r.id: r for r in conn.execute(st.select_event_states(outbox, missing))}
            first = missing[0]
            if first not in found:
                raise InvalidArgument(
                    f"no event {first} in {resolve_table(outbox).fullname}; nothing retried"
                )
            state = "published" if found[first].published_at is not None else "not parked"
            raise InvalidArgument(f"event {first} is {state}; nothing retried")
    return retried
