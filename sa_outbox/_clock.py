"""Where statements take "now" from.

Every statement of the query builder asks a clock for the SQL expression that stands for
"now". The default, `DatabaseClock`, renders PostgreSQL's ``now()``: one source of truth for
all workers, whatever their machines' clocks say. `FakeClock` renders a bind parameter holding
a time the test controls, so lease and retry scenarios run deterministically without sleeping
(freezegun and friends patch Python's clock, never the server's).
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

from sqlalchemy import DateTime, func, literal
from sqlalchemy.sql.elements import ColumnElement

from ._exceptions import InvalidArgument, InvalidArgumentType


@runtime_checkable
class Clock(Protocol):
    """Anything that can render "now" as a SQL expression.

    Examples:
        >>> isinstance(DatabaseClock(), Clock)
        True
    """

    def sql_now(self) -> ColumnElement[dt.datetime]:
        """Return the SQL expression a statement uses for the current time."""
        ...


class DatabaseClock:
    """The database server's transaction time, ``now()``; the default everywhere.

    Examples:
        >>> str(DatabaseClock().sql_now())
        'now()'
    """

    def sql_now(self) -> ColumnElement[dt.datetime]:
        return func.now()

    def __repr__(self) -> str:
        return "DatabaseClock()"


class FakeClock:
    """A clock that only moves when told to; its time reaches SQL as a bind parameter.

    Examples:
        >>> import datetime as dt
        >>> clock = FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
        >>> clock.advance(dt.timedelta(seconds=31))
        >>> clock.now().isoformat()
        '2030-01-01T00:00:31+00:00'
    """

    def __init__(self, start: dt.datetime | None = None) -> None:
        if start is None:
            start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        self._now = _aware(start)

    def now(self) -> dt.datetime:
        """The current fake time."""
        return self._now

    def set(self, when: dt.datetime) -> None:
        """Jump to ``when`` (timezone-aware)."""
        self._now = _aware(when)

    def advance(self, delta: dt.timedelta | float) -> None:
        """Move forward by ``delta`` (a timedelta or seconds); never backwards."""
        step = delta if isinstance(delta, dt.timedelta) else dt.timedelta(seconds=delta)
        if step < dt.timedelta(0):
            raise InvalidArgument(f"a FakeClock only moves forward, got {step}")
        self._now += step

    def sql_now(self) -> ColumnElement[dt.datetime]:
        return literal(self._now, DateTime(timezone=True))

    def __repr__(self) -> str:
        return f"FakeClock({self._now.isoformat()})"


def _aware(when: dt.datetime) -> dt.datetime:
    if not isinstance(when, dt.datetime):
        raise InvalidArgumentType(f"a clock time must be a datetime, got {type(when).__name__}")
    if when.tzinfo is None:
        raise InvalidArgument(f"a clock time must be timezone-aware, got naive {when}")
    return when


DATABASE_CLOCK = DatabaseClock()
