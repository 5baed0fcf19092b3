"""docs/roles.md's GRANTs, run as written, then each role's work done on its own login.

The roles are cluster-wide, so they get names of this process's own (and the tables a schema
of their own); everything is dropped at the end. Each role does what the page says it may,
and is refused (``InsufficientPrivilege``) what it was not granted, with nothing written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Session

from sa_outbox import (
    JobApp,
    JobContext,
    JobMixin,
    JobQueue,
    JobStatus,
    Outbox,
    OutboxMixin,
    PermanentError,
    Relay,
    Worker,
)
from sa_outbox.publishers.callable import CallablePublisher

from .test_docs import blocks

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = f"roles_{os.getpid()}"
PREFIX = f"sao_roles_{os.getpid()}_"
ROLES = ("migrator", "web", "worker", "relay", "ops")


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA


class OutboxEvent(OutboxMixin, Base):
    __tablename__ = "outbox"
    __table_schema__ = SCHEMA


def grants_sql() -> str:
    [block] = [b for b in blocks(ROOT / "docs" / "roles.md") if b.snippet == "grants"]
    sql = re.sub(r"--.*$", "", block.code, flags=re.M)
    sql = re.sub(r"\bapp_(\w+)", rf"{PREFIX}\1", sql)
    return re.sub(r"\bapp\b", SCHEMA, sql)


def _drop(admin: Engine) -> None:
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        for role in ROLES:
            exists = conn.scalar(
                text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": PREFIX + role}
            )
            if exists:
                conn.execute(text(f"DROP OWNED BY {PREFIX}{role}"))
                conn.execute(text(f"DROP ROLE {PREFIX}{role}"))


@pytest.fixture
def as_role(database_url: str) -> Iterator[Any]:
    admin = create_engine(database_url)
    _drop(admin)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(admin)
    with admin.begin() as conn:
        for statement in grants_sql().split(";"):
            if statement.strip():
                conn.execute(text(statement))
    engines: dict[str, Engine] = {"admin": admin}

    def engine_for(role: str) -> Engine:
        if role not in engines:
            url = make_url(database_url).set(username=PREFIX + role, password=None)
            engines[role] = create_engine(url)
        return engines[role]

    yield engine_for
    for name, eng in engines.items():
        if name != "admin":
            eng.dispose()
    _drop(admin)
    admin.dispose()


def denied(run: Any) -> None:
    with pytest.raises(ProgrammingError) as info:
        run()
    assert getattr(info.value.orig, "sqlstate", None) == "42501", info.value


def test_each_role_does_its_work_and_no_more(as_role: Any) -> None:
    web, worker_db, relay_db, ops = (as_role(r) for r in ("web", "worker", "relay", "ops"))
    queue, outbox = JobQueue(Job), Outbox(OutboxEvent)

    # The web app: a job and an event in one transaction.
    with Session(web) as session, session.begin():
        queue.enqueue(session, "send-email", {"to": "ada@example.com"})
        queue.enqueue(session, "send-email", {"to": "nobody"})
        outbox.append(
            session,
            event_type="UserSignedUp",
            aggregate_type="user",
            aggregate_id=1,
            payload={"id": 1},
        )
    with web.begin() as conn:  # it cannot claim jobs
        denied(lambda: queue.claim(conn, worker_id="web"))

    # The worker.
    sent: list[str] = []

    def send_email(job: JobContext) -> None:
        if "@" not in job.payload["to"]:
            raise PermanentError("not an address")
        sent.append(job.payload["to"])

    app = JobApp(Job, handlers={"send-email": send_email})
    with Worker(app, worker_db, listen=False, install_signal_handlers=False) as worker:
        assert worker.drain() == 2
    assert sent == ["ada@example.com"]
    with worker_db.begin() as conn:  # it cannot touch the outbox
        denied(
            lambda: outbox.append(
                conn, event_type="X", aggregate_type="user", aggregate_id=2, payload={}
            )
        )

    # The relay.
    published: list[Any] = []
    relay = Relay(relay_db, OutboxEvent, CallablePublisher(published.append))
    try:
        assert relay.run_once().published == 1
    finally:
        relay.close()
    assert [event.event_type for event in published] == ["UserSignedUp"]
    with relay_db.begin() as conn:  # it cannot enqueue jobs
        denied(lambda: queue.enqueue(conn, "send-email", {"to": "x@example.com"}))

    # The operator: status, and a retry of the failed job; no deleting.
    with ops.begin() as conn:
        assert queue.counts(conn)[JobStatus.FAILED] == 1
        assert len(queue.requeue_failed(conn, kinds="send-email")) == 1
    with ops.begin() as conn:
        denied(lambda: conn.execute(text(f"DELETE FROM {SCHEMA}.jobs")))

    with as_role("admin").connect() as conn:
        counts = queue.counts(conn)
        events = conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.outbox"))
        unpublished = conn.scalar(
            text(f"SELECT count(*) FROM {SCHEMA}.outbox WHERE published_at IS NULL")
        )
    assert counts[JobStatus.SUCCEEDED] == 1 and counts[JobStatus.PENDING] == 1
    assert sum(counts.values()) == 2  # the refused enqueue wrote nothing
    assert (events, unpublished) == (1, 0)  # nor the refused append
