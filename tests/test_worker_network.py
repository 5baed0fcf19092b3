"""A worker behind a network that stops answering (issue 18, item 2).

A proxy between the worker and the test server stops forwarding without closing anything
(`tests.blackhole.BlackholeProxy`), as a network that drops packets does. What must hold:
a worker started behind it gives up after its ``startup_timeout`` when its engine has a
``connect_timeout`` (`sa_outbox.connect_args`); a running worker whose keeper is stuck in a
heartbeat cancels its handlers by its own clock once their lease may have passed; and a
second SIGTERM stops a worker whose statement hangs. A plain ``create_engine(url)`` handed
to the worker, the relay or the maintenance runners gets the client-side timeouts of
``connect_args`` (`sa_outbox._connect_args.harden`), and one SIGTERM stops a worker whose
network stopped answering within its grace period and a bound. Each test counts the jobs at
the end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from sa_outbox import (
    AsyncWorker,
    DatabaseUnreachable,
    FakeClock,
    JobApp,
    JobContext,
    JobQueue,
    Pruner,
    Relay,
    Vacuumer,
    Worker,
    connect_args,
)
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.worker import CancelReason, Reclaimer

from . import worker_app
from .blackhole import BlackholeProxy
from .conftest import Job, OutboxEvent
from .helpers import jobs_by_status
from .worker_app import SCHEMA, create_schema, drop_schema

ROOT = Path(__file__).resolve().parent.parent
WAIT = 20.0


@pytest.fixture
def proxy(database_url: str):
    url = make_url(database_url)
    with BlackholeProxy((url.host or "127.0.0.1", url.port or 5432)) as running:
        yield running


def _through(database_url: str, proxy: BlackholeProxy) -> str:
    url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)


def test_the_blackhole_counts_a_statement_whose_answer_it_holds(engine, database_url, proxy):
    # A statement sent just before blackhole() passes; its answer is then held, and the
    # client waits as surely as for one held on its way out: `holding` must say so.
    behind = create_engine(_through(database_url, proxy))
    marker = f"/* in flight {proxy.port} */"
    done = threading.Event()

    def statement() -> None:
        with behind.connect() as conn:
            conn.execute(text(f"SELECT pg_sleep(0.5) {marker}"))
        done.set()

    thread = threading.Thread(target=statement, daemon=True)
    thread.start()
    running = text(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE :q AND pid <> pg_backend_pid()"
    )
    try:
        pause = threading.Event()
        for _ in range(int(WAIT * 100)):  # until the server runs it: the request has passed
            with engine.connect() as conn:
                if conn.execute(running, {"q": f"%{marker}%"}).scalar_one():
                    break
            pause.wait(0.01)
        else:
            pytest.fail("the statement never reached the server")
        proxy.blackhole()
        assert proxy.holding.wait(WAIT)
        assert not done.is_set()  # its answer (after 0.5 s) is held
    finally:
        proxy.restore()
        thread.join(WAIT)
        behind.dispose()
    assert done.is_set()


def test_a_worker_started_behind_a_dead_network_gives_up_after_startup_timeout(
    engine, database_url, proxy
):
    with engine.begin() as conn:
        JobQueue(Job).enqueue(conn, "noop", {})
    behind = create_engine(
        _through(database_url, proxy), connect_args=connect_args(connect_timeout=1)
    )
    proxy.blackhole()
    app = JobApp(Job, handlers={"noop": lambda job: None})
    worker = Worker(app, behind, startup_timeout=1.5, install_signal_handlers=False)
    try:
        with pytest.raises(DatabaseUnreachable, match=r"within 1.5 s \(startup_timeout\)"):
            worker.run()
    finally:
        proxy.restore()
        behind.dispose()
    assert jobs_by_status(engine) == {"pending": 1}


def test_a_stalled_heartbeat_cancels_the_handler_by_the_workers_own_clock(
    engine, database_url, proxy
):
    # A plain engine: the keepalives the worker gives it find the dead network only after
    # about 25 s, so the heartbeat hangs well past the 1.5 s lease.
    behind = create_engine(_through(database_url, proxy))
    started, returned = threading.Event(), threading.Event()
    reasons: list[CancelReason | None] = []
    app = JobApp(Job)

    @app.handler("hold")
    def hold(job: JobContext) -> None:
        started.set()
        if job.cancel.wait(WAIT):
            reasons.append(job.cancel.reason)
        returned.set()
        job.cancel.raise_if_cancelled()

    with engine.begin() as conn:
        JobQueue(Job).enqueue(conn, "hold", {})
    worker = Worker(
        app,
        behind,
        lease=1.5,
        concurrency=1,
        prefetch=0,
        listen=False,
        reclaim=False,
        vacuum=None,
        install_signal_handlers=False,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert started.wait(WAIT)
        proxy.blackhole()  # the next heartbeat is sent and never answered
        assert returned.wait(WAIT)
        assert reasons == [CancelReason.LEASE_LOST]
    finally:
        proxy.restore()
        worker.stop(now=True)
        thread.join(WAIT)
        behind.dispose()
    assert not thread.is_alive()
    assert sum(jobs_by_status(engine).values()) == 1


@pytest.fixture
def worker_schema(engine: Engine):
    create_schema(engine, audit=False)
    yield SCHEMA
    drop_schema(engine)


def _wait_for(path: Path, text: str) -> None:
    # Across processes there is no event to wait on: read the child's log, bounded.
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in the worker's log:\n{path.read_text()}")


def test_a_second_sigterm_stops_a_worker_whose_statement_hangs(
    engine, database_url, proxy, worker_schema, tmp_path
):
    log = tmp_path / "worker.log"
    env = {**os.environ, "SA_OUTBOX_WORKER_SCHEMA": worker_schema, "PYTHONPATH": str(ROOT)}
    # The only statements of an idle quiet worker are its loop's claims, every 0.1 s.
    command = [sys.executable, "-m", "tests.worker_app", "--mode", "run", "--quiet"]
    command += ["--poll-interval", "0.1", "--database-url", _through(database_url, proxy)]
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        _wait_for(log, "concurrency")  # it connected and started its loop
        proxy.blackhole()
        assert proxy.holding.wait(WAIT)  # a claim of its loop waits for an answer
        process.send_signal(signal.SIGTERM)  # graceful: waits for the claim...
        _wait_for(log, "SIGTERM received")
        process.send_signal(signal.SIGTERM)  # ... which never returns: break out of it
        assert process.wait(WAIT) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        proxy.restore()
    assert "stopped while a statement hung" in log.read_text()


def _worker_jobs(engine: Engine) -> list[Any]:
    t = worker_app.Job.__table__
    with engine.connect() as conn:
        return list(conn.execute(select(t.c.id, t.c.kind, t.c.status, t.c.lease_until)).all())


def test_one_sigterm_stops_a_worker_on_a_plain_engine_within_its_grace_period(
    engine, database_url, proxy, worker_schema, tmp_path
):
    # The engine of tests.worker_app is create_engine(url): no connect_args at all. The
    # network stops answering while three jobs run; one SIGTERM must end the process
    # within the grace period and a bound, saying what it waits for, and lose no job.
    grace, lease = 3.0, 6.0
    queue = JobQueue(worker_app.Job)
    with engine.begin() as conn:
        done = [queue.enqueue(conn, "noop", {}).id for _ in range(2)]
        held = [queue.enqueue(conn, "hold", {"seconds": 120}).id for _ in range(3)]
    log = tmp_path / "worker.log"
    env = {**os.environ, "SA_OUTBOX_WORKER_SCHEMA": worker_schema, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.worker_app", "--mode", "run", "--poll-interval", "0.1"]
    command += ["--grace", str(grace), "--lease", str(lease), "--concurrency", "5"]
    command += ["--database-url", _through(database_url, proxy)]
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + WAIT
        while Counter(row.status for row in _worker_jobs(engine)) != {"succeeded": 2, "running": 3}:
            assert time.monotonic() < deadline, log.read_text()
            assert process.poll() is None, log.read_text()
            time.sleep(0.05)
        proxy.blackhole()
        assert proxy.holding.wait(WAIT)  # its loop's next claim waits for an answer
        # Not a synchronisation: the loop has then waited on that claim for over a second,
        # which the log line at SIGTERM reports.
        time.sleep(1.0)
        assert "can stall" not in log.read_text()  # no warning: the defaults were applied
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(grace + 12) == 0, log.read_text()
        assert time.monotonic() - sent < grace + 12
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        proxy.restore()
    text_ = log.read_text()
    assert f"waiting up to {grace:g} s (grace) for 3 running jobs" in text_, text_
    for job_id in held:
        assert str(job_id) in text_
    assert "its loop waits on a statement (write" in text_, text_
    # Still in its statement, or (its write's connection was being opened through the
    # blackhole when the grace period ended) still connecting: either way it says so.
    assert (
        "grace period over; its loop still waited on a statement" in text_
        or "grace period over; its loop still waits on the database (write" in text_
    ), text_
    assert "nothing is lost" in text_, text_
    # Nothing lost: the finished jobs succeeded; the others are held by leases that
    # expire, after which the reclaimer returns them to pending.
    rows = {row.id: row for row in _worker_jobs(engine)}
    assert {i for i, row in rows.items() if row.status == "succeeded"} == set(done)
    assert {rows[i].status for i in held} <= {"running", "pending"}
    with engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
    after_lease = FakeClock(now + dt.timedelta(seconds=lease + 1))
    Reclaimer(worker_app.app, engine, clock=after_lease).run_once()
    statuses = Counter(row.status for row in _worker_jobs(engine))
    assert statuses == {"succeeded": 2, "pending": 3}


def test_a_plain_engine_handed_to_a_worker_gets_the_client_side_timeouts(engine, database_url):
    # TCP (the proxy-free shared server or any host:port URL): the socket options are
    # readable there; a unix socket has no TCP settings to read.
    url = make_url(database_url)
    if url.host is None or url.host.startswith("/") or "host" in url.query:
        pytest.skip("the database URL is a unix socket: TCP options do not apply")
    plain = create_engine(url)
    try:
        with plain.connect() as conn:  # pooled before the worker sees the engine
            early = conn.connection.driver_connection
        app = JobApp(Job, handlers={"noop": lambda job: None})
        Worker(app, plain, install_signal_handlers=False)
        with plain.connect() as conn:  # the same pooled connection: its socket is set
            assert conn.connection.driver_connection is early
            sock = socket.socket(fileno=os.dup(early.fileno()))
            with sock:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30000
            conn.invalidate()
            # The server's side of the pooled session has the same limits.
            assert _server_tcp(conn)["tcp_keepalives_idle"] == ("10", "session")
            conn.invalidate()
        with plain.connect() as conn:  # a new connection: libpq has the parameters
            given = conn.connection.driver_connection.info.get_parameters()
            server = _server_tcp(conn)
        assert given["connect_timeout"] == "10"
        assert (given["keepalives_idle"], given["tcp_user_timeout"]) == ("10", "30000")
        assert server == {
            "tcp_keepalives_count": ("3", "session"),
            "tcp_keepalives_idle": ("10", "session"),
            "tcp_keepalives_interval": ("5", "session"),
            "tcp_user_timeout": ("30000", "session"),
        }
    finally:
        plain.dispose()


def _server_tcp(conn: Connection) -> dict[str, tuple[str, str]]:
    """The server's TCP settings for the session: name → (setting, where it came from)."""
    rows = conn.execute(
        text("SELECT name, setting, source FROM pg_settings WHERE name LIKE 'tcp%'")
    ).all()
    return {name: (setting, source) for name, setting, source in rows}


