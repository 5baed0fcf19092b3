"""``sa-outbox status`` and ``sa-outbox queues`` on real PostgreSQL: the readable table, the
JSON, ``--watch`` frames, the workers seen in ``pg_stat_activity``, and the bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from sa_outbox import JobQueue, NewJob
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL
from sa_outbox.cli import database_url as cli_database_url
from sa_outbox.cli._common import _engine
from sa_outbox.cli._status import CLEAR
from sa_outbox.queue import queue_status

from .conftest import Job, OutboxEvent
from .helpers import assert_one_line_error, cli_exit
from .helpers import run_cli as run
from .helpers_admin import JOB_MODEL, MODELS, OUTBOX_MODEL, make_scene
from .test_worker_faults import ROOT, enqueue, ledger_lines, start, stop, wait_until, worker_schema
from .worker_app import SCHEMA as WORKER_SCHEMA

__all__ = ["worker_schema"]  # a fixture, used below by name


@pytest.fixture(autouse=True)
def only_env_url(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.delenv(ENV_APP_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_DATABASE_URL, database_url)


def test_the_status_table(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    make_scene(engine)
    code, out, err = run(capsys, "status", *MODELS)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("sa-outbox status at ") and lines[0].endswith(" UTC")
    header = next(line for line in lines if line.startswith("queue"))
    assert header.split() == [
        "queue",
        "kind",
        "pending",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines if line[:1].islower()}
    assert rows[("default", "ping")] == ["2", "0", "0", "0", "0"]
    assert rows[("emails", "send-email")] == ["0", "0", "0", "2", "0"]
    assert rows[("images", "resize")] == ["0", "2", "0", "0", "0"]
    assert rows[("reports", "report")] == ["0", "0", "1", "0", "0"]
    total = next(line for line in lines if line.startswith("total"))
    assert total.split() == ["total", "2", "2", "1", "2", "0"]
    assert "oldest ready job   waiting " in out
    assert "failed, last 1h    2" in out
    assert "expired leases     1 running job(s) past their lease" in out
    assert "backlog            1 unpublished, oldest " in out
    assert "parked             1" in out
    assert "workers with jobs  2" in out
    holders = [line.split() for line in lines if line.startswith("  w-")]
    assert [h[:3] for h in holders] == [["w-dead", "1", "1"], ["w-live", "1", "0"]]


def test_the_status_json_is_the_queue_status_of_the_library(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    make_scene(engine)
    code, out, _ = run(capsys, "status", *MODELS, "--json")
    assert code == 0
    found = json.loads(out)
    jobs = found["jobs"]
    assert jobs["by_status"] == {
        "pending": 2,
        "running": 2,
        "succeeded": 1,
        "failed": 2,
        "cancelled": 0,
    }
    assert (jobs["failed_recently"], jobs["expired_leases"], jobs["failed_within"]) == (2, 1, 3600)
    assert jobs["oldest_ready_age"] >= 0
    assert {"queue": "emails", "kind": "send-email", "status": "failed", "jobs": 2} in jobs[
        "counts"
    ]
    assert found["outbox"]["backlog"] == 1 and found["outbox"]["parked"] == 1
    with engine.connect() as conn:
        direct = queue_status(conn, jobs=Job, outbox=OutboxEvent).as_dict()
    assert direct["jobs"]["by_status"] == jobs["by_status"]
    assert direct["outbox"]["table"] == found["outbox"]["table"]


def test_an_empty_queue_and_one_table_only(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "status", *JOB_MODEL)
    assert code == 0
    assert "oldest ready job   none ready" in out and "outbox (" not in out
    code, out, _ = run(capsys, "status", *OUTBOX_MODEL)
    assert code == 0
    assert "backlog            0 unpublished\n" in out and "jobs (" not in out


def test_tables_by_name_are_reflected(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    make_scene(engine)
    schema = Job.__table__.schema
    code, out, err = run(
        capsys, "status", "--jobs-table", f"{schema}.jobs", "--outbox-table", f"{schema}.outbox"
    )
    assert code == 0, err
    assert f"jobs ({schema}.jobs)" in out and "parked             1" in out


def test_watch_prints_count_frames(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "status", *JOB_MODEL, "--watch", "0.01", "--count", "3")
    assert code == 0
    assert out.count("sa-outbox status at ") == 3 and CLEAR not in out  # not a terminal
    code, out, _ = run(capsys, "status", *JOB_MODEL, "--json", "--watch", "0.01", "--count", "2")
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 2 and all(f["jobs"]["by_status"]["pending"] == 0 for f in frames)


def test_watch_redraws_in_place_on_a_terminal(
    engine: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, _ = run(capsys, "status", *JOB_MODEL, "--watch", "0.01", "--count", "2")
    assert code == 0
    assert out.count(CLEAR) == 2 and out.startswith(CLEAR)


def test_watch_frames_from_a_process_show_a_change(engine: Engine, database_url: str) -> None:
    """Read a frame from ``sa-outbox status --watch``, enqueue, read the next one."""
    table = f"{Job.__table__.schema}.jobs"  # the child's tests.conftest would name another
    argv = [sys.executable, "-m", "sa_outbox", "status", "--jobs-table", table, "--json"]
    argv += ["--watch", "0.05"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", ENV_DATABASE_URL: database_url}
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        assert first["jobs"]["by_status"]["pending"] == 0
        with engine.begin() as conn:
            JobQueue(Job).enqueue(conn, "ping", {})
        while True:  # frames come until one shows the new job; the test's timeout bounds it
            frame = json.loads(process.stdout.readline())
            if frame["jobs"]["by_status"]["pending"] == 1:
                break
    finally:
        process.terminate()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def test_a_connection_named_like_a_worker_is_listed(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    named = create_engine(database_url, connect_args={"application_name": "sa-outbox worker w-9"})
    try:
        with named.connect() as held:
            held.execute(text("SELECT 1"))
            code, out, _ = run(capsys, "status", *JOB_MODEL)
            assert code == 0
            assert "workers connected  1" in out
            [row] = [line.split() for line in out.splitlines() if line.startswith("  w-9")]
            assert row[1] == "1"  # one connection
            code, out, _ = run(capsys, "status", *JOB_MODEL, "--json")
            [worker] = json.loads(out)["workers"]
            assert (worker["worker_id"], worker["connections"]) == ("w-9", 1)
    finally:
        named.dispose()


def test_a_cli_worker_shows_as_connected_and_holding_its_job(
    engine: Engine, database_url: str, worker_schema: str, tmp_path: Path
) -> None:
    ledger, log = tmp_path / "ledger", tmp_path / "worker.log"
    enqueue(engine, [NewJob("hold", {"seconds": 60})])  # into the worker app's own table
    cli = [
        "-m", "sa_outbox", "worker", "tests.worker_app:app", "--database-url", database_url,
        "--worker-id", "w-status", "--poll-interval", "60",
    ]  # fmt: skip
    worker = start(cli, log, ledger)
    try:
        wait_until(lambda: len(ledger_lines(ledger)) == 1, "the job to start")
        status = [sys.executable, "-m", "sa_outbox", "status", "--model", "tests.worker_app:Job"]
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", ENV_DATABASE_URL: database_url}
        env["SA_OUTBOX_WORKER_SCHEMA"] = WORKER_SCHEMA
        done = subprocess.run(
            status, cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
    finally:
        assert stop(worker, log) == 0, log.read_text()
    assert done.returncode == 0, done.stderr
    connected = [line.split() for line in done.stdout.splitlines() if line.startswith("  w-status")]
    assert len(connected) == 2  # connected, and holding one running job
    assert "workers connected  1" in done.stdout and "workers with jobs  1" in done.stdout


def test_queues_depth_and_throughput(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    make_scene(engine)
    code, out, err = run(capsys, "queues", *JOB_MODEL)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "queue", "pending", "running", "succeeded", "failed", "cancelled", "done", "5m", "per",
        "min",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["emails"] == ["0", "0", "0", "2", "0", "2", "0.4"]
    assert rows["reports"] == ["0", "0", "1", "0", "0", "1", "0.2"]
    assert rows["images"] == ["0", "2", "0", "0", "0", "0", "0.0"]
    code, out, _ = run(capsys, "queues", *JOB_MODEL, "--within", "1m", "--json")
    by_queue = {q["queue"]: q for q in json.loads(out)}
    assert by_queue["emails"]["per_minute"] == 2.0 and by_queue["emails"]["within"] == 60
    assert by_queue["default"]["counts"] == {"pending": 2}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status"], "give the job table (--model myapp.models:Job or --jobs-table"),
        (["status", "--model", "tests.nowhere:Job"], "cannot import 'tests.nowhere'"),
        (["status", "--model", "tests.conftest:OutboxEvent"], "is an outbox model; --model"),
        (["status", "--outbox-model", "tests.conftest:Job"], "is a job model; --outbox-model"),
        (["status", "--jobs-table", "nowhere.jobs"], "no table nowhere.jobs in the database"),
        (["status", *JOB_MODEL, "--database-url", "no url"], "could not be parsed"),
        (["status", *JOB_MODEL, "--database-url", "sqlite://"], "the database URL is for"),
        (["status", *JOB_MODEL, "--count", "2"], "--count goes with --watch"),
        (["queues"], "give the job table: --model myapp.models:Job or --jobs-table"),
    ],
)
def test_runtime_errors_are_one_line(
    engine: Engine, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_line_error(capsys, argv, message)


def test_a_table_that_is_not_a_job_table(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = Job.__table__.schema
    code, _, err = run(capsys, "status", "--jobs-table", f"{schema}.outbox")
    assert code == 1 and f"{schema}.outbox is not a job table (no column" in err


def test_an_unreachable_database_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/nowhere"
    code, _, err = run(capsys, "status", *JOB_MODEL, "--database-url", url)
    assert code == 1 and "hunter2" not in err and err.count("\n") == 1
    assert err.startswith(
        "sa-outbox status: error: database error on postgresql+psycopg://app:***@"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--watch", "0"], "argument --watch: must be more than zero"),
        (["status", "--watch", "3", "--count", "0"], "argument --count: must be more than zero"),
        (["status", "--jobs-table", "x."], "expected a table name like work.jobs"),
        (["status", "--model", "a:b", "--jobs-table", "t"], "not allowed with argument --model"),
        (["queues", "--within", "soon"], "expected a duration"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = cli_exit(capsys, argv, 2)
    assert err.splitlines()[-1].startswith(f"sa-outbox {argv[0]}: error: ") and message in err


@pytest.mark.parametrize("command", ["status", "queues"])
def test_help_has_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = cli_exit(capsys, [command, "--help"], 0)
    assert "example:" in out and f"sa-outbox {command} --" in out


@pytest.mark.parametrize(
    ("query", "expected"), [({}, "sa-outbox worker w-1"), ({"application_name": "mine"}, "mine")]
)
def test_a_worker_engine_is_named_unless_the_url_names_it(
    database_url: str, query: dict[str, str], expected: str
) -> None:
    url = cli_database_url(make_url(database_url).update_query_dict(query).render_as_string(False))
    engine = _engine(url, "sa-outbox worker w-1")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW application_name")).scalar() == expected
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("raise RuntimeError('no settings')\n", "failed: RuntimeError: no settings"),
        ("x = (\n", "failed: SyntaxError: '(' was never closed ("),
    ],
)
def test_a_model_module_that_fails_to_import_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    message: str,
) -> None:
    name = f"broken_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run(capsys, "status", "--model", f"{name}:Job")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"sa-outbox status: error: importing '{name}' {message}"), err
