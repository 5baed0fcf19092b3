"""The one driver pair: `run` and `arun` drive an operation on a connection.

An operation is a generator that yields statements and is sent back each statement's
result (the sans-I/O style of psycopg 3): written once, it runs on a sync connection with
`run` and on an asyncio one with `arun`. What differs between callers is an option, not
another loop:

- the connection kind: a `Connection` or `Session` (their `AsyncConnection` /
  `AsyncSession`), or a held connection (`HeldSteps`, `AsyncHeldSteps`) that runs each
  statement itself — the worker's loop runs its hot statements on psycopg's cursor;
- ``autocommit=True``: given an `Engine`, a connection of its own in autocommit (each
  statement commits itself: one round trip each, no BEGIN or COMMIT of their own);
- `COMMIT` and `ROLLBACK`: an operation may yield them to end the transaction it is in
  (it is sent ``None`` back);
- ``recover=True``: a statement that fails with a database error rolls the transaction
  back, and the error is thrown into the operation, which may go on.

None of them commits unless the operation says so: the caller owns the transaction.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar, cast

from sqlalchemy import Connection, Engine, Executable
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from .._pooler import prepare_for_pooler

if TYPE_CHECKING:
    # sqlalchemy.ext.asyncio needs greenlet, an optional extra: import it only for typing.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

__all__ = [
    "COMMIT",
    "ROLLBACK",
    "AsyncConn",
    "AsyncHeldSteps",
    "BoundOp",
    "BoundStep",
    "HeldSteps",
    "Op",
    "Step",
    "SyncConn",
    "TransactionStep",
    "arun",
    "run",
]

T = TypeVar("T")


class TransactionStep:
    """`COMMIT` or `ROLLBACK`: what an operation yields to end its transaction.

    Examples:
        >>> COMMIT, ROLLBACK
        (COMMIT, ROLLBACK)
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Yielded by an operation: commit the transaction it is in (it is sent ``None``).
COMMIT: Final = TransactionStep("COMMIT")
#: Yielded by an operation: roll the transaction back (it is sent ``None``).
ROLLBACK: Final = TransactionStep("ROLLBACK")

#: A statement, or a statement and the values of its bind parameters (a statement built
#: once and run again with new values).
Step: TypeAlias = Executable | tuple[Executable, dict[str, Any]]
#: An operation: yields statements, is sent back each statement's (buffered) result.
Op: TypeAlias = Generator[Step, Any, T]
#: A statement, its values, and the ``bind_arguments`` a `Session` needs to find its engine
#: (a statement as text names no table).
BoundStep: TypeAlias = tuple[Executable, dict[str, Any], dict[str, Any]]
#: An operation that may also yield `BoundStep`, `COMMIT` and `ROLLBACK`.
BoundOp: TypeAlias = Generator[Step | BoundStep | TransactionStep, Any, T]
#: What `run` drives an operation on.
SyncConn: TypeAlias = Connection | Session

if TYPE_CHECKING:
    AsyncConn: TypeAlias = AsyncConnection | AsyncSession
else:  # a name for the documentation; the types need sqlalchemy.ext.asyncio
    AsyncConn = Any


class HeldSteps(abc.ABC):
    """A connection kind `run` hands each step to (`execute_step`) instead of executing it
    through SQLAlchemy: the worker's held connection, which runs its hot statements on
    psycopg's cursor.

    Examples:
        >>> class Echo(HeldSteps):
        ...     def execute_step(self, step): return step
        >>> def op():
        ...     return (yield "SELECT 1")
        >>> run(Echo(), op())
        'SELECT 1'
    """

    @abc.abstractmethod
    def execute_step(self, step: Step) -> Any:
        """Run one statement; returns its rows (iterable; ``all()``)."""


class AsyncHeldSteps(abc.ABC):
    """`HeldSteps` for `arun`.

    Examples:
        >>> import asyncio
        >>> class Echo(AsyncHeldSteps):
        ...     async def execute_step(self, step): return step
        >>> def op():
        ...     return (yield "SELECT 1")
        >>> asyncio.run(arun(Echo(), op()))
        'SELECT 1'
    """

    @abc.abstractmethod
    async def execute_step(self, step: Step) -> Any:
        """See `HeldSteps.execute_step`."""


