"""Periodic jobs: `Schedule` (a cron expression or an interval) and the worker's `Scheduler`.

A schedule enqueues one job of its kind per tick. Every worker may run the scheduler: the
job of a tick carries the deduplication key ``periodic:<name>@<tick, UTC, ISO 8601>``, and
the job table's unique index on ``(kind, deduplication_key)`` lets only the first worker's
insert through (``ON CONFLICT DO NOTHING``). No leader, no lock, no table of its own.

Cron expressions need ``cronsim`` (``pip install "sa-outbox[cron]"``); intervals need
nothing. Ticks are computed in UTC from the worker's clock (a `FakeClock` in tests), cron
ticks in the schedule's time zone first.

Examples:
    >>> import datetime as dt
    >>> every = Schedule.build("report", every=dt.timedelta(minutes=5))
    >>> every.next_tick(dt.datetime(2030, 1, 1, 0, 3, tzinfo=dt.UTC)).isoformat()
    '2030-01-01T00:05:00+00:00'
    >>> every.deduplication_key(dt.datetime(2030, 1, 1, 0, 5, tzinfo=dt.UTC))
    'periodic:report@2030-01-01T00:05:00+00:00'
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import zoneinfo
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from sqlalchemy import Connection, select

from .._clock import Clock
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import (
    MAX_DEDUPLICATION_KEY_LENGTH,
    aware_datetime,
    count,
    duration,
)
from .._validation import (
    name as _checked_name,
)
from ..ops import JobOps, Op
from ..statements import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, NewJob, latest_deduplication_key

__all__ = [
    "Missed",
    "Schedule",
    "ScheduleStatus",
    "Scheduler",
    "Tick",
    "periodic_tick",
    "schedule_status",
]

#: What a schedule does with the ticks no worker ran in time (see `Schedule`).
Missed = Literal["skip", "backfill"]

KEY_PREFIX = "periodic:"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_TINY = dt.timedelta(microseconds=1)
#: The longest a worker waits between two looks at its schedules (its clock may jump).
MAX_SCHEDULER_WAIT = 60.0
_MAX_SCHEDULE_NAME = MAX_DEDUPLICATION_KEY_LENGTH - len(KEY_PREFIX) - 40


def _cronsim() -> Any:
    try:
        return importlib.import_module("cronsim")
    except ImportError:
        raise InvalidArgument(
            'a cron schedule needs the cronsim package: pip install "sa-outbox[cron]" '
            "(or give an interval, every=timedelta(...), which needs nothing)"
        ) from None


def _zone(tz: object, schedule: str) -> zoneinfo.ZoneInfo:
    if isinstance(tz, zoneinfo.ZoneInfo):
        return tz
    if tz is dt.UTC:
        return zoneinfo.ZoneInfo("UTC")
    if not isinstance(tz, str):
        raise InvalidArgumentType(
            f"tz of schedule {schedule!r} must be an IANA time zone name (a str such as "
            f"'Europe/Lisbon'), got {type(tz).__name__}"
        )
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(
            f"unknown time zone {tz!r} for schedule {schedule!r}: give an IANA name such as "
            "'Europe/Lisbon' or 'UTC'"
        ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """When a kind's job is enqueued: at the ticks of a ``cron`` expression (in ``tz``) or
    ``every`` interval (counted from the Unix epoch, UTC: ``every=timedelta(hours=1)`` ticks
    on the hour), with this ``queue``, ``payload``, ``priority`` and ``max_attempts``.

    ``missed`` says what becomes of ticks that passed with no worker looking: ``"skip"``
    (the default) never runs a tick from before the worker started, and a worker that fell
    behind (the database away) runs only the latest tick due, once; ``"backfill"`` runs up
    to ``backfill`` of the latest ticks due, those from before the worker started included
    (``backfill=1``: the latest missed tick runs once after downtime).

    Build one with `JobApp.periodic` or `JobApp.schedule`; they call `build`.

    Examples:
        >>> import datetime as dt
        >>> s = Schedule.build("cleanup", every=3600, missed="backfill", backfill=2)
        >>> [t.hour for t in s.last_ticks(dt.datetime(2030, 1, 1, 5, 30, tzinfo=dt.UTC))]
        [4, 5]
    """

    name: str
    kind: str
    cron: str | None
    every: dt.timedelta | None
    tz: str
    queue: str
    payload: Any
    priority: int
    max_attempts: int
    missed: Missed
    backfill: int
    zone: zoneinfo.ZoneInfo = dataclasses.field(repr=False, compare=False)

    @classmethod
    def build(
        cls,
        kind: str,
        cron: str | None = None,
        *,
        every: dt.timedelta | float | None = None,
        name: str | None = None,
        tz: str | zoneinfo.ZoneInfo | None = None,
        queue: str = DEFAULT_QUEUE,
        payload: Any = None,
        priority: int = 0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        missed: Missed = "skip",
        backfill: int | None = None,
    ) -> Schedule:
        """Check every option; an error names the schedule and what was wrong."""
        kind = _checked_name(kind, "job kind of a schedule")
        label = kind if name is None else _checked_name(name, "schedule name")
        if len(label) > _MAX_SCHEDULE_NAME:
            raise InvalidArgument(
                f"schedule name {label[:40]!r}… is over the limit of {_MAX_SCHEDULE_NAME}"
            )
        if (cron is None) == (every is None):
            raise InvalidArgument(
                f"schedule {label!r} needs a cron expression or every=, exactly one of them"
            )
        interval = None
        zone = zoneinfo.ZoneInfo("UTC")
        if every is not None:
            if tz is not None:
                raise InvalidArgument(
                    f"schedule {label!r}: tz= applies to cron expressions; an interval "
                    "(every=) counts from the Unix epoch, in UTC"
                )
            interval = _interval(every, label)
        else:
            if not isinstance(cron, str):
                raise InvalidArgumentType(
                    f"the cron expression of schedule {label!r} must be a str, "
                    f"got {type(cron).__name__}"
                )
            zone = _zone("UTC" if tz is None else tz, label)
            cronsim = _cronsim()
            try:
                cronsim.CronSim(cron, dt.datetime.now(zone))
            except (cronsim.CronSimError, ValueError) as error:
                raise InvalidArgument(
                    f"cron expression {cron!r} of schedule {label!r} is not valid: {error}"
                ) from None
        if missed not in ("skip", "backfill"):
            raise InvalidArgument(
                f"missed of schedule {label!r} must be 'skip' or 'backfill', got {missed!r}"
            )
        if missed == "skip" and backfill is not None:
            raise InvalidArgument(
                f"schedule {label!r}: backfill= needs missed='backfill' (missed is 'skip')"
            )
        depth = 1 if backfill is None else count(backfill, f"backfill of schedule {label!r}")
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as error:
            raise InvalidArgumentType(
                f"the payload of schedule {label!r} is not JSON: {error}"
            ) from None
        return cls(
            name=label,
            kind=kind,
            cron=cron,
            every=interval,
            tz=str(zone.key),
            queue=_checked_name(queue, f"queue of schedule {label!r}"),
            payload={} if payload is None else payload,
            priority=_integer(priority, f"priority of schedule {label!r}"),
            max_attempts=count(max_attempts, f"max_attempts of schedule {label!r}"),
            missed=missed,
            backfill=depth,
            zone=zone,
        )

    def __str__(self) -> str:
        when = f"cron {self.cron!r} ({self.tz})" if self.cron else f"every {self.every}"
        return f"{self.name}: {self.kind} {when}, missed={self.missed}"

    def next_tick(self, after: dt.datetime) -> dt.datetime:
        """The first tick strictly after ``after`` (timezone-aware), in UTC.

        Examples:
            >>> import datetime as dt
            >>> s = Schedule.build("hourly", every=dt.timedelta(hours=1))
            >>> s.next_tick(dt.datetime(2030, 1, 1, 9, tzinfo=dt.UTC)).hour
            10
        """
        after = aware_datetime(after, "after")
        if self.every is not None:
            return _EPOCH + ((after - _EPOCH) // self.every + 1) * self.every
        tick: dt.datetime = next(_cronsim().CronSim(self.cron, after.astimezone(self.zone)))
        return tick.astimezone(dt.UTC)

    def _backwards(self, now: dt.datetime) -> Iterator[dt.datetime]:
        # The ticks at or before ``now``, latest first, in UTC.
        if self.every is not None:
            tick = _EPOCH + ((now - _EPOCH) // self.every) * self.every
            while True:
                yield tick
                tick -= self.every
        start = (now + _TINY).astimezone(self.zone)
        for tick in _cronsim().CronSim(self.cron, start, reverse=True):
            yield tick.astimezone(dt.UTC)

    def last_ticks(
        self, now: dt.datetime, *, since: dt.datetime | None = None, limit: int | None = None
    ) -> list[dt.datetime]:
        """The latest ticks at or before ``now`` and at or after ``since`` (``None``: no
        bound), at most ``limit`` of them (default: ``backfill``), oldest first, in UTC."""
        now = aware_datetime(now, "now")
        limit = self.backfill if limit is None else limit
        ticks: list[dt.datetime] = []
        for tick in self._backwards(now):
            if len(ticks) >= limit or (since is not None and tick < since):
                break
            ticks.append(tick)
        return ticks[::-1]

    def deduplication_key(self, tick: dt.datetime) -> str:
        """The deduplication key of the job of ``tick``: the same for every worker."""
        return f"{KEY_PREFIX}{self.name}@{tick.astimezone(dt.UTC).isoformat()}"

    def job(self, tick: dt.datetime) -> NewJob:
        """The job of ``tick``: due at the tick (``run_at``), deduplicated by it."""
        return NewJob(
            self.kind,
            self.payload,
            queue=self.queue,
            priority=self.priority,
            run_at=tick,
            max_attempts=self.max_attempts,
            deduplication_key=self.deduplication_key(tick),
        )


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"{what} must be an int, got {type(value).__name__}")
    return value


def _interval(every: object, schedule: str) -> dt.timedelta:
    return duration(every, f"every= of schedule {schedule!r}")


def periodic_tick(deduplication_key: str | None) -> dt.datetime | None:
    """The tick a periodic job was enqueued for, from its deduplication key (``None``: not
    a periodic job). In a handler: ``periodic_tick(job.deduplication_key)``.

    Examples:
        >>> periodic_tick("periodic:report@2030-01-01T00:05:00+00:00").minute
        5
        >>> periodic_tick("welcome:ana") is None
        True
    """
    if not deduplication_key or not deduplication_key.startswith(KEY_PREFIX):
        return None
    _, at, when = deduplication_key.rpartition("@")
    if not at:
        return None
    try:
        return dt.datetime.fromisoformat(when)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    """A tick a worker's scheduler enqueued: ``inserted`` is False when another worker (or
    an earlier run) had already enqueued it."""

    schedule: str
    kind: str
    at: dt.datetime
    inserted: bool


class Scheduler:
    """One worker's view of the app's schedules: which ticks are due at ``now``.

    Sans-I/O: `due` says which jobs to enqueue, `done` records that they were (after the
    commit); `run_op` does both around the statements, for either driver.

    Examples:
        >>> import datetime as dt
        >>> start = dt.datetime(2030, 1, 1, 0, 2, tzinfo=dt.UTC)
        >>> scheduler = Scheduler([Schedule.build("report", every=300)])
        >>> scheduler.due(start)  # missed="skip": nothing from before the start
        []
        >>> scheduler.done(start)
        >>> [(s.name, t.minute) for s, t in scheduler.due(start + dt.timedelta(minutes=9))]
        [('report', 10)]
    """

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        self.schedules = tuple(schedules)
        # Per schedule: ticks before this were looked at (absent: not started yet).
        self._since: dict[str, dt.datetime] = {}

    def reset(self) -> None:
        """Forget the ticks looked at: the next `due` is a start (a worker's `run` calls it,
        so a worker run again after `stop` treats the ticks missed meanwhile by ``missed``).

        Examples:
            >>> import datetime as dt
            >>> start = dt.datetime(2030, 1, 1, 0, 2, tzinfo=dt.UTC)
            >>> scheduler = Scheduler([Schedule.build("report", every=300)])
            >>> scheduler.done(start)
            >>> scheduler.reset()
            >>> scheduler.due(start + dt.timedelta(minutes=9))  # 00:10 was before the start
            []
        """
        self._since.clear()

    def due(self, now: dt.datetime) -> list[tuple[Schedule, dt.datetime]]:
        """The ticks to enqueue at ``now``, by the schedules' ``missed`` policies."""
        due: list[tuple[Schedule, dt.datetime]] = []
        for schedule in self.schedules:
            since = self._since.get(schedule.name)
            if since is None and schedule.missed == "skip":
                since = now  # a tick at the very start is on time; earlier ones are missed
            for tick in schedule.last_ticks(now, since=since):
                due.append((schedule, tick))
        return due

    def done(self, now: dt.datetime) -> None:
        """The ticks due at ``now`` were enqueued (committed)."""
        for schedule in self.schedules:
            self._since[schedule.name] = now + _TINY

    def wait(self, now: dt.datetime) -> float:
        """Seconds from ``now`` to the next tick of any schedule (at most a minute)."""
        if not self.schedules:
            return MAX_SCHEDULER_WAIT
        nearest = min(schedule.next_tick(now) for schedule in self.schedules)
        return min(max((nearest - now).total_seconds(), 0.001), MAX_SCHEDULER_WAIT)

    def run_op(self, ops: JobOps, clock: Clock) -> Op[tuple[dt.datetime, list[Tick]]]:
        """Read "now" from ``clock`` (in SQL), enqueue the due ticks' jobs; returns now and
        the ticks. Run it in one transaction, then call `done` with that now."""
        now = (yield select(clock.sql_now())).scalar_one()
        due = self.due(now)
        if not due:
            return now, []
        # A tick belongs to no request: whatever span may be current, it is not the job's.
        results = yield from ops.enqueue_many(
            [schedule.job(tick) for schedule, tick in due], trace=False
        )
        ticks = [
            Tick(schedule.name, schedule.kind, tick, result.inserted)
            for (schedule, tick), result in zip(due, results, strict=True)
        ]
        return now, ticks


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """A schedule as ``sa-outbox status --app`` shows it: what it enqueues and when, its
    next tick after ``now``, and the latest tick whose job is in the table (``None``: none
    is, never enqueued or pruned since).

    Examples:
        >>> t = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
        >>> ScheduleStatus("report", "report", "every 1:00:00", "default", t, None).name
        'report'
    """

    name: str
    kind: str
    when: str
    queue: str
    next_tick: dt.datetime
    last_enqueued: dt.datetime | None


def _when(schedule: Schedule) -> str:
    return f"cron {schedule.cron} ({schedule.tz})" if schedule.cron else f"every {schedule.every}"


def schedule_status(
    conn: Connection, schedules: Sequence[Schedule], jobs: object, *, now: dt.datetime
) -> list[ScheduleStatus]:
    """Each schedule's next tick after ``now`` and the latest tick enqueued in ``jobs``
    (read from the periodic jobs' deduplication keys), on a sync `Connection`.

    Examples:
        with engine.connect() as conn:
            for s in schedule_status(conn, app.schedules, Job, now=now):
                print(s.name, s.next_tick, s.last_enqueued)
    """
    now = aware_datetime(now, "now")
    found = []
    for schedule in schedules:
        prefix = f"{KEY_PREFIX}{schedule.name}@"
        key = conn.execute(latest_deduplication_key(jobs, schedule.kind, prefix)).scalar()
        found.append(
            ScheduleStatus(
                schedule.name,
                schedule.kind,
                _when(schedule),
                schedule.queue,
                schedule.next_tick(now),
                periodic_tick(key),
            )
        )
    return found
