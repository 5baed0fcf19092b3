"""What `Worker` (threads) and `AsyncWorker` (asyncio) share, written once.

`DriverBase` takes the options (one signature, checked once by `make_settings`), builds the
`Core`, and holds the decisions that need no I/O: what the loop does next (`Step`), when the
keeper's chores are due (`KeeperPlan`), how a stop request moves the deadlines, what is
logged. Each driver adds only its way of waiting, locking and running I/O: the sync one
calls these under its lock, the async one from its event loop.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, Literal, TypeVar

from sqlalchemy import URL

from .._clock import DATABASE_CLOCK, Clock
from .._connect_args import check_listen_url, harden, unprotected
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._pooler import note_prepared_statement_error, prepare_for_pooler
from .._sqlstate import is_configuration_error
from ..maintenance._retention import PruneReport, Retention
from ..maintenance._vacuum import DEFAULT_VACUUM, VacuumPolicy, VacuumReport
from ..ops import JobOps
from ..schema import resolve_table
from ..statements import DEFAULT_LEASE, DEFAULT_MAX_PAYLOAD_BYTES
from ._core import Core, Entry, Result
from ._retry import first_line
from ._settings import Settings, jittered, log, make_settings, seconds
from .errors import DatabaseUnreachable
from .metrics import WorkerMetrics
from .registry import JobApp
from .schedule import Scheduler, Tick

E = TypeVar("E")

#: ``kinds=ALL_KINDS``: claim jobs of every kind, and fail those with no handler at once
#: (by default a worker claims only the kinds it has handlers for).
ALL_KINDS: Any = "*"
#: How long `run` waits for a first connection before it gives up (a wrong host or port).
DEFAULT_STARTUP_TIMEOUT = 10.0

#: How many job ids a log line names.
SHOWN_IDS = 10
#: Once the grace period is over, how long the final write (the releases of the jobs still
#: running) may wait on the database before its connection is broken.
FINAL_WRITE_TIMEOUT = 3.0

#: The keeper's chores, in the order it runs those that are due.
Chore = Literal["heartbeat", "reclaim", "vacuum", "prune", "schedule"]


@dataclasses.dataclass(slots=True)
class Step:
    """What the loop does next: stop, wait (``idle``, up to ``wait`` seconds; ``None``: until
    woken), or write ``results`` and claim ``claim`` jobs. ``cancel``: jobs whose handlers
    the async driver cancels (expired, or abandoned at the end of the grace period).

    Examples:
        >>> Step(stop=True).claim
        0
    """

    stop: bool = False
    idle: bool = False
    wait: float | None = None
    results: list[Result] = dataclasses.field(default_factory=list)
    claim: int = 0
    cancel: list[Entry] = dataclasses.field(default_factory=list)


class Interrupted(BaseException):
    """Raised by a driver's signal handler to break out of a statement that hangs (a network
    that dropped the connection without a word): a second SIGTERM, or any during start-up.

    A BaseException, as KeyboardInterrupt is: no ``except Exception`` on the way swallows
    it, tenacity does not retry it, and SQLAlchemy invalidates the connection it broke.

    Examples:
        >>> issubclass(Interrupted, Exception)
        False
    """


class KeeperPlan:
    """When the keeper's heartbeat and reclaim are due next (vacuum and prune keep their own
    schedules: `Vacuumer.due`, `DriverBase.prune_due`).

    A failed heartbeat is tried again within a second; the reclaimer runs every
    ``reclaim_interval`` ± 20 %, the first time after a quarter of it.

    Examples:
        >>> from types import SimpleNamespace
        >>> settings = SimpleNamespace(heartbeat_interval=10.0, reclaim_interval=None)
        >>> plan = KeeperPlan(settings, now=0.0)
        >>> plan.due(5.0, vacuum=False, prune=False)
        []
        >>> plan.due(plan.next_beat, vacuum=False, prune=True)
        ['heartbeat', 'prune']
    """

    def __init__(self, settings: Settings, *, now: float) -> None:
        self.settings = settings
        self.next_beat = now + settings.heartbeat_interval
        self.next_reclaim = now + (settings.reclaim_interval or 0.0) / 4

    def due(self, now: float, *, vacuum: bool, prune: bool, schedule: bool = False) -> list[Chore]:
        """The chores to run now, in order; ``vacuum``, ``prune`` and ``schedule`` (periodic
        jobs) say whether those are due by their own schedules."""
        chores: list[Chore] = []
        if now >= self.next_beat:
            chores.append("heartbeat")
        if self.settings.reclaim_interval is not None and now >= self.next_reclaim:
            chores.append("reclaim")
        if vacuum:
            chores.append("vacuum")
        if prune:
            chores.append("prune")
        if schedule:
            chores.append("schedule")
        return chores

    def done(self, chore: Chore, now: float, *, ok: bool) -> None:
        """Schedule ``chore`` again after it ran (``ok``) or failed, at ``now``."""
        interval = self.settings.heartbeat_interval
        if chore == "heartbeat":
            self.next_beat = now + (interval if ok else min(interval, 1.0))
        elif chore == "reclaim" and self.settings.reclaim_interval is not None:
            self.next_reclaim = now + jittered(self.settings.reclaim_interval)

    def wake_at(self) -> float:
        """The next time a heartbeat or reclaim is due."""
        if self.settings.reclaim_interval is None:
            return self.next_beat
        return min(self.next_beat, self.next_reclaim)


def _every_kind(kinds: object) -> bool:
    # ALL_KINDS, or the CLI's ``--kinds '*'`` (a list of one name).
    return kinds == ALL_KINDS or (isinstance(kinds, list | tuple) and list(kinds) == [ALL_KINDS])


class DriverBase(abc.ABC, Generic[E]):
    """The options, state and decisions of a worker, for its sync and async drivers."""

    #: The driver's name in messages ("Worker", "AsyncWorker").
    name: ClassVar[str]
    # The driver's own parts (see ``_runtime``): a threading.Event or an asyncio.Event…
    _hard_stop: Any
    _gate: Any
    _held: Any
    _runner: Any
    _keeper: Any
    listening: Any

    def __init__(
        self,
        app: JobApp,
        engine: E,
        *,
        queues: str | Sequence[str] | None = None,
        kinds: str | Sequence[str] | None = None,
        concurrency: int = 10,
        batch: int | None = None,
        prefetch: int | None = None,
        lease: dt.timedelta | float = DEFAULT_LEASE,
        heartbeat_interval: dt.timedelta | float | None = None,
        poll_interval: dt.timedelta | float = 1.0,
        listen: bool = True,
        ack_delay: dt.timedelta | float = 0.005,
        ack_batch: int | None = None,
        grace: dt.timedelta | float = 10.0,
        reclaim: bool = True,
        reclaim_interval: dt.timedelta | float | None = None,
        retention: Retention | None = None,
        vacuum: VacuumPolicy | None = DEFAULT_VACUUM,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
        clock: Clock | None = None,
        timer: Callable[[], float] = time.monotonic,
        install_signal_handlers: bool = True,
        max_error_chars: int = 4000,
        startup_timeout: dt.timedelta | float = DEFAULT_STARTUP_TIMEOUT,
        listen_url: str | URL | None = None,
        schedules: bool = True,
        pauses: object | None = None,
    ) -> None:
        if not isinstance(app, JobApp):
            raise InvalidArgumentType(f"{self.name} needs a JobApp, got {type(app).__name__}")
        self._check(app, engine)
        # Bounded client-side timeouts on the engine's connections, whatever it was made with.
        harden(engine)
        self.app = app
        self.engine = engine
        prepare_for_pooler(engine)  # behind PgBouncer: no prepared statements
        #: Where the LISTEN connection goes (``None``: the engine's URL), see `listen_url`.
        self.listen_url = check_listen_url(listen_url)
        self._hold = False
        self._stopping_logged = False  # the stop request's line, said once per run
        self.settings = make_settings(
            worker_id=worker_id,
            queues=queues,
            kinds=None if _every_kind(kinds) else kinds,
            concurrency=concurrency,
            batch=batch,
            prefetch=prefetch,
            lease=lease,
            heartbeat_interval=heartbeat_interval,
            poll_interval=poll_interval,
            listen=listen,
            ack_delay=ack_delay,
            ack_batch=ack_batch,
            grace=grace,
            reclaim=reclaim,
            reclaim_interval=reclaim_interval,
            max_error_chars=max_error_chars,
        )
        if kinds is None:
            # By default a worker claims only the kinds it has handlers for: in a rolling
            # deploy, an old worker leaves a new kind's jobs pending for the new workers.
            if not app.kinds:
                raise InvalidArgument(
                    f"{self.name}: the JobApp has no handlers; register one with "
                    "@app.handler(kind) first, or name kinds=ALL_KINDS to fail every job"
                )
            self.settings = dataclasses.replace(self.settings, kinds=tuple(sorted(app.kinds)))
        ops = JobOps(
            app.model,
            clock=clock,
            backoff=app.backoff,
            dumps=None,
            max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
        )
        self.timer = timer
        self.core = Core(app, ops, self.settings, metrics, timer)
        if pauses is not None:
            # The claim itself skips the paused queues (see QueueControl), whatever the worker
            # last heard: a pause needs no message to reach every worker.
            self.core.skip_paused(resolve_table(pauses))
        self.install_signal_handlers = install_signal_handlers
        self._stop_requested = False
        self._give_up_at: float | None = None
        self._grace_over: float | None = None
        self._running = False
        #: Whether the thread that runs `run` waits on the database now, and whether it has
        #: connected yet: a signal then may interrupt the wait.
        self._in_database = False
        self._connected = False
        self._startup_timeout = seconds(startup_timeout, "startup_timeout", allow_zero=True)
        # What the loop and the keeper wait on, since when (time.monotonic()), for the log
        # and the grace period's watch.
        self._db_since: float | None = None
        self._db_operation = ""
        self._chore_since: float | None = None
        self._chore = ""
        self._setup(clock=clock, metrics=metrics, retention=retention, vacuum=vacuum)
        self._next_prune = None if retention is None else timer() + self._prune_wait(retention)
        if not isinstance(schedules, bool):
            raise InvalidArgumentType(f"schedules must be a bool, got {type(schedules).__name__}")
        #: Enqueues the app's periodic jobs (``None``: it has none, or ``schedules=False``).
        self.scheduler = Scheduler(app.schedules) if schedules and app.schedules else None
        self._not_owned_warned: set[str] = set()  # tables the worker said it cannot vacuum
        self._schedule_ops = ops
        self._clock = clock or DATABASE_CLOCK
        self._next_schedule = None if self.scheduler is None else timer()

    @abc.abstractmethod
    def _check(self, app: JobApp, engine: E) -> None:
        """Refuse an engine (or handlers) this driver cannot run."""

    @abc.abstractmethod
    def _setup(
        self,
        *,
        clock: Clock | None,
        metrics: WorkerMetrics | None,
        retention: Retention | None,
        vacuum: VacuumPolicy | None,
    ) -> None:
        """Build the driver's own parts: held connection, reclaimer, pruner, vacuumer…"""

    @property
    def worker_id(self) -> str:
        """The id this worker claims under (``worker_id`` of its rows)."""
        return self.settings.worker_id

    def __repr__(self) -> str:
        return f"{self.name}({self.app!r}, worker_id={self.worker_id!r})"

    def _startup_error(self, error: BaseException) -> DatabaseUnreachable:
        url = getattr(self.engine, "url", None)
        where = url.render_as_string(hide_password=True) if url is not None else "the database"
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if is_configuration_error(error):
            return DatabaseUnreachable(f"{self.name} cannot use {where}: {reason}")
        return DatabaseUnreachable(
            f"{self.name} could not connect to {where} within {self._startup_timeout:g} s "
            f"(startup_timeout): {reason}"
        )

    def _log_start(self) -> None:
        s = self.settings
        log.info(
            "%s %s: queues %s, kinds %s, concurrency %d, batch %d, lease %g s, %s",
            self.name,
            s.worker_id,
            list(s.queues) if s.queues else "all",
            list(s.kinds) if s.kinds else "all",
            s.concurrency,
            s.batch,
            s.lease,
            "listening for notifications" if s.listen else f"polling every {s.poll_interval:g} s",
        )

    # -- the loop's decisions ------------------------------------------------------------

    def _decide(self, now: float) -> Step:
        """What the loop does next, at ``now`` (under the sync driver's lock)."""
        core = self.core
        if self._stop_requested and not core.stopping:
            core.begin_shutdown()
            self._grace_over = now + self.settings.grace
            self._log_stopping()  # unless the stop request's watch said it already
        grace_over = self._grace_over
        if core.stopping:
            assert grace_over is not None
            if self._hard_stop.is_set() or now >= grace_over:
                return Step(stop=True, cancel=core.abandon_running())
            if core.busy == 0 and not core.results:
                return Step(stop=True)
        expired = core.expire(now)
        core.expire_leases(now)
        claim = core.claim_size(now)
        if not claim and not core.should_write(now, claim):
            wait = core.next_wakeup(now)
            if grace_over is not None:
                wait = min(wait if wait is not None else grace_over, grace_over - now)
            return Step(idle=True, wait=wait, cancel=expired)
        return Step(results=core.take_results(), claim=claim, cancel=expired)

    def _running_jobs(self) -> str:
        """``N running jobs (ids …)`` for the log (the first ten ids)."""
        ids = [str(e.job.id) for e in self.core.in_flight.values() if e.running]
        shown = ", ".join(ids[:SHOWN_IDS]) + (", …" if len(ids) > SHOWN_IDS else "")
        return f"{len(ids)} running jobs" + (f" ({shown})" if ids else "")

    def _log_stopping(self, stuck: Sequence[str] = ()) -> None:
        """Say once, at the stop request, what the worker waits for: its running jobs, and
        a statement its loop or keeper waits on (``stuck``)."""
        if self._stopping_logged:
            return
        self._stopping_logged = True
        log.info(
            "%s %s: stopping; waiting up to %g s (grace) for %s%s",
            self.name,
            self.worker_id,
            self.settings.grace,
            self._running_jobs(),
            "".join(f"; {what}" for what in stuck),
        )

    def _log_abandoned(self) -> None:
        """Say at the end what was left behind: the jobs whose write never reached the
        database keep their lease, which expires, and the reclaimer returns them."""
        core = self.core
        ids = [str(i) for i in core.dropped_ids] + [str(e.job.id) for e in core.in_flight.values()]
        core.dropped_ids.clear()
        if not ids:
            return
        shown = ", ".join(ids[:SHOWN_IDS]) + (", …" if len(ids) > SHOWN_IDS else "")
        log.warning(
            "%s %s: left %d jobs held (%s): nothing is lost, their lease (%g s) expires and "
            "the reclaimer returns them to pending",
            self.name,
            self.worker_id,
            len(ids),
            shown,
            self.settings.lease,
        )

    def _results_to_release(self) -> tuple[list[Result], list[Entry]]:
        """``run`` is failing: the releases of the jobs claimed but not started (no attempt
        counted) and of those running (returned too, to cancel), with what had finished;
        their write is retried for a few seconds only."""
        core = self.core
        if not core.stopping:
            core.begin_shutdown()
        abandoned = core.abandon_running()
        self._stop_requested = True
        self._give_up_at = self.timer() + 5.0
        return core.take_results(), abandoned

    def _may_give_up(self, exc: BaseException) -> bool:
        """Whether a write that failed with ``exc`` is abandoned (only once stopping)."""
        if not self._stop_retrying():
            return False
        log.error(
            "%s %s: giving up writing while stopping (%s: %s)",
            self.name,
            self.worker_id,
            type(exc).__name__,
            exc,
        )
        return True

    def _stop_retrying(self) -> bool:
        # While running, a database that went away is waited for; once stopping, only
        # until the grace period (and as long again for the final write) is over.
        return self._give_up_at is not None and self.timer() >= self._give_up_at

    def _report_error(self, operation: str, error: BaseException) -> None:
        note_prepared_statement_error(self.engine, error)  # retried without prepares
        self.core.hook("database_error", operation, error)

    def _interrupt_on_signal(self) -> bool:
        """After a stop request from a signal: whether to break out of the database wait
        the signal interrupted (start-up, or a second signal while a statement hangs)."""
        return self._in_database and (not self._connected or self._hard_stop.is_set())

    def _warn_without_keepalives(self, pool_connection: Any) -> None:
        # `harden` gave the engine's connections client-side timeouts; a driver it does not
        # know leaves a dropped network holding a statement for as long as the operating
        # system's TCP settings allow (minutes).
        missing = unprotected(pool_connection)
        if missing:
            log.warning(
                "%s %s: the engine's connections have no %s: a dropped network can stall "
                "heartbeats and writes for minutes; use the psycopg driver "
                "(postgresql+psycopg://), whose connections the worker bounds itself, or set "
                "the driver's own timeouts (docs/worker.md)",
                self.name,
                self.worker_id,
                ", ".join(missing),
            )

    def _warn_deaf(self) -> None:
        # The listener's test notification never came: LISTEN through a transaction pooler.
        log.warning(
            "%s %s: notifications do not reach its LISTEN connection, which goes through a "
            "connection pooler (PgBouncer in transaction mode?): jobs start only when it polls, "
            "every %g s. Give it a direct connection to PostgreSQL for LISTEN: listen_url= "
            "(sa-outbox worker --listen-url, $SA_OUTBOX_LISTEN_URL; docs/pgbouncer.md)",
            self.name,
            self.worker_id,
            self.settings.poll_interval,
        )

    def _notified(self, payload: str) -> None:
        with self._gate:
            if self.core.on_notify(payload):
                self._gate.notify_all()

    def _listening(self) -> None:
        with self._gate:
            self.core.wake()  # what was sent while nobody listened is lost: claim now
            self._gate.notify_all()

    def _listener_callbacks(self) -> dict[str, Any]:
        """What the LISTEN connection calls back (`Listener`'s keyword arguments)."""
        return {
            "on_notify": self._notified,
            "on_connect": self._listening,
            "listening": self.listening,
            "on_deaf": self._warn_deaf,
        }

    def _log_broken(self, waited: float, where: str, done: str) -> None:
        """The grace period is over and a statement the loop waited on was broken."""
        log.warning(
            "%s %s: grace period over; its loop still waited on a statement (%s, %.1f s) on %s: %s",
            self.name,
            self.worker_id,
            self._db_operation,
            waited,
            where,
            done,
        )

    def _request_stop(self, now: bool) -> None:
        """Move the deadlines for a stop request (the drivers then wake their loop)."""
        if self._stop_requested or now:
            self._hard_stop.set()
            self._give_up_at = self.timer()
        elif self._give_up_at is None:
            self._give_up_at = self.timer() + self.settings.grace + max(self.settings.grace, 5)
        self._stop_requested = True

    # -- the keeper's chores -------------------------------------------------------------

    def _chore_failed(self, chore: Chore, exc: Exception) -> None:
        self._report_error(chore, exc)
        log.warning("%s failed (%s: %s)", chore, type(exc).__name__, first_line(exc))

    def _keeper_wait(self, plan: KeeperPlan, vacuum_interval: float | None) -> float:
        due = plan.wake_at()
        if self._next_prune is not None:
            due = min(due, self._next_prune)
        if self._next_schedule is not None:
            due = min(due, self._next_schedule)
        if vacuum_interval is not None:
            due = min(due, self.timer() + vacuum_interval)
        return max(0.0, due - self.timer())

    def _start_run(self) -> None:
        """`run` starts (again, after a `stop`): no shutdown under way, and the scheduler
        starts afresh, as a new worker's would (a stopped worker's ticks are missed ones)."""
        self.core.stopping = False
        self._stopping_logged = False
        if self.scheduler is not None:
            self.scheduler.reset()
            self._next_schedule = self.timer()

    def _schedule_is_due(self) -> bool:
        """Whether the scheduler's next look is due; if so, a retry is set for a second
        later, which `_scheduled` moves to the next tick once the look succeeded."""
        if self._next_schedule is None or self.timer() < self._next_schedule:
            return False
        self._next_schedule = self.timer() + 1.0
        return True

    def _scheduled(self, now: dt.datetime, ticks: list[Tick]) -> list[Tick]:
        """The ticks due at ``now`` were committed: the next look is at the next tick."""
        assert self.scheduler is not None
        self.scheduler.done(now)
        self._next_schedule = self.timer() + self.scheduler.wait(now)
        for tick in ticks:
            if tick.inserted:
                log.info("enqueued %s for the tick %s of %s", tick.kind, tick.at, tick.schedule)
        return ticks

    @staticmethod
    def _prune_wait(retention: Retention) -> float:
        interval = retention.interval
        assert isinstance(interval, dt.timedelta)
        return jittered(interval.total_seconds())

    def _prune_is_due(self, retention: Retention | None) -> bool:
        """Whether pruning is due now; if so, the next time is scheduled."""
        if retention is None or self._next_prune is None or self.timer() < self._next_prune:
            return False
        self._next_prune = self.timer() + self._prune_wait(retention)
        return True

    @staticmethod
    def _log_pruned(report: PruneReport) -> None:
        if report.deleted or report.skipped:
            log.info(
                "pruned %d succeeded, %d failed and %d cancelled jobs in %d batches%s",
                report.succeeded,
                report.failed,
                report.cancelled,
                report.batches,
                " (another pruner held the lock)" if report.skipped else "",
            )

    def _log_vacuumed(self, report: VacuumReport) -> None:
        for table in report.vacuumed:
            log.info("vacuumed %s (%d dead tuples)", table, report.dead_tuples[table])
        # Once per table: a role that does not own it cannot vacuum it, and the ready path
        # is then left to autovacuum (docs/vacuum.md says what to do).
        for table in report.not_owned:
            if table not in self._not_owned_warned:
                self._not_owned_warned.add(table)
                log.warning(
                    "the worker cannot vacuum %s, past its dead-tuple threshold: its database "
                    "role does not own the table, so the ready path is left to autovacuum; "
                    "run the worker as the owner, or vacuum=None to stop trying "
                    "(docs/vacuum.md)",
                    table,
                )
