"""Ready-path upkeep: `Vacuumer` / `AsyncVacuumer` vacuum a job or outbox table under load.

Every claim turns the ready index's first live entries into dead ones (the row leaves the
``status = 'pending'`` partial index), and later claims walk those dead entries until a
``VACUUM`` removes them. Autovacuum looks at a database once a minute
(``autovacuum_naptime``); at a few thousand jobs a second that is a few hundred thousand
dead entries, and a claim several times slower before it runs (docs/retention.md,
"Keeping the ready path clean", has the measurements). So a worker keeps its own table
clean: every ``interval`` it reads the table's dead-tuple count (``pg_stat_user_tables``,
one cheap query) and, past ``threshold``, runs ``VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON)``
on it (on each partition past the threshold, for a partitioned table).

However many workers run one, they do not pile up: ``SKIP_LOCKED`` returns at once when
another vacuum (autovacuum included) holds the table. A role that does not own the table
cannot vacuum it; such tables are reported in `VacuumReport.not_owned` and left alone.

Examples:
    vacuumer = Vacuumer(engine, Job, VacuumPolicy(threshold=10_000))
    report = vacuumer.run_once()     # VacuumReport(vacuumed=['public.jobs'], ...)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import statements as st
from .._connect_args import harden
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._pooler import prepare_for_pooler
from .._validation import count, duration
from ..ops import Op, arun, run
from ..schema import resolve_table

if TYPE_CHECKING:
    from sqlalchemy import Engine, Table
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["DEFAULT_VACUUM", "AsyncVacuumer", "VacuumPolicy", "VacuumReport", "Vacuumer"]


@dataclasses.dataclass(frozen=True)
class VacuumPolicy:
    """When a worker vacuums its table: past ``threshold + scale * live tuples`` dead tuples
    (autovacuum's formula), checked every ``interval``.

    A vacuum reads every index of the table whole, so its cost grows with the table; the
    ``scale`` part makes a big table wait for proportionally more dead tuples, which keeps
    vacuuming at a few percent of the work whatever the backlog or history (measured: 0.4 s
    per vacuum of a 1,000,000-row table). The defaults keep the ready index within a few
    hundred pages of dead entries on a small table, and cost one statistics query every two
    seconds while the queue is quiet.

    Examples:
        >>> VacuumPolicy(threshold=5000, interval=1).interval
        datetime.timedelta(seconds=1)
        >>> VacuumPolicy().dead_tuples_allowed(live=1_000_000)
        110000
    """

    threshold: int = 10_000
    interval: dt.timedelta | float = dt.timedelta(seconds=2)
    scale: float = 0.1

    def __post_init__(self) -> None:
        count(self.threshold, "threshold", maximum=2**31 - 1)
        if not isinstance(self.scale, int | float) or isinstance(self.scale, bool):
            raise InvalidArgumentType(f"scale must be a number, got {type(self.scale).__name__}")
        if not 0 <= self.scale <= 100:
            raise InvalidArgument(f"scale must be between 0 and 100, got {self.scale!r}")
        object.__setattr__(self, "interval", duration(self.interval, "interval"))

    def dead_tuples_allowed(self, live: int) -> int:
        """How many dead tuples a table of ``live`` live tuples may hold before a vacuum.

        Examples:
            >>> VacuumPolicy(threshold=100, scale=0.5).dead_tuples_allowed(live=1000)
            600
        """
        return self.threshold + int(self.scale * max(live, 0))

    @property
    def interval_seconds(self) -> float:
        """``interval`` in seconds.

        Examples:
            >>> VacuumPolicy(interval=0.5).interval_seconds
            0.5
        """
        assert isinstance(self.interval, dt.timedelta)
        return self.interval.total_seconds()


#: What a `Worker` or a `Relay` is given unless told otherwise (``vacuum=None`` turns it off).
DEFAULT_VACUUM = VacuumPolicy()


@dataclasses.dataclass
class VacuumReport:
    """What one round did: tables vacuumed, their dead tuples before, tables not owned.

    Examples:
        >>> VacuumReport(vacuumed=["public.jobs"], dead_tuples={"public.jobs": 12000})
        VacuumReport(vacuumed=['public.jobs'], dead_tuples={'public.jobs': 12000}, not_owned=[])
    """

    vacuumed: list[str] = dataclasses.field(default_factory=list)
    dead_tuples: dict[str, int] = dataclasses.field(default_factory=dict)
    not_owned: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    schema: str
    name: str
    dead_tuples: int
    owned: bool

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


E = TypeVar("E", "Engine", "AsyncEngine")


class _Base(Generic[E]):
    """What `Vacuumer` and `AsyncVacuumer` share: the constructor and the round, an operation
    that each drives on an autocommit connection of its engine."""

    def __init__(
        self,
        engine: E,
        target: object,
        policy: VacuumPolicy | None = None,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        policy = VacuumPolicy() if policy is None else policy
        if not isinstance(policy, VacuumPolicy):
            raise InvalidArgumentType(f"policy must be a VacuumPolicy, got {type(policy).__name__}")
        self.table: Table = resolve_table(target)
        self.policy = policy
        self._timer = timer
        self._next_check: float | None = None
        self.engine: E = engine
        harden(engine)  # bounded client-side timeouts (see sa_outbox.connect_args)
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements

    def due(self) -> bool:
        """Whether ``interval`` has passed since the last round (always true at first).

        Examples:
            vacuumer.due() and vacuumer.run_once()
        """
        return self._next_check is None or self._timer() >= self._next_check

    def _round(self) -> Op[VacuumReport]:
        report = VacuumReport()
        rows = (yield st.vacuum_candidates(self.table)).all()
        for candidate in self._plan(rows, report):
            yield st.vacuum_table(candidate.schema, candidate.name)
            self._record(report, candidate)
        return report

    def _plan(self, rows: Sequence[Any], report: VacuumReport) -> list[_Candidate]:
        self._next_check = self._timer() + self.policy.interval_seconds
        plan = []
        for row in rows:
            candidate = _Candidate(row.schema_name, row.table_name, row.dead_tuples, row.owned)
            if candidate.dead_tuples < self.policy.dead_tuples_allowed(row.live_tuples or 0):
                continue
            if not candidate.owned:
                report.not_owned.append(candidate.qualified)
                continue
            plan.append(candidate)
        return plan

    @staticmethod
    def _record(report: VacuumReport, candidate: _Candidate) -> None:
        report.vacuumed.append(candidate.qualified)
        report.dead_tuples[candidate.qualified] = candidate.dead_tuples


class Vacuumer(_Base["Engine"]):
    """Vacuum a job or outbox table (each of its partitions) once it has enough dead tuples.

    ``run_once`` checks now; `due` says whether ``policy.interval`` has passed, for a loop
    that calls it often. Each ``VACUUM`` runs on its own autocommit connection.

    Examples:
        vacuumer = Vacuumer(engine, Job)
        if vacuumer.due():
            report = vacuumer.run_once()
    """

    def run_once(self) -> VacuumReport:
        """Read the dead-tuple counts and vacuum what is past the threshold."""
        return run(self.engine, self._round(), autocommit=True)


class AsyncVacuumer(_Base["AsyncEngine"]):
    """`Vacuumer` for asyncio, on an `AsyncEngine`.

    Examples:
        vacuumer = AsyncVacuumer(async_engine, Job)
        report = await vacuumer.run_once()
    """

    async def run_once(self) -> VacuumReport:
        """See `Vacuumer.run_once`."""
        return await arun(self.engine, self._round(), autocommit=True)
