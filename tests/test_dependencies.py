"""Jobs that wait for jobs (``enqueue(..., after=[...])``) against a real PostgreSQL.

A dependant waits in the dependencies table, never in the job table; it is released
``pending`` when its last parent succeeds, or ``cancelled`` / ``failed`` / run anyway by its
``on_failure`` policy when a parent does not; the worker releases dependants right after the
write that finished their parents, and its keeper sweeps for what a crash left.
"""

from __future__ import annotations

import collections
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import (
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobQueue,
    JobStatus,
    PermanentError,
    Pruner,
    Retention,
    Worker,
)
from sa_outbox.schema import JobDependencyMixin
from sa_outbox.statements import CANCELLED_WAITING, PARENT_FAILED, NewJob
from sa_outbox.worker import JobResults
from sa_outbox.worker._core import SWEEP_INTERVAL

from . import worker_app
from .conftest import TEST_SCHEMA, Job
from .helpers import job_row, jobs_by_status, wait_until
from .test_steps import NO_JITTER, JobStep, steps_table
from .test_worker_faults import counts as fault_counts
from .test_worker_faults import ledger_lines, start, stop, worker_schema

__all__ = ["steps_table", "worker_schema"]  # fixtures, used below by name

WAIT = 20.0
#: Batches in the SIGKILL test, 5 jobs and a callback each.
BATCHES = 3


class DependencyBase(DeclarativeBase):
    pass


class JobDependency(JobDependencyMixin, DependencyBase):
    __tablename__ = "job_dependencies"
    __table_schema__ = TEST_SCHEMA


@pytest.fixture
def deps_table(engine: Engine, steps_table: None) -> Iterator[None]:
    DependencyBase.metadata.create_all(engine)
    try:
        yield
    finally:
        DependencyBase.metadata.drop_all(engine)


@pytest.fixture
def dag_queue(clock: Any, deps_table: None) -> JobQueue:
    return JobQueue(Job, clock=clock, steps=JobStep, dependencies=JobDependency)


def dag_app(ran: list[str], *, failing: set[str] = frozenset()) -> JobApp:  # type: ignore[assignment]
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep, dependencies=JobDependency)

    @app.handler("node")
    def node(job: JobContext) -> Any:
        name = job.payload["name"]
        ran.append(name)
        if name in failing:
            raise PermanentError(f"{name} broke")
        parents = job.parent_results()
        return {"name": name, "after": sorted(r["name"] for r in parents.values() if r)}

    return app


def in_jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Job.__table__)).scalar_one()


def waiting(engine: Engine) -> int:
    t = JobDependency.__table__
    with engine.connect() as conn:
        stmt = select(func.count()).select_from(t).where(t.c.released_at.is_(None))
        return conn.execute(stmt).scalar_one()


