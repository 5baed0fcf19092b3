"""Layer 2: the query builder — functions that return SQLAlchemy Core statements.

May import: ``sa_outbox.schema`` and the foundation modules, nothing that does I/O. Split
by concern: ``_job_enqueue`` (and ``_job_headers``, ``_job_unique``), ``_job_claim``
(claim, heartbeat, complete), ``_job_settle`` (retry, fail, snooze, release, reclaim,
requeue, retry by hand, prune), ``_job_cancel``, ``_job_limits`` (concurrency and rate
limits the claim obeys), ``_job_notify``, ``_queue_pause`` (paused queues); ``_inspect``
(the read-only queries of status, listings and queues); ``_outbox_append``,
``_outbox_claim``, ``_outbox_settle``; ``_inbox`` (a consumer's inbox: accept a message
once, prune); ``_maintenance`` and ``_partitions`` (upkeep).

No I/O, no sessions, no globals: each function validates its arguments (raising
`InvalidArgument` / `InvalidArgumentType` before any SQL exists), and returns a statement
whose values are bind parameters. Run it on your own connection, in your own transaction,
or extend it first (``.where(...)``, ``.returning(...)``). "Now" comes from ``clock``: the
database's ``now()`` by default, a `FakeClock`'s bind parameter in tests.

Examples:
    >>> from sqlalchemy.orm import DeclarativeBase
    >>> from sa_outbox.schema import JobMixin
    >>> class Base(DeclarativeBase): pass
    >>> class Job(JobMixin, Base): __tablename__ = "jobs"
    >>> stmt = claim_jobs(Job, worker_id="w1", batch=20, queues=["default"])
    >>> stmt = stmt.where(Job.__table__.c.kind != "slow")  # extend it, then run it yourself
"""

from .._json import MAX_DEPTH as MAX_PAYLOAD_DEPTH
from .._json import compact_json
from .._validation import (
    MAX_AGGREGATE_ID_LENGTH,
    MAX_DEDUPLICATION_KEY_LENGTH,
    MAX_MESSAGE_ID_LENGTH,
    MAX_NAME_LENGTH,
)
from ._common import DEFAULT_MAX_PAYLOAD_BYTES
from ._inbox import accept_message, prune_inbox
from ._inspect import (
    MAX_THROUGHPUT_MINUTES,
    WORKER_APPLICATION_PREFIX,
    connected_workers,
    count_jobs_by_queue_kind_status,
    job_alarms,
    job_kind_exists,
    job_queue_exists,
    job_throughput_by_minute,
    latest_deduplication_key,
    outbox_alarms,
    queue_throughput,
    select_event,
    select_event_states,
    select_events,
    select_job,
    select_job_statuses,
    select_jobs,
    select_running_jobs,
    workers_holding_jobs,
)
from ._job_cancel import (
    cancel_jobs,
    finish_cancelled_jobs,
    held_cancelled_jobs,
    job_statuses,
)
from ._job_claim import (
    ACKED,
    COMPLETION_IDS,
    COMPLETION_TOKENS,
    claim_jobs,
    complete_and_claim_jobs,
    complete_job,
    complete_jobs,
    heartbeat_job,
    heartbeat_jobs,
)
from ._job_defaults import DEFAULT_BACKOFF, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from ._job_enqueue import (
    ENQUEUE_PARAMETERS,
    UNIQUE_ENQUEUE_PARAMETERS,
    NewJob,
    enqueue_job,
    enqueue_job_template,
    enqueue_job_values,
    enqueue_jobs,
    precompiled,
)
from ._job_headers import MAX_HEADERS_BYTES
from ._job_limits import DEFAULT_LOOKAHEAD, MAX_LIMIT, ClaimLimits, Limit, lock_claim_limits
from ._job_notify import job_notify_channel_of, listen_sql, notify_jobs, parse_notify_payload
from ._job_settle import (
    count_jobs_by_status,
    fail_job,
    prune_jobs,
    reclaim_expired_jobs,
    release_jobs,
    requeue_failed_jobs,
    retry_failed_jobs,
    retry_job,
    select_unique_held_failed_jobs,
    snooze_job,
)
from ._job_unique import DEFAULT_UNIQUE_STATES, Unique, has_unique_columns
from ._maintenance import (
    PRUNE_LOCK_PREFIX,
    count_events_by_state,
    oldest_ready_pending_age,
    partition_stats,
    prune_lock,
    table_stats,
    vacuum_candidates,
    vacuum_table,
    xmin_holders,
)
from ._outbox_append import NewEvent, append_event, append_events, check_event
from ._outbox_claim import (
    DEFAULT_RELAY_BACKOFF,
    DEFAULT_RELAY_LEASE,
    claim_events,
    select_aggregate_heads,
    select_claim_candidates,
)
from ._outbox_settle import (
    mark_event_published,
    mark_events_published,
    notify_relays,
    outbox_notify_channel_of,
    prune_events,
    reject_events,
    release_events,
    requeue_parked_events,
    select_parked_events,
)
from ._partitions import (
    PARTITION_LOCK_PREFIX,
    attach_partition,
    count_in_range,
    create_partition,
    create_table_like,
    detach_partition,
    drop_partition,
    has_unfinished_rows,
    list_partitions,
    lock_partition,
    move_rows,
    partition_lock,
    partition_unlock,
    partitions_in_schema,
    select_now,
    set_lock_timeout,
    table_has_trigger,
    table_layout,
)
from ._queue_pause import pause_queue, resume_queue, select_paused_queues

