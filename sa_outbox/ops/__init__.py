"""The operations layer: the library's operations, each written once, and one driver pair.

Between the statements (`sa_outbox.statements`, which build SQL) and the runtimes (the
queue's classes, the worker, the relay, maintenance): an operation is a generator that
yields statements and is sent back their results; `run` drives it on a sync connection,
`arun` on an asyncio one. `JobOps`, `OutboxOps`, `InboxOps` and `PartitionOps` hold the
operations of each table; `ClaimParams` is what a claim asks for.

Examples:
    >>> from sqlalchemy import create_engine, text
    >>> def answer():
    ...     return (yield text("SELECT 42")).scalar()
    >>> engine = create_engine("sqlite://")
    >>> with engine.connect() as conn:
    ...     run(conn, answer())
    42
    >>> engine.dispose()
"""

from ._dependencies import DependencyOps, check_parents
from ._drive import (
    COMMIT,
    ROLLBACK,
    AsyncConn,
    AsyncHeldSteps,
    BoundOp,
    BoundStep,
    HeldSteps,
    Op,
    Step,
    SyncConn,
    TransactionStep,
    arun,
    run,
)
from ._inbox import InboxOps
from ._jobs import JobOps
from ._outbox import OutboxOps
from ._params import ClaimParams
from ._partitions import DEFAULT_AHEAD, DEFAULT_LOCK_TIMEOUT, PartitionOps, PartitionReport

__all__ = [
    "COMMIT",
    "DEFAULT_AHEAD",
    "DEFAULT_LOCK_TIMEOUT",
    "ROLLBACK",
    "AsyncConn",
    "AsyncHeldSteps",
    "BoundOp",
    "BoundStep",
    "ClaimParams",
    "DependencyOps",
    "HeldSteps",
    "InboxOps",
    "JobOps",
    "Op",
    "OutboxOps",
    "PartitionOps",
    "PartitionReport",
    "Step",
    "SyncConn",
    "TransactionStep",
    "arun",
    "check_parents",
    "run",
]
