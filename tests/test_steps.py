"""Durable steps (`JobContext.step` / `astep`) against a real PostgreSQL, on a `FakeClock`.

A handler written as named steps resumes, on its next attempt, after the last step that
completed; a step given a Session commits its rows and its record in one transaction, fenced
by the lease token, so its rows exist exactly once; a step whose lease was lost records
nothing and rolls its rows back.
"""

from __future__ import annotations

import collections
import datetime as dt
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Session

from sa_outbox import (
    AsyncWorker,
    Backoff,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobQueue,
    JobStepMixin,
    LeaseLost,
    NewJob,
    PayloadNotSerializable,
    Pruner,
    Retention,
    Worker,
)
from sa_outbox.cli import main as cli_main
from sa_outbox.worker import Reclaimer, SignalTimeout
from sa_outbox.worker._steps_sync import Steps

from .conftest import TEST_SCHEMA, WORKER_T0, Job, Order
from .helpers import job_row, jobs_by_status, wait_until
from .test_worker_faults import counts as fault_counts
from .test_worker_faults import enqueue as enqueue_jobs
from .test_worker_faults import ledger_lines, start, stop, worker_schema

__all__ = ["worker_schema"]  # a fixture, used below by name

NO_JITTER = Backoff(base=1, max=300, jitter=0)
WAIT = 10.0


class StepBase(DeclarativeBase):
    pass


class JobStep(JobStepMixin, StepBase):
    __tablename__ = "job_steps"
    __table_schema__ = TEST_SCHEMA


@pytest.fixture
def steps_table(engine: Engine) -> Iterator[None]:
    StepBase.metadata.create_all(engine)
    try:
        yield
    finally:
        StepBase.metadata.drop_all(engine)


def recorded(engine: Engine) -> dict[str, Any]:
    t = JobStep.__table__
    with engine.connect() as conn:
        return {name: result for name, result in conn.execute(select(t.c.name, t.c.result))}


def orders(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Order.__table__)).scalar_one()


def enqueue(engine: Engine, queue: JobQueue, kind: str, payload: Any = None) -> uuid.UUID:
    with engine.begin() as conn:
        return queue.enqueue(conn, kind, payload or {}).id  # type: ignore[return-value]


def order_app(runs: collections.Counter[str], *, fail_on_first: bool) -> JobApp:
    """reserve (a Session step: an order row) → charge (no Session) → crash once → ship."""
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    def reserve(db: Session) -> dict[str, Any]:
        runs["reserve"] += 1
        order = Order(customer=uuid.uuid4().hex)
        db.add(order)
        db.flush()
        return {"order": order.id, "items": (1, 2)}

    def charge() -> str:
        runs["charge"] += 1
        return f"charge-{runs['charge']}"

    @app.handler("place-order")
    def place_order(job: JobContext) -> None:
        reserved = job.step("reserve", reserve, session=True)
        assert reserved["items"] == [1, 2]  # the recorded value (JSON) on every attempt
        charged = job.step("charge", charge)
        runs[f"seen {charged}"] += 1
        if fail_on_first and job.attempts == 1:
            raise RuntimeError("the worker died after charging")
        job.step("ship", lambda: runs.update(["ship"]))

    return app


def test_a_retry_resumes_after_the_last_completed_step_and_its_rows_exist_once(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
) -> None:
    runs: collections.Counter[str] = collections.Counter()
    job_id = enqueue(engine, queue, "place-order")
    worker = make_worker(order_app(runs, fail_on_first=True))

    assert worker.drain(timeout=WAIT) == 1
    assert job_row(engine, job_id).status == "pending", job_row(engine, job_id).last_error
    assert set(recorded(engine)) == {"reserve", "charge"}, job_row(engine, job_id).last_error
    assert orders(engine) == 1

    clock.advance(NO_JITTER.delay(1))
    assert worker.drain(timeout=WAIT) == 1
    assert jobs_by_status(engine) == {"succeeded": 1}
    assert runs == {"reserve": 1, "charge": 1, "seen charge-1": 2, "ship": 1}
    assert orders(engine) == 1
    steps = recorded(engine)
    assert set(steps) == {"reserve", "charge", "ship"} and steps["charge"] == "charge-1"
    assert steps["ship"] is None  # what the lambda returned, recorded as JSON null


