"""The sync `Worker` against a real PostgreSQL, step by step with a `FakeClock`.

The worker is driven one step at a time (`claim`, `wait_for_handlers`, `heartbeat`,
`check_timeouts`, `flush`, `drain`) and its clocks are a `FakeClock`: the SQL clock, and the
local timer through ``timer=``. Handlers that must stay running block on a
`threading.Event` the test sets; nothing sleeps to synchronise, and no test asserts timings.
Every test ends by counting the jobs in the table.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, select, text

from sa_outbox import (
    AsyncWorker,
    Backoff,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    InvalidPayload,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    PayloadNotSerializable,
    PermanentError,
    Worker,
)
from sa_outbox.schema._notify_trigger import job_notify_channel
from sa_outbox.statements import listen_sql
from sa_outbox.worker import (
    ALL_KINDS,
    CancelReason,
    CountingMetrics,
    JobOutcome,
    Reclaimer,
    WorkerMetrics,
)

from .conftest import TEST_SCHEMA, Job
from .helpers import job_row, jobs_by_status, wait_until

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NO_JITTER = Backoff(base=1, max=300, jitter=0)
WAIT = 10.0  # seconds a test waits for an event before it fails (never reached when green)


def listening(engine: Engine, channel: str | None) -> psycopg.Connection[Any]:
    """A connection of its own that LISTENs on ``channel``, as the worker's listener does."""
    assert channel is not None
    raw = engine.raw_connection()
    conn = raw.driver_connection
    raw.detach()
    assert isinstance(conn, psycopg.Connection)
    conn.autocommit = True
    conn.execute(listen_sql(channel))
    return conn


def enqueue(engine: Engine, jobs: JobQueue, kind: str, n: int = 1, **kw: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        results = jobs.enqueue_many(conn, [NewJob(kind, {"n": i}, **kw) for i in range(n)])
    return [r.id for r in results if r.id is not None]


# -- registering handlers ------------------------------------------------------------------


def test_handlers_register_by_decorator_by_method_and_by_mapping() -> None:
    def plain(job: JobContext) -> None:
        pass

    app = JobApp(Job, handlers={"from-mapping": plain})

    @app.handler("decorated", timeout=5, backoff=Backoff(base=2, max=8, jitter=0))
    def decorated(job: JobContext) -> None:
        pass

    app.register("registered", plain, permanent=(KeyError,))
    assert app.kinds == ("from-mapping", "decorated", "registered")
    assert decorated.__name__ == "decorated"  # the decorator returns the function unchanged
    assert app["decorated"].timeout == 5.0
    assert [app["decorated"].retry_delay(n, jitter=False).total_seconds() for n in (1, 3, 9)] == [
        2.0,
        8.0,
        8.0,
    ]
    assert "registered" in app and "unknown" not in app and app.get("unknown") is None

    with pytest.raises(InvalidArgument, match="'decorated' already has a handler"):
        app.register("decorated", plain)
    with pytest.raises(InvalidArgumentType, match="not callable"):
        app.register("x", "not a function")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match="mapping"):
        JobApp(Job, handlers=[("a", plain)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="timeout of kind 'y'"):
        app.register("y", plain, timeout=0)


def test_worker_options_are_checked_before_anything_runs(engine: Engine) -> None:
    app = JobApp(Job)

    @app.handler("coroutine")
    async def coroutine(job: JobContext) -> None:
        pass

    with pytest.raises(InvalidArgument, match=r"\['coroutine'\] are coroutine functions"):
        Worker(app, engine)
    sync_app = JobApp(Job)
    with pytest.raises(InvalidArgument, match="concurrency must be between 1 and 1000"):
        Worker(sync_app, engine, concurrency=0)
    with pytest.raises(InvalidArgument, match="heartbeat_interval"):
        Worker(sync_app, engine, lease=10, heartbeat_interval=10)
    with pytest.raises(InvalidArgumentType, match="JobApp"):
        Worker({"a": print}, engine)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match="AsyncEngine"):
        AsyncWorker(sync_app, engine)  # type: ignore[arg-type]


# -- claim, run, acknowledge ---------------------------------------------------------------