def test_a_dag_runs_each_job_after_the_jobs_it_waits_for(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:  # one transaction: A; B and C after A; D after B and C
        a = dag_queue.enqueue(conn, "node", {"name": "a"}).id
        b = dag_queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        c = dag_queue.enqueue(conn, "node", {"name": "c"}, after=[a]).id
        d = dag_queue.enqueue(conn, "node", {"name": "d"}, after=[b, c]).id
    assert in_jobs(engine) == 1 and waiting(engine) == 3  # only A can be claimed

    ran: list[str] = []
    assert make_worker(dag_app(ran)).drain(timeout=WAIT) == 4
    assert ran[0] == "a" and set(ran[1:3]) == {"b", "c"} and ran[3] == "d"
    assert jobs_by_status(engine) == {"succeeded": 4} and waiting(engine) == 0
    with engine.connect() as conn:
        found = dag_queue.read_result(conn, d)
    assert found is not None and found.value == {"name": "d", "after": ["b", "c"]}


def test_a_parent_that_fails_cancels_fails_or_lets_its_dependants_run(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        a = dag_queue.enqueue(conn, "node", {"name": "a"}).id
        cancelled = dag_queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        failed = dag_queue.enqueue(conn, "node", {"name": "c"}, after=[a], on_failure="fail").id
        anyway = dag_queue.enqueue(conn, "node", {"name": "d"}, after=[a], on_failure="run").id
        below = dag_queue.enqueue(conn, "node", {"name": "e"}, after=[cancelled, anyway]).id

    ran: list[str] = []
    make_worker(dag_app(ran, failing={"a"})).drain(timeout=WAIT)
    assert ran == ["a", "d"]
    states = {
        name: job_row(engine, i)
        for name, i in [("b", cancelled), ("c", failed), ("d", anyway), ("e", below)]
    }
    assert {n: r.status for n, r in states.items()} == {
        "b": "cancelled",
        "c": "failed",
        "d": "succeeded",
        "e": "cancelled",
    }
    # each names the job that did not succeed
    assert states["b"].last_error == f"{PARENT_FAILED}: {a}" and states["b"].attempts == 0
    assert states["e"].last_error == f"{PARENT_FAILED}: {cancelled}"  # b's fate decided e's
    assert waiting(engine) == 0


def test_a_dependant_of_finished_jobs_is_decided_when_enqueued(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        ok = dag_queue.enqueue(conn, "node", {"name": "ok"}).id
        bad = dag_queue.enqueue(conn, "node", {"name": "bad"}).id
    make_worker(dag_app([], failing={"bad"})).drain(timeout=WAIT)
    with engine.begin() as conn:
        ready = dag_queue.enqueue(conn, "node", {"name": "x"}, after=[ok]).id
        doomed = dag_queue.enqueue(conn, "node", {"name": "y"}, after=[ok, bad]).id
    assert job_row(engine, ready).status == "pending"
    assert job_row(engine, doomed).status == "cancelled"
    assert waiting(engine) == 0


def test_bad_dependencies_are_refused_in_one_line_before_any_row(
    engine: Engine, dag_queue: JobQueue
) -> None:
    with engine.begin() as conn:
        parent = dag_queue.enqueue(conn, "node", {"name": "p"}).id
    nobody = uuid.uuid4()
    with (
        engine.begin() as conn,
        pytest.raises(InvalidArgument, match=f"^after= names jobs that do not exist: {nobody}$"),
    ):
        dag_queue.enqueue(conn, "node", {}, after=[parent, nobody])
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=r"^on_failure must be one of cancel, fail, run"):
            dag_queue.enqueue(conn, "node", {}, after=[parent], on_failure="ignore")
        with pytest.raises(InvalidArgument, match="cannot have a deduplication_key"):
            dag_queue.enqueue(conn, "node", {}, after=[parent], deduplication_key="k")
        with pytest.raises(InvalidArgumentType, match=r"^after must be a list of job ids"):
            dag_queue.enqueue(conn, "node", {}, after=parent)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"^enqueue with after= needs the dependencies"):
            JobQueue(Job).enqueue(conn, "node", {}, after=[parent])
    assert in_jobs(engine) == 1 and waiting(engine) == 0


def test_cancelling_a_waiting_job_cancels_it_and_what_waits_for_it(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        a = dag_queue.enqueue(conn, "node", {"name": "a"}).id
        b = dag_queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        c = dag_queue.enqueue(conn, "node", {"name": "c"}, after=[b]).id
    with engine.begin() as conn:
        result = dag_queue.cancel(conn, [b])
    assert result.cancelled == [b] and result.unknown == []
    assert job_row(engine, b).status == "cancelled" and job_row(engine, c).status == "cancelled"
    assert job_row(engine, b).last_error == CANCELLED_WAITING
    assert job_row(engine, c).last_error == f"{PARENT_FAILED}: {b}"
    ran: list[str] = []
    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert ran == ["a"] and waiting(engine) == 0


def test_a_waiting_job_reads_pending_and_its_result_can_be_waited_for(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        a = dag_queue.enqueue(conn, "node", {"name": "a"}).id
        b = dag_queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
    with engine.connect() as conn:
        found = dag_queue.read_result(conn, b)
    assert found is not None and found.status is JobStatus.PENDING and found.waiting
    got: list[Any] = []
    with JobResults(engine, Job, steps=JobStep, dependencies=JobDependency) as results:
        thread = threading.Thread(target=lambda: got.append(results.result(b, timeout=WAIT)))
        thread.start()
        make_worker(dag_app([])).drain(timeout=WAIT)
        thread.join(WAIT)
    assert got == [{"name": "b", "after": ["a"]}]


def test_eight_workers_finishing_a_fan_in_release_its_last_job_once(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        parents = [dag_queue.enqueue(conn, "node", {"name": f"p{i}"}).id for i in range(64)]
        last = dag_queue.enqueue(conn, "node", {"name": "last"}, after=parents).id
    ran: list[str] = []
    app = dag_app(ran)
    workers = [make_worker(app, batch=2) for _ in range(8)]
    start = threading.Barrier(8)

    def drain(worker: Worker) -> None:
        start.wait()
        worker.drain(timeout=WAIT)

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    if "last" not in ran:  # its release came after every drain had seen an empty queue
        make_worker(app).drain(timeout=WAIT)
    counts = collections.Counter(ran)
    assert counts["last"] == 1 and len(counts) == 65 and set(counts.values()) == {1}
    assert job_row(engine, last).status == "succeeded" and waiting(engine) == 0


def test_a_dependant_added_while_its_parent_runs_is_released_by_that_run(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    """The child's transaction locks the running parent FOR SHARE: the worker's write of the
    parent's success waits for its commit, and its release then sees the child."""
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep, dependencies=JobDependency)
    running, finish = threading.Event(), threading.Event()
    ran: list[str] = []

    @app.handler("node")
    def node(job: JobContext) -> None:
        ran.append(job.payload["name"])
        if job.payload["name"] == "parent":
            running.set()
            assert finish.wait(WAIT)

    with engine.begin() as conn:
        parent = dag_queue.enqueue(conn, "node", {"name": "parent"}).id
    worker = make_worker(app)
    drained = threading.Thread(target=worker.drain, kwargs={"timeout": WAIT})
    drained.start()
    assert running.wait(WAIT)
    with engine.begin() as conn:
        child = dag_queue.enqueue(conn, "node", {"name": "child"}, after=[parent]).id
        finish.set()  # the parent's handler returns; its write waits for this commit
        wait_until(lambda: lock_waits(engine) >= 1, "the worker's write waiting for the lock")
    drained.join(WAIT)
    assert job_row(engine, child).status in ("pending", "succeeded")  # released, no sweep
    worker.drain(timeout=WAIT)
    assert ran == ["parent", "child"] and jobs_by_status(engine) == {"succeeded": 2}


def lock_waits(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        ).scalar_one()


def test_the_sweep_releases_what_a_lost_release_left_waiting(
    engine: Engine, dag_queue: JobQueue, clock: Any, make_worker: Callable[..., Worker]
) -> None:
    """A worker killed between its write and its release leaves the child waiting: finished
    here by hand, with no release, as a crash would; the keeper's sweep releases it."""
    with engine.begin() as conn:
        parent = dag_queue.enqueue(conn, "node", {"name": "parent"}).id
        child = dag_queue.enqueue(conn, "node", {"name": "child"}, after=[parent]).id
    plain = JobQueue(Job, clock=clock)  # no dependencies: completes without releasing
    with engine.begin() as conn:
        [claimed] = plain.claim(conn, worker_id="crashed", batch=1)
        plain.complete(conn, claimed.id, claimed.lease_token)
    assert waiting(engine) == 1
    worker = make_worker(dag_app([]))
    assert worker.release_dependants() == 1
    assert job_row(engine, child).status == "pending" and waiting(engine) == 0
    assert worker.release_dependants() == 0


def test_the_keeper_sweeps_at_start_after_a_reclaim_and_every_sweep_interval(
    engine: Engine, dag_queue: JobQueue, clock: Any, make_worker: Callable[..., Worker]
) -> None:
    """A sweep reads every waiting row: the keeper's reclaim pass runs one when the worker
    starts, when the reclaimer found a dead worker's leases, and every `SWEEP_INTERVAL`;
    not at every pass (the fake clock drives the worker's timer and the SQL)."""
    plain = JobQueue(Job, clock=clock)  # no dependencies: completes without releasing

    def lost_release() -> uuid.UUID:
        with engine.begin() as conn:
            parent = dag_queue.enqueue(conn, "parent", {}).id
            child = dag_queue.enqueue(conn, "node", {"name": "child"}, after=[parent]).id
        with engine.begin() as conn:
            [claimed] = plain.claim(conn, worker_id="crashed", kinds=["parent"], batch=1)
            assert claimed.id == parent
            plain.complete(conn, claimed.id, claimed.lease_token)
        assert child is not None
        return child

    worker = make_worker(dag_app([]))
    sweeps: list[int] = []
    sweep = worker.release_dependants

    def counted() -> int:
        sweeps.append(sweep())
        return sweeps[-1]

    worker.release_dependants = counted  # type: ignore[method-assign]
    first = lost_release()
    worker._repair()  # the first pass: a sweep
    assert sweeps == [1] and job_row(engine, first).status == "pending"
    second = lost_release()
    worker._repair()  # nothing reclaimed, the interval not over: no sweep
    assert sweeps == [1] and waiting(engine) == 1

    with engine.begin() as conn:  # a worker dies holding a job: its lease expires
        plain.enqueue(conn, "gone", {})
        plain.claim(conn, worker_id="dead", kinds=["gone"], lease=10)
    clock.advance(11)
    worker._repair()
    assert sweeps == [1, 1] and job_row(engine, second).status == "pending"

    third = lost_release()
    clock.advance(SWEEP_INTERVAL - 1)
    worker._repair()
    assert sweeps == [1, 1] and waiting(engine) == 1
    clock.advance(1)
    worker._repair()
    assert sweeps == [1, 1, 1] and job_row(engine, third).status == "pending"


def test_pruning_takes_a_jobs_dependency_row_and_keeps_what_others_wait_for(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        a = dag_queue.enqueue(conn, "node", {"name": "a"}).id
        dag_queue.enqueue(conn, "node", {"name": "b"}, after=[a])
        held = dag_queue.enqueue(conn, "node", {"name": "held"}).id
        kept = dag_queue.enqueue(conn, "node", {"name": "kept"}).id
        dag_queue.enqueue(conn, "node", {"name": "c"}, after=[kept, held])
    with engine.begin() as conn:  # "held" is running elsewhere: its dependant waits
        conn.execute(
            text(f"UPDATE {TEST_SCHEMA}.jobs SET status = 'running' WHERE id = :id"), {"id": held}
        )
    make_worker(dag_app([]), kinds=["node"]).drain(timeout=WAIT)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {TEST_SCHEMA}.jobs SET updated_at = now() - interval '2 days'"))
    report = Pruner(
        engine,
        jobs=Job,
        steps=JobStep,
        dependencies=JobDependency,
        retention=Retention(succeeded=3600),
    ).run_once()
    assert report.succeeded == 2  # a and b; "kept" stays while c waits for it
    assert job_row(engine, kept).status == "succeeded"
    t = JobDependency.__table__
    with engine.connect() as conn:
        left = conn.execute(select(t.c.job_id, t.c.released_at)).all()
    assert len(left) == 1 and left[0].released_at is None  # c, still waiting for "held"


def test_workflows_finish_once_each_when_their_workers_are_sigkilled(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    """Real processes: 12 workflows (a, then b and c, then d) and 3 batches of 5 jobs with a
    callback each, enqueued together; worker A is SIGKILLed inside a b job (its other jobs
    anywhere in theirs), B takes over after the lease. Every workflow finishes, every
    node's effect exists once, no node ran before its parents (each checks the others'
    results), and each batch's callback ran once, after all of its jobs."""
    flows = JobQueue(
        worker_app.Job, steps=worker_app.JobStep, dependencies=worker_app.JobDependency
    )
    ids: dict[str, list[uuid.UUID]] = collections.defaultdict(list)
    with engine.begin() as conn:
        for n in range(12):
            a = flows.enqueue(conn, "node", {"name": f"a{n}"}).id
            b = flows.enqueue(conn, "node", {"name": f"b{n}", "die": n == 0}, after=[a]).id
            c = flows.enqueue(conn, "node", {"name": f"c{n}"}, after=[a]).id
            d = flows.enqueue(conn, "node", {"name": f"d{n}"}, after=[b, c]).id
            for name, job_id in zip("abcd", (a, b, c, d), strict=True):
                ids[name].append(job_id)
        for n in range(BATCHES):
            members = [NewJob("node", {"name": f"m{n}_{k}"}) for k in range(5)]
            flows.enqueue_batch(conn, members, callback=NewJob("node", {"name": f"cb{n}"}))
    ledger, log = tmp_path / "ledger", tmp_path / "workers.log"
    args = ["-m", "sa_outbox", "worker", "tests.worker_app:flow_app"]
    args += ["--database-url", database_url, "--lease", "1.5", "--concurrency", "4"]
    a = start(args, log, ledger)
    assert a.wait(WAIT * 6) == -signal.SIGKILL, log.read_text()
    b = start(args, log, ledger)
    try:
        done = {"succeeded": 48 + BATCHES * 6}
        wait_until(lambda: fault_counts(engine) == done, "B to finish", timeout=60)
    finally:
        assert stop(b, log) == 0, log.read_text()
    with engine.connect() as conn:
        effects = conn.execute(
            text(f"SELECT step, count(*), min(id) FROM {worker_schema}.effects GROUP BY step")
        ).all()
        waiting_rows = conn.execute(
            text(f"SELECT count(*) FROM {worker_schema}.job_dependencies WHERE released_at IS NULL")
        ).scalar_one()
    nodes = {f"{x}{n}" for x in "abcd" for n in range(12)}
    batches = {f"m{n}_{k}" for n in range(BATCHES) for k in range(5)}
    callbacks = {f"cb{n}" for n in range(BATCHES)}
    assert {step for step, _, _ in effects} == nodes | batches | callbacks
    assert {count for _, count, _ in effects} == {1} and waiting_rows == 0
    first = {step: at for step, _, at in effects}
    for n in range(12):  # each node's effect committed after its parents'
        assert first[f"a{n}"] < first[f"b{n}"] < first[f"d{n}"]
        assert first[f"a{n}"] < first[f"c{n}"] < first[f"d{n}"]
    for n in range(BATCHES):  # each callback once, after every job of its batch
        assert all(first[f"m{n}_{k}"] < first[f"cb{n}"] for k in range(5))
    died = [line for line in ledger_lines(ledger) if line[0] == str(ids["b"][0])]
    assert [(attempts, pid) for _, _, attempts, pid in died] == [(1, a.pid), (2, b.pid)]