def test_the_defaults_never_override_what_the_engine_sets(database_url):
    mine = create_engine(database_url, connect_args={"connect_timeout": 3, "keepalives_idle": 7})
    try:
        Worker(JobApp(Job, handlers={"noop": lambda job: None}), mine)
        with mine.connect() as conn:
            given = conn.connection.driver_connection.info.get_parameters()
        assert (given["connect_timeout"], given["keepalives_idle"]) == ("3", "7")
        assert given["keepalives_interval"] == "5"  # unset by the user: the default
    finally:
        mine.dispose()


def test_the_server_side_limits_follow_the_client_and_never_override_a_setting(database_url):
    # The server's keepalives take the client's values; one the session was started with
    # (as from postgresql.conf or ALTER ROLE ... SET: not the built-in default) is kept.
    options = "-c tcp_keepalives_count=7"
    mine = create_engine(database_url, connect_args={"keepalives_idle": 4, "options": options})
    try:
        Worker(JobApp(Job, handlers={"noop": lambda job: None}), mine)
        with mine.connect() as conn:
            first = conn.connection.driver_connection
        with mine.connect() as conn:  # the same connection, after the pool's rollback
            assert conn.connection.driver_connection is first
            server = _server_tcp(conn)
        assert server["tcp_keepalives_count"][1] == "client"
        assert server["tcp_keepalives_idle"][1] == "session"
        assert server["tcp_keepalives_interval"][1] == "session"
    finally:
        mine.dispose()


