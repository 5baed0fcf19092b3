"""Enqueueing one job: one statement per queue, compiled once; one round trip on an Engine.

`JobQueue.enqueue` and ``sa_outbox.enqueue`` run the statement of
`sa_outbox.statements.enqueue_job_template`, built once per queue and run with new values,
so SQLAlchemy's compiled cache is hit from the second job on (on 2.0, whose ``INSERT … ON
CONFLICT`` has no cache key, as its precompiled text). Given an `Engine`, the job is one
autocommit ``INSERT``: the libpq trace of the connection shows one message exchange and no
``BEGIN`` or ``COMMIT``.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Column, Engine, MetaData, Table, create_engine, event, func, select
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.engine.default import CacheStats
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

import sa_outbox
from sa_outbox import AsyncJobQueue, JobQueue, SaOutboxError
from sa_outbox import statements as st

from .conftest import Job, Order


@pytest.fixture
def own_engine(engine: Engine, database_url: str) -> Iterator[Engine]:
    """An engine of the test's own (an empty compiled cache), one connection in its pool."""
    eng = create_engine(database_url, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def _job_inserts(eng: Engine) -> list[Any]:
    """The ``cache_hit`` of every INSERT into the job table ``eng`` runs from now on."""
    hits: list[Any] = []

    @event.listens_for(eng, "after_cursor_execute")
    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: Any) -> None:
        if statement.startswith(f"INSERT INTO {Job.__table__.fullname} "):
            hits.append(context.cache_hit)

    return hits


def _jobs(eng: Engine) -> list[Any]:
    with eng.connect() as conn:
        return list(conn.execute(select(Job.__table__).order_by(Job.__table__.c.created_at)))