def test_a_step_whose_lease_was_lost_records_nothing_and_rolls_its_rows_back(
    engine: Engine, steps_table: None, queue: JobQueue, clock: FakeClock
) -> None:
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)
    job_id = enqueue(engine, queue, "place-order")
    with engine.begin() as conn:
        [claimed] = queue.claim(conn, worker_id="A", lease=30)
    steps = Steps(engine, Job.__table__, JobStep.__table__)
    token = claimed.lease_token

    def reserve(db: Session) -> int:
        db.add(Order(customer=uuid.uuid4().hex))
        return 1

    assert steps.run(job_id, token, {}, "first", reserve, True) == 1  # the lease holds
    clock.advance(31)
    [back] = Reclaimer(app, engine, clock=clock).run_once()  # A stalled: the job goes back
    assert back.id == job_id
    with pytest.raises(LeaseLost, match="cannot record step 'second' of job"):
        steps.run(job_id, token, {}, "second", reserve, True)
    with pytest.raises(LeaseLost):
        steps.run(job_id, token, {}, "third", lambda: 3, False)
    assert set(recorded(engine)) == {"first"}
    assert orders(engine) == 1  # the first step's row only


def test_bad_steps_are_refused_before_any_sql(
    engine: Engine, steps_table: None, queue: JobQueue
) -> None:
    job_id = enqueue(engine, queue, "place-order")
    with engine.begin() as conn:
        [claimed] = queue.claim(conn, worker_id="A")
    steps = Steps(engine, Job.__table__, JobStep.__table__)
    job = JobContext(claimed, steps=steps)
    with pytest.raises(InvalidArgument, match="a step's name must be a non-empty str"):
        job.step("", lambda: 1)
    with pytest.raises(InvalidArgumentType, match="fn must be callable"):
        job.step("x", 42)  # type: ignore[arg-type]

    def unstorable(db: Session) -> object:
        db.add(Order(customer=uuid.uuid4().hex))
        return object()

    with pytest.raises(PayloadNotSerializable, match="step 'odd' of job"):
        job.step("odd", unstorable, session=True)
    with pytest.raises(PayloadNotSerializable):
        job.step("odd", object)
    assert recorded(engine) == {} and orders(engine) == 0
    assert job.step("fine", lambda: {"at": dt.date(2030, 1, 1).isoformat()}) == {"at": "2030-01-01"}
    assert job_row(engine, job_id).status == "running"


