# generated from _results_async.py by tools/async_to_sync.py — do not edit
# (edit _results_async.py and run `python tools/async_to_sync.py`)
"""`JobResults`: wait for jobs to finish and read what they returned, generated
from `AsyncJobResults` (``_results_async.py``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL

from .._connect_args import check_listen_url
from .._validation import as_uuid
from ..ops import JobOps, run
from ..queue import JobResult
from ..schema import resolve_table
from ..statements import parse_done_payload
from ._results import check_engine, check_wait, outcome
from ._runtime import listen_on, wait_event
from .errors import JobNotFound, ResultTimeout

if TYPE_CHECKING:  # only for the annotations
    from sqlalchemy import Engine

    from .listen import Listener

__all__ = ["JobResults"]

log = logging.getLogger("sa_outbox.worker")

#: How long a first wait gives the LISTEN connection to start before it reads and polls.
LISTEN_START_SECONDS = 5.0


class JobResults:
    """Wait for jobs to finish and read what their handlers returned (docs/results.md).

    A worker whose `JobApp` has the steps table (``JobApp(Job, steps=JobStep)``) records
    each handler's return value (JSON) with its job's completion, and announces every job it
    finishes on the table's "done" channel at commit. `result` waits for one job: it holds
    no transaction, and is woken by that notification, on one ``LISTEN`` connection shared
    by all the waits of this object (opened at the first, closed by `close`). Behind a
    connection pooler in transaction mode, where ``LISTEN`` hears nothing, it reads the job
    every ``poll_interval`` instead, as a worker claims; ``listen_url=`` gives it a direct
    connection to PostgreSQL for the ``LISTEN``. ``recheck`` bounds a wait between two reads
    even while listening (a job finished by hand in SQL announces nothing). Given
    ``dependencies=``, a job still waiting for others reads as ``pending`` (not unknown).

    Examples:
        results = JobResults(engine, Job, steps=JobStep)
        with engine.begin() as conn:
            job = queue.enqueue(conn, "quote", {"order": 7})
        value = results.result(job.id, timeout=30)  # what the handler returned
        results.close()
    """

    def __init__(
        self,
        engine: Engine,
        jobs: object,
        *,
        steps: object,
        dependencies: object | None = None,
        listen_url: str | URL | None = None,
        poll_interval: dt.timedelta | float = 1.0,
        recheck: dt.timedelta | float = 30.0,
    ) -> None:
        check_engine(engine, "JobResults")
        self.engine = engine
        self._ops = JobOps(jobs)
        self._steps = resolve_table(steps)
        self._dependencies = None if dependencies is None else resolve_table(dependencies)
        self.listen_url = check_listen_url(listen_url)
        self.poll_interval = check_wait(poll_interval, "poll_interval")
        self.recheck = check_wait(recheck, "recheck")
        self._waiters: dict[uuid.UUID, set[threading.Event]] = {}
        self._lock = threading.Lock()  # JobResults' listener calls back from its thread
        self._listener: Listener | None = None
        self._started = False
        self._warned = False

    def read(self, job_id: uuid.UUID) -> JobResult | None:
        """Where the job stands and, once it ``succeeded``, what it returned; ``None`` for
        an unknown (or pruned) job. One read, no wait.

        Examples:
            found = results.read(job_id)
            found.status, found.value
            # -> (<JobStatus.SUCCEEDED: 'succeeded'>, {'total': 42})
        """
        job_id = as_uuid(job_id, "job id")
        with self.engine.connect() as conn:
            found = run(
                conn, self._ops.results(self._steps, [job_id], dependencies=self._dependencies)
            )
        return found.get(job_id)

    def result(self, job_id: uuid.UUID, *, timeout: dt.timedelta | float) -> Any:
        """What job ``job_id``'s handler returned, once it ``succeeded`` (``None`` when it
        returned nothing); waits for it to finish, up to ``timeout``.

        Raises `JobFailed` when it ``failed`` or was ``cancelled`` (with its last error),
        `ResultTimeout` when it has not finished within ``timeout`` (it goes on; wait again
        later), `JobNotFound` when there is no such job (or it was pruned).

        Examples:
            try:
                total = results.result(job_id, timeout=30)
            except JobFailed as exc:
                print(exc.status, exc.error)
        """
        job_id = as_uuid(job_id, "job id")
        seconds = check_wait(timeout, "timeout")
        deadline = time.monotonic() + seconds
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(event)
        try:
            listener = self._listening(deadline)
            while True:
                event.clear()  # before the read: a notification after it wakes the wait
                found = self.read(job_id)
                if found is None:
                    raise JobNotFound(f"no job {job_id} in {self._ops.table.fullname}")
                if found.finished:
                    return outcome(found)
                left = deadline - time.monotonic()
                if left <= 0:
                    status = found.status.value
                    raise ResultTimeout(
                        f"job {job_id} did not finish within {seconds:g} s (it is {status})"
                    )
                heard = listener is not None and listener.listening.is_set()
                wait = min(left, self.recheck if heard else self.poll_interval)
                wait_event(event, wait)
        finally:
            with self._lock:
                waiting = self._waiters.get(job_id)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[job_id]

    def close(self) -> None:
        """Close the LISTEN connection; a later `result` opens it again.

        Examples:
            results.close()
        """
        listener, self._listener, self._started = self._listener, None, False
        if listener is not None:
            listener.stop()

    def __enter__(self) -> JobResults:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _listening(self, deadline: float) -> Listener | None:
        """The LISTEN connection, started at the first wait, and given up to
        `LISTEN_START_SECONDS` to listen, so that the first read comes after the LISTEN."""
        with self._lock:  # one listener, whichever wait starts it
            if not self._started:
                self._started = True
                self._listener = listen_on(
                    self.engine,
                    self.listen_url,
                    self._ops.done_channel,
                    self.poll_interval,
                    on_notify=self._notified,
                    on_connect=self._wake_all,
                    on_deaf=self._deaf,
                )
        listener = self._listener
        if listener is not None and not listener.listening.is_set():
            left = min(deadline - time.monotonic(), LISTEN_START_SECONDS)
            wait_event(listener.listening, max(left, 0.0))
        return listener

    def _notified(self, payload: str) -> None:
        with self._lock:
            for job_id in parse_done_payload(payload):
                for event in self._waiters.get(job_id, ()):
                    event.set()

    def _wake_all(self) -> None:
        # Listening (again): what was announced while nobody listened is lost, so every
        # wait reads its job once more.
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()

    def _deaf(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "job results: notifications do not reach the LISTEN connection, which goes "
                "through a connection pooler (PgBouncer in transaction mode?): waits read "
                "their job every %g s. Give it a direct connection: listen_url= "
                "(docs/pgbouncer.md)",
                self.poll_interval,
            )
        self._wake_all()
