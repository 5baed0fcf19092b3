"""The example shop (examples/flask_app), driven with Flask's test client on real PostgreSQL."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import sa_outbox

from .helpers import wait_until

flask = pytest.importorskip("flask", reason="the example needs Flask (the test extra has it)")
pytest.importorskip("flask_sqlalchemy", reason="the example needs Flask-SQLAlchemy")

from examples.flask_app import create_app  # noqa: E402
from examples.flask_app.models import Job, db  # noqa: E402

SCHEMA = f"shop_{os.getpid()}"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def shop_url(database_url: str) -> Iterator[str]:
    """The test database, with ``search_path`` on an empty schema of this test's own."""
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    yield url.render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    admin.dispose()


@pytest.fixture
def app(shop_url: str) -> Iterator[Any]:
    application = create_app(shop_url)  # runs the example's Alembic migrations
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def rows(app: Any, sql: str) -> list[Any]:
    with app.app_context():
        return list(db.session.execute(text(sql)).all())


def test_the_migrations_create_everything(app: Any) -> None:
    tables = {
        r[0] for r in rows(app, f"SELECT tablename FROM pg_tables WHERE schemaname = '{SCHEMA}'")
    }
    assert tables >= {"orders", "jobs", "outbox", "sent_emails", "paused_queues"}
    [[version]] = rows(app, "SELECT version_num FROM alembic_version")
    assert version == "0002"
    # The migrations match the models: autogenerate finds nothing.
    with app.app_context(), db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), db.metadata) == []


def test_an_order_its_event_and_its_job_commit_together(app: Any) -> None:
    client = app.test_client()
    response = client.post(
        "/orders", json={"reference": "A-1", "email": "ana@example.com", "total_cents": 1200}
    )
    assert response.status_code == 201, response.json
    order_id = response.json["order_id"]
    [order] = rows(app, "SELECT id, reference FROM orders")
    [event] = rows(app, "SELECT event_type, aggregate_type, aggregate_id, payload FROM outbox")
    [job] = rows(app, "SELECT kind, queue, status, payload, deduplication_key FROM jobs")
    assert order == (order_id, "A-1")
    assert event == (
        "OrderPlaced",
        "Order",
        str(order_id),
        {"order": order_id, "email": "ana@example.com", "total_cents": 1200},
    )
    assert job == (
        "send-confirmation",
        "emails",
        "pending",
        {"order_id": order_id},
        f"confirmation:{order_id}",
    )
    assert str(job) and response.json["job_id"]


def test_placing_the_same_order_twice_writes_nothing_the_second_time(app: Any) -> None:
    client = app.test_client()
    order = {"reference": "B-7", "email": "bia@example.com", "total_cents": 500}
    assert client.post("/orders", json=order).status_code == 201
    again = client.post("/orders", json=order)
    assert again.status_code == 409 and "already placed" in again.json["errors"][0]
    counts = client.get("/status.json").json
    assert counts["orders"] == 1
    assert counts["jobs"]["pending"] == 1
    assert counts["outbox"] == {"published": 0, "unpublished": 1}


def test_bad_input_is_refused_before_anything_is_written(app: Any) -> None:
    client = app.test_client()
    response = client.post("/orders", json={"reference": "", "email": "nope", "total_cents": -1})
    assert response.status_code == 400
    assert len(response.json["errors"]) == 3
    assert client.get("/status.json").json["orders"] == 0
    assert rows(app, "SELECT count(*) FROM outbox") == [(0,)]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"reference": "A-1", "email": ', "the body is not valid JSON"),
        (b"\xff\xfe not UTF-8", "the body is not valid JSON"),
        (b"", "the body is not valid JSON"),
        (b'["A-1", "ana@example.com", 1200]', "the body must be a JSON object, got an array"),
        (b"null", "the body must be a JSON object, got null"),
        (b'"A-1"', "the body must be a JSON object, got a string"),
        (
            b'{"reference": "A-1", "email": "ana@example.com", "total_cents": 99999999999}',
            "total_cents must be a whole number from 1 to 2147483647",
        ),
        (
            b'{"reference": "A-1", "email": "ana@example.com", "total_cents": 12.5}',
            "total_cents must be a whole number from 1 to 2147483647",
        ),
        (
            b'{"reference": "A\\u0000", "email": "ana@example.com", "total_cents": 1}',
            "reference and email must not contain NUL characters",
        ),
    ],
    ids=[
        "truncated",
        "not-utf8",
        "empty",
        "a-list",
        "null",
        "a-string",
        "too-large",
        "fraction",
        "nul",
    ],
)
def test_a_body_that_is_not_an_order_is_a_400_with_one_line(
    app: Any, body: bytes, error: str
) -> None:
    """Malformed JSON, JSON that is not an object, a total PostgreSQL cannot hold: a 400
    that says why in one line, never a 500, and nothing written."""
    client = app.test_client()
    response = client.post("/orders", data=body, content_type="application/json")
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.json == {"errors": [error]}
    assert "\n" not in error
    assert client.get("/status.json").json["orders"] == 0
    assert rows(app, "SELECT count(*) FROM outbox") == [(0,)]
    assert rows(app, "SELECT count(*) FROM jobs") == [(0,)]


