"""Unique jobs (docs/unique.md): `Unique`, the key a job holds, and the SQL that stores it.

A unique job stores a key and the states in which it holds it (``unique_key``,
``unique_states``); the partial unique index ``{t}_unique_idx`` keeps one job per key among
the jobs whose status is one of their own ``unique_states``, and the enqueue skips a job whose
key is held (``ON CONFLICT DO NOTHING``). The key is the SHA-256 of a canonical JSON of what
the job is unique by (its kind, the payload or some of its fields or an explicit key, its
queue if asked, the states and the period), followed by ``:`` and the number of the time
window when there is a period: the window is computed in SQL from the statement's clock, so
that every producer agrees on it and a `FakeClock` makes it deterministic.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, Numeric, Text, cast, extract, func, literal
from sqlalchemy.sql.elements import ColumnElement

from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import MAX_DEDUPLICATION_KEY_LENGTH, key, text
from ..schema import JobStatus
from ..schema._partition_ddl import partition_interval_of

__all__ = [
    "DEFAULT_UNIQUE_STATES",
    "Unique",
    "has_unique_columns",
    "unique_key_sql",
    "unique_parts",
]

#: The states a unique job holds its key in unless told otherwise: while it waits, runs, and
#: after it succeeded (until it is pruned); a failed or cancelled job frees its key.
DEFAULT_UNIQUE_STATES: tuple[JobStatus, ...] = (
    JobStatus.PENDING,
    JobStatus.RUNNING,
    JobStatus.SUCCEEDED,
)
_REQUIRED = (JobStatus.PENDING, JobStatus.RUNNING)
#: The longest period: a window number then still fits the key comfortably.
MAX_UNIQUE_PERIOD = dt.timedelta(days=366 * 100)
_MICROSECOND = dt.timedelta(microseconds=1)


def _fields(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable) or isinstance(value, bytes | dict):
        raise InvalidArgumentType(
            "Unique(fields=) must be a field name or a sequence of them, "
            f"got {type(value).__name__}"
        )
    names = tuple(text(item, "each of Unique(fields=)") for item in value)
    if not names:
        raise InvalidArgument(
            "Unique(fields=) must name at least one payload field (or leave it out: "
            "unique by the whole payload)"
        )
    if len(set(names)) != len(names):
        raise InvalidArgument(f"Unique(fields=) names a field twice: {list(names)}")
    return tuple(sorted(names))


def _period(value: object) -> dt.timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, dt.timedelta | int | float):
        raise InvalidArgumentType(
            "Unique(period=) must be a timedelta or a number of seconds, "
            f"got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"Unique(period=) must be a finite number of seconds, got {value}")
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds > MAX_UNIQUE_PERIOD.total_seconds():
        raise InvalidArgument(
            f"Unique(period=) must be at most {MAX_UNIQUE_PERIOD.days} days, got {seconds:g} s"
        )
    period = value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=value)
    if period < _MICROSECOND:
        raise InvalidArgument(
            f"Unique(period=) must be more than zero (a window's length), got {seconds:g} s"
        )
    return period


def _states(value: object) -> tuple[JobStatus, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgumentType(
            f"Unique(states=) must be a sequence of job states, got {type(value).__name__}"
        )
    found: set[JobStatus] = set()
    for item in value:
        try:
            found.add(JobStatus(item))
        except ValueError:
            known = ", ".join(s.value for s in JobStatus)
            raise InvalidArgument(
                f"Unique(states=) holds {item!r}, which is not a job state ({known})"
            ) from None
    missing = [s.value for s in _REQUIRED if s not in found]
    if missing:
        raise InvalidArgument(
            f"Unique(states=) must include pending and running (missing: {', '.join(missing)}): "
            "retries, snoozes and reclaims move a job between them, and it must never "
            "collide with itself"
        )
    return tuple(s for s in JobStatus if s in found)  # in the enum's order: one spelling


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Unique:
    """What makes a job unique, given to ``enqueue(..., unique=Unique(...))`` (docs/unique.md).

    The job is skipped (``inserted=False``) while another job of the same kind, with the
    same key, is in one of ``states``. The key is made of the kind and one of:

    - the whole payload (the default), or ``fields``: some of its top-level fields (the
      payload must then be a JSON object that has each of them);
    - ``key``: a string of your own (the payload then plays no part).

    ``by_queue=True`` adds the queue to the key. ``period`` (a timedelta or seconds) adds a
    time window: the key is held only within fixed windows of that length (counted from the
    Unix epoch, on the statement's clock), so the same job is accepted again in the next
    window. ``states`` must include ``pending`` and ``running`` (a retried, snoozed or
    reclaimed job moves between them, and must not collide with itself); by default they are
    ``pending``, ``running`` and ``succeeded``: a ``failed`` or ``cancelled`` job does not
    block a new one. Bad values raise `InvalidArgument` (or `InvalidArgumentType`) here.

    Examples:
        >>> Unique(fields=["customer_id"], period=3600).period
        datetime.timedelta(seconds=3600)
        >>> [s.value for s in Unique().states]
        ['pending', 'running', 'succeeded']
        >>> Unique(states=["pending"])
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: Unique(states=) must include pending and \
running (missing: running): retries, snoozes and reclaims move a job between them, and it \
must never collide with itself
    """

    #: Top-level payload fields the key is made of (sorted); ``None``: the whole payload.
    fields: tuple[str, ...] | None
    #: An explicit key, instead of the payload.
    key: str | None
    #: Whether the queue is part of the key.
    by_queue: bool
    #: The length of the time windows the key is held in; ``None``: no window.
    period: dt.timedelta | None
    #: The states in which a job holds its key (in the enum's order).
    states: tuple[JobStatus, ...]

    def __init__(
        self,
        *,
        fields: Iterable[str] | str | None = None,
        key: str | None = None,
        by_queue: bool = False,
        period: dt.timedelta | float | None = None,
        states: Iterable[JobStatus | str] = DEFAULT_UNIQUE_STATES,
    ) -> None:
        checked_fields = _fields(fields)
        checked_key = None
        if key is not None:
            checked_key = _key(key)
            if checked_fields is not None:
                raise InvalidArgument(
                    "Unique takes fields= or key=, not both: the key is made of the payload's "
                    "fields or of your own key"
                )
        if not isinstance(by_queue, bool):
            raise InvalidArgumentType(
                f"Unique(by_queue=) must be True or False, got {type(by_queue).__name__}"
            )
        object.__setattr__(self, "fields", checked_fields)
        object.__setattr__(self, "key", checked_key)
        object.__setattr__(self, "by_queue", by_queue)
        object.__setattr__(self, "period", _period(period))
        object.__setattr__(self, "states", _states(states))

    @property
    def states_literal(self) -> str:
        """``states`` as a PostgreSQL array literal (``{pending,running,succeeded}``).

        Examples:
            >>> Unique(states=("running", "pending")).states_literal
            '{pending,running}'
        """
        return "{" + ",".join(s.value for s in self.states) + "}"

    @property
    def period_microseconds(self) -> int | None:
        """The period in whole microseconds (``None``: no period).

        Examples:
            >>> Unique(period=1.5).period_microseconds
            1500000
        """
        return None if self.period is None else self.period // _MICROSECOND


def _key(value: object) -> str:
    return key(value, "Unique(key=)", MAX_DEDUPLICATION_KEY_LENGTH)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def unique_parts(
    unique: object, kind: str, queue: str, payload: str, what: str
) -> tuple[str, int | None, str]:
    """A checked job's unique values: the digest, the period in microseconds (or ``None``)
    and the states as an array literal; ``payload`` is the job's serialised payload.

    The digest is the SHA-256 (hex) of a canonical JSON (keys sorted, no spaces) of the
    kind, the payload (whole, or its ``fields``) or the explicit key, the queue when
    ``by_queue``, the states, and the period: two jobs that agree on all of these share
    it, whatever the order of their payload's keys.

    Examples:
        >>> digest, period, states = unique_parts(Unique(fields="to"), "send-email", "default",
        ...                                      '{"to":"ana","body":"hi"}', "job")
        >>> digest == unique_parts(Unique(fields="to"), "send-email", "default",
        ...                        '{"body":"bye","to":"ana"}', "job")[0]
        True
        >>> period, states
        (None, '{pending,running,succeeded}')
    """
    if not isinstance(unique, Unique):
        raise InvalidArgumentType(
            f"unique must be a Unique(...) (sa_outbox.Unique), got {type(unique).__name__}"
        )
    made_of: dict[str, Any] = {"kind": kind, "states": [s.value for s in unique.states]}
    if unique.key is not None:
        made_of["key"] = unique.key
    else:
        value = json.loads(payload)
        if unique.fields is not None:
            if not isinstance(value, dict):
                raise InvalidArgument(
                    f"{what}: Unique(fields=) needs a payload that is a JSON object, "
                    f"got {type(value).__name__}"
                )
            absent = [name for name in unique.fields if name not in value]
            if absent:
                raise InvalidArgument(
                    f"{what}: the payload has no field {absent[0]!r}, which Unique(fields=) names"
                )
            value = {name: value[name] for name in unique.fields}
        made_of["args"] = value
    if unique.by_queue:
        made_of["queue"] = queue
    period = unique.period_microseconds
    if period is not None:
        made_of["period_us"] = period
    digest = hashlib.sha256(_canonical(made_of).encode()).hexdigest()
    return digest, period, unique.states_literal


def unique_key_sql(
    digest: ColumnElement[Any], period: ColumnElement[Any], now: ColumnElement[dt.datetime]
) -> ColumnElement[str]:
    """The stored key: ``digest``, then ``:`` and the window number of ``now`` when
    ``period`` (microseconds) is not NULL; NULL when ``digest`` is (a job that is not
    unique).

    Examples:
        >>> from sqlalchemy import column, func
        >>> sql = str(unique_key_sql(column("d"), column("p"), func.now()))
        >>> sql.startswith("CAST(d AS TEXT) || coalesce(") and "EXTRACT(epoch FROM now())" in sql
        True
    """
    window = cast(
        cast(
            func.floor(extract("epoch", now) * literal(1_000_000) / cast(period, Numeric())),
            BigInteger(),
        ),
        Text(),
    )
    return cast(digest, Text()).concat(
        func.coalesce(literal(":", Text()).concat(window), literal("", Text()))
    )


def has_unique_columns(table: Any) -> bool:
    """Whether a job table has the ``unique_key`` and ``unique_states`` columns (a table made
    before they were added, and not migrated yet, has not: docs/upgrading.md).

    Examples:
        >>> from sqlalchemy import Column, MetaData, Table, Text
        >>> has_unique_columns(Table("jobs", MetaData(), Column("kind", Text)))
        False
    """
    return "unique_key" in table.c and "unique_states" in table.c


def refuse_unique_on(table: Any) -> None:
    """Raise if unique jobs cannot go into ``table``: not migrated yet, or partitioned."""
    if not has_unique_columns(table):
        raise InvalidArgument(
            f"job table {table.fullname} has no unique_key and unique_states columns: add "
            "them and the index {t}_unique_idx with a migration (alembic revision "
            "--autogenerate, see docs/upgrading.md)".replace("{t}", table.name)
        )
    if partition_interval_of(table) is not None:
        raise InvalidArgument(
            f"job table {table.fullname} is partitioned (__partition_interval__): a unique "
            "index there would have to include created_at, so unique jobs are refused on it "
            "(docs/unique.md); use a deduplication_key, which works across partitions"
        )
