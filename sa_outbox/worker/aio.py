"""`AsyncWorker`: the job queue's runtime on asyncio, over an `AsyncEngine` (psycopg).

The same logic as `Worker` (`sa_outbox.worker._core`), driven by one event loop: ``async
def`` handlers run as tasks (``concurrency`` at a time), plain functions in a pool of
``concurrency`` daemon threads. See docs/worker.md.

It stays whole because it is one class, `AsyncWorker`, whose methods share its events,
its tasks and its thread pool: `DriverBase` (``_driver``) and `Core` (``_core``) already
hold what both drivers share, and what is left is how this one waits and runs its I/O, with
the public step-by-step methods (`AsyncWorker.claim`, `AsyncWorker.flush`, …) and their
docstrings.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import text

from .._clock import Clock
from .._connect_args import describe, interrupt, listen_connect_args
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._pooler import PROBE_NOTIFY_SQL
from .._sqlstate import is_bad_data
from ..maintenance._retention import AsyncPruner, PruneReport, Retention
from ..maintenance._vacuum import AsyncVacuumer, VacuumPolicy, VacuumReport
from ..ops import Op, arun
from ..queue import BatchResult, ReclaimedJob
from ._core import Entry, Result, Written
from ._direct import AsyncHeldConnection, can_hold
from ._driver import FINAL_WRITE_TIMEOUT, Chore, DriverBase, KeeperPlan
from ._retry import async_call_retrying
from ._spans import end_job_span, job_span
from ._threads import DaemonPool
from .context import JobContext
from .errors import Snooze
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
    """`Worker` for asyncio: the same options, behaviour and step-by-step methods, awaited.

    ``async def`` handlers run as tasks of the worker's loop; a timeout cancels the task
    (``asyncio.CancelledError`` inside the handler), so does the end of the grace period.
    Plain (sync) handlers run in threads, where, as in `Worker`, a timeout cancels the job's
    token. Signals (SIGTERM, SIGINT) are handled when `run` runs in the main thread.

    Examples:
        worker = AsyncWorker(app, async_engine, queues="emails", concurrency=50)
        await worker.run()
    """

    name = "AsyncWorker"

    def _check(self, app: JobApp, engine: AsyncEngine) -> None:
        if not hasattr(engine, "sync_engine"):
            raise InvalidArgumentType(
                "AsyncWorker needs an AsyncEngine (create_async_engine), "
                f"got {type(engine).__name__}"
            )

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
        self._held = AsyncHeldConnection(engine)
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
            else AsyncPruner(engine, jobs=self.app.model, retention=retention, clock=clock)
        )
        self.vacuumer = (
            None if vacuum is None else AsyncVacuumer(engine, self.app.model, vacuum, timer=timer)
        )
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self._hard_stop = asyncio.Event()
        self._keeper_stop = asyncio.Event()
        self._threads: DaemonPool | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.listener: AsyncListener | None = None
        self._run_task: asyncio.Task[Any] | None = None
        self._interrupted = False
        #: Set while the worker's LISTEN connection listens (``listen=True``, in `run`).
        self.listening = asyncio.Event()
        # What the loop waits on, since when (time.monotonic()), and the grace's watch.
        self._db_since: float | None = None
        self._db_operation = ""
        self._watch_task: asyncio.Task[None] | None = None

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Work until `stop` (or SIGTERM / SIGINT), then shut down gracefully.

        Examples:
            asyncio.run(AsyncWorker(app, async_engine).run())
        """
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._stop_requested = False
        self._give_up_at = None
        self._hard_stop.clear()
        self._keeper_stop.clear()
        self._start_run()
        self._run_task = asyncio.current_task()
        self._interrupted = False
        self.core.dropped_ids.clear()
        try:
            await self._connect_first()
        except BaseException:
            self._running = False
            raise
        restore = self._install_signals() if self.install_signal_handlers else None
        s = self.settings
        self._log_start()
        keeper = asyncio.get_running_loop().create_task(self._keep(), name="sa-outbox-keeper")
        try:
            if s.listen:
                self._start_listener()
            self._hold = can_hold(self.engine.sync_engine)
            try:
                await self._loop()
            except asyncio.CancelledError:
                if self._interrupted and self._run_task is not None:
                    # Our own signal handler (or the grace period's watch) broke a statement
                    # that hung: nothing more can be written on that network; the leases
                    # expire instead.
                    self._run_task.uncancel()
                    log.warning(
                        "async worker %s: stopped while a statement hung (a second signal, or "
                        "the end of the grace period); %d jobs held were not released and run "
                        "again once their lease expires",
                        self.worker_id,
                        self.core.unfinished(),
                    )
                    self._cancel(self.core.abandon_running())
                else:
                    # The task running us was cancelled: release what we hold, then go.
                    self.stop(now=True)
                    with contextlib.suppress(Exception):
                        await self._shutdown_now()
                    raise
            except Exception:
                await self._release_after_failure()
                raise
        finally:
            self._hold = False
            await self._held.release()
            self._keeper_stop.set()
            await self._join_keeper(keeper)
            if self.listener is not None:
                await self.listener.stop()
                self.listener = None
            if self._watch_task is not None:
                self._watch_task.cancel()
                self._watch_task = None
            if restore is not None:
                restore()
            self.close()
            self._running = False
            if not self._interrupted:
                self._log_abandoned()
            log.info("async worker %s stopped", s.worker_id)

    async def _release_after_failure(self) -> None:
        # run() is failing: give back what was claimed but never started (see Worker's).
        results, abandoned = self._results_to_release()
        self._cancel(abandoned)
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
                raw = await conn.get_raw_connection()
                self._warn_without_keepalives(raw)

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
        self._connected = True

    async def _loop(self) -> None:
        self._grace_over = None
        while True:
            self._wake.clear()
            step = self._decide(self.timer())
            self._cancel(step.cancel)
            if step.stop:
                break
            if step.idle:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), step.wait)
                continue
            if not await self._write_or_give_up(step.results, step.claim):
                return
        results = self.core.take_results()
        if results:
            await self._write_or_give_up(results, 0)

    async def _shutdown_now(self) -> None:
        self._cancel(self.core.abandon_running())
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
        notifications = self.core.notifications
        try:
            written: Written = await self._database(
                "write",
                lambda: self.core.write_op(results, claim),
                autocommit=self.core.one_statement(results, claim),
            )
        except BaseException as exc:
            groups = self.core.isolate(results, exc) if is_bad_data(exc) else None
            if groups is None:
                self.core.dropped(results)
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
        self.core.written(written)
        entries = self.core.admit(written.claimed, claim, started, notifications)
        self.core.hook(
            "batch_written", len(written.outcomes), len(written.claimed), self.timer() - started
        )
        for entry in entries:
            self._start(entry)
        return len(written.claimed)

    async def _database(
        self, operation: str, op: Callable[[], Op[T]], *, autocommit: bool = False
    ) -> T:
        # One statement needs no transaction around it (see `Worker._database`).
        async def attempt() -> T:
            if autocommit:
                return await self._held.run(op())
            await self._held.release()  # the loop never needs two connections at once
            async with self.engine.begin() as conn:
                return await arun(conn, op())

        self._in_database = True
        loop = asyncio.current_task() is self._run_task
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
            self._in_database = False
            if loop:
                self._db_since = None

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hard_stop.wait(), seconds)

    # -- handlers ------------------------------------------------------------------------

    def _start(self, entry: Entry) -> None:
        task = asyncio.get_running_loop().create_task(self._execute(entry))
        entry.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, first: Entry) -> None:
        # Runs ``first``, then the queued jobs while there are any, waking the loop only
        # when it has something to decide (`Core.wants_loop`).
        core = self.core
        task = asyncio.current_task()
        entry: Entry | None = first
        while entry is not None:
            entry.task = task
            # A job enqueued in a trace runs in a span of its own, child of that trace.
            span = None if entry.job.headers is None else job_span(entry.job, self.worker_id)
            if span is None:
                error = await self._call_handler(entry, task)
            else:
                with span.current():
                    error = await self._call_handler(entry, task, traced=True)
                end_job_span(span, error, entry.context.cancel.cancelled)
            core.finished(entry, error)
            entry = core.next_entry()
            if core.wants_loop(entry):
                self._wake.set()
            self._finished.set()

    async def _call_handler(
        self, entry: Entry, task: asyncio.Task[Any] | None, traced: bool = False
    ) -> BaseException | None:
        """Run one job's handler; returns what it raised (or the `Snooze` it returned)."""
        try:
            self.core.parse(entry)
            assert entry.spec is not None
            if entry.spec.is_async:
                returned = await entry.spec.function(entry.context)
            else:
                returned = await self._in_thread(entry.spec.function, entry.context, traced)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and task is not None:
                task.uncancel()  # that job's timeout (or grace period) only: go on
            return exc
        return returned if isinstance(returned, Snooze) else None  # returned, not raised

    async def _in_thread(
        self, function: Callable[[JobContext], Any], job: JobContext, traced: bool = False
    ) -> Any:
        if traced:  # the handler's thread runs in this context: the job's span is current
            context, handler = contextvars.copy_context(), function

            def function(job: JobContext) -> Any:
                return context.run(handler, job)

        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(returned: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(returned)
            else:
                future.set_exception(error)

        def call() -> None:
            returned: Any = None
            error: BaseException | None = None
            try:
                returned = function(job)
            except BaseException as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, returned, error)

        if self._threads is None:
            self._threads = DaemonPool(self.settings.concurrency, "sa-outbox-handler")
        self._threads.submit(call)
        # Never cancelled (see _cancel): the slot stays busy while the thread runs.
        return await future

    def _cancel(self, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.spec is not None and entry.spec.is_async and entry.task is not None:
                entry.task.cancel()

    # -- the keeper ----------------------------------------------------------------------

    async def _keep(self) -> None:
        plan = KeeperPlan(self.settings, now=self.timer())
        chores: dict[Chore, Callable[[], Awaitable[object]]] = {
            "heartbeat": self.heartbeat,
            "reclaim": self.reclaim,
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
                try:
                    await chores[chore]()
                except Exception as exc:
                    self._chore_failed(chore, exc)
                    plan.done(chore, now, ok=False)
                else:
                    plan.done(chore, now, ok=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._keeper_stop.wait(), self._keeper_wait(plan, vacuum_interval)
                )

    # -- the listener --------------------------------------------------------------------

    def _start_listener(self) -> None:
        dialect = self.engine.dialect
        if dialect.driver != "psycopg" and self.listen_url is None:
            log.warning(
                "LISTEN needs the psycopg driver (the engine uses %s): polling every %g s",
                dialect.driver,
                self.settings.poll_interval,
            )
            return
        import psycopg

        listen_url = self.listen_url
        if listen_url is not None:  # a direct connection, past the engine's pooler
            args, kwargs = listen_connect_args(listen_url.get_dialect()(), listen_url)
        else:
            # The engine's URL, with the client-side timeouts it leaves unset (see `harden`).
            args, kwargs = listen_connect_args(dialect, self.engine.url)

        async def connect() -> Any:
            return await psycopg.AsyncConnection.connect(*args, **kwargs)

        async def channel() -> str | None:
            async with self.engine.begin() as conn:
                return await arun(conn, self.core.ops.notify_channel())

        async def probe(channel: str) -> None:
            async with self.engine.begin() as conn:
                await conn.execute(text(PROBE_NOTIFY_SQL), {"channel": channel})

        self.listener = AsyncListener(
            connect,
            channel,
            on_notify=self._notified,
            on_connect=self._listening,
            listening=self.listening,
            probe=probe,
            on_deaf=self._warn_deaf,
        )
        self.listener.start()

    def _notified(self, payload: str) -> None:
        if self.core.on_notify(payload):
            self._wake.set()

    def _listening(self) -> None:
        self.core.wake()  # what was sent while nobody listened is lost: claim now
        self._wake.set()

    # -- stopping ------------------------------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Ask `run` to stop gracefully (``now=True``: skip the grace period).

        Call it from the worker's event loop (``loop.call_soon_threadsafe(worker.stop)``
        from another thread).

        Examples:
            asyncio.get_running_loop().call_later(60, worker.stop)
            await worker.run()
        """
        first = not self._stop_requested
        self._request_stop(now)
        self._wake.set()
        if first and self._running and self._watch_task is None:
            since = self._db_since
            stuck = []
            if since is not None and time.monotonic() - since >= 0.5:
                conn = self._held.driver_connection()
                where = "a connection being opened" if conn is None else describe(conn)
                waited = time.monotonic() - since
                stuck.append(
                    f"its loop waits on a statement ({self._db_operation}, {waited:.1f} s) "
                    f"on {where}"
                )
            self._log_stopping(stuck)
            self._watch_task = asyncio.get_running_loop().create_task(
                self._watch(), name="sa-outbox-grace"
            )

    async def _watch(self) -> None:
        """See `Worker._watch`: once the grace period is over, a statement the loop still
        waits on has its socket shut down (or, on a connection of a transaction, the
        loop's task is cancelled), so that `run` returns."""
        deadline = time.monotonic() + self.settings.grace
        await asyncio.sleep(self.settings.grace)
        while self._running:
            since = self._db_since
            if since is not None:
                limit = 1.0 if since < deadline else FINAL_WRITE_TIMEOUT
                if time.monotonic() - max(since, deadline) >= limit:
                    self._break_loop(since)
                    return
            await asyncio.sleep(0.1)

    def _break_loop(self, since: float) -> None:
        self._request_stop(True)
        self._wake.set()
        conn = self._held.driver_connection()
        waited = time.monotonic() - since
        if conn is None:
            done = "its task cancelled"
            if self._run_task is not None:
                self._interrupted = True
                self._run_task.cancel()
            where = "a connection of a transaction"
        else:
            where = describe(conn)
            done = interrupt(conn)
        log.warning(
            "async worker %s: grace period over; its loop still waited on a statement (%s, "
            "%.1f s) on %s: %s",
            self.worker_id,
            self._db_operation,
            waited,
            where,
            done,
        )

    async def _join_keeper(self, keeper: asyncio.Task[None]) -> None:
        # The keeper ends after its chore; one stuck on a dead network is cancelled after a
        # second, and waited for two more (psycopg then tries to cancel the statement).
        done, _ = await asyncio.wait({keeper}, timeout=1.0)
        if not done:
            log.warning("async worker %s: its keeper still waits: cancelled", self.worker_id)
            keeper.cancel()
            await asyncio.wait({keeper}, timeout=2.0)
        if keeper.done() and not keeper.cancelled():
            keeper.exception()  # retrieved: the keeper logs its own failures

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for sig in previous:
                loop.add_signal_handler(sig, self._on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not a Unix loop
            return None

        def restore() -> None:
            for sig, old in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, old)

        return restore

    def _on_signal(self, signum: int) -> None:
        log.info("async worker %s: %s received", self.worker_id, signal.Signals(signum).name)
        self.stop()
        if self._interrupt_on_signal() and self._run_task is not None:
            # The loop waits on a statement that a dead network may never answer.
            self._interrupted = True
            self._run_task.cancel()

    def close(self) -> None:
        """Stop the handler threads (after their current job); `run` does it on return.

        Examples:
            worker.close()
        """
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.close()

    # -- step by step --------------------------------------------------------------------

    async def claim(self) -> int:
        """See `Worker.claim`."""
        claim = max(0, min(self.settings.batch, self.core.room()))
        return await self._write(self.core.take_results(), claim)

    async def wait_for_handlers(self, timeout: float | None = None) -> bool:
        """See `Worker.wait_for_handlers`."""
        try:
            async with asyncio.timeout(timeout):
                while self.core.unfinished():
                    self._finished.clear()
                    await self._finished.wait()
        except TimeoutError:
            return False
        return True

    async def flush(self) -> int:
        """See `Worker.flush`."""
        results = self.core.take_results()
        if results:
            await self._write(results, 0)
        return len(results)

    def check_timeouts(self) -> int:
        """See `Worker.check_timeouts` (async handlers are cancelled too)."""
        expired = self.core.expire(self.timer())
        self._cancel(expired)
        return len(expired)

    async def heartbeat(self) -> BatchResult | None:
        """See `Worker.heartbeat`."""
        pairs = self.core.heartbeat_pairs()
        sent_at = self.timer()
        result = None
        lost = 0
        try:
            if pairs:
                async with self.engine.begin() as conn:
                    beat = await arun(conn, self.core.heartbeat_op(pairs))
                result = beat.result
                lost = self.core.beaten(pairs, beat, sent_at)
        finally:  # a heartbeat that failed may leave leases to expire: cancel those jobs
            lost += self.core.expire_leases(self.timer())
        if result is not None:
            self.core.hook("heartbeat", len(result.done), lost, self.timer() - sent_at)
        return result

    async def prune(self) -> PruneReport:
        """See `Worker.prune`.

        Examples:
            worker = AsyncWorker(app, async_engine, retention=Retention(succeeded=86400))
            (await worker.prune()).succeeded
            # -> 0
        """
        if self.pruner is None:
            raise InvalidArgument("this worker has no retention policy (retention=Retention(...))")
        return await self.pruner.run_once()

    async def prune_due(self) -> PruneReport | None:
        """See `Worker.prune_due`.

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
        """See `Worker.run_schedules`."""
        if self.scheduler is None:
            return []
        async with self.engine.begin() as conn:
            now, ticks = await arun(conn, self.scheduler.run_op(self._schedule_ops, self._clock))
        return self._scheduled(now, ticks)

    async def reclaim(self) -> list[ReclaimedJob]:
        """See `Worker.reclaim`."""
        return await self.reclaimer.run_once()

    async def run_once(self, timeout: float | None = None) -> int:
        """See `Worker.run_once`."""
        claimed = await self.claim()
        await self._wait_renewing(timeout)
        self.check_timeouts()
        await self.flush()
        return claimed

    async def _wait_renewing(self, timeout: float | None) -> bool:
        """See `Worker._wait_renewing`."""
        interval = self.settings.heartbeat_interval
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            if await self.wait_for_handlers(interval if left is None else min(interval, left)):
                return True
            if left is not None and left <= interval:
                return False
            try:
                await self.heartbeat()
            except Exception:  # its jobs were cancelled if their leases may have expired
                log.warning("a heartbeat failed while waiting for the handlers", exc_info=True)

    async def drain(self, timeout: float | None = None) -> int:
        """See `Worker.drain`."""
        total = 0
        while True:
            claimed = await self.run_once(timeout)
            total += claimed
            if not claimed:
                return total
