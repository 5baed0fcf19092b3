"""``sa-outbox status --app``: the JobApp's schedules, their next tick and the last tick
enqueued (from the periodic jobs' deduplication keys), on real PostgreSQL. Every test
counts the jobs by status at the end."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import Engine

from sa_outbox import JobApp, JobQueue
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL
from sa_outbox.worker import schedule_status

from .conftest import Job
from .helpers import assert_one_line_error, jobs_by_status
from .helpers import run_cli as run

app = JobApp(Job)
HOURLY = app.schedule(kind="report", every=dt.timedelta(hours=1), name="a_b")
# A name that an unescaped LIKE 'periodic:a_b@%' would match: its ticks are not a_b's.
OTHER = app.schedule(kind="report", every=dt.timedelta(hours=1), name="aXb", queue="reports")
NIGHTLY = app.schedule("0 3 * * *", kind="cleanup", tz="Europe/Lisbon")
APP = ["--app", "tests.test_cli_schedules:app"]
empty = JobApp(Job)


@pytest.fixture(autouse=True)
def only_env_url(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.delenv(ENV_APP_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_DATABASE_URL, database_url)


def enqueue_ticks(engine: Engine) -> dict[str, dt.datetime]:
    """Two past ticks of aXb and one of the nightly cleanup; none of a_b."""
    now = dt.datetime.now(dt.UTC)
    other = OTHER.last_ticks(now, limit=3)
    nightly = NIGHTLY.last_ticks(now, limit=1)
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(
            conn, [OTHER.job(other[0]), OTHER.job(other[1]), NIGHTLY.job(nightly[0])]
        )
    return {"aXb": other[1], "cleanup": nightly[0]}


def test_status_lists_each_schedule_with_its_next_and_last_tick(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    last = enqueue_ticks(engine)
    code, out, err = run(capsys, "status", *APP, "--json")
    assert code == 0, err
    found = json.loads(out)
    now = dt.datetime.fromisoformat(found["taken_at"])
    rows = {s["name"]: s for s in found["schedules"]}
    assert list(rows) == ["a_b", "aXb", "cleanup"]
    assert rows["a_b"]["last_enqueued"] is None
    assert rows["aXb"]["last_enqueued"] == last["aXb"].isoformat()
    assert rows["cleanup"]["last_enqueued"] == last["cleanup"].isoformat()
    assert rows["a_b"]["next_tick"] == HOURLY.next_tick(now).isoformat()
    assert rows["cleanup"]["next_tick"] == NIGHTLY.next_tick(now).isoformat()
    assert rows["cleanup"]["when"] == "cron 0 3 * * * (Europe/Lisbon)"
    assert rows["aXb"]["when"] == "every 1:00:00" and rows["aXb"]["queue"] == "reports"
    assert found["jobs"]["by_status"]["pending"] == 3  # the app's model is the job table

    code, out, _ = run(capsys, "status", *APP)
    assert code == 0
    assert "schedules          3\n" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["a_b"].rstrip().endswith("none in the table")
    assert lines["cleanup"].split()[1] == "cleanup"
    assert "cron 0 3 * * * (Europe/Lisbon)" in lines["cleanup"]
    assert jobs_by_status(engine) == {"pending": 3}


def test_without_app_no_schedules_are_shown(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    enqueue_ticks(engine)
    code, out, _ = run(capsys, "status", "--model", "tests.conftest:Job", "--json")
    assert code == 0 and "schedules" not in json.loads(out)
    code, out, _ = run(capsys, "status", "--model", "tests.conftest:Job")
    assert code == 0 and "schedules" not in out
    assert jobs_by_status(engine) == {"pending": 3}


def test_an_app_with_no_schedule_says_none(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "status", "--app", "tests.test_cli_schedules:empty")
    assert code == 0
    assert "schedules          0\n" in out
    assert jobs_by_status(engine) == {}


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("json:dumps", "json:dumps is not a JobApp"),
        ("tests.nowhere:app", "cannot import 'tests.nowhere'"),
        ("tests.test_cli_schedules", "expected TARGET as module:attribute"),
    ],
)
def test_a_bad_app_is_one_line(
    engine: Engine, capsys: pytest.CaptureFixture[str], target: str, message: str
) -> None:
    assert_one_line_error(capsys, ["status", "--app", target], message)
    assert jobs_by_status(engine) == {}


def test_the_python_api(engine: Engine) -> None:
    last = enqueue_ticks(engine)
    now = dt.datetime.now(dt.UTC)
    with engine.connect() as conn:
        found = {s.name: s for s in schedule_status(conn, app.schedules, Job, now=now)}
    assert found["aXb"].last_enqueued == last["aXb"]
    assert found["a_b"].last_enqueued is None
    assert found["cleanup"].next_tick == NIGHTLY.next_tick(now)
    assert jobs_by_status(engine) == {"pending": 3}
