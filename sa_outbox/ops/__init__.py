"""The operations layer: the library's operations, each written once, and one driver pair.

Between the statements (`sa_outbox.statements`, which build SQL) and the runtimes (the
queue's classes, the worker, the relay, maintenance): an operation is a generator that
yields statements and is sent back their results; `run` drives it on a sync connection,
`arun` on an asyncio one.

Examples:
    >>> from sqlalchemy import create_engine, text
    >>> def answer():
    ...     return (yield text("SELECT 42")).scalar()
    >>> with create_engine("sqlite://").connect() as conn:
    ...     run(conn, answer())
    42
"""

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
from ._params import ClaimParams

__all__ = [
    "COMMIT",
    "ROLLBACK",
    "AsyncConn",
    "AsyncHeldSteps",
    "BoundOp",
    "BoundStep",
    "ClaimParams",
    "HeldSteps",
    "Op",
    "Step",
    "SyncConn",
    "TransactionStep",
    "arun",
    "run",
]
