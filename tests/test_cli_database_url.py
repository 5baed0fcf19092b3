"""Every command names the database one way: ``--database-url``, else
``$SA_OUTBOX_DATABASE_URL``, else ``$DATABASE_URL``.

Each command runs here with nothing but ``DATABASE_URL`` set, as the README configures an
application, against the test database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.schema import CreateSchema, DropSchema

from sa_outbox import JobMixin, JobQueue, JobStatus, Outbox
from sa_outbox.cli import (
    ENV_APP_DATABASE_URL,
    ENV_DATABASE_URL,
    given_database_url,
    main,
)
from sa_outbox.cli._demo import DEMO_SCHEMA, demo_schema_lock
from sa_outbox.cli._demo import Job as DemoJob

from .conftest import TEST_SCHEMA, Job, OutboxEvent

ROOT = Path(__file__).resolve().parents[1]
PARTITIONED_SCHEMA = f"cli_url_{os.getpid()}"
NO_URL = f"give the database with --database-url, ${ENV_DATABASE_URL} or ${ENV_APP_DATABASE_URL}"


class PartitionedBase(DeclarativeBase):
    pass


class PartitionedJob(JobMixin, PartitionedBase):
    __tablename__ = "jobs"
    __table_schema__ = PARTITIONED_SCHEMA
    __partition_interval__ = "day"


def wait_until(
    predicate: Callable[[], bool],
    what: str,
    *,
    timeout: float = 60.0,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll ``predicate`` (another process's doing) until true; fail after ``timeout`` s,
    or as soon as ``process`` has exited, showing its ``log``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        ended = process is not None and process.poll() is not None
        if ended or time.monotonic() > deadline:
            shown = f":\n{log.read_text()}" if log is not None and log.exists() else ""
            reason = "the process exited" if ended else f"{timeout} s"
            raise AssertionError(f"gave up waiting for {what} ({reason}){shown}")
        time.sleep(0.05)


def app_env(database_url: str) -> dict[str, str]:
    """A subprocess's environment with the database in ``DATABASE_URL`` only."""
    env = {k: v for k, v in os.environ.items() if k != ENV_DATABASE_URL}
    return {**env, ENV_APP_DATABASE_URL: database_url, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def only_app_url(monkeypatch: pytest.MonkeyPatch, database_url: str) -> str:
    """The database in ``$DATABASE_URL`` only, as an application configures it."""
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)
    return database_url


@pytest.fixture
def no_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv(ENV_APP_DATABASE_URL, raising=False)


@pytest.fixture
def demo_engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url)
    yield eng
    with demo_schema_lock(eng), eng.begin() as conn:
        conn.execute(DropSchema(DEMO_SCHEMA, cascade=True, if_exists=True))
    eng.dispose()


