"""The retry delay: min(base*2^(attempts-1), max) + jitter, in Python and in SQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

from sqlalchemy import Float, Integer, Interval, bindparam, func, literal_column, type_coerce
from sqlalchemy.sql.elements import ColumnElement

from ._validation import duration

#: 2**62 seconds is far past any max; capping the exponent keeps power() from overflowing.
_MAX_EXPONENT = 62


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and additive jitter.

    ``delay(attempts) = min(base * 2 ** (attempts - 1), max) + uniform(0, jitter)``. The
    reclaimer applies the same formula in SQL (`sql_delay`), so a job that kills its worker
    backs off exactly like one that raised.

    Examples:
        >>> b = Backoff(base=1, max=300, jitter=0)
        >>> [b.delay(n).total_seconds() for n in (1, 2, 3, 10, 20)]
        [1.0, 2.0, 4.0, 300.0, 300.0]
    """

    base: dt.timedelta | float = 1.0
    max: dt.timedelta | float = 300.0
    jitter: dt.timedelta | float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", duration(self.base, "backoff base"))
        object.__setattr__(self, "max", duration(self.max, "backoff max"))
        object.__setattr__(self, "jitter", duration(self.jitter, "backoff jitter", allow_zero=True))

    @property
    def _seconds(self) -> tuple[float, float, float]:
        return tuple(  # type: ignore[return-value]
            _as_delta(v).total_seconds() for v in (self.base, self.max, self.jitter)
        )

    def delay(self, attempts: int) -> dt.timedelta:
        """The delay before the next run of a job that has made ``attempts`` attempts."""
        base, cap, jitter = self._seconds
        exponent = min(max(attempts - 1, 0), _MAX_EXPONENT)
        seconds = min(base * 2.0**exponent, cap) + (random.uniform(0, jitter) if jitter else 0.0)
        return dt.timedelta(seconds=seconds)

    def sql_delay(self, attempts: ColumnElement[int]) -> ColumnElement[dt.timedelta]:
        """The same delay as a SQL interval expression over an ``attempts`` column."""
        base, cap, jitter = self._seconds
        exponent = func.least(func.greatest(attempts - 1, 0), _MAX_EXPONENT)
        seconds = func.least(
            bindparam("backoff_base", base, type_=Float) * func.power(2, exponent.cast(Integer)),
            bindparam("backoff_max", cap, type_=Float),
        ) + func.random() * bindparam("backoff_jitter", jitter, type_=Float)
        return type_coerce(seconds * literal_column("interval '1 second'"), Interval())


def _as_delta(value: dt.timedelta | float) -> dt.timedelta:
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=value)
