"""What `Worker` and `AsyncWorker` do differently; the rest of them is written once.

``aio.py`` (`AsyncWorker`) is the source: ``tools/async_to_sync.py`` generates ``sync.py``
(`Worker`) from it, turning ``await x`` into ``x`` and each name of an asyncio helper here into
its synchronous twin's: `AsyncGate` → `Gate` (the lock, and what wakes the loop),
`AsyncHandlers` → `Handlers` (where handlers run), `AsyncRunner` → `Runner` (what runs `run`,
and how a signal breaks a statement that hangs), `AsyncKeeper` → `Keeper`, `AsyncGrace` →
`Grace` (the grace period's watch), `async_open_listener` → `open_listener`,
`async_wait_event` → `wait_event`, `require_async_engine` → `require_engine`. The twins have
the same methods, so one body of code drives either.

It stays whole because each twin reads best beside its other: the pairs here are the whole
of what the two drivers do differently, and splitting them would part each pair.

Examples:
    >>> gate = Gate()
    >>> with gate:
    ...     gate.wait(0.01)
    False
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Connection, text

from .._connect_args import describe, in_use, interrupt, listen_connect_args
from .._exceptions import InvalidArgument, InvalidArgumentType
from .._pooler import PROBE_NOTIFY_SQL
from ..ops import Op, arun, run
from ._core import Core, Entry
from ._driver import FINAL_WRITE_TIMEOUT, DriverBase, Interrupted
from ._settings import check_engine
from ._signals import install_stop_signals
from ._threads import DaemonPool
from .context import JobContext
from .listen import AsyncListener, Listener
from .registry import JobApp

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "AsyncGate",
    "AsyncGrace",
    "AsyncHandlers",
    "AsyncKeeper",
    "AsyncRunner",
    "Gate",
    "Grace",
    "Handlers",
    "Keeper",
    "Runner",
    "async_listen_on",
    "async_open_listener",
    "async_pool_connection",
    "async_wait_event",
    "listen_on",
    "open_listener",
    "pool_connection",
    "require_async_engine",
    "require_engine",
    "wait_event",
]

log = logging.getLogger("sa_outbox.worker")
Driver = DriverBase[Any]


def require_engine(app: JobApp, engine: object) -> None:
    """`Worker`'s engine and handlers: a sync ``Engine``, no coroutine functions.

    Examples:
        >>> try:
        ...     require_engine(None, "postgresql://")  # the engine is checked first
        ... except InvalidArgumentType as exc:
        ...     print(exc)
        Worker needs a sync Engine (create_engine), got str
    """
    check_engine(engine, "Worker")
    coroutines = [kind for kind in app.kinds if app[kind].is_async]
    if coroutines:
        raise InvalidArgument(
            f"the handlers of {coroutines} are coroutine functions: run them with AsyncWorker"
        )


def require_async_engine(app: JobApp, engine: object) -> None:
    """`AsyncWorker`'s engine: an ``AsyncEngine`` (its handlers may be either kind).

    Examples:
        >>> try:
        ...     require_async_engine(None, "postgresql://")
        ... except InvalidArgumentType as exc:
        ...     print(exc)
        AsyncWorker needs an AsyncEngine (create_async_engine), got str
    """
    if not hasattr(engine, "sync_engine"):
        raise InvalidArgumentType(
            f"AsyncWorker needs an AsyncEngine (create_async_engine), got {type(engine).__name__}"
        )


def wait_event(event: threading.Event, seconds: float | None) -> bool:
    """``event.wait(seconds)``: whether it was set.

    Examples:
        >>> wait_event(threading.Event(), 0.01)
        False
    """
    return event.wait(seconds)


async def async_wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """`wait_event` on an ``asyncio.Event``.

    Examples:
        >>> asyncio.run(async_wait_event(asyncio.Event(), 0.01))
        False
    """
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


class Gate(threading.Condition):
    """`Worker`'s lock over its `Core` (an RLock: a signal handler may re-enter it), and the
    condition its loop waits on: ``with gate:``, ``gate.wait(seconds)``, ``gate.notify_all()``.

    Examples:
        >>> gate = Gate()
        >>> with gate:
        ...     gate.wait_for(lambda: True, 1.0)
        True
    """


class AsyncGate:
    """`Gate` for `AsyncWorker`: one event loop needs no lock (``with gate:`` does nothing),
    and the loop waits on an ``asyncio.Event``.

    Examples:
        >>> async def main():
        ...     gate = AsyncGate()
        ...     gate.notify_all()
        ...     return await gate.wait(60)  # at once: woken
        >>> asyncio.run(main())
        True
    """

    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        self._changed.set()  # what the block changed may be what `wait_for` waits for

    def notify_all(self) -> None:
        """Wake the loop."""
        self._wake.set()

    async def wait(self, timeout: float | None) -> bool:
        """Until `notify_all` (since the last wait), or ``timeout`` seconds."""
        woken = await async_wait_event(self._wake, timeout)
        self._wake.clear()
        return woken

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Until ``predicate()`` holds, checked after each ``with gate:`` block, or ``timeout``
        seconds (then False)."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True


class Handlers:
    """Where `Worker` runs its handlers: ``size`` daemon threads, started at the first job,
    each running ``execute(entry)``.

    Examples:
        handlers = Handlers(16, worker._execute)
        handlers.start(entries)
    """

    def __init__(self, size: int, execute: Callable[[Entry], object]) -> None:
        self._size = size
        self._execute = execute
        self._pool: DaemonPool | None = None

    def start(self, entries: list[Entry]) -> None:
        """Run ``execute`` for each of ``entries``, each on a free thread."""
        if not entries:
            return
        if self._pool is None:
            self._pool = DaemonPool(self._size, "sa-outbox-handler")
        for entry in entries:
            self._pool.submit(functools.partial(self._execute, entry))

    @staticmethod
    def call(entry: Entry, traced: bool) -> Any:
        """Call the job's handler, here, on the handler's thread."""
        assert entry.spec is not None
        return entry.spec.function(entry.context)

    def cancel(self, entries: list[Entry]) -> None:
        """Nothing: a thread cannot be cancelled (the jobs' tokens were)."""

    def drop(self, core: Core) -> None:
        """`run` was interrupted: the threads run on; their jobs' leases expire."""

    def close(self) -> None:
        """Let the threads end after their current job."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class AsyncHandlers:
    """`Handlers` for `AsyncWorker`: ``async def`` handlers run as tasks of its loop (which
    a timeout cancels), plain functions in a pool of ``size`` daemon threads.

    Examples:
        handlers = AsyncHandlers(16, worker._execute)
        handlers.start(entries)
    """

    def __init__(self, size: int, execute: Callable[[Entry], Coroutine[Any, Any, None]]) -> None:
        self._size = size
        self._execute = execute
        self._threads: DaemonPool | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, entries: list[Entry]) -> None:
        """A task per entry, running ``execute``."""
        loop = asyncio.get_running_loop()
        for entry in entries:
            task = entry.task = loop.create_task(self._execute(entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def call(self, entry: Entry, traced: bool) -> Any:
        """Await the job's handler, or call it in a thread; ``traced``: in this context."""
        spec = entry.spec
        assert spec is not None
        task = entry.task = asyncio.current_task()
        try:
            if spec.is_async:
                return await spec.function(entry.context)
            return await self._in_thread(spec.function, entry.context, traced)
        except asyncio.CancelledError:
            if task is not None:
                task.uncancel()  # that job's timeout (or grace period) only: go on
            raise

    async def _in_thread(
        self, function: Callable[[JobContext], Any], job: JobContext, traced: bool
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
            self._threads = DaemonPool(self._size, "sa-outbox-handler")
        self._threads.submit(call)
        # Never cancelled (see cancel): the slot stays busy while the thread runs.
        return await future

    def cancel(self, entries: list[Entry]) -> None:
        """Cancel the tasks of ``entries``' async handlers."""
        for entry in entries:
            if entry.spec is not None and entry.spec.is_async and entry.task is not None:
                entry.task.cancel()

    def drop(self, core: Core) -> None:
        """`run` was interrupted: release the running jobs in ``core``, cancel their tasks."""
        self.cancel(core.abandon_running())

    def close(self) -> None:
        """Let the handler threads end after their current job."""
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.close()


class Runner:
    """The thread that runs `Worker.run`: its loop's identity, and its signal handlers,
    which raise `Interrupted` to break a statement that hangs.

    Examples:
        >>> runner = Runner()
        >>> runner.begin(); runner.in_loop()
        True
    """

    #: What `run` raises when already running.
    busy_error: type[Exception] = InvalidArgument
    #: What a failed write notes as dropped (`Interrupted` is not: the leases expire).
    write_errors: type[BaseException] = Exception

    def __init__(self) -> None:
        self.ident: int | None = None

    def begin(self) -> None:
        """`run` starts, on this thread."""
        self.ident = threading.get_ident()

    def in_loop(self) -> bool:
        """Whether this is the loop's thread."""
        return threading.get_ident() == self.ident

    @staticmethod
    def in_main() -> bool:
        """Whether a signal can reach this thread's wait (the main thread's)."""
        return threading.current_thread() is threading.main_thread()

    @staticmethod
    def guard(loop: Callable[[], None], cancelled: Callable[[], None]) -> None:
        """Run ``loop`` (a thread is not cancelled: ``cancelled`` is for `AsyncRunner`)."""
        loop()

    def install_signals(self, on_signal: Callable[[int], bool]) -> Callable[[], None] | None:
        """SIGTERM and SIGINT call ``on_signal``, which says whether to break the wait."""
        if not self.in_main():
            return None

        def break_wait(signum: int) -> None:
            if on_signal(signum):
                raise Interrupted(signal.Signals(signum).name)

        return install_stop_signals(break_wait)


class AsyncRunner:
    """`Runner` for `AsyncWorker`: the task that runs `run`, which a signal (or the end of
    the grace period) cancels to break a statement that hangs; `guard` turns that
    cancellation into `Interrupted`.

    Examples:
        >>> async def main():
        ...     runner = AsyncRunner()
        ...     runner.begin()
        ...     return runner.in_loop()
        >>> asyncio.run(main())
        True
    """

    busy_error: type[Exception] = RuntimeError
    write_errors: type[BaseException] = BaseException

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.interrupted = False

    def begin(self) -> None:
        """`run` starts, in the current task."""
        self.task = asyncio.current_task()
        self.interrupted = False

    def in_loop(self) -> bool:
        """Whether the current task runs `run`."""
        return asyncio.current_task() is self.task

    @staticmethod
    def in_main() -> bool:
        """True: a signal handler runs on the loop, whatever task waits."""
        return True

    def interrupt(self) -> None:
        """Cancel `run`'s task, which `guard` turns into `Interrupted`."""
        if self.task is not None:
            self.interrupted = True
            self.task.cancel()

    async def guard(
        self, loop: Callable[[], Awaitable[None]], cancelled: Callable[[], Awaitable[None]]
    ) -> None:
        """Await ``loop``: our own cancellation raises `Interrupted`; another's awaits
        ``cancelled`` (release what is held) and propagates."""
        try:
            await loop()
        except asyncio.CancelledError:
            if not self.interrupted or self.task is None:
                await cancelled()
                raise
            self.task.uncancel()
            raise Interrupted("cancelled") from None

    def install_signals(self, on_signal: Callable[[int], bool]) -> Callable[[], None] | None:
        """SIGTERM and SIGINT, on the loop, call ``on_signal``: True cancels `run`'s task."""
        if threading.current_thread() is not threading.main_thread():
            return None
        loop = asyncio.get_running_loop()

        def handler(signum: int) -> None:
            if on_signal(signum):
                self.interrupt()

        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for sig in previous:
                loop.add_signal_handler(sig, handler, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not a Unix loop
            return None

        def restore() -> None:
            for sig, old in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, old)

        return restore


class Keeper:
    """`Worker`'s keeper thread (heartbeats, reclaims, vacuum, prune, schedules).

    Examples:
        keeper = Keeper()
        keeper.start(worker._keep)
        keeper.join(worker)
    """

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None

    def start(self, keep: Callable[[], None]) -> None:
        """Run ``keep`` in a daemon thread."""
        self.thread = threading.Thread(target=keep, name="sa-outbox-keeper", daemon=True)
        self.thread.start()

    def join(self, worker: Driver) -> None:
        """Wait for the keeper to end after its chore; one stuck on a dead network is broken
        after a second (its connection's socket shut down), and waited for a few more."""
        keeper = self.thread
        if keeper is None:
            return
        keeper.join(1.0)
        if not keeper.is_alive() or keeper.ident is None:
            return
        for conn in in_use(worker.engine, [keeper.ident]):
            where = describe(conn)
            log.warning(
                "worker %s: its keeper still waits on a statement (%s) on %s: %s",
                worker.worker_id,
                worker._chore,
                where,
                interrupt(conn),
            )
        keeper.join(5.0)


class AsyncKeeper:
    """`Keeper` for `AsyncWorker`: a task of its loop.

    Examples:
        keeper = AsyncKeeper()
        keeper.start(worker._keep)
        await keeper.join(worker)
    """

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    def start(self, keep: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``keep`` as a task."""
        self.task = asyncio.get_running_loop().create_task(keep(), name="sa-outbox-keeper")

    async def join(self, worker: Driver) -> None:
        """Wait a second for the keeper to end after its chore, then cancel it and wait two
        more (psycopg then tries to cancel the statement)."""
        keeper = self.task
        if keeper is None:
            return
        done, _ = await asyncio.wait({keeper}, timeout=1.0)
        if not done:
            log.warning("async worker %s: its keeper still waits: cancelled", worker.worker_id)
            keeper.cancel()
            await asyncio.wait({keeper}, timeout=2.0)
        if keeper.done() and not keeper.cancelled():
            keeper.exception()  # retrieved: the keeper logs its own failures


def _past_grace(since: float, deadline: float) -> bool:
    # A statement begun before the end of the grace period gets a second more; the final
    # write (the releases of the jobs still running) a few seconds.
    limit = 1.0 if since < deadline else FINAL_WRITE_TIMEOUT
    return time.monotonic() - max(since, deadline) >= limit


class Grace:
    """`Worker`'s grace-period watch, a thread of `run`: at the stop request it logs what the
    worker waits for; once the grace period is over, a statement the loop still waits on (a
    network that stopped answering, a lock) is broken — cancelled, its socket shut down —
    so that `run` returns instead of waiting as long as TCP allows.

    Examples:
        grace = Grace(worker)
        grace.start(); grace.requested(first=True); grace.end()
    """

    def __init__(self, worker: Driver) -> None:
        self._worker = worker
        self._done = threading.Event()
        self._requested_at: float | None = None  # time.monotonic() at the first stop()

    def reset(self) -> None:
        """`run` starts: no stop request yet."""
        self._requested_at = None
        self._done.clear()

    def start(self) -> None:
        """`run` has connected: watch for a stop request."""
        threading.Thread(target=self._watch, name="sa-outbox-grace", daemon=True).start()

    def requested(self, first: bool) -> None:
        """`stop` was called (maybe from a signal handler: no lock taken here)."""
        if self._requested_at is None:
            self._requested_at = time.monotonic()

    def end(self) -> None:
        """`run` ends: so does the watch."""
        self._done.set()

    def _watch(self) -> None:
        # It polls the stop request: a signal handler must not take a lock (an Event's) that
        # the same handler, interrupted by a second signal, may be holding.
        worker = self._worker
        while self._requested_at is None:
            if self._done.wait(0.25):
                return
        with worker._gate:
            worker._log_stopping(self._stuck())
        deadline = self._requested_at + worker.settings.grace
        if self._done.wait(max(0.0, deadline - time.monotonic())):
            return
        while not self._done.is_set():
            since = worker._db_since
            if since is not None and _past_grace(since, deadline):
                self._break_loop(since)
                return
            self._done.wait(0.1)

    def _stuck(self) -> list[str]:
        """What the loop and the keeper wait on for more than half a second, for the log."""
        worker, now = self._worker, time.monotonic()
        keeper = worker._keeper.thread
        stuck = []
        for who, ident, since, what in (
            ("its loop", worker._runner.ident, worker._db_since, worker._db_operation),
            ("its keeper", keeper and keeper.ident, worker._chore_since, worker._chore),
        ):
            if ident is None or since is None or now - since < 0.5:
                continue
            connections = in_use(worker.engine, [ident])
            where = describe(connections[0]) if connections else "a connection being opened"
            stuck.append(f"{who} waits on a statement ({what}, {now - since:.1f} s) on {where}")
        return stuck

    def _break_loop(self, since: float) -> None:
        worker = self._worker
        with worker._gate:
            worker._request_stop(True)  # give up writing: the next failure ends the loop
            worker._gate.notify_all()
        ident = worker._runner.ident
        connections = [] if ident is None else in_use(worker.engine, [ident])
        waited = time.monotonic() - since
        if not connections:
            log.warning(
                "worker %s: grace period over; its loop still waits on the database (%s, "
                "%.1f s): connecting, which connect_timeout bounds",
                worker.worker_id,
                worker._db_operation,
                waited,
            )
        for conn in connections:
            worker._log_broken(waited, describe(conn), interrupt(conn))


class AsyncGrace:
    """`Grace` for `AsyncWorker`: at the first stop request it logs what the worker waits
    for, and starts a task that, once the grace period is over, shuts down the socket of a
    statement the loop still waits on (or, on a connection of a transaction, cancels the
    loop's task), so that `run` returns.

    Examples:
        grace = AsyncGrace(worker)
        grace.start(); grace.requested(first=True); grace.end()
    """

    def __init__(self, worker: Driver) -> None:
        self._worker = worker
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        """`run` starts: no watch yet."""
        self._task = None

    def start(self) -> None:
        """`run` has connected (the watch starts at the stop request)."""

    def requested(self, first: bool) -> None:
        """`stop` was called, on the loop: the first time, log and start watching."""
        worker = self._worker
        if not (first and worker._running and self._task is None):
            return
        since = worker._db_since
        stuck = []
        if since is not None and time.monotonic() - since >= 0.5:
            conn = worker._held.driver_connection()
            where = "a connection being opened" if conn is None else describe(conn)
            waited = time.monotonic() - since
            stuck.append(
                f"its loop waits on a statement ({worker._db_operation}, {waited:.1f} s) on {where}"
            )
        worker._log_stopping(stuck)
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="sa-outbox-grace")

    def end(self) -> None:
        """`run` ends: so does the watch."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        worker = self._worker
        deadline = time.monotonic() + worker.settings.grace
        await asyncio.sleep(worker.settings.grace)
        while worker._running:
            since = worker._db_since
            if since is not None and _past_grace(since, deadline):
                self._break_loop(since)
                return
            await asyncio.sleep(0.1)

    def _break_loop(self, since: float) -> None:
        worker = self._worker
        worker._request_stop(True)
        worker._gate.notify_all()
        conn = worker._held.driver_connection()
        waited = time.monotonic() - since
        if conn is None:
            worker._runner.interrupt()
            worker._log_broken(waited, "a connection of a transaction", "its task cancelled")
        else:
            worker._log_broken(waited, describe(conn), interrupt(conn))


def pool_connection(conn: Connection) -> Any:
    """The pool's connection under ``conn``.

    Examples:
        worker._warn_without_keepalives(pool_connection(conn))
    """
    return conn.connection


async def async_pool_connection(conn: AsyncConnection) -> Any:
    """`pool_connection` of an ``AsyncConnection``.

    Examples:
        worker._warn_without_keepalives(await async_pool_connection(conn))
    """
    return await conn.get_raw_connection()


def open_listener(worker: Driver) -> Listener | None:
    """`Worker`'s LISTEN thread, started: on a connection of the engine's pool (detached:
    it never goes back), or a direct one to ``listen_url``.

    Examples:
        worker.listener = open_listener(worker)
    """
    ops = worker.core.ops
    return listen_on(
        worker.engine,
        worker.listen_url,
        ops.notify_channel,
        worker.settings.poll_interval,
        **worker._listener_callbacks(),
    )


def async_open_listener(worker: Driver) -> AsyncListener | None:
    """`open_listener` for `AsyncWorker`: a task on a psycopg ``AsyncConnection`` of its
    own; ``None`` (it polls) when the engine's driver is not psycopg.

    Examples:
        worker.listener = async_open_listener(worker)
    """
    ops = worker.core.ops
    return async_listen_on(
        worker.engine,
        worker.listen_url,
        ops.notify_channel,
        worker.settings.poll_interval,
        **worker._listener_callbacks(),
    )


def listen_on(
    engine: Any,
    listen_url: URL | None,
    channel_op: Callable[[], Op[str | None]],
    poll_interval: float,
    **callbacks: Any,
) -> Listener | None:
    """A `Listener` thread, started, on the channel ``channel_op`` finds: on a connection
    of ``engine``'s pool (detached: it never goes back), or a direct one to ``listen_url``.
    ``poll_interval`` is what its user polls at without it (for `async_listen_on`'s log).

    Examples:
        listener = listen_on(engine, None, ops.notify_channel, 1.0, on_notify=print)
    """

    def connect() -> Any:
        if listen_url is not None:  # a direct connection, past the engine's pooler
            import psycopg

            args, kwargs = listen_connect_args(listen_url.get_dialect()(), listen_url)
            return psycopg.connect(*args, **kwargs)
        raw = engine.raw_connection()
        conn = raw.driver_connection
        raw.detach()  # a LISTEN connection never goes back to the pool
        return conn

    def channel() -> str | None:
        with engine.begin() as conn:
            return run(conn, channel_op())

    def probe(channel: str) -> None:
        with engine.begin() as conn:
            conn.execute(text(PROBE_NOTIFY_SQL), {"channel": channel})

    listener = Listener(connect, channel, probe=probe, **callbacks)
    listener.start()
    return listener


def async_listen_on(
    engine: Any,
    listen_url: URL | None,
    channel_op: Callable[[], Op[str | None]],
    poll_interval: float,
    **callbacks: Any,
) -> AsyncListener | None:
    """`listen_on` for asyncio: an `AsyncListener` task on a psycopg ``AsyncConnection`` of
    its own; ``None`` (its user polls every ``poll_interval``) when the engine's driver is
    not psycopg and there is no ``listen_url``.

    Examples:
        listener = async_listen_on(async_engine, None, ops.notify_channel, 1.0, on_notify=print)
    """
    dialect = engine.dialect
    if dialect.driver != "psycopg" and listen_url is None:
        log.warning(
            "LISTEN needs the psycopg driver (the engine uses %s): polling every %g s",
            dialect.driver,
            poll_interval,
        )
        return None
    import psycopg

    if listen_url is not None:  # a direct connection, past the engine's pooler
        args, kwargs = listen_connect_args(listen_url.get_dialect()(), listen_url)
    else:
        # The engine's URL, with the client-side timeouts it leaves unset (see `harden`).
        args, kwargs = listen_connect_args(dialect, engine.url)

    async def connect() -> Any:
        return await psycopg.AsyncConnection.connect(*args, **kwargs)

    async def channel() -> str | None:
        async with engine.begin() as conn:
            return await arun(conn, channel_op())

    async def probe(channel: str) -> None:
        async with engine.begin() as conn:
            await conn.execute(text(PROBE_NOTIFY_SQL), {"channel": channel})

    listener = AsyncListener(connect, channel, probe=probe, **callbacks)
    listener.start()
    return listener