def test_every_job_runs_with_its_context_and_succeeds_once(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    seen: list[tuple[uuid.UUID, str, Any, int, str | None, bool]] = []
    lock = threading.Lock()

    def record(job: JobContext) -> None:
        with lock:
            seen.append(
                (
                    job.id,
                    job.kind,
                    job.payload,
                    job.attempts,
                    job.deduplication_key,
                    job.cancel.cancelled,
                )
            )

    app = JobApp(Job, handlers={"send": record})
    with engine.begin() as conn:
        ids = [
            queue.enqueue(conn, "send", {"n": i}, deduplication_key=f"send:{i}").id
            for i in range(45)
        ]
    metrics = CountingMetrics()
    worker = make_worker(app, concurrency=4, batch=10, metrics=metrics)

    assert worker.drain(timeout=WAIT) == 45

    assert sorted(s[0] for s in seen) == sorted(ids)  # type: ignore[type-var]
    assert {(s[1], s[3], s[5]) for s in seen} == {("send", 1, False)}
    assert {s[4] for s in seen} == {f"send:{i}" for i in range(45)}
    assert {s[2]["n"] for s in seen} == set(range(45))
    assert jobs_by_status(engine) == {"succeeded": 45}
    with engine.connect() as conn:
        held = conn.execute(
            select(Job.__table__.c.id).where(Job.__table__.c.lease_token.is_not(None))
        ).all()
    assert held == []
    assert metrics.outcomes("send")[JobOutcome.SUCCEEDED] == 45
    assert metrics.totals["acknowledged"] == 45
    # Batched: at most one write per claimed batch (10) plus the final ones, not one per job.
    assert metrics.totals["transactions"] < 45


def test_a_transient_error_retries_with_the_kinds_backoff_until_max_attempts(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    app = JobApp(Job)

    @app.handler("flaky", backoff=Backoff(base=2, max=5, jitter=0))
    def flaky(job: JobContext) -> None:
        raise RuntimeError(f"SMTP timeout at attempt {job.attempts}")

    [job_id] = enqueue(engine, queue, "flaky", max_attempts=3)
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics)

    assert worker.drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.run_at) == ("pending", 1, T0 + dt.timedelta(seconds=2))
    lines = row.last_error.splitlines()
    assert lines[0] == "RuntimeError: SMTP timeout at attempt 1"
    assert lines[1] == "Traceback (most recent call last):"
    assert any("in flaky" in line for line in lines)
    assert row.lease_token is None

    assert worker.drain(timeout=WAIT) == 0  # not due yet: no hot loop
    clock.advance(2)
    assert worker.drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("pending", 2)
    assert row.run_at == T0 + dt.timedelta(seconds=2 + 4)  # base * 2^(2-1)
    clock.advance(4)
    assert worker.drain(timeout=WAIT) == 1
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("failed", 3)
    assert row.last_error.startswith("RuntimeError: SMTP timeout at attempt 3")
    assert metrics.outcomes("flaky") == {
        **dict.fromkeys(JobOutcome, 0),
        JobOutcome.RETRIED: 2,
        JobOutcome.FAILED: 1,
    }
    assert jobs_by_status(engine) == {"failed": 1}


class AddressRejected(PermanentError):
    pass


