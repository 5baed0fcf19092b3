"""What a database error means for the code that met it, by SQLSTATE (PostgreSQL's codes).

Three answers, used by every runtime that talks to the database on its own:

- `is_transient`: worth retrying after a wait (the connection was lost; the server is
  restarting, shutting down or refusing connections; a serialization failure or deadlock;
  a lock or statement timeout; too many connections; a prepared statement a transaction
  pooler moved). A worker rides these out.
- `is_configuration_error`: the database, the role or the password is wrong: retrying
  cannot help, and a worker stops at start-up with a one-line message.
- `is_not_ready`: the server answered but cannot take this session yet (a standby while the
  URL asks for a writable server, as during a failover; a server starting up, shutting down
  or in recovery; no free connection slot): the command-line ``worker`` and ``relay`` wait
  for it at start-up instead of stopping.
- `is_bad_data`: the statement's own values were refused (data exceptions, program limits
  such as an over-long index entry, integrity violations): the job that produced them fails,
  the others go on.

Errors met while connecting carry no SQLSTATE (libpq reports them as text), so those are
told apart by the server's message.

Examples:
    >>> is_transient(ValueError("no"))
    False
    >>> sqlstate_of(ValueError("no")) is None
    True
"""

from __future__ import annotations

import re

import psycopg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = ["is_bad_data", "is_configuration_error", "is_not_ready", "is_transient", "sqlstate_of"]

#: Classes and codes worth a retry: 08 connection exceptions; 40001 serialization failure,
#: 40P01 deadlock; 53300 too many connections; 55P03 lock not available (lock_timeout);
#: 57014 query canceled (statement_timeout); 57P01-03 admin/crash shutdown, cannot connect now;
#: 42P05 / 26000 a prepared statement that already exists / does not exist: psycopg's, moved
#: between server connections by a transaction pooler, retried once it prepares nothing more
#: (sa_outbox._pooler.note_prepared_statement_error).
_TRANSIENT_CLASSES = frozenset({"08"})
_TRANSIENT_CODES = frozenset(
    {"40001", "40P01", "53300", "55P03", "57014", "57P01", "57P02", "57P03", "42P05", "26000"}
)
#: 22 data exception, 23 integrity constraint violation, 54 program limit exceeded.
_BAD_DATA_CLASSES = frozenset({"22", "23", "54"})
#: 28 invalid authorization, 3D000 invalid catalog name (no such database).
_CONFIGURATION_CLASSES = frozenset({"28"})
_CONFIGURATION_CODES = frozenset({"3D000"})
#: What the server says, at connection time, when the URL names the wrong thing.
_CONFIGURATION_MESSAGE = re.compile(
    r'FATAL:\s+(database ".*" does not exist|role ".*" does not exist'
    r"|password authentication failed|no pg_hba\.conf entry)"
)


#: 57P03 cannot connect now (starting up, shutting down, in recovery), 53300 too many clients.
_NOT_READY_CODES = frozenset({"57P03", "53300"})
#: The same as libpq reports it at connection time (no SQLSTATE), and what it says when
#: ``target_session_attrs`` turns a server down (a standby when a writable one is asked for).
_NOT_READY_MESSAGE = re.compile(
    r"session is read-only|session is not read-only|server is in hot standby mode"
    r"|server is not in hot standby mode|too many clients already"
    r"|the database system is (starting up|shutting down|in recovery mode|not yet accepting"
    r" connections|not accepting connections)"
)


def sqlstate_of(error: BaseException) -> str | None:
    """The SQLSTATE of a driver error (or of the one SQLAlchemy wraps), if it has one."""
    original = error.orig if isinstance(error, DBAPIError) else error
    state = getattr(original, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_configuration_error(error: BaseException) -> bool:
    """Whether ``error`` says the database URL names a database, role or password that
    does not work (retrying cannot help).

    Examples:
        >>> is_configuration_error(OSError('FATAL:  database "nope" does not exist'))
        True
    """
    state = sqlstate_of(error)
    if state is not None:
        return state[:2] in _CONFIGURATION_CLASSES or state in _CONFIGURATION_CODES
    return _CONFIGURATION_MESSAGE.search(str(error)) is not None


def is_transient(error: BaseException) -> bool:
    """Whether a database error is worth retrying after a wait (see the module's doc).

    Examples:
        >>> is_transient(PoolTimeout("QueuePool limit reached"))
        True
    """
    if isinstance(error, PoolTimeout):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    state = sqlstate_of(error)
    if state is not None:
        return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES
    if is_configuration_error(error):
        return False
    # No SQLSTATE: an error of the connection itself (refused, reset, closed, timed out).
    return isinstance(
        error, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError
    )


def is_not_ready(error: BaseException) -> bool:
    """Whether the server answered but cannot take this session yet (see the module's doc).

    Examples:
        >>> is_not_ready(OSError("connection failed: session is read-only"))
        True
        >>> is_not_ready(OSError("connection refused"))
        False
    """
    state = sqlstate_of(error)
    if state in _NOT_READY_CODES:
        return True
    return _NOT_READY_MESSAGE.search(str(error)) is not None


def is_bad_data(error: BaseException) -> bool:
    """Whether the database refused a statement's own values (see the module's doc).

    Examples:
        >>> is_bad_data(ValueError("no"))
        False
    """
    state = sqlstate_of(error)
    return state is not None and state[:2] in _BAD_DATA_CLASSES