async def test_stop_ends_an_async_worker_on_a_plain_engine_within_its_grace_period(
    engine, database_url, proxy, caplog
):
    # create_async_engine(url), no connect_args: the network stops answering while a job
    # runs; stop() must end run() within the grace period and a bound, and lose nothing.
    behind = create_async_engine(_through(database_url, proxy))
    started = asyncio.Event()
    app = JobApp(Job)

    @app.handler("hold")
    async def hold(job: JobContext) -> None:
        started.set()
        await asyncio.wait_for(job.cancel.wait_async(), WAIT)

    with engine.begin() as conn:
        [held] = [JobQueue(Job).enqueue(conn, "hold", {}).id]
    grace = 2.0
    worker = AsyncWorker(
        app,
        behind,
        grace=grace,
        lease=6.0,
        poll_interval=0.1,
        listen=False,
        vacuum=None,
        install_signal_handlers=False,
    )
    caplog.set_level(logging.INFO, logger="sa_outbox.worker")
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), WAIT)
        proxy.blackhole()
        await asyncio.wait_for(asyncio.to_thread(proxy.holding.wait, WAIT), WAIT + 1)
        await asyncio.sleep(1.0)  # not a synchronisation: the claim then waited a second
        sent = time.monotonic()
        worker.stop()
        await asyncio.wait_for(run, grace + 12)
        assert time.monotonic() - sent < grace + 12
    finally:
        proxy.restore()
        if not run.done():
            run.cancel()
        await behind.dispose()
    assert f"waiting up to {grace:g} s (grace) for 1 running jobs ({held})" in caplog.text
    assert "its loop waits on a statement" in caplog.text
    assert "grace period over; its loop still waited on a statement" in caplog.text
    with engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
    Reclaimer(app, engine, clock=FakeClock(now + dt.timedelta(seconds=7))).run_once()
    assert jobs_by_status(engine) == {"pending": 1}


