"""The enqueue on psycopg's cursor (`sa_outbox.ops._cursor.DriverInsert`).

`JobQueue.enqueue` and ``sa_outbox.enqueue`` hand their one INSERT to the driver's cursor
when nothing listens to the engine. These tests hold it to what ``execute`` guarantees: the
job joins the caller's transaction (rolled back with it, visible inside it), an Engine's job
commits on its own without leaving the pooled connection in autocommit, errors come out as
SQLAlchemy's exceptions with nothing written, a killed connection is invalidated, and a
listener on the engine sees the statement (the cursor path steps aside).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, exc, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

import sa_outbox
from sa_outbox import JobQueue
from sa_outbox.ops._cursor import NOT_RUN, DriverInsert

from .conftest import TEST_SCHEMA, Job, Order


@pytest.fixture
def own_engine(engine: Engine, database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def _jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(Job)) or 0)


def _orders(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(Order)) or 0)


def test_the_cursor_path_runs_for_a_plain_engine(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    values = queue._ops.enqueue_values("noop", {"n": 1}, {})
    row = DriverInsert(lambda: sa_outbox.statements.enqueue_job_template(Job)).run(
        own_engine, values
    )
    assert row is not NOT_RUN
    assert row[0] == values["job_id"]
    assert _jobs(own_engine) == 1


def test_in_a_session_the_job_is_visible_inside_and_rolls_back_with_it(
    own_engine: Engine,
) -> None:
    with Session(own_engine) as session:
        session.add(Order(customer="ana"))
        result = sa_outbox.enqueue(session, "send-email", {"to": "ana"}, model=Job)
        assert result.inserted
        seen = session.scalar(select(Job.kind).where(Job.id == result.id))
        assert seen == "send-email"
        session.rollback()
    assert (_jobs(own_engine), _orders(own_engine)) == (0, 0)

    with Session(own_engine) as session, session.begin():
        session.add(Order(customer="bob"))
        result = sa_outbox.enqueue(session, "send-email", {"to": "bob"}, model=Job)
    with own_engine.connect() as conn:
        row = conn.execute(select(Job.kind, Job.payload, Job.status).where(Job.id == result.id))
        assert row.one() == ("send-email", {"to": "bob"}, "pending")
    assert (_jobs(own_engine), _orders(own_engine)) == (1, 1)


def test_on_a_connection_not_begun_commit_commits_the_job(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    with own_engine.connect() as conn:
        queue.enqueue(conn, "a", {})
        assert conn.in_transaction()
        conn.commit()
    with own_engine.connect() as conn:
        queue.enqueue(conn, "b", {})
        # closed without commit: rolled back, as with execute()
    with own_engine.connect() as conn:
        assert conn.scalars(select(Job.kind)).all() == ["a"]


def test_an_engine_job_commits_and_leaves_the_pooled_connection_transactional(
    own_engine: Engine,
) -> None:
    queue = JobQueue(Job)
    assert queue.enqueue(own_engine, "a", {}).inserted
    # The pool's only connection ran the job in autocommit; it is transactional again.
    with own_engine.connect() as conn:
        conn.execute(text(f"INSERT INTO {TEST_SCHEMA}.orders (customer) VALUES ('x')"))
        conn.rollback()
    assert (_jobs(own_engine), _orders(own_engine)) == (1, 0)


def test_a_deduplicated_job_reports_not_inserted(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    first = queue.enqueue(own_engine, "a", {}, deduplication_key="k")
    second = queue.enqueue(own_engine, "a", {}, deduplication_key="k")
    assert first.inserted and first.id is not None
    assert not second.inserted and second.id is None
    assert _jobs(own_engine) == 1


@pytest.fixture
def refusing_trigger(engine: Engine) -> Iterator[None]:
    """A trigger of the user's that refuses every job: an error the database raises."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE FUNCTION {TEST_SCHEMA}.refuse_job() RETURNS trigger LANGUAGE plpgsql "
                "AS $$ BEGIN RAISE EXCEPTION 'no jobs today'; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER refuse_job BEFORE INSERT ON {TEST_SCHEMA}.jobs "
                f"FOR EACH ROW EXECUTE FUNCTION {TEST_SCHEMA}.refuse_job()"
            )
        )
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER refuse_job ON {TEST_SCHEMA}.jobs"))
            conn.execute(text(f"DROP FUNCTION {TEST_SCHEMA}.refuse_job()"))


@pytest.mark.usefixtures("refusing_trigger")
def test_an_error_is_sqlalchemys_and_nothing_is_written(own_engine: Engine) -> None:
    queue = JobQueue(Job)
    with pytest.raises(exc.DBAPIError, match="no jobs today"):
        queue.enqueue(own_engine, "a", {})
    with (
        pytest.raises(exc.DBAPIError, match="no jobs today"),
        Session(own_engine) as session,
        session.begin(),
    ):
        session.add(Order(customer="ana"))
        sa_outbox.enqueue(session, "a", {}, model=Job)
    assert (_jobs(own_engine), _orders(own_engine)) == (0, 0)
    # The connection is usable afterwards.
    with own_engine.connect() as conn:
        assert conn.scalar(text("SELECT 1")) == 1


def test_a_killed_connection_is_invalidated_and_the_next_job_goes_through(
    own_engine: Engine, engine: Engine
) -> None:
    queue = JobQueue(Job)
    queue.enqueue(own_engine, "a", {})
    with own_engine.connect() as conn:
        pid = conn.scalar(text("SELECT pg_backend_pid()"))
    with engine.begin() as conn:
        assert conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    with pytest.raises(exc.OperationalError) as raised:
        queue.enqueue(own_engine, "b", {})
    assert raised.value.connection_invalidated
    queue.enqueue(own_engine, "c", {})
    with own_engine.connect() as conn:
        assert sorted(conn.scalars(select(Job.kind))) == ["a", "c"]


def test_a_listener_on_the_engine_sees_the_statement(own_engine: Engine) -> None:
    seen: list[str] = []

    @event.listens_for(own_engine, "before_cursor_execute")
    def _seen(*args: Any) -> None:
        seen.append(args[2])

    queue = JobQueue(Job)
    queue.enqueue(own_engine, "a", {})
    with Session(own_engine) as session, session.begin():
        sa_outbox.enqueue(session, "b", {}, model=Job)
    assert sum("INSERT INTO" in s and ".jobs" in s for s in seen) == 2
    assert _jobs(own_engine) == 2


async def test_run_sync_on_an_async_connection_takes_the_usual_path(
    async_engine: AsyncEngine, engine: Engine
) -> None:
    # The sync Connection of run_sync holds an asyncio driver connection: no cursor path.
    async with async_engine.begin() as conn:
        await conn.run_sync(lambda sync: JobQueue(Job).enqueue(sync, "a", {}))
    assert _jobs(engine) == 1
