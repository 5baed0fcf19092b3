"""Batches (``JobQueue.enqueue_batch`` / ``add_to_batch``) against a real PostgreSQL: a
callback job runs once, when the last of the batch's jobs has finished, and counts what
became of them; jobs join while it waits; a finished batch refuses them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from sa_outbox import (
    InvalidArgument,
    JobApp,
    JobContext,
    JobQueue,
    JobStatus,
    NewJob,
    PermanentError,
    Worker,
)

from .conftest import Job
from .helpers import job_row, jobs_by_status, wait_until
from .test_dependencies import JobDependency, dag_queue, deps_table, lock_waits
from .test_steps import NO_JITTER, JobStep, steps_table

__all__ = ["dag_queue", "deps_table", "steps_table"]  # fixtures, used below by name

WAIT = 20.0


def batch_app(calls: list[dict[str, int]], ran: list[str]) -> JobApp:
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep, dependencies=JobDependency)

    @app.handler("photo")
    def photo(job: JobContext) -> str:
        ran.append(job.payload["name"])
        if job.payload.get("broken"):
            raise PermanentError("not a photo")
        if job.payload.get("flaky") and job.attempts == 1:
            raise ConnectionError("storage busy")
        return str(job.payload["name"])

    @app.handler("album-ready")
    def album_ready(job: JobContext) -> None:
        counts = collections.Counter(job.parent_statuses().values())
        calls.append({str(status): n for status, n in counts.items()})
        ran.append("callback")

    return app


def photos(*names: str, **flags: Any) -> list[NewJob]:
    return [NewJob("photo", {"name": name, **flags.get(name, {})}) for name in names]


def test_the_callback_runs_once_after_the_last_job_and_counts_what_became_of_them(
    engine: Engine, dag_queue: JobQueue, clock: Any, make_worker: Callable[..., Worker]
) -> None:
    jobs = photos(
        "p1", "p2", "p3", "p4", "bad", "gone", "flaky", bad={"broken": True}, flaky={"flaky": True}
    )
    with engine.begin() as conn:
        batch = dag_queue.enqueue_batch(conn, jobs, callback=NewJob("album-ready", {}))
    assert len(batch.jobs) == 7 and job_row(engine, batch.jobs[0]).status == "pending"
    with engine.begin() as conn:
        dag_queue.cancel(conn, [batch.jobs[5]])
    calls: list[dict[str, int]] = []
    ran: list[str] = []
    worker = make_worker(batch_app(calls, ran))
    worker.drain(timeout=WAIT)
    assert calls == []  # "flaky" failed once: it waits for its retry, and so does the callback
    clock.advance(NO_JITTER.delay(1))
    worker.drain(timeout=WAIT)
    assert calls == [{"succeeded": 5, "failed": 1, "cancelled": 1}]
    assert ran[-1] == "callback" and ran.count("callback") == 1
    assert job_row(engine, batch.id).status == "succeeded"


def test_jobs_join_a_batch_while_it_waits_and_a_finished_batch_refuses_them(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        batch = dag_queue.enqueue_batch(conn, photos("p1"), callback=NewJob("album-ready", {}))
        joined = dag_queue.add_to_batch(conn, batch.id, photos("p2", "p3"))
    assert len(joined) == 2
    calls: list[dict[str, int]] = []
    ran: list[str] = []
    make_worker(batch_app(calls, ran)).drain(timeout=WAIT)
    assert calls == [{"succeeded": 3}] and ran[-1] == "callback"
    with engine.begin() as conn, pytest.raises(InvalidArgument, match=f"^batch {batch.id} is over"):
        dag_queue.add_to_batch(conn, batch.id, photos("late"))
    assert jobs_by_status(engine) == {"succeeded": 4}


def test_a_job_joining_while_the_last_one_finishes_holds_the_callback_back(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    """The joiner locks the callback's row: the release that the last job's worker runs
    waits for it, then sees a job it cannot see finished, and leaves the callback waiting."""
    with engine.begin() as conn:
        batch = dag_queue.enqueue_batch(conn, photos("p1"), callback=NewJob("album-ready", {}))
    calls: list[dict[str, int]] = []
    ran: list[str] = []
    worker = make_worker(batch_app(calls, ran), kinds=["photo"])
    with engine.begin() as conn:
        dag_queue.add_to_batch(conn, batch.id, [])  # the lock alone, held until the commit
        drained = threading.Thread(target=worker.drain, kwargs={"timeout": WAIT})
        drained.start()  # p1 succeeds; its release waits for this transaction
        wait_until(lambda: lock_waits(engine) >= 1, "the release waiting for the lock")
        late = dag_queue.add_to_batch(conn, batch.id, photos("late"))
    drained.join(WAIT)
    assert job_row(engine, late[0]).status == "succeeded"  # the same drain ran it
    worker.drain(timeout=WAIT)
    make_worker(batch_app(calls, ran)).drain(timeout=WAIT)
    assert calls == [{"succeeded": 2}] and ran == ["p1", "late", "callback"]


def test_eight_workers_on_a_batch_run_its_callback_once(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    names = [f"p{i}" for i in range(40)]
    with engine.begin() as conn:
        batch = dag_queue.enqueue_batch(conn, photos(*names), callback=NewJob("album-ready", {}))
    calls: list[dict[str, int]] = []
    ran: list[str] = []
    app = batch_app(calls, ran)
    workers = [make_worker(app, batch=3) for _ in range(8)]
    start = threading.Barrier(len(workers))

    def drain(worker: Worker) -> None:
        start.wait()
        worker.drain(timeout=WAIT)

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    if "callback" not in ran:  # released after every drain had seen an empty queue
        make_worker(app).drain(timeout=WAIT)
    assert calls == [{"succeeded": 40}] and ran.count("callback") == 1
    assert job_row(engine, batch.id).status == JobStatus.SUCCEEDED


def test_a_batch_needs_a_job_and_the_dependencies_table(
    engine: Engine, dag_queue: JobQueue
) -> None:
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=r"^a batch needs at least one job"):
            dag_queue.enqueue_batch(conn, [], callback=NewJob("album-ready", {}))
        with pytest.raises(InvalidArgument, match=r"^enqueue_batch needs the dependencies"):
            JobQueue(Job).enqueue_batch(conn, photos("p"), callback=NewJob("album-ready", {}))