@pytest.fixture
def partitioned(engine: Engine) -> Iterator[None]:
    with engine.begin() as conn:
        conn.execute(DropSchema(PARTITIONED_SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(PARTITIONED_SCHEMA))
    PartitionedBase.metadata.create_all(engine)
    yield
    with engine.begin() as conn:
        conn.execute(DropSchema(PARTITIONED_SCHEMA, cascade=True, if_exists=True))


@pytest.fixture
def relay_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module with a relay factory of an engine, publishing to a list."""
    name = f"relay_factory_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from sqlalchemy import Engine

            from sa_outbox import Relay
            from sa_outbox.publishers.callable import CallablePublisher
            from tests.conftest import OutboxEvent

            published = []

            def make_relay(engine: Engine) -> Relay:
                publisher = CallablePublisher(lambda event: published.append(event.payload))
                return Relay(engine, OutboxEvent, publisher, listen=False, vacuum=None)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_the_order_is_the_argument_then_sa_outbox_then_the_application_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_APP_DATABASE_URL, "postgresql://app@db/app")
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://sa@db/sa")
    assert given_database_url("postgresql://arg@db/arg") == "postgresql://arg@db/arg"
    assert given_database_url(None) == "postgresql://sa@db/sa"
    monkeypatch.setenv(ENV_DATABASE_URL, "")  # an empty variable counts as unset
    assert given_database_url(None) == "postgresql://app@db/app"
    monkeypatch.delenv(ENV_APP_DATABASE_URL)
    assert given_database_url(None) is None


def test_the_help_states_the_order_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    order = "--database-url URL, else $SA_OUTBOX_DATABASE_URL, else $DATABASE_URL"
    assert out.count(order) == 1
    assert "jobs" in out and "relay" in out


def test_demo_runs_on_database_url(only_app_url: str, demo_engine: Engine) -> None:
    assert main(["demo", "--jobs", "3"]) == 0
    with demo_engine.connect() as conn:
        done = conn.scalar(
            select(func.count()).where(DemoJob.__table__.c.status == JobStatus.SUCCEEDED)
        )
    assert done == 3


def test_prune_and_health_run_on_database_url(
    only_app_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prune", "--model", "tests.conftest:Job", "--older-than", "1d"]) == 0
    assert capsys.readouterr().out.startswith("pruned 0 succeeded, 0 failed and 0 cancelled jobs")
    assert main(["health", "--model", "tests.conftest:Job"]) == 0
    assert f"{TEST_SCHEMA}.jobs: " in capsys.readouterr().out


def test_partitions_maintain_runs_on_database_url(
    only_app_url: str, partitioned: None, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"{__name__}:PartitionedJob"
    assert main(["partitions", "maintain", "--model", target]) == 0
    assert capsys.readouterr().out.startswith(f"{PARTITIONED_SCHEMA}.jobs: created ")


def test_jobs_enqueue_runs_on_database_url(
    only_app_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["jobs", "enqueue", "ping", "--payload", "{}", "--model", "tests.conftest:Job"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("enqueued job ")
    with engine.connect() as conn:
        assert JobQueue(Job).counts(conn)[JobStatus.PENDING] == 1


def test_relay_makes_its_engine_on_database_url(
    only_app_url: str, engine: Engine, relay_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with engine.begin() as conn:
        Outbox(OutboxEvent).append(
            conn, event_type="Pinged", aggregate_type="ping", aggregate_id=1, payload={"n": 1}
        )
    assert main(["relay", f"{relay_module}:make_relay", "--once", "--log-level", "ERROR"]) == 0
    assert "1 claimed, 1 published" in capsys.readouterr().out
    assert sys.modules[relay_module].published == [{"n": 1}]


def test_the_worker_runs_on_database_url(engine: Engine, database_url: str, tmp_path: Path) -> None:
    with engine.begin() as conn:
        JobQueue(Job).enqueue(conn, "ping", {"n": 1})
    (tmp_path / "cli_url_tasks.py").write_text(
        textwrap.dedent(
            f"""
            from sqlalchemy.orm import DeclarativeBase

            from sa_outbox import JobApp, JobMixin

            class Base(DeclarativeBase):
                pass

            class Job(JobMixin, Base):
                __tablename__ = "jobs"
                __table_schema__ = "{TEST_SCHEMA}"  # the tests' table, in this process too

            app = JobApp(Job, handlers={{"ping": lambda job: None}})
            """
        )
    )
    log = tmp_path / "worker.log"

    def succeeded() -> bool:
        with engine.connect() as conn:
            return JobQueue(Job).counts(conn)[JobStatus.SUCCEEDED] == 1

    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "sa_outbox", "worker", "cli_url_tasks:app"],
            cwd=tmp_path,
            env=app_env(database_url),
            stdout=out,
            stderr=out,
        )
    try:
        wait_until(succeeded, "the worker to run the job", process=worker, log=log)
    finally:
        worker.send_signal(signal.SIGTERM)
        returncode = worker.wait(60)
    assert returncode == 0, log.read_text()


def test_the_argument_wins_over_both_variables(
    engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_DATABASE_URL, "sqlite://")
    monkeypatch.setenv(ENV_APP_DATABASE_URL, "sqlite://")
    argv = ["health", "--model", "tests.conftest:Job", "--database-url", database_url]
    assert main(argv) == 0


def test_sa_outbox_database_url_wins_over_database_url(
    engine: Engine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_DATABASE_URL, database_url)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, "sqlite://")
    assert main(["health", "--model", "tests.conftest:Job"]) == 0
    monkeypatch.setenv(ENV_DATABASE_URL, "sqlite://")
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)
    assert main(["health", "--model", "tests.conftest:Job"]) == 1
    assert "the database URL is for 'sqlite'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "tests.worker_app:app"],
        ["prune", "--model", "tests.conftest:Job", "--older-than", "1d"],
        ["health", "--model", "tests.conftest:Job"],
        ["partitions", "maintain", "--model", "tests.conftest:Job"],
        ["jobs", "enqueue", "ping", "--payload", "{}", "--model", "tests.conftest:Job"],
        ["relay", "{relay_module}:make_relay"],
    ],
    ids=lambda argv: argv[0],
)
def test_without_any_url_each_command_names_all_three(
    no_url: None, relay_module: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [arg.replace("{relay_module}", relay_module) for arg in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"sa-outbox {argv[0]}: error: {NO_URL}\n"


MALFORMED = [
    (
        "postgresql+psycopg://app:hunter2@db:notaport/app",
        "the database URL's port 'notaport' is not a number",
    ),
    (
        "postgresql://app:hunter2@[::1/app",
        "the database URL's host '[::1' has no closing ']' (an IPv6 address goes in [ ])",
    ),
    (
        "postgresql+nosuch://app:hunter2@db/app",
        "the database URL names an unknown PostgreSQL driver 'nosuch'",
    ),
    (
        "postgresql://app:hunter2@db:70000/app",
        "the database URL's port 70000 is not between 1 and 65535",
    ),
]

EVERY_COMMAND = [
    ["demo"],
    ["worker", "tests.worker_app:app"],
    ["relay", "{relay_module}:make_relay"],
    ["prune", "--model", "tests.conftest:Job", "--older-than", "1d"],
    ["health", "--model", "tests.conftest:Job"],
    ["partitions", "maintain", "--model", "tests.conftest:Job"],
    ["jobs", "enqueue", "ping", "--payload", "{}", "--model", "tests.conftest:Job"],
    ["jobs", "list", "--jobs-table", "public.jobs"],
    ["status", "--model", "tests.conftest:Job"],
    ["queues", "--model", "tests.conftest:Job"],
    ["outbox", "list", "--outbox-model", "tests.conftest:OutboxEvent"],
    ["dashboard", "--model", "tests.conftest:Job"],
]


@pytest.mark.parametrize(("url", "message"), MALFORMED, ids=["port", "ipv6", "driver", "range"])
@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=lambda argv: " ".join(argv[:2]))
def test_a_malformed_url_is_one_line_in_every_command(
    no_url: None,
    relay_module: str,
    argv: list[str],
    url: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [arg.replace("{relay_module}", relay_module) for arg in argv]
    assert main([*argv, "--database-url", url]) == 1
    out, err = capsys.readouterr()
    name = " ".join(argv[:1])
    assert err.startswith(f"sa-outbox {name}: error: {message}") and err.count("\n") == 1
    assert "Traceback" not in out + err and "hunter2" not in out + err


def test_a_malformed_url_in_the_environment_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, MALFORMED[0][0])
    assert main(["status", "--model", "tests.conftest:Job"]) == 1
    assert capsys.readouterr().err == f"sa-outbox status: error: {MALFORMED[0][1]}\n"
