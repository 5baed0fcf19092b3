# The source of sync.py (Worker): after an edit here or in _runtime.py, regenerate it with
# `python tools/async_to_sync.py` (CI fails when it is stale).
"""`AsyncWorker`: the job queue's runtime on asyncio, over an `AsyncEngine` (psycopg).

The same logic as `Worker` (`sa_outbox.worker._core`), driven by one event loop: ``async
def`` handlers run as tasks (``concurrency`` at a time), plain functions in a pool of
``concurrency`` daemon threads. See docs/worker.md.

It stays whole because it is one class, `AsyncWorker`, whose methods share its state:
`DriverBase` (``_driver``) and `Core` (``_core``) hold what both drivers share, the twins of
``_runtime`` what they do differently, and what is left is the one flow of the loop, the
keeper and the steps, with the public step-by-step methods (`AsyncWorker.claim`,
`AsyncWorker.flush`, …) and their docstrings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .._clock import Clock
from .._exceptions import InvalidArgument
from .._sqlstate import is_bad_data
from ..maintenance._retention import AsyncPruner, PruneReport, Retention
from ..maintenance._vacuum import AsyncVacuumer, VacuumPolicy, VacuumReport
from ..ops import Op, arun
from ..queue import BatchResult, ReclaimedJob
from ._core import Entry, Result, Written
from ._direct import AsyncHeldConnection, can_hold
from ._driver import Chore, DriverBase, Interrupted, KeeperPlan
from ._retry import async_call_retrying
from ._runtime import (
    AsyncGate,
    AsyncGrace,
    AsyncHandlers,
    AsyncKeeper,
    AsyncRunner,
    async_open_listener,
    async_pool_connection,
    async_wait_event,
    require_async_engine,
)
from ._spans import end_job_span, job_span
from ._steps_async import AsyncSteps
from .errors import DatabaseUnreachable, Snooze
from .listen import AsyncListener
from .metrics import WorkerMetrics
from .reclaimer import AsyncReclaimer
from .registry import JobApp
from .schedule import Tick

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["AsyncWorker"]

log = logging.getLogger("sa_outbox.worker")
T = TypeVar("T")


class AsyncWorker(DriverBase["AsyncEngine"]):
    """Run the jobs of a `JobApp` on asyncio, until stopped.

    ``run()`` claims batches from ``queues`` (``None``: all) and ``kinds`` (``None``: all;
    a job of a kind with no handler fails at once), runs each job's handler with no
    transaction open (``concurrency`` at a time), and writes the results in batches, each
    fenced by the job's lease token. It heartbeats every held job every
    ``heartbeat_interval`` (a third of ``lease`` by default) without rotating tokens, reclaims
    expired leases every ``reclaim_interval`` (half the lease; ``reclaim=False`` to leave
    that to a separate `Reclaimer`), prunes finished jobs every ``retention.interval`` when
    given a ``retention`` policy (`Retention`; one pruner at a time across all workers, see
    `Pruner`), vacuums its table past ``vacuum.threshold`` dead tuples (`sa_outbox.Vacuumer`,
    checked every ``vacuum.interval``; ``None`` leaves it to autovacuum), enqueues the app's
    periodic jobs at their ticks (`JobApp.periodic`; ``schedules=False`` leaves that to the
    other workers; each tick is enqueued once whatever the number), wakes up on the
    table's NOTIFY (``listen``; on a connection to ``listen_url`` when given, a direct one
    past a transaction pooler such as PgBouncer, see docs/pgbouncer.md) and polls
    every ``poll_interval`` anyway. Given ``pauses`` (a `QueuePauseMixin` model), its claims
    skip the queues paused with `QueueControl` (docs/worker.md, "Pausing a queue"). Results
    wait up to ``ack_delay`` seconds (or until ``ack_batch`` are ready) so that one commit
    acknowledges many jobs.

    A claim takes up to ``batch`` jobs (default: ``concurrency``, at least 50); those beyond
    the free handlers wait in the worker, heartbeated like the running ones, for at most
    ``prefetch`` of them. ``prefetch=None`` (the default) adapts: none until handlers have
    returned, then as many as they get through in about 0.1 s at their average run time (at
    most two batches: the next claim need not wait for the last batch to drain) —
    short jobs share claims and commits even at ``concurrency=1``, long ones are not hoarded.
    ``prefetch=0`` claims only for free handlers.

    On SIGTERM or SIGINT (or `stop`) it stops claiming, cancels the running jobs' tokens
    (reason ``shutdown``), lets them finish for up to ``grace`` seconds, then releases the
    rest back to ``pending`` without counting the attempt. A second signal skips the grace
    period. A statement still hanging once the grace period is over (a dead network, a
    lock) is cancelled and its socket shut down: `run` returns, and the jobs it could not
    release keep leases that expire (the reclaimer returns them). The engine's connections
    get the client-side timeouts of `sa_outbox.connect_args` it leaves unset. A lost
    connection or a restarting server is retried with backoff, forever while running;
    nothing is written twice (every write is fenced).

    ``async def`` handlers run as tasks of the worker's loop; a timeout cancels the task
    (``asyncio.CancelledError`` inside the handler), so does the end of the grace period.
    Plain (sync) handlers run in threads, where, as in `Worker`, a timeout cancels the job's
    token. Signals (SIGTERM, SIGINT) are handled when `run` runs in the main thread.

    While it runs, the loop keeps one connection of the engine's pool for its batches (in
    autocommit mode; a write with follow-up jobs, retries or failures gives it back and takes
    one for its transaction; a pool of a single connection is shared, not kept), and runs
    its hot statements through psycopg's cursor on it — unless the engine has event
    listeners, which then see them run through SQLAlchemy.

    Between runs, tests drive it step by step: `claim`, `wait_for_handlers`, `flush`,
    `heartbeat`, `check_timeouts`, `reclaim`, or `run_once` / `drain`. ``clock`` is the
    SQL clock (a `FakeClock` in tests) and ``timer`` the local one (timeouts, local lease
    deadlines): ``timer=lambda: clock.now().timestamp()`` moves both together.

    Examples:
        worker = AsyncWorker(app, async_engine, queues=["default", "emails"], concurrency=16)
        await worker.run()  # returns after SIGTERM / SIGINT / worker.stop()

        # behind PgBouncer (transaction mode): the engine's connections are checked and
        # prepare nothing there (sa_outbox._pooler); LISTEN needs a direct connection
        url = "postgresql+psycopg://app@db:5432/app"
        await AsyncWorker(app, pooled_engine, listen_url=url).run()
    """

    name = "AsyncWorker"

    def _check(self, app: JobApp, engine: AsyncEngine) -> None:
        require_async_engine(app, engine)

    def _setup(
        self,
        *,
        clock: Clock | None,
        metrics: WorkerMetrics | None,
        retention: Retention | None,
        vacuum: VacuumPolicy | None,
    ) -> None:
        engine, timer = self.engine, self.timer
        # The loop's connection: kept by `run` between batches, by a step for its duration.
        self._held: AsyncHeldConnection = AsyncHeldConnection(engine)
        steps = self.app.steps_table
        if steps is not None:
            self.core.steps = AsyncSteps(
                engine,
                self.app.table,
                steps,
                clock=clock,
                dependencies=self.app.dependencies_table,
            )
        self.reclaimer = AsyncReclaimer(
            self.app,
            engine,
            interval=self.settings.reclaim_interval or 1.0,
            clock=clock,
            metrics=metrics,
        )
        self.pruner = (
            None
            if retention is None
            else AsyncPruner(
                engine,
                jobs=self.app.model,
                retention=retention,
                clock=clock,
                steps=self.app.steps_table,
                dependencies=self.app.dependencies_table,
            )
        )
        self.vacuumer = (
            None if vacuum is None else AsyncVacuumer(engine, self.app.model, vacuum, timer=timer)
        )
        self._gate: AsyncGate = AsyncGate()  # guards the core, wakes the loop
        self._hard_stop = asyncio.Event()
        self._keeper_stop = asyncio.Event()
        self._handlers = AsyncHandlers(self.settings.concurrency, self._execute)
        self._runner: AsyncRunner = AsyncRunner()
        self._keeper = AsyncKeeper()
        self._grace = AsyncGrace(self)
        self.listener: AsyncListener | None = None
        #: Set while the worker's LISTEN connection listens (``listen=True``, in `run`).
        self.listening = asyncio.Event()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Work until `stop` (or SIGTERM / SIGINT), then shut down gracefully.

        Examples:
            await AsyncWorker(app, async_engine, queues="emails", concurrency=16).run()
        """
        with self._gate:
            if self._running:
                raise self._runner.busy_error("this worker is already running")
            self._running = True
            self._stop_requested = False
            self._give_up_at = None
            self._hard_stop.clear()
            self._keeper_stop.clear()
            self._grace.reset()
            self._start_run()
            self.core.dropped_ids.clear()
        self._runner.begin()
        try:
            await self._connect_first()
        except BaseException:
            with self._gate:
                self._running = False
            raise
        restore = (
            self._runner.install_signals(self._on_signal) if self.install_signal_handlers else None
        )
        s = self.settings
        self._log_start()
        interrupted = False
        try:
            self._keeper.start(self._keep)
            self._grace.start()
            if s.listen:
                self.listener = async_open_listener(self)
            self._hold = can_hold(self.engine.sync_engine)
            try:
                await self._runner.guard(self._loop, self._cancelled)
            except Interrupted:
                # A statement that hung was broken: nothing more can be written on that
                # network; the leases expire instead.
                interrupted = True
                with self._gate:
                    unwritten = self.core.unfinished()
                log.warning(
                    "async worker %s: stopped while a statement hung "
                    "(a second signal, or the end of the grace period); "
                    "%d jobs held were not released and run again once their lease expires",
                    self.worker_id,
                    unwritten,
                )
                self._handlers.drop(self.core)
            except Exception:
                await self._release_after_failure()
                raise
        finally:
            self._hold = False
            await self._held.release()
            self._keeper_stop.set()
            if self.listener is not None:
                await self.listener.stop()
                self.listener = None
            await self._keeper.join(self)
            self._grace.end()
            if restore is not None:
                restore()
            self.close()
            with self._gate:
                self._running = False
                if not interrupted:
                    self._log_abandoned()
            log.info("async worker %s stopped", s.worker_id)

    async def _cancelled(self) -> None:
        # The task running `run` was cancelled (not by us): release what we hold, then go.
        self.stop(now=True)
        with self._gate:
            self._handlers.cancel(self.core.abandon_running())
            results = self.core.take_results()
        if results:
            with contextlib.suppress(Exception):
                await self._write_or_give_up(results, 0)

    async def _release_after_failure(self) -> None:
        # run() is failing: give back what was claimed but never started (and stop what
        # runs), so those jobs need not wait for their lease and lose no attempt.
        with self._gate:
            results, abandoned = self._results_to_release()
            self._handlers.cancel(abandoned)
        if not results:
            return
        try:
            await self._write(results, 0)
        except Exception as exc:
            log.warning("async worker %s: could not release its jobs (%s)", self.worker_id, exc)

    async def _connect_first(self) -> None:
        # A wrong URL fails here, in one line; an outage later is ridden out.
        deadline = time.monotonic() + self._startup_timeout

        async def attempt() -> None:
            async with self.engine.connect() as conn:
                self._warn_without_keepalives(await async_pool_connection(conn))

        # sync-only: self._in_database = True
        try:
            await async_call_retrying(
                attempt,
                "connect",
                stop=lambda: self._hard_stop.is_set() or time.monotonic() >= deadline,
                sleep=self._sleep,
                report=self._report_error,
            )
        except Exception as exc:
            raise self._startup_error(exc) from exc
        except Interrupted:
            raise DatabaseUnreachable(f"{self.name} was stopped while connecting") from None
        finally:
            self._in_database = False
        self._connected = True

    async def _loop(self) -> None:
        self._grace_over = None
        while True:
            with self._gate:
                step = self._decide(self.timer())
                self._handlers.cancel(step.cancel)
                if step.idle:
                    await self._gate.wait(step.wait)
                    continue
            if step.stop:
                break
            if not await self._write_or_give_up(step.results, step.claim):
                return
        # The final write: what finished in time, and the releases of what did not.
        with self._gate:
            results = self.core.take_results()
        if results:
            await self._write_or_give_up(results, 0)

    async def _write_or_give_up(self, results: list[Result], claim: int) -> bool:
        try:
            await self._write(results, claim)
        except Exception as exc:
            if not self._may_give_up(exc):
                raise
            return False
        return True

    async def _write(self, results: list[Result], claim: int) -> int:
        started = self.timer()
        with self._gate:
            notifications = self.core.notifications
        autocommit = self.core.one_statement(results, claim)
        try:
            written: Written = await self._database(
                "write", lambda: self.core.write_op(results, claim), autocommit=autocommit
            )
        except self._runner.write_errors as exc:
            with self._gate:
                groups = self.core.isolate(results, exc) if is_bad_data(exc) else None
                if groups is None:
                    self.core.dropped(results)
            if groups is None:
                raise
        else:
            groups = None
        finally:
            if not self._hold:
                await self._held.release()
        if groups is not None:  # the database refused some result's values: try them apart
            for group in groups:
                await self._write(group, 0)
            return await self._write([], claim) if claim else 0
        elapsed = self.timer() - started
        with self._gate:
            self.core.written(written)
            entries = self.core.admit(written.claimed, claim, started, notifications)
            self.core.note_ended(written)
            ended = self.core.release_due(self.timer(), len(written.claimed))
        self.core.hook("batch_written", len(written.outcomes), len(written.claimed), elapsed)
        self._handlers.start(entries)
        if ended:
            await self._release_after(ended)
        return len(written.claimed)

    async def _release_after(self, parents: list[Any]) -> None:
        # After the writes' commits, in a transaction of its own: it sees every write that
        # committed before it began, so of two workers finishing the last two jobs another
        # waits for, the later one's release finds both. A release that fails is left to
        # the keeper's next sweep (`release_dependants`).
        try:
            await self._database("release", lambda: self.core.release_op(parents))
        except Exception as exc:
            self.core.sweep_soon()
            log.warning(
                "%s %s: releasing the jobs that wait for %d finished jobs failed (%s: %s); "
                "the keeper's next sweep will",
                self.name,
                self.worker_id,
                len(parents),
                type(exc).__name__,
                exc,
            )

    async def _database(
        self, operation: str, op: Callable[[], Op[T]], *, autocommit: bool = False
    ) -> T:
        # One statement needs no transaction around it: in autocommit mode it is one round
        # trip and one commit, where BEGIN, the statement and COMMIT are three. It runs on
        # the loop's held connection (see `_direct`); a transaction takes one from the pool.
        async def attempt() -> T:
            if autocommit:
                return await self._held.run(op())
            await self._held.release()  # the loop never needs two connections at once
            async with self.engine.begin() as conn:
                return await arun(conn, op())

        main = self._runner.in_main()
        self._in_database = main
        loop = self._runner.in_loop()
        if loop:
            self._db_operation, self._db_since = operation, time.monotonic()
        try:
            return await async_call_retrying(
                attempt,
                operation,
                stop=self._stop_retrying,
                sleep=self._sleep,
                report=self._report_error,
            )
        finally:
            if main:
                self._in_database = False
            if loop:
                self._db_since = None

    async def _sleep(self, seconds: float) -> None:
        await async_wait_event(self._hard_stop, seconds)

    # -- handlers ------------------------------------------------------------------------

    async def _execute(self, first: Entry) -> None:
        # Runs ``first``, then the queued jobs while there are any: one lock round per job,
        # and the loop is woken only when it has something to decide (`Core.wants_loop`).
        core = self.core
        entry: Entry | None = first
        while entry is not None:
            # A job enqueued in a trace runs in a span of its own, child of that trace.
            span = None if entry.job.headers is None else job_span(entry.job, self.worker_id)
            if span is None:
                error = await self._call_handler(entry)
            else:
                with span.current():
                    error = await self._call_handler(entry, traced=True)
                end_job_span(span, error, entry.context.cancel.cancelled)
            with self._gate:
                core.finished(entry, error)
                entry = core.next_entry()
                if core.wants_loop(entry):
                    self._gate.notify_all()

    async def _call_handler(self, entry: Entry, traced: bool = False) -> BaseException | None:
        """Run one job's handler; returns what it raised (or the `Snooze` it returned)."""
        try:
            self.core.parse(entry)
            returned = await self._handlers.call(entry, traced)
            self.core.keep_result(entry, returned)
        except BaseException as exc:
            return exc
        return returned if isinstance(returned, Snooze) else None  # returned, not raised

    # -- the keeper: heartbeats, the reclaimer, vacuum, pruning, schedules ---------------

    async def _keep(self) -> None:
        plan = KeeperPlan(self.settings, now=self.timer())
        chores: dict[Chore, Callable[[], Any]] = {
            "heartbeat": self.heartbeat,
            "reclaim": self._repair,
            "vacuum": self.vacuum,
            "prune": self.prune_due,
            "schedule": self.run_schedules,
        }
        vacuum_interval = None if self.vacuumer is None else self.vacuumer.policy.interval_seconds
        while not self._keeper_stop.is_set():
            now = self.timer()
            vacuum = self.vacuumer is not None and self.vacuumer.due()
            for chore in plan.due(
                now,
                vacuum=vacuum,
                prune=self._next_prune is not None,
                schedule=self._schedule_is_due(),
            ):
                self._chore, self._chore_since = chore, time.monotonic()
                try:
                    await chores[chore]()
                except Exception as exc:
                    self._chore_failed(chore, exc)
                    plan.done(chore, now, ok=False)
                else:
                    plan.done(chore, now, ok=True)
                finally:
                    self._chore_since = None
            await async_wait_event(self._keeper_stop, self._keeper_wait(plan, vacuum_interval))

    # -- stopping ------------------------------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Ask `run` to stop gracefully (``now=True``: skip the grace period).

        Call it from the worker's event loop (``loop.call_soon_threadsafe(worker.stop)``
        from another thread).

        Examples:
            asyncio.get_running_loop().call_later(60, worker.stop)
            await worker.run()
        """
        with self._gate:
            self._grace.requested(first=not self._stop_requested)
            self._request_stop(now)
            self._gate.notify_all()

    def _on_signal(self, signum: int) -> bool:
        log.info("async worker %s: %s received", self.worker_id, signal.Signals(signum).name)
        self.stop()
        # The loop may wait on a statement that a dead network never answers: break it?
        return self._interrupt_on_signal()

    def close(self) -> None:
        """Stop the handler threads (after their current job); `run` does it on return.

        Examples:
            worker.close()
        """
        self._handlers.close()

    # sync-only: def __enter__(self) -> Worker: return self
    # sync-only: def __exit__(self, *exc_info: object) -> None: self.close()

    # -- step by step (tests, scripts) ---------------------------------------------------

    async def claim(self) -> int:
        """Write the results ready so far and claim as many jobs as there is room for (free
        handlers, plus the jobs that may wait for one; up to ``batch``), in one
        transaction; start them. Returns how many.

        Examples:
            await worker.claim()
            # -> 10
        """
        with self._gate:
            claim = max(0, min(self.settings.batch, self.core.room()))
            results = self.core.take_results()
        return await self._write(results, claim)

    async def wait_for_handlers(self, timeout: float | None = None) -> bool:
        """Wait until no handler is running and no claimed job waits for one; False if
        ``timeout`` passed first.

        Examples:
            assert await worker.wait_for_handlers(timeout=10)
        """
        with self._gate:
            return await self._gate.wait_for(lambda: self.core.unfinished() == 0, timeout)

    async def flush(self) -> int:
        """Write the results ready so far (one transaction); returns how many.

        Examples:
            await worker.flush()
            # -> 10
        """
        with self._gate:
            results = self.core.take_results()
        if results:
            await self._write(results, 0)
        return len(results)

    def check_timeouts(self) -> int:
        """Give up the jobs past their kind's timeout (cancel, retry); returns how many.

        Examples:
            clock.advance(31)  # past a timeout of 30 s, with timer=clock-based
            worker.check_timeouts()
            # -> 1
        """
        with self._gate:
            expired = self.core.expire(self.timer())
            self._handlers.cancel(expired)
        return len(expired)

    async def heartbeat(self) -> BatchResult | None:
        """Renew the lease of every job held (one statement); cancel the lost ones.

        Returns what the statement renewed and found lost (``None``: nothing held). A
        heartbeat that fails raises, after cancelling the jobs whose lease may have expired.

        Examples:
            (await worker.heartbeat()).lost
            # -> []
        """
        with self._gate:
            pairs = self.core.heartbeat_pairs()
            sent_at = self.timer()
        lost = 0
        beat = result = None
        try:
            if pairs:
                async with self.engine.begin() as conn:
                    beat = await arun(conn, self.core.heartbeat_op(pairs))
                result = beat.result
        finally:  # a heartbeat that failed may leave leases to expire: cancel those jobs
            with self._gate:
                if beat is not None:
                    lost = self.core.beaten(pairs, beat, sent_at)
                lost += self.core.expire_leases(self.timer())
        if result is not None:
            self.core.hook("heartbeat", len(result.done), lost, self.timer() - sent_at)
        return result

    async def prune(self) -> PruneReport:
        """Prune the job table now, by the ``retention`` policy (see `Pruner`).

        Examples:
            worker = AsyncWorker(app, async_engine, retention=Retention(succeeded=86400))
            (await worker.prune()).succeeded
            # -> 0
        """
        if self.pruner is None:
            raise InvalidArgument("this worker has no retention policy (retention=Retention(...))")
        return await self.pruner.run_once()

    async def prune_due(self) -> PruneReport | None:
        """Prune if ``retention.interval`` (± 20 %) has passed since the last time; the keeper
        calls this. Returns the report, or ``None`` when not due (or no policy).

        Examples:
            await worker.prune_due()
            # -> None
        """
        if not self._prune_is_due(None if self.pruner is None else self.pruner.retention):
            return None
        report = await self.prune()
        self._log_pruned(report)
        return report

    async def vacuum(self) -> VacuumReport | None:
        """Vacuum the job table now if it has ``vacuum.threshold`` dead tuples (see
        `sa_outbox.Vacuumer`); the keeper calls this every ``vacuum.interval``. ``None`` when
        the worker was built with ``vacuum=None``.

        Examples:
            report = await worker.vacuum()
        """
        if self.vacuumer is None:
            return None
        report = await self.vacuumer.run_once()
        self._log_vacuumed(report)
        return report

    async def run_schedules(self) -> list[Tick]:
        """Enqueue the jobs of the periodic schedules' ticks that are due, by the worker's
        clock (``now`` read in SQL, so a `FakeClock`'s); the keeper calls this at every tick.
        Returns the ticks, each ``inserted`` unless another worker enqueued it first.

        Examples:
            [tick.at for tick in await worker.run_schedules() if tick.inserted]
        """
        if self.scheduler is None:
            return []
        async with self.engine.begin() as conn:
            now, ticks = await arun(conn, self.scheduler.run_op(self._schedule_ops, self._clock))
        return self._scheduled(now, ticks)

    async def reclaim(self) -> list[ReclaimedJob]:
        """Run the reclaimer once (every expired lease of the table, not only this worker's).

        Examples:
            await worker.reclaim()
            # -> []
        """
        return await self.reclaimer.run_once()

    async def release_dependants(self) -> int:
        """Sweep the jobs that wait for others (``JobApp(dependencies=)``): release each one
        its parents now decide; returns how many were released. The keeper runs it when
        the worker starts, after a reclaim that found expired leases (a worker died), after
        a release that failed, and every 10 minutes: it releases what a worker killed
        between a write and its release left waiting.

        Examples:
            await worker.release_dependants()
            # -> 0
        """
        if self.core.dependencies is None:
            return 0
        total, after = 0, None
        while True:
            async with self.engine.begin() as conn:
                released, after = await arun(conn, self.core.sweep_op(after))
            total += released
            if after is None:
                return total

    async def _repair(self) -> None:
        reclaimed = await self.reclaim()
        if self.core.sweep_due(self.core.timer(), len(reclaimed)):
            await self.release_dependants()

    async def run_once(self, timeout: float | None = None) -> int:
        """Claim one batch, wait for its handlers (up to ``timeout``), write the results.

        Returns how many jobs were claimed. Handlers still running after ``timeout`` keep
        their jobs; a later call writes their results.

        Examples:
            while await worker.run_once():
                pass
        """
        claimed = await self.claim()
        await self._wait_renewing(timeout)
        self.check_timeouts()
        await self.flush()
        return claimed

    async def _wait_renewing(self, timeout: float | None) -> bool:
        """`wait_for_handlers`, renewing the held jobs' leases every heartbeat interval
        meanwhile: `run_once` and `drain` run no keeper, and a job that runs longer than
        its lease would otherwise be claimed again by another worker while it still runs."""
        interval = self.settings.heartbeat_interval
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if await self.wait_for_handlers(interval if left is None else min(interval, left)):
                return True
            if left is not None and left <= interval:
                return False
            try:
                await self.heartbeat()
            except Exception:  # its jobs were cancelled if their leases may have expired
                log.warning("a heartbeat failed while waiting for the handlers", exc_info=True)

    async def drain(self, timeout: float | None = None) -> int:
        """`run_once` until a claim finds nothing; returns how many jobs were claimed.

        Examples:
            worker = AsyncWorker(app, async_engine, listen=False)
            await worker.drain()
        """
        total = 0
        while True:
            claimed = await self.run_once(timeout)
            total += claimed
            if not claimed:
                return total
