"""`Supervisor`: several worker processes under one parent (issue 16).

Real processes on the real database: the supervisor restarts a child killed with SIGKILL,
stops them all on SIGTERM, and no job is lost or left behind. Across processes there is
no event to wait on, so the tests poll the database (or the process table) with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from sa_outbox import InvalidArgument, JobQueue, NewJob
from sa_outbox.worker.supervisor import Supervisor

from .helpers import wait_until
from .worker_app import Job, create_schema, drop_schema

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0


@pytest.fixture
def worker_schema(engine: Engine) -> Iterator[str]:
    create_schema(engine, audit=False)
    yield Job.__table__.schema
    drop_schema(engine)


def enqueue(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("noop", {"n": i}) for i in range(n)])


def counts(engine: Engine) -> dict[str, int]:
    t = Job.__table__
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all()
    return {str(status): n for status, n in rows}


def test_a_killed_child_is_restarted_and_stop_stops_them_all(engine, database_url, worker_schema):
    enqueue(engine, 200)
    supervisor = Supervisor(
        "tests.worker_app:app",
        database_url,
        processes=2,
        worker_options={"concurrency": 2, "poll_interval": 0.2},
        install_signal_handlers=False,
    )
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        wait_until(lambda: counts(engine) == {"succeeded": 200}, "the first jobs are done")
        pids = supervisor.pids
        assert len(pids) == 2 and all(pids.values())
        first = pids[0]
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: supervisor.pids[0] not in (None, first), "child 0 was started again")
        enqueue(engine, 100)
        wait_until(lambda: counts(engine) == {"succeeded": 300}, "the later jobs are done")
    finally:
        supervisor.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert supervisor.restarts == 1
    assert all(pid is None for pid in supervisor.pids.values())
    assert counts(engine) == {"succeeded": 300}


def test_sigterm_stops_the_cli_supervisor_and_its_children_gracefully(
    engine, database_url, worker_schema, tmp_path
):
    enqueue(engine, 50)
    log = tmp_path / "supervisor.log"
    env = {**os.environ, "SA_OUTBOX_WORKER_SCHEMA": worker_schema, "PYTHONPATH": str(ROOT)}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "sa_outbox", "worker", "tests.worker_app:app"),
                *("--processes", "2", "--poll-interval", "0.2", "--database-url", database_url),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        wait_until(lambda: counts(engine) == {"succeeded": 50}, "the jobs are done")
        children = [
            int(pid)
            for pid in subprocess.run(
                ["pgrep", "-P", str(process.pid), "-f", "spawn_main"],
                capture_output=True,
                text=True,
            ).stdout.split()
        ]
        assert len(children) == 2, log.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # every child is gone too
    assert "SIGTERM received" in log.read_text()
    assert counts(engine) == {"succeeded": 50}


def test_a_wrong_target_or_count_is_refused_before_any_child_starts(database_url):
    with pytest.raises(InvalidArgument, match="processes"):
        Supervisor("tests.worker_app:app", database_url, processes=0)
    with pytest.raises(InvalidArgument, match="cannot import"):
        Supervisor("no_such_module:app", database_url, processes=1)
