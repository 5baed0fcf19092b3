"""The enqueue INSERT run on the driver's own cursor: the same statement and round trip,
without SQLAlchemy's per-execution work.

An enqueue is one small ``INSERT … RETURNING id``. Through ``Session.execute`` or
``Connection.execute`` SQLAlchemy spends ~5 times the driver's own CPU on it (execution context,
compiled-cache lookup, result object; measured with callgrind, docs/performance.md), which
is most of what a job adds to a short transaction. `DriverInsert` compiles the statement
once per dialect and hands its text and values to psycopg's cursor, inside the caller's
transaction (a `Session`'s or a `Connection`'s) or, given an `Engine`, on a pooled
connection in autocommit.

It steps aside (`DriverInsert.run` returns `NOT_RUN`, and the caller executes the statement
the usual way) whenever that would hide something from the application: another driver
than psycopg 3 (sync), listeners on the engine or connection (``before_cursor_execute``, echo,
tracing), ``do_orm_execute`` listeners on the session, or a ``schema_translate_map``.
Errors come out as SQLAlchemy's own exceptions (`sqlalchemy.exc.DBAPIError` subclasses), and
a lost connection is invalidated, as ``execute`` does.

Examples:
    >>> from sqlalchemy import Column, Integer, MetaData, Table, insert
    >>> t = Table("t", MetaData(), Column("id", Integer, primary_key=True))
    >>> fast = DriverInsert(lambda: insert(t).returning(t.c.id))
    >>> # fast.run(engine_or_connection_or_session, {...}) -> a row, None, or NOT_RUN
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final, cast

from sqlalchemy import Connection, Engine, exc
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from .._pooler import prepare_for_pooler

__all__ = ["NOT_RUN", "DriverInsert"]


class _NotRun:
    def __repr__(self) -> str:
        return "NOT_RUN"


#: What `DriverInsert.run` returns when it stepped aside: execute the statement as usual.
NOT_RUN: Final = _NotRun()


class _Compiled:
    """The statement's text for one dialect, its constants' values already processed."""

    __slots__ = ("constants", "processors", "sql")

    def __init__(self, stmt: ClauseElement, dialect: Dialect) -> None:
        compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
        self.sql: str = compiled.string
        constants: dict[str, Any] = {}
        processors: list[tuple[str, Callable[[Any], Any]]] = []
        for param, name in compiled.bind_names.items():
            process = param.type.dialect_impl(dialect).bind_processor(dialect)
            if param.callable is None and param.value is not None:
                constants[name] = param.value if process is None else process(param.value)
            elif process is not None:
                processors.append((name, process))
        self.constants = constants
        self.processors = processors

    def params(self, values: dict[str, Any]) -> dict[str, Any]:
        params = {**self.constants, **values}
        for name, process in self.processors:
            params[name] = process(params[name])
        return params


def _plain_engine(engine: Engine) -> bool:
    """Whether running on the driver's cursor hides nothing from this engine's application."""
    return (
        engine.dialect.driver == "psycopg"
        and not engine.dialect.is_async  # run_sync on an AsyncConnection: awaitable cursors
        and not engine._has_events
        and not engine.echo
        and not engine.get_execution_options().get("schema_translate_map")
    )


def _plain_connection(conn: Connection) -> bool:
    return (
        not conn._has_events
        and not conn.closed
        and not conn.invalidated
        and _plain_engine(conn.engine)
        and not conn.get_execution_options().get("schema_translate_map")
    )


class DriverInsert:
    """An ``INSERT … RETURNING`` built once by ``build``, compiled once per dialect, run on
    the driver's cursor (see the module's docstring for when it steps aside).

    Examples:
        >>> from sqlalchemy import Column, Integer, MetaData, Table, insert
        >>> t = Table("t", MetaData(), Column("id", Integer, primary_key=True))
        >>> DriverInsert(lambda: insert(t).returning(t.c.id))
        DriverInsert(t)
    """

    def __init__(self, build: Callable[[], ClauseElement]) -> None:
        self._stmt = build()
        self._compiled: weakref.WeakKeyDictionary[Dialect, _Compiled] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        table = getattr(self._stmt, "table", None)
        return f"DriverInsert({getattr(table, 'name', '?')})"

    def _for(self, dialect: Dialect) -> _Compiled:
        compiled = self._compiled.get(dialect)
        if compiled is None:
            compiled = self._compiled[dialect] = _Compiled(self._stmt, dialect)
        return compiled

    def run(self, target: Engine | Connection | Session, values: dict[str, Any]) -> Any:
        """The first row the statement returns (None if none), or `NOT_RUN`.

        In a `Session` or `Connection` the row joins its transaction (begun here if it was
        not); given an `Engine`, it commits on its own (autocommit), on a pooled connection.
        """
        if isinstance(target, Engine):
            return self._autocommit(target, values) if _plain_engine(target) else NOT_RUN
        if isinstance(target, scoped_session):  # Flask-SQLAlchemy's db.session, say
            target = target()
        if isinstance(target, Session):
            if target.dispatch.do_orm_execute:
                return NOT_RUN
            conn = target.connection(bind_arguments={"clause": self._stmt})
        elif isinstance(target, Connection):
            conn = target
        else:
            return NOT_RUN
        if not _plain_connection(conn):
            return NOT_RUN
        if not conn.in_transaction():
            conn.begin()  # as execute() would: conn.commit() then commits the job
        proxied = conn.connection
        try:
            return self._execute(proxied.driver_connection, conn.dialect, values)
        except exc.DBAPIError as error:
            if error.connection_invalidated:
                conn.invalidate(error.orig)
            raise

    def _autocommit(self, engine: Engine, values: dict[str, Any]) -> Any:
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
        proxied = engine.raw_connection()
        try:
            driver: Any = proxied.driver_connection
            was_autocommit = driver.autocommit
            try:
                if not was_autocommit:
                    driver.autocommit = True
                return self._execute(driver, engine.dialect, values)
            finally:
                if not was_autocommit and not driver.closed:
                    driver.autocommit = False
        except exc.DBAPIError as error:
            if error.connection_invalidated:
                proxied.invalidate(error.orig)
            raise
        finally:
            proxied.close()

    def _execute(self, driver: Any, dialect: Dialect, values: dict[str, Any]) -> Any:
        compiled = self._for(dialect)
        params = compiled.params(values)
        dbapi = dialect.loaded_dbapi
        try:
            with driver.cursor() as cursor:
                cursor.execute(compiled.sql, params)
                return cursor.fetchone()
        except dbapi.Error as error:
            lost = dialect.is_disconnect(error, driver, None)
            raise exc.DBAPIError.instance(
                compiled.sql,
                params,
                error,
                dbapi.Error,
                connection_invalidated=lost,
                dialect=dialect,
            ) from error
