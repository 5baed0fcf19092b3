"""``sa-outbox worker`` and ``sa-outbox relay`` given a database they cannot reach at all (a
host that does not resolve, a refused port, a role the server refuses) end at start-up with
one line and status 1, each in a process of its own as a user runs them; a connection lost
*after* a good start is still ridden out. Real PostgreSQL, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from sa_outbox import NewJob
from sa_outbox.cli import main
from sa_outbox.statements import WORKER_APPLICATION_PREFIX

from .helpers import wait_until
from .test_worker_faults import counts, enqueue, ledger_lines, start, stop, worker_schema
from .worker_app import SCHEMA

__all__ = ["worker_schema"]  # a fixture, used below by name

ROOT = Path(__file__).resolve().parents[1]
#: Generous: proves the command did not hang (it used to retry for 10 s before the line).
DONE_WITHIN = 60


def bad_urls(database_url: str) -> dict[str, tuple[str, str]]:
    """A URL for each way the first connection fails, and what the line must say."""
    base = make_url(database_url).set(drivername="postgresql+psycopg")
    nobody = base.set(username=f"sa_outbox_nobody_{os.getpid()}", password="hunter2")
    return {
        "unresolvable host": (
            "postgresql://app:hunter2@sa-outbox-nowhere.invalid:5432/app",
            "failed to resolve host 'sa-outbox-nowhere.invalid'",
        ),
        "refused port": ("postgresql://app:hunter2@127.0.0.1:1/app", "Connection refused"),
        "unknown role": (
            nobody.render_as_string(hide_password=False),
            f'role "sa_outbox_nobody_{os.getpid()}" does not exist',
        ),
    }


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    """An async JobApp and two relay factories (sync and async), importable from tmp_path."""
    (tmp_path / "startup_targets.py").write_text(
        textwrap.dedent(
            """
            from sqlalchemy import Engine
            from sqlalchemy.ext.asyncio import AsyncEngine

            from sa_outbox import AsyncRelay, JobApp, Relay
            from sa_outbox.publishers.callable import CallablePublisher
            from tests.conftest import OutboxEvent
            from tests.worker_app import Job

            async_app = JobApp(Job)

            @async_app.handler("ping")
            async def ping(job):
                return None

            def make_relay(engine: Engine) -> Relay:
                return Relay(engine, OutboxEvent, CallablePublisher(print), vacuum=None)

            def make_async_relay(engine: AsyncEngine) -> AsyncRelay:
                return AsyncRelay(engine, OutboxEvent, CallablePublisher(print), vacuum=None)
            """
        )
    )
    return tmp_path


COMMANDS = {
    "worker": ["worker", "tests.worker_app:app"],
    "async worker": ["worker", "startup_targets:async_app"],
    "worker --processes 2": ["worker", "tests.worker_app:app", "--processes", "2"],
    "relay": ["relay", "startup_targets:make_relay"],
    "async relay": ["relay", "startup_targets:make_async_relay"],
    "relay --once": ["relay", "startup_targets:make_relay", "--once"],
}


@pytest.mark.parametrize("failure", ["unresolvable host", "refused port", "unknown role"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_first_connection_that_fails_ends_the_command_in_one_line(
    database_url: str, modules: Path, command: str, failure: str
) -> None:
    url, reason = bad_urls(database_url)[failure]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env |= {"PYTHONPATH": f"{modules}{os.pathsep}{ROOT}", "SA_OUTBOX_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "sa_outbox", *COMMANDS[command]],
        cwd=modules,
        env=env,
        capture_output=True,
        text=True,
        timeout=DONE_WITHIN,
        check=False,
    )
    name = COMMANDS[command][0]
    shown = make_url(url).set(drivername="postgresql+psycopg").render_as_string()
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"sa-outbox {name}: error: cannot connect to {shown}: ")
    assert reason in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "WARNING" not in done.stderr and "hunter2" not in done.stderr
    assert done.stdout == ""


def test_a_connection_lost_after_the_start_is_still_ridden_out(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    ledger, log = tmp_path / "ledger", tmp_path / "worker.log"
    worker_id = f"startup-{uuid.uuid4().hex[:8]}"
    [first] = enqueue(engine, [NewJob("noop", {"n": 1})])
    args = ["-m", "sa_outbox", "worker", "tests.worker_app:app", "--worker-id", worker_id]
    worker = start([*args, "--database-url", database_url, "--log-level", "WARNING"], log, ledger)
    try:
        wait_until(lambda: len(ledger_lines(ledger)) == 1, "the first job", timeout=DONE_WITHIN)
        with engine.connect() as conn:  # every connection the worker holds, killed
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": f"{WORKER_APPLICATION_PREFIX}{worker_id}"},
            ).scalar_one()
        assert killed >= 1
        [second] = enqueue(engine, [NewJob("noop", {"n": 2})])
        wait_until(lambda: len(ledger_lines(ledger)) == 2, "the second job", timeout=DONE_WITHIN)
        assert worker.poll() is None, log.read_text()  # still running
    finally:
        assert stop(worker, log) == 0, log.read_text()
    assert [line[0] for line in ledger_lines(ledger)] == [str(first), str(second)]
    assert counts(engine) == {"succeeded": 2}
    assert worker_schema == SCHEMA


def test_a_listen_url_that_cannot_connect_ends_the_worker_in_one_line(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    listen = "postgresql://app:hunter2@127.0.0.1:1/app"
    argv = ["worker", "tests.worker_app:app", "--database-url", database_url]
    assert main([*argv, "--listen-url", listen, "--log-level", "ERROR"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "sa-outbox worker: error: cannot connect to postgresql+psycopg://app:***@127.0.0.1:1/app: "
    )
    assert err.count("\n") == 1 and "hunter2" not in err


def test_a_server_that_cannot_take_the_session_yet_is_waited_for_then_named_in_one_line(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a worker started mid-failover meets (only a standby up): the server answers but
    refuses the session ``target_session_attrs`` asks for. Here the shared server, a primary,
    asked for a standby: the same refusal, turned around. Waited for, then the same line."""
    from sqlalchemy import create_engine

    from sa_outbox.cli._common import CommandError, connect_once

    url = make_url(database_url).set(drivername="postgresql+psycopg")
    engine = create_engine(url.update_query_dict({"target_session_attrs": "standby"}))
    try:
        with caplog.at_level("WARNING", "sa_outbox.cli"), pytest.raises(CommandError) as error:
            connect_once(engine, wait=0.5)
    finally:
        engine.dispose()
    assert str(error.value).startswith("cannot connect to postgresql+psycopg://")
    assert "server is not in hot standby mode" in str(error.value)
    assert "\n" not in str(error.value)
    waits = [
        r.getMessage() for r in caplog.records if "cannot take connections yet" in r.getMessage()
    ]
    assert waits and all("waiting up to" in message for message in waits)