def test_the_form_and_the_status_page(app: Any) -> None:
    client = app.test_client()
    form = {"reference": "C-3", "email": "cid@example.com", "total_cents": "990"}
    response = client.post("/orders", data=form)
    assert response.status_code == 302
    page = client.get("/").get_data(as_text=True)
    assert "1 orders" in page
    assert "pending: 1" in page and "unpublished: 1" in page
    assert "send-confirmation" in page and "OrderPlaced" in page


def test_the_flask_worker_command_sends_the_confirmations(app: Any) -> None:
    client = app.test_client()
    for i in range(3):
        order = {"reference": f"W-{i}", "email": f"w{i}@example.com", "total_cents": 100 + i}
        assert client.post("/orders", json=order).status_code == 201
    with app.app_context():  # a job the handler must refuse: its order does not exist
        sa_outbox.enqueue(
            db.session, "send-confirmation", {"order_id": 999}, model=Job, queue="emails"
        )
        db.session.commit()
    result = app.test_cli_runner().invoke(args=["worker", "--drain", "--concurrency", "2"])
    assert result.exit_code == 0, result.output
    assert "worked 4 job(s)" in result.output
    counts = client.get("/status.json").json
    assert counts["emails_sent"] == 3
    assert counts["jobs"] == {
        "pending": 0,
        "running": 0,
        "succeeded": 3,
        "failed": 1,
        "cancelled": 0,
    }
    [[error]] = rows(app, "SELECT last_error FROM jobs WHERE status = 'failed'")
    assert "order 999 does not exist" in error


def test_the_flask_status_jobs_and_outbox_commands_see_and_retry_a_failed_job(app: Any) -> None:
    client = app.test_client()
    order = {"reference": "S-1", "email": "s@example.com", "total_cents": 5}
    assert client.post("/orders", json=order).status_code == 201
    with app.app_context():  # fails: order 999 does not exist (yet)
        sa_outbox.enqueue(
            db.session, "send-confirmation", {"order_id": 999}, model=Job, queue="emails"
        )
        db.session.commit()
    runner = app.test_cli_runner()
    assert "worked 2 job(s)" in runner.invoke(args=["worker", "--drain"]).output

    status = runner.invoke(args=["status"])
    assert status.exit_code == 0, status.output
    rows = [line.split() for line in status.output.splitlines()]
    assert ["emails", "send-confirmation", "0", "0", "1", "1", "0"] in rows
    assert "failed, last 1h    1" in status.output
    assert "backlog            1 unpublished" in status.output  # the OrderPlaced event
    listed = runner.invoke(args=["jobs", "list", "--status", "failed"])
    assert listed.exit_code == 0 and "order 999 does not exist" in listed.output
    failed_id = listed.output.splitlines()[1].split()[0]
    shown = runner.invoke(args=["jobs", "show", failed_id, "--json"])
    assert json.loads(shown.output)["payload"] == {"order_id": 999}
    assert "OrderPlaced" in runner.invoke(args=["outbox", "list"]).output
    assert runner.invoke(args=["queues"]).output.startswith("queue ")

    with app.app_context():  # the cause fixed: the order exists now
        db.session.execute(
            text(
                "INSERT INTO orders (id, reference, email, total_cents) "
                "VALUES (999, 'S-999', 'late@example.com', 1)"
            )
        )
        db.session.commit()
    retried = runner.invoke(args=["jobs", "retry", "--all-failed"])
    assert (
        retried.exit_code == 0
        and f"retried 1 job(s), pending now:\n  {failed_id}" in retried.output
    )
    assert "worked 1 job(s)" in runner.invoke(args=["worker", "--drain"]).output
    assert client.get("/status.json").json["jobs"]["failed"] == 0