__all__ = [
    "ACKED",
    "COMPLETION_IDS",
    "COMPLETION_TOKENS",
    "DEFAULT_BACKOFF",
    "DEFAULT_LEASE",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_QUEUE",
    "DEFAULT_RELAY_BACKOFF",
    "DEFAULT_RELAY_LEASE",
    "DEFAULT_UNIQUE_STATES",
    "ENQUEUE_PARAMETERS",
    "MAX_AGGREGATE_ID_LENGTH",
    "MAX_DEDUPLICATION_KEY_LENGTH",
    "MAX_HEADERS_BYTES",
    "MAX_LIMIT",
    "MAX_MESSAGE_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_PAYLOAD_DEPTH",
    "MAX_THROUGHPUT_MINUTES",
    "PARTITION_LOCK_PREFIX",
    "PRUNE_LOCK_PREFIX",
    "UNIQUE_ENQUEUE_PARAMETERS",
    "WORKER_APPLICATION_PREFIX",
    "ClaimLimits",
    "Limit",
    "NewEvent",
    "NewJob",
    "Unique",
    "accept_message",
    "append_event",
    "append_events",
    "attach_partition",
    "cancel_jobs",
    "check_event",
    "claim_events",
    "claim_jobs",
    "compact_json",
    "complete_and_claim_jobs",
    "complete_job",
    "complete_jobs",
    "connected_workers",
    "count_events_by_state",
    "count_in_range",
    "count_jobs_by_queue_kind_status",
    "count_jobs_by_status",
    "create_partition",
    "create_table_like",
    "detach_partition",
    "drop_partition",
    "enqueue_job",
    "enqueue_job_template",
    "enqueue_job_values",
    "enqueue_jobs",
    "fail_job",
    "finish_cancelled_jobs",
    "has_unfinished_rows",
    "has_unique_columns",
    "heartbeat_job",
    "heartbeat_jobs",
    "held_cancelled_jobs",
    "job_alarms",
    "job_kind_exists",
    "job_notify_channel_of",
    "job_queue_exists",
    "job_statuses",
    "job_throughput_by_minute",
    "latest_deduplication_key",
    "list_partitions",
    "listen_sql",
    "lock_claim_limits",
    "lock_partition",
    "mark_event_published",
    "mark_events_published",
    "move_rows",
    "notify_jobs",
    "notify_relays",
    "oldest_ready_pending_age",
    "outbox_alarms",
    "outbox_notify_channel_of",
    "parse_notify_payload",
    "partition_lock",
    "partition_stats",
    "partition_unlock",
    "partitions_in_schema",
    "pause_queue",
    "precompiled",
    "prune_events",
    "prune_inbox",
    "prune_jobs",
    "prune_lock",
    "queue_throughput",
    "reclaim_expired_jobs",
    "reject_events",
    "release_events",
    "release_jobs",
    "requeue_failed_jobs",
    "requeue_parked_events",
    "resume_queue",
    "retry_failed_jobs",
    "retry_job",
    "select_aggregate_heads",
    "select_claim_candidates",
    "select_event",
    "select_event_states",
    "select_events",
    "select_job",
    "select_job_statuses",
    "select_jobs",
    "select_now",
    "select_parked_events",
    "select_paused_queues",
    "select_running_jobs",
    "select_unique_held_failed_jobs",
    "set_lock_timeout",
    "snooze_job",
    "table_has_trigger",
    "table_layout",
    "table_stats",
    "vacuum_candidates",
    "vacuum_table",
    "workers_holding_jobs",
    "xmin_holders",
]
