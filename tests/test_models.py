"""The mixins on the base styles users have, with their own table names and schemas."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import Engine, MetaData, func, select, text
from sqlalchemy.engine.default import CacheStats
from sqlalchemy.orm import (
    DeclarativeBase,
    DeclarativeBaseNoMeta,
    MappedAsDataclass,
    Session,
)

from sa_outbox import (
    Backoff,
    FakeClock,
    JobApp,
    JobDataclassMixin,
    JobMixin,
    JobQueue,
    JobStatus,
    Outbox,
    OutboxDataclassMixin,
    OutboxMixin,
)
from sa_outbox import statements as st
from sa_outbox.schema import JobDependencyDataclassMixin, JobStepDataclassMixin

from .conftest import TEST_SCHEMA, Job

SQLALCHEMY_2_1 = tuple(int(p) for p in sqlalchemy.__version__.split(".")[:2]) >= (2, 1)


@pytest.fixture
def schema(engine: Engine) -> Iterator[str]:
    name = f"models_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {name}"))
    yield name
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {name} CASCADE"))


def declarative() -> tuple[Any, Any, Any]:
    class Base(DeclarativeBase):
        pass

    return Base, JobMixin, OutboxMixin


def dataclass_base() -> tuple[Any, Any, Any]:
    class Base(MappedAsDataclass, DeclarativeBase):
        pass

    return Base, JobDataclassMixin, OutboxDataclassMixin


def no_meta() -> tuple[Any, Any, Any]:
    class Base(DeclarativeBaseNoMeta):
        metadata = MetaData()

    return Base, JobMixin, OutboxMixin


def flask_sqlalchemy() -> tuple[Any, Any, Any]:
    flask_sqlalchemy = pytest.importorskip(
        "flask_sqlalchemy", reason="Flask-SQLAlchemy is an optional test dependency"
    )
    db = flask_sqlalchemy.SQLAlchemy()
    return db.Model, JobMixin, OutboxMixin


@pytest.mark.parametrize("make_base", [declarative, dataclass_base, no_meta, flask_sqlalchemy])
def test_models_on_each_base_style(engine: Engine, schema: str, make_base: Any) -> None:
    base, job_mixin, outbox_mixin = make_base()
    job_cls = type(
        "BackgroundJob",
        (job_mixin, base),
        {"__tablename__": "background_jobs", "__table_schema__": schema},
    )
    event_cls = type(
        "DomainEvent",
        (outbox_mixin, base),
        {"__tablename__": "domain_events", "__table_schema__": schema},
    )
    base.metadata.create_all(engine, tables=[job_cls.__table__, event_cls.__table__])

    with engine.connect() as conn:
        indexes = dict(
            conn.execute(
                text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s"),
                {"s": schema},
            ).all()
        )
        enum_schema = conn.execute(
            text(
                "SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                " WHERE t.typname = 'job_status' AND n.nspname = :s"
            ),
            {"s": schema},
        ).scalar()
    assert enum_schema == schema  # the enum lives beside its table
    assert "WHERE (status = 'pending'::" in indexes["background_jobs_ready_idx"]
    assert "queue, priority DESC, run_at, id" in indexes["background_jobs_ready_idx"]
    assert "UNIQUE" in indexes["background_jobs_dedup_idx"]
    assert "WHERE (deduplication_key IS NOT NULL)" in indexes["background_jobs_dedup_idx"]
    assert "WHERE (status = 'running'::" in indexes["background_jobs_expired_lease_idx"]
    assert "(status, updated_at)" in indexes["background_jobs_retention_idx"]
    assert (
        "WHERE ((published_at IS NULL) AND (parked_at IS NULL))"
        in indexes["domain_events_ready_idx"]
    )
    assert "WHERE (published_at IS NULL)" in indexes["domain_events_aggregate_idx"]

    # The ORM path: the user's own session adds a job row directly, then the queue claims it.
    with Session(engine) as session, session.begin():
        session.add(job_cls(kind="orm-added", payload={"via": "orm"}))
    queue = JobQueue(job_cls)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w")
        queue.complete(conn, job.id, job.lease_token)
    assert (job.kind, job.payload, job.queue, job.max_attempts) == (
        "orm-added",
        {"via": "orm"},
        "default",
        8,
    )
    outbox = Outbox(event_cls)
    with Session(engine) as session, session.begin():
        outbox.append(
            session, event_type="Created", aggregate_type="thing", aggregate_id=1, payload={}
        )
        loaded = session.scalars(select(event_cls)).one()
        assert loaded.headers == {} and loaded.seq >= 1 and loaded.published_at is None


def test_metadata_schema_is_used_when_no_table_schema_is_given(schema: str) -> None:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class MyJob(JobMixin, Base):
        __tablename__ = "jobs"

    assert MyJob.__table__.fullname == f"{schema}.jobs"
    assert MyJob.__table__.c.status.type.schema == schema


def test_a_claim_can_be_extended_and_run_in_the_users_transaction(engine: Engine) -> None:
    clock = FakeClock()
    queue = JobQueue(Job, clock=clock)
    with engine.begin() as conn:
        queue.enqueue(conn, "report", {"size": "big"})
        small = queue.enqueue(conn, "report", {"size": "small"}).id
    t = Job.__table__
    stmt = st.claim_jobs(Job, worker_id="w", batch=5, clock=clock)
    stmt = stmt.where(t.c.payload["size"].astext == "small")
    with engine.begin() as conn:
        assert [row.id for row in conn.execute(stmt)] == [small]


def test_statements_of_one_shape_compile_once(engine: Engine) -> None:
    """Different values, same statement shape: SQLAlchemy's compiled cache is hit.

    SQLAlchemy 2.0's PostgreSQL ``INSERT … ON CONFLICT`` construct opts out of the cache
    (``inherit_cache = False``; 2.1 caches it), so on 2.0 only the enqueue recompiles.
    """
    clock = FakeClock()
    hits: dict[str, list[CacheStats]] = {"enqueue": [], "claim": [], "complete": []}
    with engine.begin() as conn:
        for i in range(3):
            clock.advance(1)
            stmt = st.enqueue_job(Job, f"k{i}", {"i": i}, deduplication_key=f"d{i}", clock=clock)
            hits["enqueue"].append(conn.execute(stmt).context.cache_hit)
            # The batch size is part of the claim's shape (its LIMIT is in the SQL text, for
            # generic plans): a worker's claims of one size share one compiled statement.
            result = conn.execute(st.claim_jobs(Job, worker_id=f"w{i}", batch=3, clock=clock))
            hits["claim"].append(result.context.cache_hit)
            pairs = [(row.id, row.lease_token) for row in result]
            done = conn.execute(st.complete_jobs(Job, pairs, clock=clock))
            hits["complete"].append(done.context.cache_hit)
    # After the first round (which may compile), statements come from the cache.
    assert hits["claim"][1:] == hits["complete"][1:] == [CacheStats.CACHE_HIT] * 2
    expected = CacheStats.CACHE_HIT if SQLALCHEMY_2_1 else CacheStats.NO_CACHE_KEY
    assert hits["enqueue"][1:] == [expected] * 2


def test_backoff_in_sql_matches_backoff_in_python(engine: Engine) -> None:
    backoff = Backoff(base=dt.timedelta(seconds=2), max=dt.timedelta(minutes=10), jitter=0)
    with engine.connect() as conn:
        for attempts in (0, 1, 2, 3, 9, 10, 50, 2000):
            in_sql = conn.execute(select(backoff.sql_delay(func.cast(attempts, Job.attempts.type))))
            assert in_sql.scalar_one() == backoff.delay(attempts), attempts


def test_jitter_stays_within_bounds() -> None:
    backoff = Backoff(base=1, max=10, jitter=0.5)
    for attempts in range(1, 12):
        delay = backoff.delay(attempts).total_seconds()
        floor = min(2 ** (attempts - 1), 10)
        assert floor <= delay <= floor + 0.5


def test_job_status_counts_use_the_enum(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "k", {})
        assert queue.counts(conn)[JobStatus.PENDING] == 1
        status = conn.execute(text(f"SELECT status FROM {TEST_SCHEMA}.jobs")).scalar_one()
    assert status == "pending"


def test_the_dataclass_mixins_keep_their_column_order_whatever_the_hash_seed() -> None:
    # The order was once a set's: it changed with PYTHONHASHSEED, and with it the inbox's
    # composite primary key, which autogenerate then no longer recognised.
    script = (
        "from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass\n"
        "from sa_outbox import InboxDataclassMixin, JobDataclassMixin, OutboxDataclassMixin\n"
        "class B(MappedAsDataclass, DeclarativeBase): pass\n"
        "class I(InboxDataclassMixin, B): __tablename__ = 'inbox'\n"
        "class J(JobDataclassMixin, B): __tablename__ = 'jobs'\n"
        "class O(OutboxDataclassMixin, B): __tablename__ = 'outbox'\n"
        "print([[c.name for c in t.__table__.columns] for t in (I, J, O)],"
        " [c.name for c in I.__table__.primary_key.columns])\n"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(6)
    }
    assert len(seen) == 1, seen
    assert seen.pop().rstrip().endswith("['source', 'message_id']")


def test_a_workflow_runs_on_the_dataclass_mixins_of_every_table(
    engine: Engine, schema: str, make_worker: Any
) -> None:
    # A MappedAsDataclass base refuses a plain mixin's columns: the steps and dependencies
    # tables have dataclass variants too, and a worker runs a workflow on them.
    class Base(MappedAsDataclass, DeclarativeBase):
        pass

    class FlowJob(JobDataclassMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = schema

    class FlowStep(JobStepDataclassMixin, Base):
        __tablename__ = "job_steps"
        __table_schema__ = schema

    class FlowDependency(JobDependencyDataclassMixin, Base):
        __tablename__ = "job_dependencies"
        __table_schema__ = schema

    Base.metadata.create_all(engine)
    app = JobApp(FlowJob, steps=FlowStep, dependencies=FlowDependency)
    app.register("first", lambda job: job.step("count", lambda: 2))
    app.register("second", lambda job: sum(r for r in job.parent_results().values()) + 1)
    queue = JobQueue(FlowJob, steps=FlowStep, dependencies=FlowDependency)
    with engine.begin() as conn:
        first = queue.enqueue(conn, "first", {}).id
        second = queue.enqueue(conn, "second", {}, after=[first]).id
    assert make_worker(app).drain(timeout=20) == 2
    with engine.connect() as conn:
        found = queue.read_result(conn, second)
        steps = conn.execute(select(FlowStep.name).order_by(FlowStep.name)).scalars().all()
    assert found is not None and found.value == 3
    assert steps == ["@result", "@result", "count"]
    assert FlowStep(job_id=uuid.UUID(int=1), name="n", result=None).name == "n"
