"""``sa-outbox jobs enqueue``: one job by hand, read back from the test database; and every
way it can be refused, each with one line and nothing written."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from sqlalchemy import Engine, select

from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL, main

from .conftest import Job
from .helpers import notifications_during

MODEL = "tests.conftest:Job"
WHEN = "2030-01-01T09:00:00Z"


@pytest.fixture(autouse=True)
def only_app_url(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)


def enqueue(*args: str) -> int:
    return main(["jobs", "enqueue", *args])


def rows(engine: Engine) -> list[object]:
    t = Job.__table__
    with engine.connect() as conn:
        return list(conn.execute(select(t).order_by(t.c.created_at)).all())


def test_a_job_with_every_option(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["send-receipt", "--payload", '{"order_id": 42, "lines": [1, 2]}', "--model", MODEL]
    argv += ["--queue", "emails", "--priority", "-5", "--dedup-key", "receipt:42"]
    argv += ["--max-attempts", "3", "--run-at", "2030-01-02T03:04:05+02:00"]
    assert enqueue(*argv) == 0
    [job] = rows(engine)
    assert capsys.readouterr().out == f"enqueued job {job.id} (send-receipt, queue emails)\n"
    assert (job.kind, job.queue, job.priority, job.max_attempts) == (
        "send-receipt",
        "emails",
        -5,
        3,
    )
    assert job.payload == {"order_id": 42, "lines": [1, 2]}
    assert job.deduplication_key == "receipt:42"
    assert job.run_at == dt.datetime(2030, 1, 2, 1, 4, 5, tzinfo=dt.UTC)
    assert str(job.status) == "pending" and job.attempts == 0


def test_the_defaults_and_a_delay(engine: Engine) -> None:
    assert enqueue("ping", "--payload", "[]", "--model", MODEL, "--delay", "90s") == 0
    [job] = rows(engine)
    assert (job.queue, job.priority, job.max_attempts, job.payload) == ("default", 0, 8, [])
    assert job.run_at - job.created_at == dt.timedelta(seconds=90)  # one transaction: one now()


def test_a_taken_deduplication_key_is_skipped_and_said_so(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["send-receipt", "--payload", "{}", "--model", MODEL, "--dedup-key", "receipt:7"]
    assert enqueue(*argv, "--json") == 0
    first = json.loads(capsys.readouterr().out)
    assert first["inserted"] is True and uuid.UUID(first["id"]) == rows(engine)[0].id
    assert enqueue(*argv) == 0
    assert capsys.readouterr().out == (
        "skipped: a job of kind 'send-receipt' with deduplication key 'receipt:7' already exists\n"
    )
    assert enqueue(*argv, "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"id": None, "inserted": False}
    assert len(rows(engine)) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["k", "--model", MODEL], "the following arguments are required: --payload"),
        (["k", "--payload", "{}", "--model", MODEL, "--jobs-table", "t"], "not allowed with"),
        (["k", "--payload", "{}", "--model", MODEL, "--unique-period", "1y"], "a duration"),
        (
            ["k", "--payload", "{}", "--model", MODEL, "--unique-key", "a", "--unique-fields", "b"],
            "argument --unique-fields: not allowed with argument --unique-key",
        ),
        (["k", "--payload", "{}", "--model", MODEL, "--priority", "high"], "expected a whole"),
        (["k", "--payload", "{}", "--model", MODEL, "--max-attempts", "0"], "more than zero"),
        (["k", "--payload", "{}", "--model", MODEL, "--delay", "soon"], "expected a duration"),
        (
            ["k", "--payload", "{}", "--model", MODEL, "--run-at", "2030-01-01T09:00:00"],
            "argument --run-at: needs a time zone, e.g. 2030-01-01T09:00:00+00:00",
        ),
        (["k", "--payload", "{}", "--model", MODEL, "--run-at", "tomorrow"], "ISO 8601 time"),
        (
            ["k", "--payload", "{}", "--model", MODEL, "--delay", "1m", "--run-at", WHEN],
            "argument --run-at: not allowed with argument --delay",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    engine: Engine, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        enqueue(*argv)
    assert exit_.value.code == 2
    *usage, error = capsys.readouterr().err.splitlines()
    assert usage[0].startswith("usage: sa-outbox jobs enqueue ")
    assert error.startswith("sa-outbox jobs enqueue: error: ") and message in error
    assert rows(engine) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--payload", "{order: 1}"], "argument --payload: not valid JSON (Expecting property"),
        (["--payload", "NaN"], "argument --payload: not valid JSON (NaN is not JSON)"),
        (["--payload", '{"x": Infinity}'], "not valid JSON (Infinity is not JSON)"),
        (["--payload", "{}", "--unique-states", "pending"], "must include pending and running"),
    ],
)
def test_a_bad_payload_or_unique_option_is_one_line_without_the_usage(
    engine: Engine, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        enqueue("k", "--model", MODEL, *argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("sa-outbox jobs enqueue: error: ") and message in err, err
    assert err.count("\n") == 1  # no usage before it
    assert rows(engine) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["k", "--model", "tests.nowhere:Job"], "cannot import 'tests.nowhere'"),
        (["k", "--model", "tests.conftest:Nope"], "'tests.conftest' has no attribute 'Nope'"),
        (["k", "--model", "json:dumps"], "json:dumps is not a job or outbox model"),
        (
            ["k", "--model", "tests.conftest:OutboxEvent"],
            "tests.conftest:OutboxEvent is an outbox model; --model needs the job model",
        ),
        (["k"], "give the job table: --model myapp.models:Job or --jobs-table SCHEMA.TABLE"),
        (["k", "--jobs-table", "nowhere.jobs"], "no table nowhere.jobs in the database"),
        (
            ["k", "--model", MODEL, "--database-url", "sqlite://"],
            "the database URL is for 'sqlite'",
        ),
        (["k", "--model", MODEL, "--database-url", "no url"], "could not be parsed"),
        (["", "--model", MODEL], "kind must not be empty"),
        (["k", "--model", MODEL, "--queue", ""], "queue must not be empty"),
        (["k", "--model", MODEL, "--priority", str(2**31)], "priority must be between"),
    ],
)
def test_runtime_errors_exit_1_with_one_line(
    engine: Engine, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert enqueue(*argv, "--payload", "{}") == 1
    err = capsys.readouterr().err
    assert err.startswith("sa-outbox jobs: error: ") and message in err
    assert err.count("\n") == 1
    assert rows(engine) == []


def test_a_payload_over_the_limit_is_refused(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = json.dumps({"blob": "x" * (1 << 20)})
    assert enqueue("import-file", "--payload", payload, "--model", MODEL) == 1
    err = capsys.readouterr().err
    assert "payload of job kind 'import-file' is 1048587 bytes, over the limit of 1048576" in err
    assert rows(engine) == []


def test_an_unreachable_database_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/nowhere"
    assert enqueue("k", "--payload", "{}", "--model", MODEL, "--database-url", url) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "sa-outbox jobs: error: database error on postgresql+psycopg://app:***@127.0.0.1:1/nowhere"
    )
    assert "hunter2" not in err and err.count("\n") == 1


def test_the_table_by_name_reflected_from_the_database(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ping", "--payload", '{"n": 1}', "--jobs-table", Job.__table__.fullname]
    assert enqueue(*argv, "--lock-key", "tenant:7") == 0
    [job] = rows(engine)
    assert capsys.readouterr().out == f"enqueued job {job.id} (ping, queue default)\n"
    assert (job.kind, job.payload, job.lock_key) == ("ping", {"n": 1}, "tenant:7")


def test_unique_options_skip_a_second_job_while_the_first_holds_the_key(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    unique = ["--unique-fields", "customer_id", "--unique-by-queue", "--unique-period", "1h"]
    first = ["report", "--payload", '{"customer_id": 7, "month": 5}', "--model", MODEL]
    assert enqueue(*first, *unique) == 0
    assert capsys.readouterr().out.startswith("enqueued job ")
    second = ["report", "--payload", '{"customer_id": 7, "month": 6}', "--model", MODEL]
    assert enqueue(*second, *unique, "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"id": None, "inserted": False}
    assert enqueue(*second, *unique) == 0
    assert capsys.readouterr().out == "skipped: a job of kind 'report' holds the same unique key\n"
    # Another queue is another key (--unique-by-queue); another customer too.
    assert enqueue(*second, *unique, "--queue", "reports") == 0
    other = ["report", "--payload", '{"customer_id": 8}', "--model", MODEL, *unique]
    assert enqueue(*other) == 0
    # --unique-key: the payload plays no part; --unique-states: a failed job keeps the key.
    keyed = ["--unique-key", "nightly", "--unique-states", "pending,running,failed"]
    assert enqueue("nightly", "--payload", "1", "--model", MODEL, *keyed) == 0
    assert enqueue("nightly", "--payload", "2", "--model", MODEL, *keyed) == 0
    # --unique alone: by the whole payload.
    assert enqueue("whole", "--payload", "[1]", "--model", MODEL, "--unique") == 0
    assert enqueue("whole", "--payload", "[1]", "--model", MODEL, "--unique") == 0
    assert enqueue("whole", "--payload", "[2]", "--model", MODEL, "--unique") == 0
    capsys.readouterr()
    found = sorted((r.kind, r.queue, json.dumps(r.payload, sort_keys=True)) for r in rows(engine))
    assert found == [
        ("nightly", "default", "1"),
        ("report", "default", '{"customer_id": 7, "month": 5}'),
        ("report", "default", '{"customer_id": 8}'),
        ("report", "reports", '{"customer_id": 7, "month": 6}'),
        ("whole", "default", "[1]"),
        ("whole", "default", "[2]"),
    ]


def test_workers_listening_on_the_table_are_notified(engine: Engine) -> None:
    argv = ["ping", "--payload", "{}", "--model", MODEL, "--queue", "pings"]
    code, payloads = notifications_during(engine, Job, lambda: enqueue(*argv))
    assert code == 0
    got = [json.loads(p) for p in payloads]
    assert len(got) == 1 and "pings" in json.dumps(got)
