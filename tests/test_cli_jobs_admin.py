"""``sa-outbox jobs list / show / retry`` and ``sa-outbox outbox list / show / retry`` on real
PostgreSQL: what they print, what they change (and never: a running job), the bad input."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import Engine

from sa_outbox import JobApp, JobContext, Outbox, Worker
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL

from .conftest import Job, OutboxEvent
from .helpers import assert_one_line_error, cli_exit, notifications_during
from .helpers import job_row as job
from .helpers import run_cli as run
from .helpers_admin import JOB_MODEL, OUTBOX_MODEL, Scene, make_scene


@pytest.fixture(autouse=True)
def only_app_url(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)


@pytest.fixture
def scene(engine: Engine) -> Scene:
    return make_scene(engine)


def test_list_failed_jobs_with_their_errors_first_line(
    scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "jobs", "list", "--status", "failed", *JOB_MODEL)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == [
        "id",
        "queue",
        "kind",
        "status",
        "attempts",
        "updated",
        "(UTC)",
        "error",
    ]
    assert {row.split()[0] for row in rows} == {str(i) for i in scene.failed}
    for row in rows:
        assert row.split()[1:5] == ["emails", "send-email", "failed", "1/1"]
        assert row.endswith("SMTPError: 550 refused")  # the first line only


def test_list_filters_and_json(scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "jobs", "list", "--kind", "ping", "--json", *JOB_MODEL)
    assert code == 0
    found = json.loads(out)
    assert sorted(j["id"] for j in found) == sorted(str(i) for i in scene.pending)
    assert {j["status"] for j in found} == {"pending"} and found[0]["error_line"] is None
    code, out, _ = run(capsys, "jobs", "list", "--queue", "images", "--limit", "1", *JOB_MODEL)
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = run(capsys, "jobs", "list", "--queue", "nowhere", *JOB_MODEL)
    assert (code, out) == (0, "no jobs match\n")


def test_show_prints_every_column_and_the_whole_error(
    scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = scene.failed[0]
    code, out, _ = run(capsys, "jobs", "show", str(failed), *JOB_MODEL)
    assert code == 0
    for column in (c.name for c in Job.__table__.c):
        assert f"\n{column}:" in f"\n{out}"
    assert f"last_error:\n  SMTPError: 550 refused\n  line 2 {failed}\n" in out
    code, out, _ = run(capsys, "jobs", "show", str(failed), "--json", *JOB_MODEL)
    shown = json.loads(out)
    assert shown["id"] == str(failed) and shown["last_error"].endswith(f"line 2 {failed}")
    assert shown["status"] == "failed" and shown["payload"] in ({"to": 0}, {"to": 1})


def test_retry_by_id_keeps_attempts_and_gives_one_more(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = scene.failed[0]
    code, out, err = run(capsys, "jobs", "retry", str(failed), *JOB_MODEL)
    assert code == 0, err
    assert out == f"retried 1 job(s), pending now:\n  {failed}\n"
    row = job(engine, failed)
    assert (str(row.status), row.attempts, row.max_attempts) == ("pending", 1, 2)
    assert row.last_error.startswith("SMTPError")  # kept until the next attempt
    assert str(job(engine, scene.failed[1]).status) == "failed"


def test_retry_with_reset_attempts(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(capsys, "jobs", "retry", str(scene.failed[0]), "--reset-attempts", *JOB_MODEL)
    assert code == 0
    row = job(engine, scene.failed[0])
    assert (str(row.status), row.attempts, row.max_attempts) == ("pending", 0, 1)


def test_retry_is_all_or_nothing_and_never_touches_a_running_job(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    before = job(engine, scene.running)
    code, out, err = run(
        capsys, "jobs", "retry", str(scene.failed[0]), str(scene.running), *JOB_MODEL
    )
    assert code == 1 and out == ""
    assert err == (
        f"sa-outbox jobs: error: job {scene.running} is running, not failed; nothing retried\n"
    )
    assert job(engine, scene.running) == before
    assert str(job(engine, scene.failed[0]).status) == "failed"  # rolled back
    unknown = uuid.uuid4()
    code, _, err = run(capsys, "jobs", "retry", str(unknown), *JOB_MODEL)
    assert code == 1 and f"no job {unknown} in " in err and err.count("\n") == 1


def test_retry_all_failed_of_a_kind_and_a_worker_runs_them(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    running_before = job(engine, scene.running)
    code, out, _ = run(capsys, "jobs", "retry", "--all-failed", "--kind", "send-email", *JOB_MODEL)
    assert code == 0 and out.startswith("retried 2 job(s), pending now:\n")
    assert job(engine, scene.running) == running_before
    code, out, _ = run(capsys, "jobs", "retry", "--all-failed", "--json", *JOB_MODEL)
    assert json.loads(out) == {"retried": []}
    code, out, _ = run(capsys, "jobs", "retry", "--all-failed", *JOB_MODEL)
    assert out == "no failed jobs to retry\n"

    app = JobApp(Job)
    sent: list[object] = []

    @app.handler("send-email")
    def send(context: JobContext) -> None:
        sent.append(context.payload["to"])

    worker = Worker(app, engine, kinds=["send-email"], listen=False, install_signal_handlers=False)
    with worker:
        assert worker.drain() == 2
    assert sorted(sent) == [0, 1]  # type: ignore[type-var]
    assert all(str(job(engine, i).status) == "succeeded" for i in scene.failed)


def test_a_retry_wakes_the_listening_workers(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, got = notifications_during(
        engine, Job, lambda: run(capsys, "jobs", "retry", "--all-failed", *JOB_MODEL)[0]
    )
    assert code == 0
    assert got == ['["emails"]']


def test_outbox_list_show_and_retry_parked(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "outbox", "list", "--parked", *OUTBOX_MODEL)
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:5] == ["id", "seq", "type", "aggregate", "attempts"]
    assert row.split()[0] == str(scene.parked) and row.endswith("broker said no")
    code, out, _ = run(capsys, "outbox", "list", *OUTBOX_MODEL, "--json")
    assert [e["id"] for e in json.loads(out)] == [str(scene.backlog)]
    code, out, _ = run(capsys, "outbox", "show", str(scene.parked), *OUTBOX_MODEL)
    assert code == 0 and "last_error:\n  broker said no\n  details\n" in out
    assert "\nparked_at:" in out and "\naggregate_id:" in out

    code, _, err = run(capsys, "outbox", "retry", str(scene.backlog), *OUTBOX_MODEL)
    assert code == 1 and f"event {scene.backlog} is not parked; nothing retried" in err
    code, out, _ = run(capsys, "outbox", "retry", str(scene.parked), *OUTBOX_MODEL)
    assert code == 0 and out == f"retried 1 event(s), unparked:\n  {scene.parked}\n"
    with engine.connect() as conn:
        assert Outbox(OutboxEvent).parked(conn) == []
    code, out, _ = run(capsys, "outbox", "retry", "--all-parked", *OUTBOX_MODEL)
    assert (code, out) == (0, "no parked events to retry\n")
    unknown = uuid.uuid4()
    code, _, err = run(capsys, "outbox", "show", str(unknown), *OUTBOX_MODEL)
    assert code == 1 and f"no event {unknown} in " in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["jobs", "list", *JOB_MODEL, "--kind", "nope"],
            "unknown kind 'nope': no job of that kind",
        ),
        (["jobs", "retry", "--all-failed", "--kind", "nope", *JOB_MODEL], "unknown kind 'nope'"),
        (
            ["jobs", "show", str(uuid.UUID(int=7)), *JOB_MODEL],
            "no job 00000000-0000-0000-0000-000000000007",
        ),
        (["jobs", "list"], "give the job table: --model myapp.models:Job or --jobs-table"),
        (["jobs", "list", "--model", "tests.nowhere:Job"], "cannot import 'tests.nowhere'"),
        (["jobs", "list", "--model", "tests.conftest:OutboxEvent"], "is an outbox model"),
        (["jobs", "list", *JOB_MODEL, "--database-url", "sqlite://"], "the database URL is for"),
        (["outbox", "list"], "give the outbox table: --outbox-model"),
        (["outbox", "list", "--outbox-model", "tests.conftest:Job"], "is a job model"),
        (
            ["outbox", "retry", str(uuid.UUID(int=8)), *OUTBOX_MODEL],
            "no event 00000000-0000-0000-0000-000000000008",
        ),
    ],
)
def test_runtime_errors_are_one_line(
    scene: Scene, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_line_error(capsys, argv, message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", "show", "42", *JOB_MODEL], "argument ID: expected an id like"),
        (["jobs", "retry", "not-an-id", *JOB_MODEL], "argument ID: expected an id like"),
        (["jobs", "retry", *JOB_MODEL], "give the ids of the jobs to retry, or --all-failed"),
        (["jobs", "retry", str(uuid.UUID(int=1)), "--all-failed", *JOB_MODEL], "not both"),
        (
            ["jobs", "retry", str(uuid.UUID(int=1)), "--kind", "k", *JOB_MODEL],
            "go with --all-failed",
        ),
        (["jobs", "list", "--status", "lost", *JOB_MODEL], "argument --status: invalid choice"),
        (["jobs", "list", "--limit", "0", *JOB_MODEL], "must be more than zero"),
        (["outbox", "retry", *OUTBOX_MODEL], "or --all-parked"),
        (["outbox", "show", "x", *OUTBOX_MODEL], "argument ID: expected an id like"),
    ],
)
def test_usage_errors_exit_2(
    engine: Engine, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    last = cli_exit(capsys, argv, 2)[1].splitlines()[-1]
    assert last.startswith(f"sa-outbox {' '.join(argv[:2])}: error: ") and message in last


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["outbox"],
        ["jobs", "enqueue"],
        ["jobs", "list"],
        ["jobs", "show"],
        ["jobs", "retry"],
        ["outbox", "list"],
        ["outbox", "show"],
        ["outbox", "retry"],
    ],
)
def test_help_has_an_example(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = cli_exit(capsys, [*argv, "--help"], 0)
    assert "example:" in out and f"sa-outbox {' '.join(argv)} " in out


def test_every_command_works_on_tables_named_instead_of_models(
    engine: Engine, scene: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = Job.__table__.schema
    jobs, outbox = ["--jobs-table", f"{schema}.jobs"], ["--outbox-table", f"{schema}.outbox"]
    code, out, _ = run(capsys, "jobs", "list", "--status", "failed", "--kind", "send-email", *jobs)
    assert code == 0 and len(out.splitlines()) == 3
    code, out, _ = run(capsys, "jobs", "show", str(scene.failed[0]), "--json", *jobs)
    assert code == 0 and json.loads(out)["status"] == "failed"
    code, out, _ = run(capsys, "jobs", "retry", *map(str, scene.failed), *jobs)
    assert code == 0 and out.startswith("retried 2 job(s)")
    assert {str(job(engine, i).status) for i in scene.failed} == {"pending"}
    code, out, _ = run(capsys, "queues", *jobs, "--json")
    assert code == 0 and {q["queue"] for q in json.loads(out)} >= {"emails", "images"}
    code, out, _ = run(capsys, "outbox", "show", str(scene.parked), *outbox)
    assert code == 0 and "broker said no" in out
    code, out, _ = run(capsys, "outbox", "retry", str(scene.parked), *outbox)
    assert code == 0 and str(scene.parked) in out
    with engine.connect() as conn:
        assert Outbox(OutboxEvent).parked(conn) == []


def test_jobs_cancel_stops_waiting_and_running_jobs_and_leaves_finished_ones(
    scene: Scene, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [str(scene.pending[0]), str(scene.running), str(scene.succeeded)]
    code, out, err = run(capsys, "jobs", "cancel", *ids, *JOB_MODEL)
    assert code == 0, err
    assert out.splitlines() == [
        "cancelled 1 waiting job(s):",
        f"  {scene.pending[0]}",
        "cancelling 1 running job(s), stopped at their worker's next heartbeat:",
        f"  {scene.running}",
        "left 1 finished job(s) alone:",
        f"  {scene.succeeded}",
    ]
    assert job(engine, scene.pending[0]).status == "cancelled"
    assert job(engine, scene.running).status == "cancelled"
    assert job(engine, scene.succeeded).status == "succeeded"
    assert job(engine, scene.pending[1]).status == "pending"

    code, out, _ = run(capsys, "jobs", "cancel", str(scene.pending[1]), "--json", *JOB_MODEL)
    assert code == 0
    assert json.loads(out) == {
        "cancelled": [str(scene.pending[1])],
        "cancelling": [],
        "finished": [],
    }


def test_jobs_cancel_with_an_unknown_id_cancels_nothing(
    scene: Scene, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = uuid.UUID(int=7)
    argv = ["jobs", "cancel", str(scene.pending[0]), str(unknown), *JOB_MODEL]
    assert_one_line_error(capsys, argv, f"no job {unknown} in ")
    assert job(engine, scene.pending[0]).status == "pending"  # rolled back with the rest