def test_the_flask_queues_command_pauses_and_resumes_the_worker(app: Any) -> None:
    with app.app_context():
        sa_outbox.enqueue(
            db.session, "send-confirmation", {"order_id": 1}, model=Job, queue="emails"
        )
        db.session.commit()
    runner = app.test_cli_runner()
    paused = runner.invoke(args=["queues", "pause", "emails", "--by", "ops: SMTP down"])
    assert paused.exit_code == 0 and "paused emails (by ops: SMTP down)" in paused.output
    assert "worked 0 job(s)" in runner.invoke(args=["worker", "--drain"]).output
    listed = runner.invoke(args=["queues"])
    assert listed.output.splitlines()[0].split()[-1] == "paused"
    assert "paused queues      1" in runner.invoke(args=["status"]).output
    typo = runner.invoke(args=["queues", "pause", "emials"])
    assert typo.exit_code == 1
    resumed = runner.invoke(args=["queues", "resume", "emails"])
    assert resumed.exit_code == 0 and "resumed emails" in resumed.output
    assert "worked 1 job(s)" in runner.invoke(args=["worker", "--drain"]).output
    assert rows(app, "SELECT status::text, count(*) FROM jobs GROUP BY 1") == [("failed", 1)]


def test_the_flask_admin_commands_help_and_bad_input(app: Any) -> None:
    runner = app.test_cli_runner()
    helped = runner.invoke(args=["status", "--help"])
    assert helped.exit_code == 0 and "usage: flask status" in helped.output
    assert "example:" in helped.output
    assert "status" in runner.invoke(args=["--help"]).output
    bad = runner.invoke(args=["jobs", "show", "42"])
    assert bad.exit_code == 2
    unknown = runner.invoke(args=["jobs", "show", "00000000-0000-0000-0000-000000000001"])
    assert unknown.exit_code == 1


def test_the_flask_relay_command_publishes_the_events_once(app: Any) -> None:
    client = app.test_client()
    for i in range(3):
        order = {"reference": f"R-{i}", "email": f"r{i}@example.com", "total_cents": 10 + i}
        assert client.post("/orders", json=order).status_code == 201
    runner = app.test_cli_runner()
    result = runner.invoke(args=["relay", "--once"], env={"AMQP_URL": ""})
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [m["body"]["total_cents"] for m in lines] == [10, 11, 12]  # commit order
    assert all(m["type"] == "OrderPlaced" and m["message_id"] for m in lines)
    assert "published 3 event(s)" in result.output
    assert client.get("/status.json").json["outbox"] == {"published": 3, "unpublished": 0}
    again = runner.invoke(args=["relay", "--once"], env={"AMQP_URL": ""})
    assert "published 0 event(s)" in again.output  # marked: never published twice here


def test_the_flask_relay_command_publishes_to_rabbitmq(app: Any) -> None:
    import asyncio

    from .brokers import RABBITMQ, require

    require("RabbitMQ", RABBITMQ, "aio_pika")
    import aio_pika

    url = f"amqp://guest:guest@{RABBITMQ}/"
    queue_name = f"shop-events-test-{os.getpid()}"

    async def declare() -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(queue_name)
            await channel.declare_queue(queue_name, durable=True)

    async def received() -> list[Any]:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue(queue_name)
            messages = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                messages.append(message)
            await queue.delete()
            return messages

    asyncio.run(declare())
    client = app.test_client()
    order = {"reference": "Q-1", "email": "q@example.com", "total_cents": 77}
    assert client.post("/orders", json=order).status_code == 201
    env = {"AMQP_URL": url, "AMQP_QUEUE": queue_name}
    result = app.test_cli_runner().invoke(args=["relay", "--once"], env=env)
    assert "published 1 event(s)" in result.output, result.output
    [message] = asyncio.run(received())
    assert json.loads(message.body) == {
        "order": 1,
        "email": "q@example.com",
        "total_cents": 77,
    }
    assert message.type == "OrderPlaced" and message.message_id
    assert client.get("/status.json").json["outbox"] == {"published": 1, "unpublished": 0}