def _given_parameters(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.connection.driver_connection.info.get_parameters())


@pytest.mark.parametrize(
    "build",
    [
        lambda engine: Relay(engine, OutboxEvent, CallablePublisher(lambda events: None)),
        lambda engine: Pruner(engine, jobs=Job),
        lambda engine: Vacuumer(engine, Job),
        lambda engine: Reclaimer(JobApp(Job), engine),
    ],
    ids=["relay", "pruner", "vacuumer", "reclaimer"],
)
def test_the_relay_and_the_maintenance_runners_bound_a_plain_engine(database_url, build):
    plain = create_engine(database_url)
    try:
        assert "keepalives_idle" not in _given_parameters(plain)
        plain.dispose()
        build(plain)
        given = _given_parameters(plain)
        assert (given["connect_timeout"], given["keepalives_idle"]) == ("10", "10")
        assert given["tcp_user_timeout"] == "30000"
    finally:
        plain.dispose()


async def test_an_async_engine_handed_to_an_async_worker_gets_the_timeouts(database_url):
    plain = create_async_engine(database_url)
    try:
        AsyncWorker(JobApp(Job, handlers={"noop": lambda job: None}), plain)
        async with plain.connect() as conn:
            raw = await conn.get_raw_connection()
            given = raw.driver_connection.info.get_parameters()
            source = await conn.scalar(
                text("SELECT source FROM pg_settings WHERE name = 'tcp_keepalives_idle'")
            )
        assert (given["connect_timeout"], given["keepalives_idle"]) == ("10", "10")
        assert source == "session"
    finally:
        await plain.dispose()
