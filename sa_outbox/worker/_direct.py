"""The loop's own connection, and its hot statements run at the driver level.

A worker's loop writes a batch and claims the next one in one autocommit statement, again
and again (`Core.one_statement`). It keeps one connection for that (`HeldConnection`,
`AsyncHeldConnection`) instead of taking one from the pool for every batch, and runs the
statement — built once by `sa_outbox.statements` — through psycopg's cursor on that
connection: compiled once (`driver_statement`), its bound values processed once, only the
arrays that change processed at each run, and rows returned as psycopg's tuples, which the
operations decode positionally. That is about a third less of the loop's CPU per batch
than SQLAlchemy's execution of the same cached statement (its execution context, parameter
processing and result rows), with the same SQL, the same values and the same rows.

SQLAlchemy still runs a statement when the driver is not psycopg, when the engine has
event listeners (``before_cursor_execute`` and the like, which instrumentation relies on:
they see every statement, as before), or when a returned column's type decodes values
itself (a ``TypeDecorator`` of the user's).

A connection that failed is invalidated and dropped; the next attempt connects afresh.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import ARRAY, Connection, Engine, Executable, Uuid
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql import ClauseElement

from ..ops import AsyncHeldSteps, HeldSteps, Op, Step, arun, run

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "AsyncHeldConnection",
    "DriverStatement",
    "HeldConnection",
    "Rows",
    "can_hold",
    "driver_statement",
]

T = TypeVar("T")

#: Statements compiled for the driver, per connection runner (built-once statements only
#: repeat; a FakeClock's fresh statements would grow it: it is emptied when full).
_CACHE_SIZE = 32
_EXPANDED = re.compile(r"^(.+)_\d+$")


class DriverStatement:
    """A statement compiled for psycopg: its SQL, and its bound values processed as
    SQLAlchemy would (``values`` replaces some of them at each run).

    Examples:
        >>> import uuid
        >>> from sqlalchemy.dialects.postgresql import psycopg
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import JobMixin, statements as st
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> stmt = st.complete_jobs(Job, [(uuid.UUID(int=1), uuid.UUID(int=2))])
        >>> ds = driver_statement(stmt, psycopg.dialect())
        >>> "%(completion_ids)s" in ds.sql, ds.bind(None)["status_1"]
        (True, 'running')
    """

    __slots__ = ("params", "processors", "sql", "uuid_arrays")

    def __init__(
        self,
        sql: str,
        params: dict[str, Any],
        processors: dict[str, Callable[[Any], Any]],
        uuid_arrays: frozenset[str] = frozenset(),
    ) -> None:
        self.sql = sql
        self.params = params
        self.processors = processors
        self.uuid_arrays = uuid_arrays

    def bind(self, values: dict[str, Any] | None) -> dict[str, Any]:
        """The parameters of one run: the fixed ones, and ``values`` processed.

        A ``uuid[]`` parameter (the SQL casts it) is sent as the text of an array literal:
        psycopg adapts a list element by element, in Python, which costs five times as much
        as joining the UUIDs' hex digits (50 pairs: ~100 µs against ~17 µs).
        """
        if not values:
            return self.params
        params = dict(self.params)
        processors = self.processors
        for name, value in values.items():
            if value is None:
                params[name] = None
            elif name in self.uuid_arrays and (literal := _uuid_array_literal(value)):
                params[name] = literal
            else:
                process = processors.get(name)
                params[name] = value if process is None else process(value)
        return params


def _uuid_array_literal(values: object) -> str | None:
    """``{hex,hex,…}`` for a list of UUIDs (PostgreSQL reads a UUID's 32 hex digits)."""
    if not isinstance(values, list):
        return None
    try:
        return "{" + ",".join([value.hex for value in values]) + "}"
    except (AttributeError, TypeError):  # not UUIDs: adapted as they are
        return None


def _is_uuid_array(type_: object) -> bool:
    return isinstance(type_, ARRAY) and isinstance(type_.item_type, Uuid)


def driver_statement(stmt: Executable, dialect: Dialect) -> DriverStatement | None:
    """``stmt`` compiled for the psycopg driver of ``dialect``; ``None`` if SQLAlchemy must
    run it (another driver or parameter style, or a returned column whose type decodes
    values itself)."""
    if not isinstance(stmt, ClauseElement):
        return None
    if dialect.driver != "psycopg" or dialect.paramstyle != "pyformat":
        return None
    for column in getattr(stmt, "exported_columns", ()):
        if column.type.dialect_impl(dialect).result_processor(dialect, None) is not None:
            return None
    compiled = stmt.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    if getattr(compiled, "escaped_bind_names", None):
        return None
    binds = getattr(compiled, "binds", None)
    if not isinstance(binds, dict):
        return None
    processors: dict[str, Callable[[Any], Any]] = {}
    params: dict[str, Any] = {}
    uuid_arrays: set[str] = set()
    for name, value in (compiled.construct_params() or {}).items():
        bind = binds.get(name)
        if bind is None:  # an expanded IN list: queue_1 → queue_1_1, queue_1_2, …
            match = _EXPANDED.match(name)
            bind = binds.get(match.group(1)) if match else None
            if bind is None:
                return None
        if _is_uuid_array(bind.type):
            uuid_arrays.add(name)
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors[name] = process
            value = None if value is None else process(value)
        params[name] = value
    return DriverStatement(compiled.string, params, processors, frozenset(uuid_arrays))


class Rows:
    """A statement's rows (psycopg's tuples), with the part of SQLAlchemy's `Result` that
    the worker's operations use: iteration and `all`.

    Examples:
        >>> [row[0] for row in Rows([(1, "a"), (2, "b")])], Rows([]).all()
        ([1, 2], [])
    """

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def all(self) -> list[Any]:
        return self._rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


def _has_events(conn: Connection) -> bool:
    # Listeners of the engine (or connection) see each statement, as before: SQLAlchemy runs it.
    return bool(getattr(conn, "_has_events", True) or getattr(conn.engine, "_has_events", True))


class _Statements:
    """Statements compiled for the driver, by statement (kept alive while cached)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Executable, DriverStatement | None]] = {}

    def get(self, stmt: Executable, dialect: Dialect) -> DriverStatement | None:
        hit = self._cache.get(id(stmt))
        if hit is not None and hit[0] is stmt:
            return hit[1]
        compiled = driver_statement(stmt, dialect)
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        self._cache[id(stmt)] = (stmt, compiled)
        return compiled


def can_hold(engine: Engine) -> bool:
    """Whether the engine's pool has room for a held connection and another one (the
    keeper's heartbeats, a transaction): a pool of one connection is shared, not held.

    Examples:
        >>> from sqlalchemy import create_engine
        >>> can_hold(create_engine("postgresql+psycopg://", pool_size=1, max_overflow=0))
        False
        >>> can_hold(create_engine("postgresql+psycopg://"))  # 5, and 10 more on demand
        True
    """
    pool = engine.pool
    size = getattr(pool, "size", None)
    if not callable(size):  # NullPool and the like: a connection whenever asked
        return True
    overflow = getattr(pool, "_max_overflow", 0)  # QueuePool's; -1: no limit
    return bool(overflow < 0 or size() + overflow >= 2)


def _split(step: Step) -> tuple[Executable, dict[str, Any] | None]:
    return step if isinstance(step, tuple) else (step, None)


class HeldConnection(HeldSteps):
    """The sync loop's autocommit connection, kept between batches (see the module doc).

    Examples:
        held = HeldConnection(engine)
        written = held.run(core.write_op(results, claim))
        held.release()
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None
        self._cursor: Any = None
        self._statements = _Statements()

    def run(self, op: Op[T]) -> T:
        """Drive ``op`` on the held connection (connecting first if needed). If it fails,
        the connection is invalidated and dropped, and the error raised."""
        try:
            return run(self, op)
        except BaseException:
            self.discard()
            raise

    def _connect(self) -> Connection:
        conn = self._conn = self._engine.connect()
        # On the connection, not with engine.execution_options(): an engine of options sets
        # the level with an event listener, and with listeners SQLAlchemy runs the
        # statements (`_has_events`). The pool resets the level on return.
        conn.execution_options(isolation_level="AUTOCOMMIT")
        return conn

    def execute_step(self, step: Step) -> Any:
        """Run one statement on the held connection (see the module doc)."""
        conn = self._conn
        if conn is None:
            conn = self._connect()
        stmt, values = _split(step)
        direct = None if _has_events(conn) else self._statements.get(stmt, conn.dialect)
        if direct is None:
            return conn.execute(stmt, values) if values is not None else conn.execute(stmt)
        cursor = self._cursor
        if cursor is None:
            driver = conn.connection.driver_connection
            assert driver is not None
            cursor = self._cursor = driver.cursor()
        cursor.execute(direct.sql, direct.bind(values))
        return Rows(cursor.fetchall())

    def discard(self) -> None:
        """Invalidate and drop the connection (after an error: its state is unknown)."""
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            try:
                conn.invalidate()
            finally:
                conn.close()

    def release(self) -> None:
        """Give the connection back to the pool."""
        conn, cursor, self._conn, self._cursor = self._conn, self._cursor, None, None
        if cursor is not None:
            cursor.close()
        if conn is not None:
            conn.close()


class AsyncHeldConnection(AsyncHeldSteps):
    """`HeldConnection` for asyncio: the `AsyncWorker` loop's autocommit connection.

    Examples:
        held = AsyncHeldConnection(async_engine)
        written = await held.run(core.write_op(results, claim))
        await held.release()
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._cursor: Any = None
        self._statements = _Statements()

    async def run(self, op: Op[T]) -> T:
        """See `HeldConnection.run`."""
        try:
            return await arun(self, op)
        except BaseException:
            await self.discard()
            raise

    async def execute_step(self, step: Step) -> Any:
        """See `HeldConnection.execute_step`."""
        conn = self._conn
        if conn is None:
            conn = self._conn = await self._engine.connect()
            await conn.execution_options(isolation_level="AUTOCOMMIT")  # see HeldConnection
        stmt, values = _split(step)
        sync = conn.sync_connection
        direct = (
            None if sync is None or _has_events(sync) else self._statements.get(stmt, conn.dialect)
        )
        if direct is None:
            if values is not None:
                return await conn.execute(stmt, values)
            return await conn.execute(stmt)
        cursor = self._cursor
        if cursor is None:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            cursor = self._cursor = driver.cursor()
        await cursor.execute(direct.sql, direct.bind(values))
        return Rows(await cursor.fetchall())

    def driver_connection(self) -> Any:
        """The psycopg connection held now (``None``: none), to break a statement that
        hangs at the end of the grace period."""
        conn = self._conn
        sync = None if conn is None else conn.sync_connection
        if sync is None or sync.closed:
            return None
        return sync.connection.driver_connection

    async def discard(self) -> None:
        """See `HeldConnection.discard`."""
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            try:
                await conn.invalidate()
            finally:
                await conn.close()

    async def release(self) -> None:
        """See `HeldConnection.release`."""
        conn, cursor, self._conn, self._cursor = self._conn, self._cursor, None, None
        if cursor is not None:
            await cursor.close()
        if conn is not None:
            await conn.close()