def test_a_second_enqueue_compiles_nothing(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    hits = _job_inserts(own_engine)
    sizes = []
    with own_engine.begin() as conn:
        for i in range(3):
            queue.enqueue(conn, "send-email", {"n": i})
            sizes.append(len(own_engine._compiled_cache))  # type: ignore[attr-defined]
    assert hits == [CacheStats.CACHE_MISS, CacheStats.CACHE_HIT, CacheStats.CACHE_HIT]
    assert sizes[0] == sizes[1] == sizes[2]
    assert len(_jobs(own_engine)) == 3


def test_every_option_shares_the_one_statement(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    hits = _job_inserts(own_engine)
    when = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    with own_engine.begin() as conn:
        queue.enqueue(conn, "a", {})
        queue.enqueue(conn, "b", [1, 2], queue="emails", priority=-3, max_attempts=2)
        queue.enqueue(conn, "c", None, run_at=when)
        queue.enqueue(conn, "d", "x", delay=dt.timedelta(minutes=5))
        queue.enqueue(conn, "e", 1.5, deduplication_key="only")
        now = conn.execute(select(func.now())).scalar_one()
    assert hits == [CacheStats.CACHE_MISS] + [CacheStats.CACHE_HIT] * 4
    rows = {row.kind: row for row in _jobs(own_engine)}
    assert rows["a"].run_at == now and rows["a"].queue == "default"
    assert (rows["b"].queue, rows["b"].priority, rows["b"].max_attempts) == ("emails", -3, 2)
    assert rows["b"].payload == [1, 2] and rows["c"].payload is None
    assert rows["c"].run_at == when
    assert rows["d"].run_at == now + dt.timedelta(minutes=5)
    assert rows["e"].deduplication_key == "only"


def test_the_session_enqueue_hits_the_cache_and_joins_the_transaction(
    own_engine: Engine,
) -> None:
    factory = sessionmaker(own_engine)
    sa_outbox.install(factory, job_model=Job)
    hits = _job_inserts(own_engine)
    for i in range(3):
        with factory() as session, session.begin():
            session.add(Order(customer=f"c{i}"))
            sa_outbox.enqueue(session, "send-receipt", {"order": i})
    with factory() as session, session.begin():
        sa_outbox.enqueue(session, "send-receipt", {"order": "gone"})
        session.rollback()
    assert hits[1:] == [CacheStats.CACHE_HIT] * 3
    assert [row.payload for row in _jobs(own_engine)] == [{"order": i} for i in range(3)]


def test_a_session_bound_per_model_finds_the_job_tables_engine(engine: Engine) -> None:
    # No default bind: the engine is found through the job model (the statement SQLAlchemy
    # 2.0 runs as text names no table of its own).
    with Session(binds={Job: engine}) as session, session.begin():
        assert sa_outbox.enqueue(session, "k", {}, model=Job).inserted
        assert sa_outbox.enqueue(session, "k", {}, model=Job, deduplication_key="d").inserted
    assert len(_jobs(engine)) == 2


def _traced(eng: Engine, call: Any) -> tuple[Any, list[str]]:
    """``call()``'s result and the libpq trace (the frontend's messages) of ``eng``'s one
    pooled connection while it ran."""
    with eng.connect() as conn:
        pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            result = call()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    return result, lines


def _messages(lines: list[str], side: str) -> list[str]:
    return [line.split("\t")[2].strip() for line in lines if line.startswith(side + "\t")]


def test_enqueue_on_an_engine_is_one_autocommit_round_trip(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    queue.enqueue(own_engine, "warm-up", {})  # the pool's first connection is made here
    result, lines = _traced(
        own_engine, lambda: queue.enqueue(own_engine, "send-email", {"to": "ana"})
    )
    sent = _messages(lines, "F")
    # The extended protocol's one exchange (Parse/Bind/Describe/Execute, then Sync), and no
    # simple Query: psycopg sends BEGIN and COMMIT as those.
    assert sent.count("Sync") == 1 and "Query" not in sent, sent
    assert _messages(lines, "B")[-1] == "ReadyForQuery", lines
    assert lines[-1].endswith("I")  # idle: no transaction left open
    assert result.inserted
    # Committed: another connection sees it at once.
    assert [row.id for row in _jobs(own_engine) if row.kind == "send-email"] == [result.id]


def test_enqueue_on_an_engine_deduplicates(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    first = queue.enqueue(own_engine, "index-book", {"id": 7}, deduplication_key="book:7")
    again = queue.enqueue(own_engine, "index-book", {"id": 7}, deduplication_key="book:7")
    other = queue.enqueue(own_engine, "other-kind", {"id": 7}, deduplication_key="book:7")
    assert first.inserted and first.id is not None
    assert not again.inserted and again.id is None
    assert other.inserted
    assert sorted(row.kind for row in _jobs(own_engine)) == ["index-book", "other-kind"]
    # The connection went back to the pool as it was: the next transaction is one.
    with own_engine.connect() as conn:
        queue.enqueue(conn, "rolled-back", {})
        conn.rollback()
    assert "rolled-back" not in {row.kind for row in _jobs(own_engine)}


def test_sa_outbox_enqueue_takes_an_engine_too(engine: Engine) -> None:
    assert sa_outbox.enqueue(engine, "k", {}, model=Job, deduplication_key="x").inserted
    assert not sa_outbox.enqueue(engine, "k", {}, model=Job, deduplication_key="x").inserted
    assert len(_jobs(engine)) == 1


async def test_async_enqueue_on_an_async_engine_commits(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    queue = AsyncJobQueue(Job)
    hits = _job_inserts(async_engine.sync_engine)
    first = await queue.enqueue(async_engine, "a", {}, deduplication_key="k")
    again = await queue.enqueue(async_engine, "a", {}, deduplication_key="k")
    third = await sa_outbox.enqueue(async_engine, "b", {}, model=Job)
    assert first.inserted and not again.inserted and third.inserted
    assert hits[1:] == [CacheStats.CACHE_HIT] * 2
    assert sorted(row.kind for row in _jobs(engine)) == ["a", "b"]
    async with async_engine.connect() as conn:  # back in the pool in a transaction's mode
        await queue.enqueue(conn, "rolled-back", {})
        await conn.rollback()
    assert len(_jobs(engine)) == 2


def test_precompiled_text_escapes_other_colons() -> None:
    """A colon in a quoted name is not read as a bind parameter of the text."""

    # Copies: a type shared with another table would take its schema (an Enum would).
    columns = [Column(c.name, c.type.copy()) for c in Job.__table__.columns]
    table = Table("jobs:odd", MetaData(), *columns)
    stmt = st.precompiled(st.enqueue_job_template(table))
    sql = str(stmt.compile(dialect=pg_psycopg.dialect()))
    assert '"jobs:odd"' in sql
    assert "%(job_kind)s" in sql and "%(job_payload)s" in sql
    assert stmt.selected_columns.keys() == ["id"]


BAD_JOBS: list[tuple[str, Any, dict[str, Any]]] = [
    ("", {}, {}),
    (" ", {}, {}),
    ("k\x00", {}, {}),
    ("x" * 129, {}, {}),
    (7, {}, {}),
    ("k", {}, {"queue": None}),
    ("k", {}, {"priority": True}),
    ("k", {}, {"priority": 2**31}),
    ("k", {}, {"max_attempts": 0}),
    ("k", {}, {"max_attempts": 1.0}),
    ("k", {}, {"run_at": dt.datetime(2030, 1, 1)}),
    ("k", {}, {"delay": -1}),
    ("k", {}, {"delay": 5, "run_at": dt.datetime.now(dt.UTC)}),
    ("k", {}, {"deduplication_key": 3}),
    ("k", {}, {"deduplication_key": "k" * 100_000}),
    ("k", {"a": object()}, {}),
    ("k", {"a": "\x00"}, {}),
    ("k", "x" * (2 << 20), {}),
]


@pytest.mark.parametrize(("kind", "payload", "options"), BAD_JOBS)
def test_the_values_refuse_what_enqueue_job_refuses(
    kind: Any, payload: Any, options: dict[str, Any]
) -> None:
    with pytest.raises(SaOutboxError) as expected:
        st.enqueue_job(Job, kind, payload, **options)
    with pytest.raises(type(expected.value)) as got:
        st.enqueue_job_values(kind, payload, **options)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"queue": "emails", "priority": -5, "max_attempts": 1},
        {"deduplication_key": "welcome:ana"},
        {"delay": 30},
        {"delay": dt.timedelta(0)},
        {"run_at": dt.datetime(2031, 1, 1, tzinfo=dt.UTC)},
    ],
)
def test_the_values_are_the_checked_job(options: dict[str, Any]) -> None:
    values = st.enqueue_job_values("send-email", {"to": "ana"}, **options)
    assert sorted(values) == sorted(st.ENQUEUE_PARAMETERS)
    delay = options.get("delay")
    assert values["job_payload"] == '{"to":"ana"}'
    assert values["job_kind"] == "send-email"
    assert values["job_queue"] == options.get("queue", "default")
    assert values["job_priority"] == options.get("priority", 0)
    assert values["job_max_attempts"] == options.get("max_attempts", st.DEFAULT_MAX_ATTEMPTS)
    assert values["job_deduplication_key"] == options.get("deduplication_key")
    assert values["job_run_at"] == options.get("run_at")
    assert values["job_delay"] == (
        dt.timedelta(seconds=delay) if isinstance(delay, int) else delay or dt.timedelta(0)
    )
    assert values["job_id"].version == 7