# -- the embedded default: one server shared by the app's processes -------------------------


@pytest.fixture
def instance() -> Iterator[Path]:
    """An instance folder of the test's own (short: the server's socket lives in it)."""
    folder = Path(tempfile.mkdtemp(prefix="shop-", dir="/tmp"))
    yield folder
    stop_leftover_servers(folder)
    shutil.rmtree(folder, ignore_errors=True)


def stop_leftover_servers(folder: Path) -> None:
    """Stop a server a failed test may have left (a passing one leaves none)."""
    pgserver = pytest.importorskip("pgserver")
    pg_ctl = str(Path(pgserver.__file__).parent / "pginstall/bin/pg_ctl")
    for pgdata in folder.glob("**/pgdata"):
        if (pgdata / "postmaster.pid").exists():
            owner = pgdata.stat().st_uid
            subprocess.run(
                [pg_ctl, "-D", str(pgdata), "-m", "immediate", "stop"],
                user=owner if os.geteuid() == 0 and owner != 0 else None,
                capture_output=True,
                check=False,
            )


def flask_command(instance: Path, *args: str) -> list[str]:
    app = f"examples.flask_app:create_app(instance_path={str(instance)!r})"
    return [sys.executable, "-m", "flask", "--app", app, *args]


def no_url_env() -> dict[str, str]:
    """The environment of a first try: no database variable at all."""
    gone = ("DATABASE_URL", "SA_OUTBOX_DATABASE_URL", "AMQP_URL")
    return {k: v for k, v in os.environ.items() if k not in gone}


def processes_naming(folder: Path) -> list[str]:
    psutil = pytest.importorskip("psutil")
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if str(folder) in line and "create_app" not in line:  # the server and its watchers
            found.append(line)
    return found


def served_at(web: subprocess.Popen[str], timeout: float = 120.0) -> str:
    """The address ``flask run`` prints once it listens (read in a thread, with a deadline)."""
    lines: queue.Queue[str] = queue.Queue()
    assert web.stderr is not None
    threading.Thread(target=lambda: [lines.put(line) for line in web.stderr], daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if match := re.search(r"Running on (http://127\.0\.0\.1:\d+)", line):
            return match.group(1)
    raise AssertionError("flask run did not start:\n" + "".join(seen))


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_the_worker_sees_the_web_process_job_on_the_embedded_default(instance: Path) -> None:
    pytest.importorskip("pgserver", reason="the embedded PostgreSQL (the test extra has it)")
    web = subprocess.Popen(
        flask_command(instance, "run", "--port", "0"),
        cwd=ROOT,
        env=no_url_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = served_at(web)
        order = {"reference": "E-1", "email": "eve@example.com", "total_cents": 4200}
        placed = http("POST", f"{base}/orders", order)
        assert http("GET", f"{base}/status.json")["jobs"]["pending"] == 1

        # Another terminal, another process: the same embedded server, the same job.
        worker = subprocess.run(
            flask_command(instance, "worker", "--drain"),
            cwd=ROOT,
            env=no_url_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert worker.returncode == 0, worker.stderr
        assert "worked 1 job(s)" in worker.stdout
        status = http("GET", f"{base}/status.json")
        assert status["emails_sent"] == 1 and status["jobs"]["succeeded"] == 1
        assert placed["order_id"] == 1
    finally:
        web.send_signal(signal.SIGTERM)  # as a service manager stops it
        web.wait(60)
        if web.stderr is not None:
            web.stderr.close()

    # The last process is gone, killed by a signal: the server stopped, its data stayed.
    wait_until(lambda: not processes_naming(instance), "the embedded server to stop")
    assert (instance / "pgdata" / "pgdata" / "PG_VERSION").exists()
    relay = subprocess.run(
        flask_command(instance, "relay", "--once"),
        cwd=ROOT,
        env=no_url_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert relay.returncode == 0, relay.stderr
    assert "published 1 event(s)" in relay.stdout  # the order's event, kept across runs
    wait_until(lambda: not processes_naming(instance), "the embedded server to stop again")
