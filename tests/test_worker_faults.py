"""Faults, with real connections and real processes: nothing lost, nothing completed twice.

- a connection terminated (``pg_terminate_backend``) in the middle of a claim, or after a
  completion ran but before it committed: the worker reconnects with backoff and goes on;
- the database refusing every connection for a while (as while a server restarts);
- a worker process killed with SIGKILL in the middle of a job: another one finishes it after
  the lease; a job that kills every worker that takes it ends ``failed`` after max_attempts;
- SIGTERM to ``sa-outbox worker``: running jobs finish or are released;
- the chaos test: worker processes on 10,000 jobs, one SIGKILLed, connections terminated.

The job table of ``tests/worker_app.py`` carries audit triggers: every claim (with its new
token) and every completion (with the token that completed it) leaves a row, so "each job
succeeded exactly once, by its final token" is checked in the database itself. Waiting for a
process is waiting for a condition (a count in the database, an exit) with a time limit.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import FakeClock, JobApp, JobContext, JobMixin, JobQueue, NewJob, Worker
from sa_outbox.worker import CancelReason, CountingMetrics, Reclaimer

from . import worker_app
from .helpers import wait_until
from .worker_app import SCHEMA, Job

ROOT = Path(__file__).resolve().parents[1]
WAIT = 10.0
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def worker_schema(engine: Engine) -> Iterator[str]:
    worker_app.create_schema(engine)
    yield SCHEMA
    worker_app.drop_schema(engine)


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT status, count(*) FROM {SCHEMA}.jobs GROUP BY status")
        ).all()
    return {str(status): n for status, n in rows}


def enqueue(engine: Engine, jobs: list[NewJob], clock: FakeClock | None = None) -> list[uuid.UUID]:
    ids = []
    with engine.begin() as conn:
        for start in range(0, len(jobs), 1000):
            results = JobQueue(Job, clock=clock).enqueue_many(conn, jobs[start : start + 1000])
            ids.extend(r.id for r in results if r.id is not None)
    return ids


def assert_completed_exactly_once_by_final_token(engine: Engine, expected: int) -> None:
    """Every job succeeded; one completion each, by the token of its last claim."""
    with engine.connect() as conn:
        problems = conn.execute(
            text(
                f"""
                WITH last_claim AS (
                    SELECT DISTINCT ON (job_id) job_id, token
                    FROM {SCHEMA}.claims ORDER BY job_id, seq DESC
                ), done AS (
                    SELECT job_id, count(*) AS n, min(CAST(token AS text)) AS token
                    FROM {SCHEMA}.completions GROUP BY job_id
                )
                SELECT j.id, j.status, d.n, d.token, CAST(c.token AS text)
                FROM {SCHEMA}.jobs AS j
                LEFT JOIN done AS d ON d.job_id = j.id
                LEFT JOIN last_claim AS c ON c.job_id = j.id
                WHERE j.status <> 'succeeded' OR d.n IS DISTINCT FROM 1
                   OR d.token IS DISTINCT FROM CAST(c.token AS text)
                """
            )
        ).all()
        total = conn.execute(text(f"SELECT count(*) FROM {SCHEMA}.completions")).scalar_one()
    assert problems == [], f"{len(problems)} jobs not completed exactly once: {problems[:5]}"
    assert total == expected


def terminate_backend_of(conn: Connection, admin: Engine) -> None:
    pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
    with admin.connect() as c:
        c.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})


# -- connections terminated in the middle of a write ---------------------------------------


@pytest.mark.parametrize("moment", ["mid-claim", "after the completion, before commit"])
def test_a_terminated_connection_is_retried_and_nothing_is_written_twice(
    engine: Engine, database_url: str, worker_schema: str, moment: str
) -> None:
    ids = enqueue(engine, [NewJob("noop", {"n": i}) for i in range(60)])
    worker_engine = create_engine(database_url)
    kills = {"left": 2, "seen": 0}

    def is_target(statement: str) -> bool:
        if moment == "mid-claim":
            return "FOR UPDATE SKIP LOCKED" in statement
        return "AS acks" in statement  # complete_jobs: UPDATE … FROM unnest(…) AS acks

    def maybe_kill(conn: Connection, statement: str) -> None:
        if is_target(statement):
            kills["seen"] += 1
            if kills["left"] and kills["seen"] % 2 == 0:
                kills["left"] -= 1
                terminate_backend_of(conn, engine)

    if moment == "mid-claim":  # before the claim reaches the server
        event.listen(worker_engine, "before_cursor_execute", lambda c, cur, s, *a: maybe_kill(c, s))
    else:  # the completion ran in the transaction, which then cannot commit
        event.listen(worker_engine, "after_cursor_execute", lambda c, cur, s, *a: maybe_kill(c, s))
    metrics = CountingMetrics()
    worker = Worker(
        worker_app.app, worker_engine, concurrency=4, batch=10, metrics=metrics, listen=False
    )
    try:
        worker.drain(timeout=WAIT)
    finally:
        worker.close()
        worker_engine.dispose()
    assert kills["left"] == 0
    assert [operation for operation, _ in metrics.errors] == ["write", "write"]
    assert counts(engine) == {"succeeded": len(ids)}
    assert_completed_exactly_once_by_final_token(engine, len(ids))


def test_a_lease_heartbeats_could_not_renew_cancels_the_handler(
    engine: Engine, database_url: str, worker_schema: str
) -> None:
    clock = FakeClock(T0)
    started, returned = threading.Event(), threading.Event()
    reasons: list[object] = []
    app = JobApp(Job)

    @app.handler("long")
    def long_job(job: JobContext) -> None:
        started.set()
        job.cancel.wait(WAIT)
        reasons.append(job.cancel.reason)
        returned.set()

    [job_id] = enqueue(engine, [NewJob("long", {})], clock=clock)
    worker_engine = create_engine(database_url)

    def kill_heartbeats(conn: Connection, cursor: object, statement: str, *args: object) -> None:
        if "WITH live AS" in statement:  # heartbeat_jobs: its held rows, locked in id order
            terminate_backend_of(conn, engine)

    event.listen(worker_engine, "before_cursor_execute", kill_heartbeats)
    worker = Worker(
        app, worker_engine, lease=30, clock=clock, timer=lambda: clock.now().timestamp()
    )
    try:
        worker.claim()
        assert started.wait(WAIT)
        clock.advance(20)
        with pytest.raises(OperationalError):
            worker.heartbeat()  # failed, but the lease has 10 s left: nothing cancelled
        assert not returned.is_set()
        clock.advance(10)
        with pytest.raises(OperationalError):
            worker.heartbeat()  # failed again, and the lease may now have expired
        assert returned.wait(WAIT)
        assert reasons == [CancelReason.LEASE_LOST]
        assert worker.wait_for_handlers(WAIT)
        event.remove(worker_engine, "before_cursor_execute", kill_heartbeats)
        worker.flush()  # nobody reclaimed it meanwhile: the fenced completion still holds
    finally:
        worker.close()
        worker_engine.dispose()
    assert counts(engine) == {"succeeded": 1}
    assert_completed_exactly_once_by_final_token(engine, 1)
    assert job_id is not None


# -- the database goes away and comes back -------------------------------------------------


class OutageBase(DeclarativeBase):
    pass


class OutageJob(JobMixin, OutageBase):
    __tablename__ = "jobs"


class WaitableMetrics(CountingMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def database_error(self, operation: str, error: BaseException) -> None:
        super().database_error(operation, error)
        with self.changed:
            self.changed.notify_all()


@pytest.fixture
def outage_database(engine: Engine, database_url: str) -> Iterator[tuple[str, Engine]]:
    name = f"sa_outbox_outage_{os.getpid()}"
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(database_url).set(database=name)
    outage_engine = create_engine(url)
    OutageBase.metadata.create_all(outage_engine)
    with outage_engine.begin() as conn:
        conn.exec_driver_sql(worker_app.AUDIT_SQL.format(schema="public"))
    yield name, outage_engine
    outage_engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def test_the_worker_waits_for_a_database_that_went_away_and_loses_nothing(
    engine: Engine, outage_database: tuple[str, Engine]
) -> None:
    name, outage_engine = outage_database
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    started = threading.Semaphore(0)
    gate = threading.Event()
    app = JobApp(OutageJob)

    @app.handler("gated")
    def gated(job: JobContext) -> None:
        started.release()
        assert gate.wait(WAIT)

    app.register("noop", lambda job: None)
    queue = JobQueue(OutageJob)
    with outage_engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("gated", {}, priority=1) for _ in range(4)])
        queue.enqueue_many(conn, [NewJob("noop", {"n": i}) for i in range(50)])
    metrics = WaitableMetrics()
    worker = Worker(
        app,
        outage_engine,
        concurrency=4,
        poll_interval=0.05,
        metrics=metrics,
        install_signal_handlers=False,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        for _ in range(4):
            assert started.acquire(timeout=WAIT)  # the four gated jobs run; 50 wait
        assert worker.listening.wait(WAIT)
        with admin.connect() as conn:  # the server "goes down": no connection in or out
            conn.execute(text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                    " WHERE datname = :name"
                ),
                {"name": name},
            )
        gate.set()  # four results to write, and nowhere to write them
        with metrics.changed:
            assert metrics.changed.wait_for(lambda: len(metrics.errors) >= 3, WAIT)
        assert counts_in(outage_engine, admin, name) is None
        with admin.connect() as conn:  # the server is back
            conn.execute(text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        wait_until(
            lambda: counts_in(outage_engine, admin, name) == {"succeeded": 54},
            "every job to succeed after the outage",
        )
        assert worker.listening.wait(WAIT)  # the listener reconnected too
    finally:
        gate.set()
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    with outage_engine.connect() as conn:
        done = conn.execute(
            text("SELECT count(*), count(DISTINCT job_id) FROM public.completions")
        ).one()
    assert tuple(done) == (54, 54)
    assert {operation for operation, _ in metrics.errors} >= {"write"}


def counts_in(outage_engine: Engine, admin: Engine, name: str) -> dict[str, int] | None:
    """Job counts of the outage database, or None while it refuses connections."""
    with admin.connect() as conn:
        allowed = conn.execute(
            text("SELECT datallowconn FROM pg_database WHERE datname = :name"), {"name": name}
        ).scalar_one()
    if not allowed:
        return None
    t = OutageJob.__table__
    with outage_engine.connect() as conn:
        rows = conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all()
    return {str(status): n for status, n in rows}


# -- processes -----------------------------------------------------------------------------


def worker_env(ledger: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "SA_OUTBOX_WORKER_SCHEMA": SCHEMA, "PYTHONPATH": str(ROOT)}
    if ledger is not None:
        env["SA_OUTBOX_WORKER_LEDGER"] = str(ledger)
    return env


def start(args: list[str], log: Path, ledger: Path | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=worker_env(ledger), stdout=out, stderr=out
        )


def ledger_lines(ledger: Path) -> list[tuple[str, str, int, int]]:
    if not ledger.exists():
        return []
    lines = []
    for line in ledger.read_text().splitlines():
        job_id, token, attempts, pid = line.split()
        lines.append((job_id, token, int(attempts), int(pid)))
    return lines


def stop(process: subprocess.Popen[bytes], log: Path) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"worker {process.pid} ignored SIGTERM:\n{log.read_text()}") from None


def test_a_worker_killed_mid_job_leaves_it_to_another_after_the_lease(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    ledger, log = tmp_path / "ledger", tmp_path / "workers.log"
    [held] = enqueue(engine, [NewJob("hold", {"seconds": 60}, priority=1)])
    enqueue(engine, [NewJob("noop", {"n": i}) for i in range(20)])
    args = ["-m", "tests.worker_app", "--database-url", database_url, "--mode", "run"]
    a = start([*args, "--lease", "1.5"], log, ledger)
    try:
        wait_until(lambda: any(line[0] == str(held) for line in ledger_lines(ledger)), "job A")
        a.send_signal(signal.SIGKILL)  # in the middle of the job
        assert a.wait(WAIT) == -signal.SIGKILL
        b = start([*args, "--lease", "1.5"], log, ledger)
        try:
            wait_until(lambda: counts(engine) == {"succeeded": 21}, "B to finish A's job")
        finally:
            assert stop(b, log) == 0, log.read_text()
    finally:
        if a.poll() is None:
            a.kill()
    runs = [line for line in ledger_lines(ledger) if line[0] == str(held)]
    assert [(attempts, pid) for _, _, attempts, pid in runs] == [(1, a.pid), (2, b.pid)]
    with engine.connect() as conn:
        [completed_by] = conn.execute(
            text(f"SELECT worker_id FROM {SCHEMA}.completions WHERE job_id = :id"), {"id": held}
        ).scalars()
    assert f":{b.pid}:" in completed_by
    assert_completed_exactly_once_by_final_token(engine, 21)


def test_a_job_that_kills_every_worker_fails_after_max_attempts_without_looping_hot(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    """Each worker process runs on a fake clock an hour later than the previous one."""
    ledger, log = tmp_path / "ledger", tmp_path / "workers.log"
    [poison] = enqueue(engine, [NewJob("kill-worker", {}, max_attempts=3)], clock=FakeClock(T0))
    args = ["-m", "tests.worker_app", "--database-url", database_url, "--lease", "30"]
    for attempt in (1, 2, 3):
        now = T0 + dt.timedelta(hours=attempt)
        worker = start([*args, "--clock", now.isoformat()], log, ledger)
        assert worker.wait(60) == -signal.SIGKILL, log.read_text()
        after_lease = FakeClock(now + dt.timedelta(seconds=31))
        with engine.connect() as conn:
            row = conn.execute(select(Job.__table__).where(Job.__table__.c.id == poison)).one()
        assert (row.status, row.attempts) == ("running", attempt)
        [reclaimed] = Reclaimer(worker_app.app, engine, clock=after_lease).run_once()
        assert reclaimed.id == poison
        with engine.begin() as conn:
            row = conn.execute(select(Job.__table__).where(Job.__table__.c.id == poison)).one()
            claim = JobQueue(Job, clock=after_lease).claim(conn, worker_id="eager", batch=10)
        if attempt < 3:
            # Back to pending, but not now: the backoff keeps it from looping hot.
            assert row.status == "pending" and row.run_at > after_lease.now()
            assert claim == []
        else:
            assert row.status == "failed"
            assert row.last_error.startswith("lease expired at ")
    runs = ledger_lines(ledger)
    assert [attempts for _, _, attempts, _ in runs] == [1, 2, 3]
    assert len({pid for *_, pid in runs}) == 3
    assert counts(engine) == {"failed": 1}


def test_sigterm_to_the_cli_worker_finishes_or_releases_running_jobs(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    ledger, log = tmp_path / "ledger", tmp_path / "worker.log"
    polite, stubborn, waiting = enqueue(
        engine,
        [
            NewJob("hold", {"seconds": 60}, priority=2),  # returns when its token is cancelled
            NewJob("stubborn", {"seconds": 60}, priority=1),  # ignores it
            NewJob("noop", {}, priority=0),  # never claimed: concurrency is 2
        ],
    )
    cli = [
        "-m", "sa_outbox", "worker", "tests.worker_app:app", "--database-url", database_url,
        "--concurrency", "2", "--grace", "1", "--poll-interval", "60",
    ]  # fmt: skip
    worker = start(cli, log, ledger)
    try:
        wait_until(lambda: len(ledger_lines(ledger)) == 2, "both jobs to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
    output = log.read_text()
    assert "SIGTERM received" in output
    assert "releasing 1 running jobs back to pending" in output
    with engine.connect() as conn:
        rows = {
            row.id: row
            for row in conn.execute(
                select(Job.__table__).where(Job.__table__.c.id.in_([polite, stubborn, waiting]))
            )
        }
    assert (rows[polite].status, rows[polite].attempts) == ("succeeded", 1)
    assert (rows[stubborn].status, rows[stubborn].attempts) == ("pending", 0)
    assert rows[stubborn].lease_token is None
    assert (rows[waiting].status, rows[waiting].attempts) == ("pending", 0)


# -- chaos ---------------------------------------------------------------------------------

CHAOS_JOBS = 10_000
CHAOS_WORKERS = 3


def test_chaos_every_job_succeeds_exactly_once_by_its_final_token(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    """Worker processes on 10,000 no-op jobs; one is SIGKILLed, connections are terminated."""
    ledger, log = tmp_path / "ledger", tmp_path / "workers.log"
    ids = enqueue(engine, [NewJob("noop", {"n": i}) for i in range(CHAOS_JOBS)])
    application = f"sa-outbox-chaos-{os.getpid()}"
    url = make_url(database_url).update_query_dict({"application_name": application})
    cli = [
        "-m", "sa_outbox", "worker", "tests.worker_app:app",
        "--database-url", url.render_as_string(hide_password=False),
        "--concurrency", "8", "--batch", "20", "--lease", "2", "--grace", "5",
    ]  # fmt: skip
    workers = [start(cli, log, ledger) for _ in range(CHAOS_WORKERS)]

    def succeeded() -> int:
        return counts(engine).get("succeeded", 0)

    def terminate_worker_connections() -> int:
        with engine.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name = :name"
                    ),
                    {"name": application},
                ).all()
            )

    terminated = []
    try:
        victim = workers[0].pid
        wait_until(
            lambda: (
                succeeded() >= CHAOS_JOBS * 0.15
                and any(pid == victim for *_, pid in ledger_lines(ledger))
            ),
            "the workers to get going",
        )
        workers[0].send_signal(signal.SIGKILL)  # mid-batch: it holds claimed jobs
        assert workers[0].wait(WAIT) == -signal.SIGKILL
        for share in (0.4, 0.7):
            wait_until(lambda share=share: succeeded() >= CHAOS_JOBS * share, f"{share:.0%}")
            terminated.append(terminate_worker_connections())
        wait_until(lambda: succeeded() == CHAOS_JOBS, "every job", timeout=180)
    finally:
        codes = [stop(worker, log) for worker in workers[1:]]
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert codes == [0] * (CHAOS_WORKERS - 1), log.read_text()
    assert all(n > 0 for n in terminated)

    assert counts(engine) == {"succeeded": CHAOS_JOBS}
    assert_completed_exactly_once_by_final_token(engine, CHAOS_JOBS)
    runs = collections.Counter(job_id for job_id, *_ in ledger_lines(ledger))
    assert set(runs) == {str(i) for i in ids}  # each job ran at least once
    duplicates = sum(runs.values()) - CHAOS_JOBS
    with engine.connect() as conn:
        claims = conn.execute(text(f"SELECT count(*) FROM {SCHEMA}.claims")).scalar_one()
    print(
        f"\nchaos: {CHAOS_JOBS} jobs, {CHAOS_WORKERS} workers (1 SIGKILLed), "
        f"{sum(terminated)} connections terminated; {claims} claims, "
        f"{sum(runs.values())} handler runs ({duplicates} duplicates: jobs whose run was "
        "lost with the killed worker or a terminated connection and ran again)"
    )
