"""The README's command lines, run as written, as a new user would: a ``myapp`` package made
of the README's own files, ``DATABASE_URL`` and nothing else, real processes.

The README marks them ``<!-- snippet: readme-… -->``: ``myapp/tasks.py`` and
``myapp/outbox.py`` come from it verbatim, and each ``sh`` line of the worker, the
``jobs enqueue`` and the relay snippets runs as it is printed (``sa-outbox`` is this
interpreter's ``python -m sa_outbox``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.schema import CreateSchema, DropSchema

from sa_outbox import JobMixin, JobQueue, JobStatus, Outbox, OutboxMixin
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL

from .brokers import RABBITMQ, require
from .test_cli_database_url import wait_until
from .test_docs import blocks

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = f"readme_cli_{os.getpid()}"
PAYLOAD = {"order": 42, "email": "ana@example.com", "total_cents": 1200}

MODELS = """\
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sa_outbox import JobMixin, OutboxMixin


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    total_cents: Mapped[int]


class Job(JobMixin, Base):
    __tablename__ = "jobs"


class OutboxEvent(OutboxMixin, Base):
    __tablename__ = "outbox"
"""

MAIL = """\
from pathlib import Path

SENT = Path(__file__).with_name("sent.txt")


class Mailer:
    def send_receipt(self, order_id, *, idempotency_key):
        with SENT.open("a") as sent:
            sent.write(f"{order_id} {idempotency_key}\\n")


mailer = Mailer()
"""


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    __table_args__ = {"schema": SCHEMA}  # noqa: RUF012 - SQLAlchemy's own convention
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    total_cents: Mapped[int]


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA


class OutboxEvent(OutboxMixin, Base):
    __tablename__ = "outbox"
    __table_schema__ = SCHEMA


def snippet(name: str) -> str:
    found = [b for b in blocks(ROOT / "docs" / "tour.md") if b.snippet == name]
    assert len(found) == 1, f"docs/tour.md has no snippet {name!r}"
    return found[0].code


def command_lines(name: str) -> list[list[str]]:
    """The snippet's command lines, ``sa-outbox`` run by this interpreter."""
    lines = []
    for line in snippet(name).splitlines():
        argv = shlex.split(line)
        assert argv[0] == "sa-outbox", line
        lines.append([sys.executable, "-m", "sa_outbox", *argv[1:]])
    return lines


@pytest.fixture
def app_url(database_url: str) -> Iterator[str]:
    """The test database, ``search_path`` on an empty schema holding the README's tables."""
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(SCHEMA))
    Base.metadata.create_all(admin)
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    yield url.render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
    admin.dispose()


@pytest.fixture
def app_engine(database_url: str, app_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def myapp(tmp_path: Path) -> Path:
    """The README's application: its models, its tasks.py and outbox.py, a stand-in mailer."""
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODELS)
    (package / "mail.py").write_text(MAIL)
    (package / "tasks.py").write_text(snippet("readme-tasks"))
    (package / "outbox.py").write_text(snippet("readme-outbox"))
    return tmp_path


def env_of(app_url: str, **extra: str) -> dict[str, str]:
    """Only ``DATABASE_URL``, as the README configures the application."""
    env = {k: v for k, v in os.environ.items() if k != ENV_DATABASE_URL}
    return {**env, ENV_APP_DATABASE_URL: app_url, **extra}


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def counts(engine: Engine) -> dict[JobStatus, int]:
    with engine.connect() as conn:
        return JobQueue(Job).counts(conn)


def stop(process: subprocess.Popen[bytes], log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, log.read_text()


def test_enqueue_then_the_worker_as_the_readme_runs_them(
    app_url: str, app_engine: Engine, myapp: Path
) -> None:
    first, again = command_lines("readme-enqueue")
    enqueued = run(first, myapp, env_of(app_url))
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.split()[2]
    assert enqueued.stdout == f"enqueued job {job_id} (send-receipt, queue default)\n"
    assert uuid.UUID(job_id)
    skipped = run(again, myapp, env_of(app_url))
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout == (
        "skipped: a job of kind 'send-receipt' with deduplication key 'receipt:42' already exists\n"
    )
    assert counts(app_engine)[JobStatus.PENDING] == 1

    [worker_line] = command_lines("readme-worker")
    log = myapp / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            worker_line, cwd=myapp, env=env_of(app_url), stdout=out, stderr=out
        )
    try:
        wait_until(lambda: counts(app_engine)[JobStatus.SUCCEEDED] == 1, "the worker", log=log)
    finally:
        stop(worker, log)
    assert (myapp / "myapp" / "sent.txt").read_text() == "42 receipt:42\n"


def test_the_relay_as_the_readme_runs_it(app_url: str, app_engine: Engine, myapp: Path) -> None:
    require("RabbitMQ", RABBITMQ, "aio_pika")
    import aio_pika

    amqp = f"amqp://guest:guest@{RABBITMQ}/"
    queue_name = f"readme-events-{os.getpid()}"

    async def bind() -> None:
        connection = await aio_pika.connect(amqp)
        async with connection:
            channel = await connection.channel()
            events = await channel.declare_exchange(
                "events", aio_pika.ExchangeType.TOPIC, durable=True
            )
            queue = await channel.declare_queue(queue_name, durable=True)
            await queue.bind(events, routing_key="OrderPlaced")

    async def received() -> list[Any]:
        connection = await aio_pika.connect(amqp)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue(queue_name)
            messages = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                messages.append(message)
            await queue.delete()
            return messages

    asyncio.run(bind())
    with app_engine.begin() as conn:
        Outbox(OutboxEvent).append(
            conn,
            event_type="OrderPlaced",
            aggregate_type="Order",
            aggregate_id=42,
            payload=PAYLOAD,
        )
    t = OutboxEvent.__table__

    def published() -> bool:
        with app_engine.connect() as conn:
            return conn.scalar(select(func.count()).where(t.c.published_at.is_not(None))) == 1

    [relay_line] = command_lines("readme-relay")
    log = myapp / "relay.log"
    with log.open("wb") as out:
        relay = subprocess.Popen(
            relay_line, cwd=myapp, env=env_of(app_url, AMQP_URL=amqp), stdout=out, stderr=out
        )
    try:
        wait_until(published, "the relay to publish the event", log=log)
    finally:
        stop(relay, log)
    [message] = asyncio.run(received())
    assert message.type == "OrderPlaced"
    assert json.loads(message.body) == {
        "order": 42,
        "email": "ana@example.com",
        "total_cents": 1200,
    }
