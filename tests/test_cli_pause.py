"""``sa-outbox queues pause/resume`` and the paused queues in ``status`` and ``queues``, on
real PostgreSQL; a real worker given the pause table shows the pause takes effect. Every
test counts the jobs by status at the end."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import (
    FakeClock,
    JobApp,
    JobContext,
    JobQueue,
    QueueControl,
    QueuePauseMixin,
    Worker,
)
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL, run_admin
from sa_outbox.queue import queue_depths, queue_status

from .conftest import TEST_SCHEMA, Job
from .helpers import assert_one_line_error, cli_exit, jobs_by_status, wait_until
from .helpers import run_cli as run

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
ROOT = Path(__file__).resolve().parents[1]
PAUSES = ["--pause-model", "tests.test_cli_pause:PausedQueue"]
TARGETS = ["--model", "tests.conftest:Job", *PAUSES]


class ControlBase(DeclarativeBase):
    pass


class PausedQueue(QueuePauseMixin, ControlBase):
    __tablename__ = "paused_queues"
    __table_schema__ = TEST_SCHEMA


@pytest.fixture(autouse=True)
def pause_table(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> Iterator[None]:
    monkeypatch.delenv(ENV_APP_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_DATABASE_URL, database_url)
    ControlBase.metadata.create_all(engine)
    yield
    ControlBase.metadata.drop_all(engine)


def enqueue_three(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        for n in range(2):
            queue.enqueue(conn, "send-email", {"n": n}, queue="emails")
        queue.enqueue(conn, "ping", {}, queue="default")


def paused_rows(engine: Engine) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(PausedQueue.queue, PausedQueue.paused_by)).all()
    return [(queue, by) for queue, by in rows]


def test_pause_stops_a_worker_and_resume_lets_it_go_on(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    code, out, err = run(capsys, "queues", "pause", "emails", "--by", "ana: SMTP down", *TARGETS)
    assert (code, out, err) == (0, "paused emails (by ana: SMTP down)\n", "")
    assert paused_rows(engine) == [("emails", "ana: SMTP down")]

    clock = FakeClock(T0)
    app = JobApp(Job)
    done: list[str] = []

    @app.handler("send-email")
    @app.handler("ping")
    def work(job: JobContext) -> None:
        done.append(job.kind)

    worker = Worker(
        app,
        engine,
        pauses=PausedQueue,
        clock=clock,
        listen=False,
        timer=lambda: clock.now().timestamp(),
        install_signal_handlers=False,
    )
    with worker:
        assert worker.drain() == 1  # the ping; the paused queue's jobs wait
        assert done == ["ping"]
        code, out, _ = run(capsys, "queues", "resume", "emails", *TARGETS)
        assert (code, out) == (0, "resumed emails\n")
        assert worker.drain() == 2
    assert paused_rows(engine) == []
    assert jobs_by_status(engine) == {"succeeded": 3}


def test_the_tables_may_be_given_before_the_action(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    code, out, err = run(capsys, "queues", *TARGETS, "pause", "emails")
    assert (code, out, err) == (0, "paused emails\n", "")
    code, out, err = run(
        capsys, "queues", "--model", "tests.conftest:Job", "resume", "emails", *PAUSES
    )
    assert (code, out, err) == (0, "resumed emails\n", "")
    assert paused_rows(engine) == []
    assert jobs_by_status(engine) == {"pending": 3}


def test_pausing_twice_says_since_when_and_by_whom(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    assert run(capsys, "queues", "pause", "emails", "--by", "ana", *TARGETS)[0] == 0
    code, out, _ = run(capsys, "queues", "pause", "emails", "--by", "bob", *TARGETS)
    assert code == 0
    assert out.startswith("emails was paused already, since ") and out.endswith(" by ana\n")
    assert paused_rows(engine) == [("emails", "ana")]  # the first pause is kept
    assert jobs_by_status(engine) == {"pending": 3}


def test_a_queue_no_job_has_is_refused_unless_new(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    assert_one_line_error(
        capsys, ["queues", "pause", "emials", *TARGETS], "no job has queue 'emials' in "
    )
    assert paused_rows(engine) == []
    code, out, _ = run(capsys, "queues", "pause", "reports", "--new", *TARGETS)
    assert (code, out) == (0, "paused reports\n")
    assert paused_rows(engine) == [("reports", None)]
    assert jobs_by_status(engine) == {"pending": 3}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["queues", "pause", "", *TARGETS], "QUEUE must not be empty"),
        (["queues", "pause", "   ", *TARGETS], "QUEUE must not be empty"),
        (["queues", "resume", "", *TARGETS], "QUEUE must not be empty"),
        (["queues", "pause", "emails", "--by", "", *TARGETS], "--by must not be empty"),
        (["queues", "resume", "emails", *TARGETS], "queue 'emails' is not paused (in "),
        (
            ["queues", "pause", "emails", "--model", "tests.conftest:Job"],
            "no pause table configured: give --pause-model",
        ),
        (
            ["queues", "resume", "emails", "--model", "tests.conftest:Job"],
            "no pause table configured: give --pause-model",
        ),
        (
            [
                "queues",
                "pause",
                "emails",
                "--model",
                "tests.conftest:Job",
                "--pause-model",
                "tests.conftest:Job",
            ],
            "tests.conftest:Job is a job model; --pause-model needs the QueuePauseMixin model",
        ),
        (
            [
                "queues",
                "pause",
                "emails",
                "--model",
                "tests.conftest:Job",
                "--pause-table",
                "nowhere",
            ],
            "no table nowhere in the database",
        ),
        (
            ["queues", "pause", "emails", *PAUSES],
            "give the job table: --model myapp.models:Job",
        ),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    engine: Engine, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    enqueue_three(engine)
    assert_one_line_error(capsys, argv, message)
    assert paused_rows(engine) == []
    assert jobs_by_status(engine) == {"pending": 3}


def test_a_missing_queue_argument_is_a_usage_error(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = cli_exit(capsys, ["queues", "pause", *TARGETS], 2)
    assert "the following arguments are required: QUEUE" in err
    assert paused_rows(engine) == []


def test_status_and_queues_show_the_paused_queues(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    run(capsys, "queues", "pause", "emails", "--by", "ana", *TARGETS)
    run(capsys, "queues", "pause", "later", "--new", *TARGETS)

    code, out, _ = run(capsys, "status", *TARGETS)
    assert code == 0
    assert "paused queues      2\n" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["emails"][-1] == "ana" and rows["later"][0] == "later"
    code, out, _ = run(capsys, "status", *TARGETS, "--json")
    found = json.loads(out)
    assert [(p["queue"], p["paused_by"]) for p in found["paused"]] == [
        ("emails", "ana"),
        ("later", None),
    ]
    code, out, _ = run(capsys, "status", "--model", "tests.conftest:Job", "--json")
    assert json.loads(out)["paused"] is None  # no pause table given: not known
    assert "paused queues" not in run(capsys, "status", "--model", "tests.conftest:Job")[1]

    code, out, _ = run(capsys, "queues", *TARGETS)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[-1] == "paused"
    by_queue = {line.split()[0]: line for line in lines[1:]}
    assert by_queue["emails"].rstrip().endswith("paused")
    assert not by_queue["default"].rstrip().endswith("paused")
    assert by_queue["later"].rstrip().endswith("paused")  # paused before its first job
    code, out, _ = run(capsys, "queues", *TARGETS, "--json")
    assert {d["queue"]: d["paused"] for d in json.loads(out)} == {
        "default": False,
        "emails": True,
        "later": True,
    }
    assert "paused" not in run(capsys, "queues", "--model", "tests.conftest:Job")[1]
    assert jobs_by_status(engine) == {"pending": 3}


def test_the_queues_columns_stay_aligned_with_the_paused_column(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    run(capsys, "queues", "pause", "emails", "--by", "ana", *TARGETS)
    code, out, _ = run(capsys, "queues", *TARGETS)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["queue", "pending"] and header.split()[-1] == "paused"
    # Each count ends where its column's name ends (right-aligned), the queue's name starts
    # where "queue" starts, and the paused flag where "paused" starts.
    ends = {m.group(): m.end() for m in re.finditer(r"\S+", header)}
    starts = {m.group(): m.start() for m in re.finditer(r"\S+", header)}
    for row in rows:
        queue = row.split()[0]
        assert row.startswith(queue)
        for status in ("pending", "running", "succeeded", "failed", "cancelled"):
            cell = row[starts[status] : ends[status]]
            assert cell.strip().isdigit() and cell == cell.strip().rjust(len(cell)), (status, row)
        assert row[ends["min"] - 1] == "0"  # per min, right-aligned under its name
        flag = row[starts["paused"] :]
        assert flag == ("paused" if queue == "emails" else ""), row
    assert jobs_by_status(engine) == {"pending": 3}


def test_the_python_api_reports_the_paused_queues(engine: Engine) -> None:
    enqueue_three(engine)
    with engine.begin() as conn:
        QueueControl(PausedQueue, jobs=Job).pause(conn, "emails", paused_by="ops")
    with engine.connect() as conn:
        status = queue_status(conn, jobs=Job, pauses=PausedQueue)
        depths = queue_depths(conn, Job, pauses=PausedQueue)
        plain = queue_status(conn, jobs=Job)
    assert status.paused is not None
    assert [(p.queue, p.paused_by) for p in status.paused] == [("emails", "ops")]
    assert plain.paused is None
    assert {d.queue: d.paused for d in depths} == {"default": False, "emails": True}
    assert jobs_by_status(engine) == {"pending": 3}


def test_run_admin_takes_the_pause_model_as_a_preset(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    argv = ["queues", "pause", "emails"]
    assert run_admin(argv, engine=engine, jobs=Job, pauses=PausedQueue, prog="flask") == 0
    assert capsys.readouterr().out == "paused emails\n"
    assert run_admin(["queues", "resume", "emails"], engine=engine, jobs=Job, prog="flask") == 1
    assert capsys.readouterr().err.startswith("flask queues: error: no pause table configured")
    assert paused_rows(engine) == [("emails", None)]
    assert jobs_by_status(engine) == {"pending": 3}


@pytest.mark.parametrize("processes", ["1", "2"])
def test_the_worker_command_honours_the_pause_table(
    processes: str,
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "pause_app.py").write_text(
        "from sqlalchemy.orm import DeclarativeBase\n"
        "from sa_outbox import JobApp, JobMixin, QueuePauseMixin\n"
        "class Base(DeclarativeBase):\n"
        "    pass\n"
        "class Job(JobMixin, Base):\n"
        "    __tablename__ = 'jobs'\n"
        f"    __table_schema__ = {TEST_SCHEMA!r}\n"
        "class PausedQueue(QueuePauseMixin, Base):\n"
        "    __tablename__ = 'paused_queues'\n"
        f"    __table_schema__ = {TEST_SCHEMA!r}\n"
        "app = JobApp(Job)\n"
        "app.register('send-email', lambda job: None)\n"
        "app.register('ping', lambda job: None)\n"
    )
    with engine.begin() as conn:
        QueueControl(PausedQueue, jobs=Job).pause(conn, "emails", paused_by="test")
    enqueue_three(engine)  # the emails first: a claim would take them before the ping
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env[ENV_DATABASE_URL] = database_url
    argv = ["worker", "pause_app:app", "--pause-model", "pause_app:PausedQueue"]
    argv += ["--processes", processes]
    log = tmp_path / "worker.log"
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "sa_outbox", *argv], cwd=tmp_path, env=env, stderr=err
        )
    try:
        wait_until(lambda: jobs_by_status(engine).get("succeeded") == 1, "the ping")
        assert process.poll() is None, log.read_text()
        assert jobs_by_status(engine) == {"pending": 2, "succeeded": 1}  # emails wait
        code, out, _ = run(capsys, "queues", "resume", "emails", *TARGETS)
        assert (code, out) == (0, "resumed emails\n")
        wait_until(lambda: jobs_by_status(engine) == {"succeeded": 3}, "the emails")
    finally:
        process.terminate()
        process.wait(30)
    assert process.returncode == 0, log.read_text()
    assert jobs_by_status(engine) == {"succeeded": 3}


def test_the_worker_command_refuses_a_pause_model_that_is_not_one(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_three(engine)
    argv = ["worker", "tests.test_cli_pause:empty_app", "--pause-model", "tests.conftest:Job"]
    assert_one_line_error(capsys, argv, "--pause-model needs the QueuePauseMixin model")
    assert jobs_by_status(engine) == {"pending": 3}


empty_app = JobApp(Job)
