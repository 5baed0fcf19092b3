"""`Supervisor`: N worker processes under one parent, for handlers that need several cores.

One Python process runs its handlers on one core at a time (the GIL); CPU-bound handlers
need processes, as Celery's prefork pool or Oban Pro's multi-process execution give them.
The supervisor starts ``processes`` children, each a `Worker` (or `AsyncWorker`, for an app
with ``async def`` handlers) with its own engine (made with `sa_outbox.connect_args`) and
worker id (``{worker_id}-{n}``). It restarts a child that died, with a backoff (1 s,
doubling up to 30 s, back to 1 s once a child ran for a minute). It forwards SIGTERM and
SIGINT to every child, so each stops gracefully; a second signal stops them now. It holds
no database connection itself.

Children are started with the ``spawn`` method: each imports the app afresh from
``target`` (``module:attribute``), so nothing a fork would share (connections, threads)
leaks into them.

Examples:
    supervisor = Supervisor("myapp.tasks:app", os.environ["DATABASE_URL"], processes=2,
                            worker_options={"concurrency": 4})
    supervisor.run()  # until SIGTERM / SIGINT / supervisor.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from .._asyncio_ext import create_async_engine
from .._connect_args import connect_args
from .._exceptions import InvalidArgument
from .._loading import load_instance
from .._pooler import prepare_for_pooler
from .._validation import count
from ..statements import WORKER_APPLICATION_PREFIX
from ._settings import default_worker_id
from ._signals import install_stop_signals
from .aio import AsyncWorker
from .registry import JobApp
from .sync import Worker

__all__ = ["Supervisor"]

log = logging.getLogger("sa_outbox.worker")

#: A child that ran this long before it died is restarted at once the next time.
_HEALTHY_RUN = 60.0
_FIRST_BACKOFF = 1.0
_MAX_BACKOFF = 30.0


def _load_app(target: str) -> JobApp:
    app: JobApp = load_instance(target, JobApp, "a JobApp", example="myapp.tasks:app")
    return app


def _watch_parent(parent: int, stop: Callable[[], None]) -> None:
    # A supervisor killed with SIGKILL cannot stop its children: each notices it is orphaned.
    while os.getppid() == parent:
        time.sleep(1.0)
    log.warning("worker: its supervisor (pid %d) is gone; stopping", parent)
    stop()


def _named(url: str, worker_id: str) -> dict[str, object]:
    # The child names its connections, so that ``sa-outbox status`` lists it as connected,
    # unless the URL gives a name of its own.
    args = connect_args()
    if "application_name" not in make_url(url).query:
        args["application_name"] = f"{WORKER_APPLICATION_PREFIX}{worker_id}"
    return args


def _run_child(target: str, url: str, options: dict[str, Any], worker_id: str, parent: int) -> None:
    # The child's whole life: load the app, build its engine, run one worker until stopped.
    # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which passes
    # it on once (else each child would see it twice, and skip its grace period).
    os.setpgrp()
    logging.basicConfig(level=options.pop("log_level", "INFO"))
    app = _load_app(target)
    if any(app[kind].is_async for kind in app.kinds):

        async def run_async() -> None:
            engine = create_async_engine(url, connect_args=_named(url, worker_id))
            prepare_for_pooler(engine)
            worker = AsyncWorker(app, engine, worker_id=worker_id, **options)
            loop = asyncio.get_running_loop()
            threading.Thread(
                target=_watch_parent,
                args=(parent, lambda: loop.call_soon_threadsafe(worker.stop)),
                daemon=True,
            ).start()
            try:
                await worker.run()
            finally:
                await engine.dispose()

        asyncio.run(run_async())
        return
    engine = create_engine(url, connect_args=_named(url, worker_id))
    prepare_for_pooler(engine)
    try:
        worker = Worker(app, engine, worker_id=worker_id, **options)
        threading.Thread(target=_watch_parent, args=(parent, worker.stop), daemon=True).start()
        worker.run()
    finally:
        engine.dispose()


class Supervisor:
    """Run ``processes`` worker processes for the `JobApp` at ``target`` until stopped.

    ``worker_options`` go to each child's `Worker` (``concurrency``, ``queues``, ``lease``…;
    ``worker_id`` is the supervisor's own, suffixed per child). ``run`` returns after every
    child stopped. `stop` may be called from another thread.

    Examples:
        Supervisor("myapp.tasks:app", url, processes=4).run()
    """

    def __init__(
        self,
        target: str,
        database_url: str,
        *,
        processes: int,
        worker_options: Mapping[str, Any] | None = None,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        log_level: str = "INFO",
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.processes = count(processes, "processes", maximum=256)
        _load_app(target)  # a wrong target fails here, before any child starts
        options = dict(worker_options or {})
        if "worker_id" in options:
            raise InvalidArgument("give the supervisor's worker_id=, not worker_options'")
        options["install_signal_handlers"] = True
        options["log_level"] = log_level
        self.target = target
        self.database_url = database_url
        self.options = options
        self.worker_id = worker_id or default_worker_id()
        self.install_signal_handlers = install_signal_handlers
        self.timer = timer
        self._context = multiprocessing.get_context("spawn")
        self._children: dict[int, BaseProcess] = {}
        self._started_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._due: dict[int, float] = {}
        self._stopping = 0  # how many stop requests
        self._wake = threading.Event()
        #: How many children were started again after one died.
        self.restarts = 0

    def __repr__(self) -> str:
        return f"Supervisor({self.target!r}, processes={self.processes})"

    @property
    def pids(self) -> dict[int, int | None]:
        """The process id of each child by its number (``None``: not running now)."""
        return {n: (child.pid if child.is_alive() else None) for n, child in self._children.items()}

    def _start(self, n: int) -> None:
        child = self._context.Process(
            target=_run_child,
            args=(
                self.target,
                self.database_url,
                dict(self.options),
                f"{self.worker_id}-{n}",
                os.getpid(),
            ),
            name=f"sa-outbox-worker-{n}",
        )
        child.start()
        self._children[n] = child
        self._started_at[n] = self.timer()
        log.info("supervisor: started worker %d (pid %s)", n, child.pid)

    def run(self) -> int:
        """Start the children, keep them running, stop them on a signal; returns 0, or 1 if
        a child did not stop within its grace period and was killed.

        Examples:
            status = Supervisor("myapp.tasks:app", url, processes=2).run()
        """
        restore = self._install_signals() if self.install_signal_handlers else None
        try:
            for n in range(self.processes):
                self._start(n)
            self._watch()
            return self._wait_for_children()
        finally:
            if restore is not None:
                restore()

    def _watch(self) -> None:
        while not self._stopping:
            now = self.timer()
            for n, child in list(self._children.items()):
                if child.is_alive() or n in self._due:
                    continue
                ran = now - self._started_at[n]
                wait_s = self._backoff.get(n, _FIRST_BACKOFF) if ran < _HEALTHY_RUN else 0.0
                self._backoff[n] = min(max(wait_s, _FIRST_BACKOFF) * 2, _MAX_BACKOFF)
                self._due[n] = now + wait_s
                log.warning(
                    "supervisor: worker %d (pid %s) exited with %s; restarting in %g s",
                    n,
                    child.pid,
                    child.exitcode,
                    wait_s,
                )
            for n, due in list(self._due.items()):
                if now >= due and not self._stopping:
                    del self._due[n]
                    self.restarts += 1
                    self._start(n)
            sentinels = [c.sentinel for c in self._children.values() if c.is_alive()]
            timeout = min([d - self.timer() for d in self._due.values()], default=1.0)
            self._wake.clear()
            if sentinels:
                wait(sentinels, timeout=max(0.0, min(timeout, 1.0)))
            else:
                self._wake.wait(max(0.0, min(timeout, 1.0)))

    def _wait_for_children(self) -> int:
        grace = float(self.options.get("grace", 10.0))
        deadline = self.timer() + grace + max(grace, 5.0)
        status = 0
        for child in self._children.values():
            child.join(max(0.0, deadline - self.timer()))
            if child.is_alive():
                log.error("supervisor: worker pid %s did not stop in time; killing it", child.pid)
                child.kill()
                child.join()
                status = 1
        return status

    def stop(self, *, now: bool = False) -> None:
        """Stop every child gracefully (a second call, or ``now``: at once). Thread-safe.

        Examples:
            threading.Timer(60, supervisor.stop).start()
        """
        self._stopping += 2 if now else 1
        for child in self._children.values():
            if child.is_alive() and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)
                    if self._stopping > 1:
                        os.kill(child.pid, signal.SIGTERM)
        self._wake.set()

    def _install_signals(self) -> Callable[[], None]:
        def on_signal(signum: int) -> None:
            log.info("supervisor: %s received", signal.Signals(signum).name)
            self.stop()

        return install_stop_signals(on_signal)
