"""``sa-outbox``: the demo end to end against the test database, and the CLI's errors.

The demo owns the schema ``sa_outbox_demo``; every check reads the rows back from it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, func, inspect, select
from sqlalchemy.schema import DropSchema

import sa_outbox
from sa_outbox import InvalidArgument
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL, main
from sa_outbox.cli import _common as cli_common
from sa_outbox.cli import _main as cli_main
from sa_outbox.cli import database_url as parse_url
from sa_outbox.cli._demo import (
    BAD_RECIPIENT,
    DEMO_SCHEMA,
    Job,
    OutboxEvent,
    demo_schema_lock,
    run_demo,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def demo_engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url)
    yield eng
    with demo_schema_lock(eng), eng.begin() as conn:
        conn.execute(DropSchema(DEMO_SCHEMA, cascade=True, if_exists=True))
    eng.dispose()


@pytest.fixture
def no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv(ENV_APP_DATABASE_URL, raising=False)


def status_counts(engine: Engine) -> dict[str, int]:
    t = Job.__table__
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all()
    return {str(status): n for status, n in rows}


def test_demo_works_every_job_and_publishes_the_event(demo_engine, database_url, capsys):
    assert main(["demo", "--database-url", database_url, "--jobs", "57"]) == 0

    assert status_counts(demo_engine) == {"succeeded": 57, "failed": 1}
    jobs, events = Job.__table__, OutboxEvent.__table__
    with demo_engine.connect() as conn:
        failed = conn.execute(select(jobs).where(jobs.c.status == "failed")).one()
        welcome0 = conn.execute(
            select(func.count()).where(jobs.c.deduplication_key == "welcome:user0")
        ).scalar_one()
        leases_held = conn.execute(
            select(func.count()).where(jobs.c.lease_token.is_not(None))
        ).scalar_one()
        attempts = set(conn.execute(select(jobs.c.attempts).distinct()).scalars())
        event = conn.execute(select(events)).one()
    assert failed.payload == {"to": BAD_RECIPIENT}
    assert failed.last_error == f"invalid recipient {BAD_RECIPIENT!r}: not an e-mail address"
    assert welcome0 == 1  # the duplicate deduplication key was skipped
    assert leases_held == 0  # every acknowledgement released its lease
    assert attempts == {1}  # nothing ran twice
    assert event.published_at is not None
    assert event.payload == {"jobs": 58}

    out = capsys.readouterr().out
    assert "58 jobs + 1 outbox event in one transaction; 1 duplicate key skipped" in out
    assert "worked     58 jobs in " in out
    assert "jobs       pending 0, running 0, succeeded 57, failed 1" in out
    assert f"failed     send-email {failed.id}: {failed.last_error}" in out
    assert f"published  event {event.id} (DemoJobsEnqueued)" in out
    assert f"SELECT status, count(*) FROM {DEMO_SCHEMA}.jobs GROUP BY status;" in out


def test_demo_starts_afresh_each_run(demo_engine, database_url):
    assert main(["demo", "--database-url", database_url, "--jobs", "5"]) == 0
    assert main(["demo", "--database-url", database_url, "--jobs", "3"]) == 0
    assert status_counts(demo_engine) == {"succeeded": 3, "failed": 1}


def test_demo_reads_the_url_from_the_environment(demo_engine, database_url, monkeypatch):
    monkeypatch.setenv(ENV_DATABASE_URL, database_url)
    assert main(["demo", "--jobs", "4"]) == 0
    assert status_counts(demo_engine) == {"succeeded": 4, "failed": 1}


def test_demo_without_a_url_uses_the_embedded_database(
    demo_engine, database_url, no_env_url, monkeypatch, capsys
):
    started: list[bool] = []

    def fake_embedded() -> str:
        started.append(True)
        return database_url

    monkeypatch.setattr(cli_main, "embedded_database_url", fake_embedded)
    assert main(["demo", "--jobs", "2"]) == 0
    assert started == [True]
    out = capsys.readouterr().out
    assert "starting a temporary embedded PostgreSQL" in out
    assert "look" not in out  # the embedded server stops with the process
    assert status_counts(demo_engine) == {"succeeded": 2, "failed": 1}


def test_demo_without_a_url_nor_pgserver_says_what_to_install(no_env_url, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pgserver", None)  # import pgserver now fails
    assert main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sa-outbox demo: error: ")
    if sys.version_info >= (3, 13):  # pgserver has no build for it: nothing to install
        assert "has no build for Python 3.13: pass a URL" in err
    else:
        assert 'pip install "sa-outbox[embedded]"' in err


@pytest.mark.parametrize("jobs", [0, 100_001, 2.5, True])
def test_run_demo_refuses_a_bad_job_count(jobs):
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(InvalidArgument, match="jobs must be an int between 1 and 100000"):
        run_demo(engine, jobs=jobs)


def test_concurrent_demos_on_one_database_take_turns(demo_engine):
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = list(pool.map(lambda n: run_demo(demo_engine, jobs=n), [150, 90]))
    assert [dict(r.counts) for r in reports] == [
        {"pending": 0, "running": 0, "succeeded": 150, "failed": 1, "cancelled": 0},
        {"pending": 0, "running": 0, "succeeded": 90, "failed": 1, "cancelled": 0},
    ]
    assert all(r.lost == 0 and len(r.published) == 1 for r in reports)


def test_unreachable_database_is_a_clear_error_without_the_password(capsys):
    url = "postgresql://demo:hunter2@127.0.0.1:1/nowhere"
    assert main(["demo", "--database-url", url]) == 1
    err = capsys.readouterr().err
    prefix = "sa-outbox demo: error: database error on "
    assert f"{prefix}postgresql+psycopg://demo:***@127.0.0.1:1/nowhere: " in err
    assert "hunter2" not in err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///app.db", "sa-outbox needs PostgreSQL, but the database URL is for 'sqlite'"),
        ("not a url", "the database URL could not be parsed"),
    ],
)
def test_bad_database_urls_are_refused(url, message, capsys):
    assert main(["demo", "--database-url", url]) == 1
    assert message in capsys.readouterr().err


def test_a_driver_that_cannot_load_says_what_to_install(monkeypatch, capsys):
    def no_libpq(url: object, **options: object) -> Engine:
        raise ImportError("no pq wrapper available")

    monkeypatch.setattr(cli_common, "create_engine", no_libpq)
    assert main(["demo", "--database-url", "postgresql://app@db/app"]) == 1
    err = capsys.readouterr().err
    assert "no pq wrapper available" in err
    assert 'pip install "sa-outbox[binary]"' in err


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("postgres://app@db/app", "postgresql+psycopg://app@db/app"),
        ("postgresql://app@db/app", "postgresql+psycopg://app@db/app"),
        ("postgresql+asyncpg://app@db/app", "postgresql+psycopg://app@db/app"),
        ("postgresql+psycopg_async://app@db/app", "postgresql+psycopg://app@db/app"),
        ("postgresql+psycopg2://app@db/app", "postgresql+psycopg2://app@db/app"),
    ],
)
def test_database_urls_run_on_a_sync_driver(raw, expected):
    assert parse_url(raw).render_as_string() == expected


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"sa-outbox {sa_outbox.__version__}\n"


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: sa-outbox" in out
    assert "demo" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["demo", "--jobs", "0"], "argument --jobs: must be between 1 and 100,000, got 0"),
        (["demo", "--jobs", "many"], "argument --jobs: expected a whole number, got 'many'"),
        (["launch"], "invalid choice: 'launch'"),
        (["partitions"], "the following arguments are required: ACTION"),
        (["partitions", "maintain"], "one of the arguments --model --outbox-model is required"),
        (["partitions", "maintain", "--model", "m:Job", "--ahead", "0"], "must be more than"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_python_m_sa_outbox_runs_the_demo(demo_engine, database_url):
    done = subprocess.run(
        [sys.executable, "-m", "sa_outbox", "demo", "--database-url", database_url, "--jobs", "25"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "jobs       pending 0, running 0, succeeded 25, failed 1" in done.stdout
    assert status_counts(demo_engine) == {"succeeded": 25, "failed": 1}


def demo_rows(engine: Engine) -> tuple[int, int]:
    """(jobs, outbox events) in the demo's schema; (0, 0) before it made its tables."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("jobs", schema=DEMO_SCHEMA):
            return 0, 0
        jobs = conn.execute(select(func.count()).select_from(Job.__table__)).scalar_one()
        events = conn.execute(select(func.count()).select_from(OutboxEvent.__table__))
        return jobs, events.scalar_one()


@pytest.mark.parametrize("after", [0.0, 0.5, 2.0])
def test_ctrl_c_stops_the_demo_with_status_130(
    demo_engine: Engine, database_url: str, after: float
) -> None:
    """SIGINT (what Ctrl-C sends) once the demo says it runs, or a little later: it stops
    then, with 130 and one line, and leaves its one transaction of jobs whole or absent."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_DATABASE_URL, ENV_APP_DATABASE_URL)}
    argv = ["demo", "--database-url", database_url, "--jobs", "100000"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "sa_outbox", *argv],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        assert line == "running the demo with 100,000 jobs (Ctrl-C stops it)\n", line
        time.sleep(after)  # the moment of the Ctrl-C only, not a synchronisation
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)  # promptly: well before 100,000 jobs are done
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130, out + err
    assert err == "sa-outbox demo: interrupted\n"
    assert "sa-outbox demo on" not in out  # no summary: it did not run on to the end
    jobs, events = demo_rows(demo_engine)
    assert (jobs, events) in {(0, 0), (100_001, 1)}  # the enqueue's transaction: all or none