def _sync_executor(conn: SyncConn | HeldSteps) -> Callable[[Any], Any]:
    if isinstance(conn, HeldSteps):
        return conn.execute_step
    execute = conn.execute
    session = conn if isinstance(conn, Session) else None

    def step_on(step: Any) -> Any:
        if isinstance(step, tuple):
            if len(step) == 3 and session is not None:
                return session.execute(step[0], step[1], bind_arguments=step[2])
            return execute(step[0], step[1])
        if isinstance(step, TransactionStep):
            (conn.commit if step is COMMIT else conn.rollback)()
            return None
        return execute(step)

    return step_on


def run(
    conn: SyncConn | HeldSteps | Engine,
    op: BoundOp[T],
    *,
    autocommit: bool = False,
    recover: bool = False,
) -> T:
    """Drive ``op`` on ``conn``; returns what it returns.

    ``autocommit=True``: ``conn`` is an `Engine`; the operation runs on a connection of its
    own in autocommit (behind PgBouncer, without prepared statements). ``recover=True``: a
    statement's database error rolls back, and is thrown into the operation.

    Examples:
        >>> from sqlalchemy import create_engine, text
        >>> engine = create_engine("sqlite://")
        >>> def op():
        ...     return (yield text("SELECT 41 + 1")).scalar()
        >>> with engine.connect() as conn:
        ...     run(conn, op())
        42
        >>> engine.dispose()
    """
    if autocommit:
        if not isinstance(conn, Engine):
            raise TypeError(f"autocommit=True needs an Engine, not {type(conn).__name__}")
        prepare_for_pooler(conn)  # behind PgBouncer: no prepared statements
        with conn.connect() as own:
            own.execution_options(isolation_level="AUTOCOMMIT")
            return run(own, op, recover=recover)
    if isinstance(conn, Engine):
        raise TypeError("run() on an Engine needs autocommit=True")
    execute = _sync_executor(conn)
    try:
        step = next(op)
        while True:
            try:
                result = execute(step)
            except DBAPIError as exc:
                if not recover:
                    raise
                cast("SyncConn", conn).rollback()
                step = op.throw(exc)
            else:
                step = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _async_executor(conn: AsyncConn | AsyncHeldSteps) -> Callable[[Any], Awaitable[Any]]:
    if isinstance(conn, AsyncHeldSteps):
        return conn.execute_step
    execute = conn.execute
    session = hasattr(conn, "sync_session")

    async def step_on(step: Any) -> Any:
        if isinstance(step, tuple):
            if len(step) == 3 and session:
                return await cast("AsyncSession", conn).execute(
                    step[0], step[1], bind_arguments=step[2]
                )
            return await execute(step[0], step[1])
        if isinstance(step, TransactionStep):
            await (conn.commit if step is COMMIT else conn.rollback)()
            return None
        return await execute(step)

    return step_on


async def arun(
    conn: AsyncConn | AsyncHeldSteps | AsyncEngine,
    op: BoundOp[T],
    *,
    autocommit: bool = False,
    recover: bool = False,
) -> T:
    """`run` for asyncio: on an `AsyncConnection`, `AsyncSession`, `AsyncHeldSteps`, or (with
    ``autocommit=True``) an `AsyncEngine`.

    Examples:
        result = await arun(async_conn, ops.counts())
    """
    if autocommit:
        engine = cast("AsyncEngine", conn)
        prepare_for_pooler(engine)
        async with engine.connect() as own:
            await own.execution_options(isolation_level="AUTOCOMMIT")
            return await arun(own, op, recover=recover)
    execute = _async_executor(cast("AsyncConn | AsyncHeldSteps", conn))
    try:
        step = next(op)
        while True:
            try:
                result = await execute(step)
            except DBAPIError as exc:
                if not recover:
                    raise
                await cast("AsyncConnection", conn).rollback()
                step = op.throw(exc)
            else:
                step = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