def test_a_step_without_a_steps_table_fails_the_job_at_once_saying_what_to_add(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    app = JobApp(Job)

    @app.handler("stepped")
    def stepped(job: JobContext) -> None:
        job.step("one", lambda: 1)

    job_id = enqueue(engine, queue, "stepped")
    assert make_worker(app).drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    assert row.status == "failed" and row.attempts == 1
    assert "job.step() needs a steps table: JobApp(Job, steps=JobStep)" in row.last_error


async def test_async_steps_resume_after_the_last_completed_step(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    runs: collections.Counter[str] = collections.Counter()
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    async def reserve(db: AsyncSession) -> int:
        runs["reserve"] += 1
        db.add(Order(customer=uuid.uuid4().hex))
        await db.flush()
        return 7

    @app.handler("place-order")
    async def place_order(job: JobContext) -> None:
        assert await job.astep("reserve", reserve, session=True) == 7
        await job.astep("charge", lambda: runs.update(["charge"]))
        if job.attempts == 1:
            raise RuntimeError("crash")
        with pytest.raises(Exception, match=r"job.step\(\) cannot run on a AsyncWorker"):
            job.step("sync", lambda: 1)
        runs["done"] += 1

    job_id = enqueue(engine, queue, "place-order")
    worker = make_async_worker(app)
    assert await worker.drain(timeout=WAIT) == 1
    clock.advance(NO_JITTER.delay(1))
    assert await worker.drain(timeout=WAIT) == 1
    assert job_row(engine, job_id).status == "succeeded"
    assert runs == {"reserve": 1, "charge": 1, "done": 1}
    assert orders(engine) == 1 and set(recorded(engine)) == {"reserve", "charge"}
    with engine.connect() as conn:  # the step's row and its record: one transaction
        xmins = conn.execute(
            text(
                f"SELECT (SELECT xmin::text FROM {TEST_SCHEMA}.orders), "
                f"(SELECT xmin::text FROM {TEST_SCHEMA}.job_steps WHERE name = 'reserve')"
            )
        ).one()
    assert xmins[0] == xmins[1]


@pytest.mark.parametrize("via", ["Pruner", "sa-outbox prune"])
def test_pruning_a_job_prunes_its_recorded_steps_and_no_others(
    engine: Engine, database_url: str, steps_table: None, queue: JobQueue, via: str
) -> None:
    done, busy = enqueue(engine, queue, "place-order"), enqueue(engine, queue, "place-order")
    with engine.begin() as conn:
        claimed = {job.id: job for job in queue.claim(conn, worker_id="A", batch=2)}
    steps = Steps(engine, Job.__table__, JobStep.__table__)
    for job_id, job in claimed.items():
        steps.run(job_id, job.lease_token, {}, "one", lambda: 1, False)
        steps.run(job_id, job.lease_token, {}, "two", lambda: 2, False)
    with engine.begin() as conn:
        queue.complete(conn, done, claimed[done].lease_token)
        conn.execute(text(f"UPDATE {TEST_SCHEMA}.jobs SET updated_at = now() - interval '2 days'"))
    if via == "Pruner":
        report = Pruner(
            engine, jobs=Job, steps=JobStep, retention=Retention(succeeded=3600)
        ).run_once()
        assert report.succeeded == 1
    else:
        table = f"{TEST_SCHEMA}.job_steps"
        args = ["prune", "--jobs-table", f"{TEST_SCHEMA}.jobs", "--steps-table", table]
        assert cli_main([*args, "--older-than", "1h", "--database-url", database_url]) == 0
    t = JobStep.__table__
    with engine.connect() as conn:
        left = sorted(conn.execute(select(t.c.job_id, t.c.name)).all())
    assert left == [(busy, "one"), (busy, "two")]
    assert jobs_by_status(engine) == {"running": 1}


def test_workers_sigkilled_between_steps_leave_every_steps_rows_exactly_once(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    """Real processes: worker A is SIGKILLed between two steps (its other jobs anywhere in
    theirs); B takes everything over after the lease. Each step's row exists once."""
    jobs = [
        NewJob("stepped", {"n": i, "die": i == 0}, priority=1 if i == 0 else 0) for i in range(30)
    ]
    ids = enqueue_jobs(engine, jobs)
    ledger, log = tmp_path / "ledger", tmp_path / "workers.log"
    args = ["-m", "sa_outbox", "worker", "tests.worker_app:app", "--database-url", database_url]
    a = start([*args, "--lease", "1.5", "--concurrency", "4"], log, ledger)
    assert a.wait(WAIT * 6) == -signal.SIGKILL, log.read_text()
    b = start([*args, "--lease", "1.5", "--concurrency", "4"], log, ledger)
    try:
        wait_until(lambda: fault_counts(engine) == {"succeeded": 30}, "B to finish", timeout=60)
    finally:
        assert stop(b, log) == 0, log.read_text()
    with engine.connect() as conn:
        effects = conn.execute(
            text(f"SELECT job_id, step, count(*) FROM {worker_schema}.effects GROUP BY 1, 2")
        ).all()
        recorded = conn.execute(text(f"SELECT count(*) FROM {worker_schema}.job_steps")).scalar()
    assert sorted((job_id, step) for job_id, step, _ in effects) == sorted(
        (job_id, step) for job_id in ids for step in ("one", "two")
    )
    assert {n for _, _, n in effects} == {1} and recorded == 60
    died = [line for line in ledger_lines(ledger) if line[0] == str(ids[0])]
    assert [(attempts, pid) for _, _, attempts, pid in died] == [(1, a.pid), (2, b.pid)]


def test_a_durable_sleep_frees_the_worker_and_resumes_at_its_wake_up_time(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
) -> None:
    runs: collections.Counter[str] = collections.Counter()
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("trial")
    def trial(job: JobContext) -> None:
        job.step("welcome", lambda: runs.update(["welcome"]))
        job.sleep("trial-period", dt.timedelta(minutes=10))
        job.step("convert", lambda: runs.update(["convert"]))

    job_id = enqueue(engine, queue, "trial")
    worker = make_worker(app)
    assert worker.drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    wake = WORKER_T0 + dt.timedelta(minutes=10)
    assert (row.status, row.attempts, row.run_at) == ("pending", 0, wake)  # a snooze
    assert runs == {"welcome": 1}

    # Woken early (a retry by hand, say): it sleeps again for what is left, not 10 minutes.
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE {TEST_SCHEMA}.jobs SET run_at = :at"),
            {"at": WORKER_T0 + dt.timedelta(minutes=4)},
        )
    clock.advance(dt.timedelta(minutes=4))
    assert worker.drain(timeout=WAIT) == 1
    assert job_row(engine, job_id).run_at == wake and runs == {"welcome": 1}

    clock.advance(dt.timedelta(minutes=5))
    assert worker.drain(timeout=WAIT) == 0  # not due yet
    clock.advance(dt.timedelta(minutes=1))
    assert worker.drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 1)
    assert runs == {"welcome": 1, "convert": 1}
    assert set(recorded(engine)) == {"welcome", "trial-period", "convert"}


async def test_an_async_durable_sleep_resumes_at_its_wake_up_time(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    runs: collections.Counter[str] = collections.Counter()
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("trial")
    async def trial(job: JobContext) -> None:
        await job.astep("welcome", lambda: runs.update(["welcome"]))
        await job.asleep("trial-period", 600)
        runs["after"] += 1

    job_id = enqueue(engine, queue, "trial")
    worker = make_async_worker(app)
    assert await worker.drain(timeout=WAIT) == 1
    assert job_row(engine, job_id).status == "pending" and runs == {"welcome": 1}
    clock.advance(600)
    assert await worker.drain(timeout=WAIT) == 1
    assert job_row(engine, job_id).status == "succeeded"
    assert runs == {"welcome": 1, "after": 1}


def signal_app(got: list[Any]) -> JobApp:
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("refund")
    def refund(job: JobContext) -> None:
        try:
            got.append(job.receive_signal("approved", dt.timedelta(minutes=2)))
        except SignalTimeout as timeout:
            got.append(str(timeout))

    return app


def test_a_signal_sent_before_the_wait_is_found_and_a_second_one_is_refused(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
) -> None:
    got: list[Any] = []
    signals = JobQueue(Job, clock=clock, steps=JobStep)
    job_id = enqueue(engine, queue, "refund")
    with engine.begin() as conn:
        assert signals.send_signal(conn, job_id, "approved", {"by": "ana"}) is True
        assert signals.send_signal(conn, job_id, "approved", {"by": "rui"}) is False
        assert signals.send_signal(conn, uuid.uuid4(), "approved") is False  # no such job
    assert make_worker(signal_app(got)).drain(timeout=WAIT) == 1
    assert got == [{"by": "ana"}] and jobs_by_status(engine) == {"succeeded": 1}
    with engine.begin() as conn:  # finished: nothing more is sent
        assert signals.send_signal(conn, job_id, "other") is False


def test_a_signal_wakes_a_job_asleep_waiting_for_it_at_once(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
) -> None:
    got: list[Any] = []
    signals = JobQueue(Job, clock=clock, steps=JobStep)
    job_id = enqueue(engine, queue, "refund")
    worker = make_worker(signal_app(got))
    assert worker.drain(timeout=WAIT) == 1  # waits: asleep, no worker held
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("pending", 0) and row.run_at > WORKER_T0
    assert worker.drain(timeout=WAIT) == 0
    with engine.begin() as conn:
        assert signals.send_signal(conn, job_id, "approved", [1, 2]) is True
    assert job_row(engine, job_id).run_at == WORKER_T0  # due now: the clock has not moved
    assert worker.drain(timeout=WAIT) == 1
    assert got == [[1, 2]] and jobs_by_status(engine) == {"succeeded": 1}


def test_no_signal_within_the_timeout_raises_signal_timeout(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
) -> None:
    got: list[Any] = []
    job_id = enqueue(engine, queue, "refund")
    worker = make_worker(signal_app(got))
    assert worker.drain(timeout=WAIT) == 1  # waits: asleep until the deadline, no worker held
    assert job_row(engine, job_id).run_at == WORKER_T0 + dt.timedelta(minutes=2)
    clock.advance(119)
    assert worker.drain(timeout=WAIT) == 0  # it does not look again before its deadline
    clock.advance(1)
    assert worker.drain(timeout=WAIT) == 1
    assert got == [f"no signal 'approved' came for job {job_id} within 120 s"]
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_a_signal_sent_while_the_wait_looks_is_seen_by_that_wait(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
) -> None:
    """The sender holds the job's row lock, its signal not committed yet, when the running
    handler starts to wait: the wait blocks on the lock, then sees the signal, in that run."""
    got: list[Any] = []
    go = threading.Event()
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("refund")
    def refund(job: JobContext) -> None:
        assert go.wait(WAIT)
        got.append(job.receive_signal("approved", 3600))

    job_id = enqueue(engine, queue, "refund")
    worker = make_worker(app)
    worker.claim()  # the handler runs, held before its wait
    with engine.connect() as sender:
        sending = sender.begin()
        signals = JobQueue(Job, clock=clock, steps=JobStep)
        assert signals.send_signal(sender, job_id, "approved", 1)
        go.set()
        wait_until(lambda: lock_waiters(engine) == 1, "the wait to block on the row lock")
        sending.commit()
    assert worker.wait_for_handlers(WAIT)
    worker.flush()
    assert got == [1] and jobs_by_status(engine) == {"succeeded": 1}


def lock_waiters(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        ).scalar_one()


def test_signals_need_the_steps_table_and_a_json_payload(
    engine: Engine, steps_table: None, queue: JobQueue
) -> None:
    job_id = enqueue(engine, queue, "refund")
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=r"JobQueue\(Job, steps=JobStep\)"):
            queue.send_signal(conn, job_id, "approved")
        with pytest.raises(PayloadNotSerializable, match="signal 'approved' to job"):
            JobQueue(Job, steps=JobStep).send_signal(conn, job_id, "approved", object())
    assert recorded(engine) == {}


async def test_an_async_handler_receives_a_signal_sent_while_it_sleeps(
    engine: Engine,
    steps_table: None,
    queue: JobQueue,
    clock: FakeClock,
    make_async_worker: Callable[..., AsyncWorker],
) -> None:
    got: list[Any] = []
    app = JobApp(Job, backoff=NO_JITTER, steps=JobStep)

    @app.handler("refund")
    async def refund(job: JobContext) -> None:
        got.append(await job.areceive_signal("approved", 3600))

    job_id = enqueue(engine, queue, "refund")
    worker = make_async_worker(app)
    assert await worker.drain(timeout=WAIT) == 1
    with engine.begin() as conn:
        JobQueue(Job, clock=clock, steps=JobStep).send_signal(conn, job_id, "approved", "yes")
    assert await worker.drain(timeout=WAIT) == 1
    assert got == ["yes"] and job_row(engine, job_id).status == "succeeded"


def test_prune_refuses_a_steps_table_without_the_job_table_in_one_line(
    database_url: str, steps_table: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["prune", "--outbox-table", f"{TEST_SCHEMA}.outbox", "--older-than", "1h"]
    args += ["--steps-table", f"{TEST_SCHEMA}.job_steps", "--database-url", database_url]
    assert cli_main(args) == 1
    err = capsys.readouterr().err
    assert err == (
        "sa-outbox prune: error: --steps-table is pruned with the job table: "
        "give --model or --jobs-table too\n"
    )