def test_permanent_errors_fail_at_once(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ran: list[str] = []
    app = JobApp(Job)

    @app.handler("rejected")
    def rejected(job: JobContext) -> None:
        ran.append(job.kind)
        raise AddressRejected(f"no such mailbox: {job.payload['n']}")

    @app.handler("declared", permanent=(ValueError,))
    def declared(job: JobContext) -> None:
        ran.append(job.kind)
        raise ValueError("not a number")

    def parse(payload: dict[str, Any]) -> int:
        return int(payload["amount"])

    @app.handler("parsed", parse=parse)
    def parsed(job: JobContext) -> None:
        ran.append(job.kind)

    ids = {
        kind: enqueue(engine, queue, kind)[0]
        for kind in ("rejected", "declared", "parsed", "nobody-handles-this")
    }
    make_worker(app).drain(timeout=WAIT)
    # By default a worker claims only the kinds it handles: the last one stays pending, for
    # a worker that knows it (a rolling deploy), until one that claims every kind fails it.
    unknown = job_row(engine, ids["nobody-handles-this"])
    assert (unknown.status, unknown.attempts, unknown.last_error) == ("pending", 0, None)
    make_worker(app, kinds=ALL_KINDS).drain(timeout=WAIT)

    assert sorted(ran) == ["declared", "rejected"]  # no handler ran for the other two
    errors = {kind: job_row(engine, job_id).last_error for kind, job_id in ids.items()}
    assert errors["rejected"].startswith(f"{__name__}.AddressRejected: no such mailbox: 0\n")
    assert errors["declared"].startswith("ValueError: not a number\nTraceback")
    assert errors["parsed"].startswith(
        f"{InvalidPayload.__module__}.InvalidPayload: payload of job kind 'parsed' is invalid: "
        "'amount'"
    )
    assert errors["nobody-handles-this"].startswith(
        "sa_outbox.worker.errors.UnknownJobKind: no handler for job kind 'nobody-handles-this'"
    )
    assert "(handlers: rejected, declared, parsed)" in errors["nobody-handles-this"]
    rows = [job_row(engine, job_id) for job_id in ids.values()]
    assert {(row.status, row.attempts) for row in rows} == {("failed", 1)}
    assert jobs_by_status(engine) == {"failed": 4}


def test_parse_gives_the_handler_its_value(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    got: list[Any] = []
    app = JobApp(Job)
    app.register("charge", lambda job: got.append((job.payload, job.claimed.payload)), parse=len)
    enqueue(engine, queue, "charge")
    make_worker(app).drain(timeout=WAIT)
    assert got == [(1, {"n": 0})]
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_a_timeout_cancels_the_handler_and_retries_the_job(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    started, returned = threading.Event(), threading.Event()
    reasons: list[CancelReason | None] = []
    app = JobApp(Job)

    @app.handler("slow", timeout=10, backoff=Backoff(base=7, max=7, jitter=0))
    def slow(job: JobContext) -> None:
        started.set()
        job.cancel.wait(WAIT)
        reasons.append(job.cancel.reason)
        returned.set()

    [job_id] = enqueue(engine, queue, "slow")
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics)
    assert worker.claim() == 1
    assert started.wait(WAIT)
    clock.advance(9)
    assert worker.check_timeouts() == 0
    clock.advance(1)
    assert worker.check_timeouts() == 1
    assert returned.wait(WAIT)
    assert reasons == [CancelReason.TIMEOUT]
    assert worker.wait_for_handlers(WAIT)
    assert worker.flush() == 1

    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.run_at) == ("pending", 1, T0 + dt.timedelta(seconds=17))
    assert row.last_error == (
        "sa_outbox.worker.errors.JobTimeout: job kind 'slow' ran longer than its timeout of 10 s"
    )
    assert metrics.outcomes("slow")[JobOutcome.RETRIED] == 1
    assert metrics.outcomes("slow")[JobOutcome.SUCCEEDED] == 0  # the late return was dropped
    assert jobs_by_status(engine) == {"pending": 1}


# -- leases --------------------------------------------------------------------------------


def test_heartbeats_keep_the_lease_alive_without_rotating_the_token(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    started, release = threading.Event(), threading.Event()
    app = JobApp(Job)

    @app.handler("long")
    def long_job(job: JobContext) -> None:
        started.set()
        assert release.wait(WAIT)

    [job_id] = enqueue(engine, queue, "long")
    metrics = CountingMetrics()
    worker = make_worker(app, lease=30, metrics=metrics)
    worker.claim()
    assert started.wait(WAIT)
    first = job_row(engine, job_id)
    assert first.lease_until == T0 + dt.timedelta(seconds=30)

    for beat in (1, 2, 3):
        clock.advance(20)
        result = worker.heartbeat()
        assert result is not None and result.done == [job_id]
        row = job_row(engine, job_id)
        assert row.lease_until == T0 + dt.timedelta(seconds=20 * beat + 30)
        assert (row.status, row.lease_token) == ("running", first.lease_token)
        assert worker.reclaim() == []  # 60 s after the claim, the lease is still alive

    release.set()
    assert worker.wait_for_handlers(WAIT)
    worker.flush()
    assert jobs_by_status(engine) == {"succeeded": 1}
    assert metrics.totals["renewed"] == 3


def test_a_lost_lease_cancels_the_handler_and_its_result_changes_nothing(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    """The article's section 10 with a real worker: A loses the job to B, A's writes fail."""
    started, returned = threading.Event(), threading.Event()
    reasons: list[CancelReason | None] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("work")
    def work(job: JobContext) -> None:
        started.set()
        job.cancel.wait(WAIT)
        reasons.append(job.cancel.reason)
        job.enqueue("follow-up", {"of": str(job.id)})  # must not survive the lost lease
        returned.set()

    [job_id] = enqueue(engine, queue, "work")
    metrics = CountingMetrics()
    a = make_worker(app, lease=30, metrics=metrics, worker_id="A")
    a.claim()  # 1. A claims, token T1
    assert started.wait(WAIT)
    clock.advance(31)  # 2. A stalls past its lease (no heartbeat)
    [reclaimed] = Reclaimer(app, engine, clock=clock).run_once()  # 3. back to the queue
    assert (reclaimed.id, reclaimed.status, reclaimed.worker_id) == (job_id, "pending", "A")
    clock.advance(NO_JITTER.delay(1))
    with engine.begin() as conn:  # 4. B claims it, token T2
        [b] = queue.claim(conn, worker_id="B")

    result = a.heartbeat()  # A finds out: its handler is cancelled
    assert result is not None and result.lost == [job_id]
    assert returned.wait(WAIT)
    assert reasons == [CancelReason.LEASE_LOST]
    assert a.wait_for_handlers(WAIT)
    a.flush()  # 5. A's completion matches no row
    row = job_row(engine, job_id)
    assert (row.status, row.worker_id, row.lease_token) == ("running", "B", b.lease_token)
    assert metrics.outcomes("work")[JobOutcome.LOST] == 1
    with engine.begin() as conn:  # 6. B completes it
        queue.complete(conn, b.id, b.lease_token)
    assert jobs_by_status(engine) == {"succeeded": 1}  # and no follow-up from A's run


def test_jobs_enqueued_by_a_handler_commit_with_its_completion_only(
    engine: Engine, queue: JobQueue, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    children: list[Any] = []
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("parent")
    def parent(job: JobContext) -> None:
        job.enqueue(
            "child",
            {"parent": job.payload["n"]},
            queue="children",
            deduplication_key=f"child-of:{job.id}",
        )
        if job.payload["n"] == 1:
            raise RuntimeError("the parent failed after enqueueing")
        with pytest.raises(PayloadNotSerializable):
            job.enqueue("child", {"bad": object()})  # refused in the handler, not later

    app.register("child", lambda job: children.append(job.payload["parent"]))
    enqueue(engine, queue, "parent", 2)
    make_worker(app).drain(timeout=WAIT)

    assert children == [0]  # the failed parent's child was never written
    assert jobs_by_status(engine) == {"succeeded": 2, "pending": 1}
    clock.advance(1)
    with engine.begin() as conn:  # the retried parent, now succeeding, writes it; once
        conn.execute(
            text(f"UPDATE {TEST_SCHEMA}.jobs SET payload = '{{\"n\": 2}}' WHERE status = 'pending'")
        )
    make_worker(app).drain(timeout=WAIT)
    assert sorted(children) == [0, 2]
    assert jobs_by_status(engine) == {"succeeded": 4}


# -- release and shutdown ------------------------------------------------------------------


def test_release_gives_jobs_back_without_counting_the_attempt(
    engine: Engine, queue: JobQueue
) -> None:
    ids = enqueue(engine, queue, "work", 2, queue="emails")
    with engine.begin() as conn:
        a, b = queue.claim(conn, worker_id="w", batch=2)
        channel = queue.notify_channel(conn)
    listener = listening(engine, channel)
    try:
        with engine.begin() as conn:
            result = queue.release_many(conn, [(a.id, a.lease_token), (b.id, uuid.uuid4())])
        notified = [n.payload for n in listener.notifies(timeout=WAIT, stop_after=1)]
    finally:
        listener.close()
    assert (result.done, result.lost) == ([a.id], [b.id])
    row = job_row(engine, a.id)
    assert (row.status, row.attempts, row.lease_token, row.worker_id) == ("pending", 0, None, None)
    assert row.run_at == T0  # it keeps its place in line
    assert job_row(engine, b.id).status == "running"  # the wrong token changed nothing
    assert json.loads(notified[0]) == ["emails"]
    assert set(ids) == {a.id, b.id}
    assert jobs_by_status(engine) == {"pending": 1, "running": 1}


def test_a_handler_that_gives_up_on_shutdown_releases_its_job(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    started = threading.Event()
    app = JobApp(Job)

    @app.handler("long")
    def long_job(job: JobContext) -> None:
        started.set()
        job.cancel.wait(WAIT)
        job.cancel.raise_if_cancelled()

    [job_id] = enqueue(engine, queue, "long")
    metrics = CountingMetrics()
    worker = make_worker(app, metrics=metrics)
    worker.claim()
    assert started.wait(WAIT)
    worker.core.begin_shutdown()  # what stop() does first: tokens cancelled, no more claims
    assert worker.wait_for_handlers(WAIT)
    worker.flush()
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, row.lease_token) == ("pending", 0, None)
    assert metrics.outcomes()[JobOutcome.RELEASED] == 1
    assert jobs_by_status(engine) == {"pending": 1}


def run_in_thread(worker: Worker) -> threading.Thread:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # pragma: no cover - reported by the join below
            errors.append(exc)
            raise

    thread = threading.Thread(target=target, name="worker-under-test")
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_stop_lets_running_jobs_finish_then_releases_the_rest(
    engine: Engine, queue: JobQueue
) -> None:
    started = {kind: threading.Event() for kind in ("polite", "quitter", "stubborn")}
    stubborn_may_return, stubborn_returned = threading.Event(), threading.Event()
    app = JobApp(Job)

    @app.handler("polite")
    def polite(job: JobContext) -> None:
        started["polite"].set()
        job.cancel.wait(WAIT)  # finishes as soon as shutdown is asked

    @app.handler("quitter")
    def quitter(job: JobContext) -> None:
        started["quitter"].set()
        job.cancel.wait(WAIT)
        job.cancel.raise_if_cancelled()

    @app.handler("stubborn")
    def stubborn(job: JobContext) -> None:
        started["stubborn"].set()
        stubborn_may_return.wait(WAIT)  # ignores its token
        stubborn_returned.set()

    ids = {kind: enqueue(engine, JobQueue(Job), kind, priority=1)[0] for kind in started}
    [waiting] = enqueue(engine, JobQueue(Job), "polite")  # never claimed: concurrency is 3
    worker = Worker(
        app, engine, concurrency=3, grace=1.0, listen=False, install_signal_handlers=False
    )
    thread = run_in_thread(worker)
    for event in started.values():
        assert event.wait(WAIT)
    worker.stop()
    thread.join(WAIT)
    assert not thread.is_alive() and not thread.errors  # type: ignore[attr-defined]

    rows = {kind: job_row(engine, job_id) for kind, job_id in ids.items()}
    assert (rows["polite"].status, rows["polite"].attempts) == ("succeeded", 1)
    for kind in ("quitter", "stubborn"):
        assert (rows[kind].status, rows[kind].attempts, rows[kind].lease_token) == (
            "pending",
            0,
            None,
        )
    assert (job_row(engine, waiting).status, job_row(engine, waiting).attempts) == ("pending", 0)
    stubborn_may_return.set()
    assert stubborn_returned.wait(WAIT)
    assert job_row(engine, ids["stubborn"]).status == "pending"  # its late result is dropped
    assert jobs_by_status(engine) == {"succeeded": 1, "pending": 3}


def test_sigterm_stops_the_worker_gracefully(engine: Engine, queue: JobQueue) -> None:
    started = threading.Event()
    app = JobApp(Job)

    @app.handler("polite")
    def polite(job: JobContext) -> None:
        started.set()
        job.cancel.wait(WAIT)

    [job_id] = enqueue(engine, JobQueue(Job), "polite")
    previous = signal.getsignal(signal.SIGTERM)
    worker = Worker(app, engine, listen=False, grace=5)

    def send_sigterm() -> None:
        if started.wait(WAIT):
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=send_sigterm)
    killer.start()
    worker.run()  # in the main thread: it installs its signal handlers
    killer.join(WAIT)
    assert job_row(engine, job_id).status == "succeeded"
    assert signal.getsignal(signal.SIGTERM) is previous  # restored
    assert jobs_by_status(engine) == {"succeeded": 1}


# -- waking up -----------------------------------------------------------------------------


def test_a_worker_wakes_up_on_notify_not_on_polling(engine: Engine) -> None:
    ran = threading.Event()
    app = JobApp(Job, handlers={"ping": lambda job: ran.set()})
    worker = Worker(app, engine, poll_interval=3600, install_signal_handlers=False, reclaim=False)
    thread = run_in_thread(worker)
    try:
        assert worker.listening.wait(WAIT)
        # The worker claimed at start and found nothing; its next poll is an hour away.
        with engine.begin() as conn:
            JobQueue(Job).enqueue(conn, "ping", {})
        assert ran.wait(WAIT)
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_notifications_for_other_queues_do_not_wake_a_worker(engine: Engine) -> None:
    worker = Worker(JobApp(Job), engine, queues=["default", "emails"], kinds=ALL_KINDS)
    worker.core.notified = False
    assert not worker.core.on_notify('["images"]')
    assert not worker.core.notified
    assert worker.core.on_notify('["images","emails"]')
    assert worker.core.on_notify("")  # too many queues to name: any worker wakes up
    assert Worker(JobApp(Job), engine, kinds=ALL_KINDS).core.on_notify('["images"]')  # all queues


def test_the_trigger_sends_one_notification_per_statement(engine: Engine, queue: JobQueue) -> None:
    with engine.connect() as conn:
        channel = queue.notify_channel(conn)
    assert channel == job_notify_channel(TEST_SCHEMA, "jobs") == f"{TEST_SCHEMA}.jobs"
    listener = listening(engine, channel)
    try:
        with engine.begin() as conn:  # 500 jobs in two queues, one statement
            queue.enqueue_many(
                conn,
                [NewJob("bulk", {"i": i}, queue=("a", "b")[i % 2]) for i in range(500)],
            )
        with engine.begin() as conn:  # nothing inserted (a taken key): no notification
            queue.enqueue(conn, "solo", {}, deduplication_key="k")
            queue.enqueue(conn, "solo", {}, deduplication_key="k")
        got = [n.payload for n in listener.notifies(timeout=WAIT, stop_after=2)]
        listener.execute("SELECT 1")  # anything else already sent is in by now
        got += [n.payload for n in listener.notifies(timeout=0)]
    finally:
        listener.close()
    assert [json.loads(p) for p in got] == [["a", "b"], ["default"]]
    assert jobs_by_status(engine) == {"pending": 501}


# -- hooks -----------------------------------------------------------------------------


def test_a_failing_metrics_hook_never_stops_the_worker(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    class Broken(WorkerMetrics):
        def job_finished(self, kind: str, outcome: JobOutcome, seconds: float) -> None:
            raise RuntimeError("exporter down")

    enqueue(engine, queue, "ok", 3)
    worker = make_worker(JobApp(Job, handlers={"ok": lambda job: None}), metrics=Broken())
    assert worker.drain(timeout=WAIT) == 3
    assert jobs_by_status(engine) == {"succeeded": 3}


def test_a_reclaimer_runs_alone_until_stopped(
    engine: Engine, queue: JobQueue, clock: FakeClock
) -> None:
    ids = enqueue(engine, queue, "work", 3)
    with engine.begin() as conn:
        queue.claim(conn, worker_id="gone", batch=3, lease=30)
    clock.advance(31)
    reclaimer = Reclaimer(JobApp(Job, backoff=NO_JITTER), engine, clock=clock, interval=0.05)
    thread = threading.Thread(target=reclaimer.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        deadline = threading.Event()
        for _ in range(200):  # wait for the condition, never for a duration
            if jobs_by_status(engine) == {"pending": 3}:
                break
            deadline.wait(0.05)
    finally:
        reclaimer.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    rows = [job_row(engine, job_id) for job_id in ids]
    assert {(row.status, row.attempts, row.worker_id) for row in rows} == {("pending", 1, None)}
    assert {row.run_at for row in rows} == {clock.now() + dt.timedelta(seconds=1)}


# -- the ready path ----------------------------------------------------------------------


def test_the_worker_vacuums_its_table_past_the_threshold(
    engine: Engine, database_url: str, queue: JobQueue, clock: FakeClock
) -> None:
    # One pooled connection does all the worker's writes, so forcing its statistics out
    # makes the dead-tuple count exact (see tests/test_vacuum.py).
    from sqlalchemy import create_engine

    from sa_outbox import VacuumPolicy

    one = create_engine(database_url, pool_size=1, max_overflow=0)
    app = JobApp(Job)
    app.register("noop", lambda job: None)
    worker = Worker(
        app,
        one,
        clock=clock,
        timer=lambda: clock.now().timestamp(),
        listen=False,
        install_signal_handlers=False,
        vacuum=VacuumPolicy(threshold=100, interval=60),
    )
    try:
        enqueue(one, queue, "noop", 200)
        assert worker.drain(WAIT) == 200
        with one.connect() as conn:
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
        assert worker.vacuumer is not None and worker.vacuumer.due()
        report = worker.vacuum()
        assert not worker.vacuumer.due()  # the next check is an interval away
    finally:
        worker.close()
        one.dispose()
    assert report is not None and report.vacuumed == [f"{TEST_SCHEMA}.jobs"]
    assert jobs_by_status(engine) == {"succeeded": 200}


def test_vacuum_none_leaves_the_table_to_autovacuum(
    make_worker: Callable[..., Worker],
) -> None:
    worker = make_worker(JobApp(Job), vacuum=None, kinds=ALL_KINDS)
    assert worker.vacuumer is None
    assert worker.vacuum() is None


def test_a_vacuum_that_fails_is_reported_and_no_job_is_lost(engine: Engine) -> None:
    import socket

    from sqlalchemy import create_engine

    from sa_outbox import Vacuumer, VacuumPolicy

    class Errors(WorkerMetrics):
        def __init__(self) -> None:
            self.vacuum_failed = threading.Event()

        def database_error(self, operation: str, error: BaseException) -> None:
            if operation == "vacuum":
                self.vacuum_failed.set()

    with socket.socket() as sock:  # a port nothing listens on: connecting really fails
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    unreachable = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    finished = threading.Event()
    handled: list[int] = []
    app = JobApp(Job)

    @app.handler("noop")
    def noop(job: JobContext) -> None:
        handled.append(job.payload["n"])
        if len(handled) == 50:
            finished.set()

    enqueue(engine, JobQueue(Job), "noop", 50)  # the database's clock: due now
    metrics = Errors()
    worker = Worker(app, engine, listen=False, install_signal_handlers=False, metrics=metrics)
    worker.vacuumer = Vacuumer(unreachable, Job, VacuumPolicy(threshold=1))
    thread = run_in_thread(worker)
    try:
        assert metrics.vacuum_failed.wait(WAIT)  # the keeper tried, failed, and went on
        assert finished.wait(WAIT)
    finally:
        worker.stop()
        thread.join(WAIT)
        unreachable.dispose()
    assert not thread.is_alive() and not thread.errors  # type: ignore[attr-defined]
    assert jobs_by_status(engine) == {"succeeded": 50}


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_run_once_renews_the_lease_of_a_job_that_outlives_it(
    engine: Engine,
    queue: JobQueue,
    clock: FakeClock,
    make_worker: Callable[..., Worker],
    make_async_worker: Callable[..., AsyncWorker],
    flavour: str,
) -> None:
    # run_once and drain run no keeper: while they wait for a long handler, they renew its
    # lease themselves, or another worker would claim the job again mid-run.
    with engine.begin() as conn:
        job_id = queue.enqueue(conn, "long", {}).id
    started, gate = threading.Event(), threading.Event()

    def long(job: JobContext) -> None:
        started.set()
        gate.wait(60)

    app = JobApp(Job)
    app.register("long", long)
    options = {"lease": 30, "heartbeat_interval": 0.05}
    claimed: list[int] = []
    if flavour == "sync":
        worker = make_worker(app, **options)
        thread = threading.Thread(target=lambda: claimed.append(worker.run_once()))
    else:
        aworker = make_async_worker(app, **options)
        thread = threading.Thread(target=lambda: claimed.append(asyncio.run(aworker.run_once())))
    thread.start()
    try:
        assert started.wait(30)
        assert job_row(engine, job_id).lease_until == clock.now() + dt.timedelta(seconds=30)
        clock.advance(20)  # two thirds of the lease: a renewal now counts from here
        renewed = clock.now() + dt.timedelta(seconds=30)
        wait_until(lambda: job_row(engine, job_id).lease_until == renewed, "the renewal", 30)
    finally:
        gate.set()
        thread.join(30)
    assert claimed == [1]
    row = job_row(engine, job_id)
    assert (str(row.status), row.attempts) == ("succeeded", 1)
    assert jobs_by_status(engine) == {"succeeded": 1}
