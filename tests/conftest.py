"""The test bed: a real PostgreSQL, from SA_OUTBOX_TEST_DATABASE_URL or embedded (pgserver).

Every test gets empty tables: the session creates them once in a schema of its own (named
after the process, so concurrent runs do not collide) and each test truncates them. Models
are declared on a base of the tests' own, as a user would.
"""

from __future__ import annotations

import datetime as dt
import gc
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sa_outbox import AsyncWorker, Backoff, FakeClock, JobApp, JobQueue, Worker
from sa_outbox._embedded import embedded_database_url
from sa_outbox.schema import JobMixin, OutboxMixin

# One schema per test process, so concurrent runs on one database never collide.
TEST_SCHEMA = f"sa_outbox_test_{os.getpid()}"


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = TEST_SCHEMA


class OutboxEvent(OutboxMixin, Base):
    __tablename__ = "outbox"
    __table_schema__ = TEST_SCHEMA


class Order(Base):
    """An aggregate of the user's own, for the unit-of-work tests."""

    __tablename__ = "orders"
    __table_args__ = {"schema": TEST_SCHEMA}  # noqa: RUF012 - SQLAlchemy's own convention

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(unique=True)


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_per_module() -> Iterator[None]:
    """Collect garbage as each module ends, so that a connection a module left open fails
    that module (psycopg's ResourceWarning, an error here) instead of whichever later test
    the collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def database_url() -> str:
    """``SA_OUTBOX_TEST_DATABASE_URL`` when set, else an embedded PostgreSQL on loopback TCP
    (the PgBouncer and network-fault tests put a TCP proxy in front of it)."""
    return os.environ.get("SA_OUTBOX_TEST_DATABASE_URL") or embedded_database_url(tcp=True)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_size=20, max_overflow=20)
    with eng.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {TEST_SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {TEST_SCHEMA}"))
    Base.metadata.create_all(eng)
    yield eng
    with eng.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {TEST_SCHEMA} CASCADE"))
    eng.dispose()


@pytest.fixture(autouse=True)
def _clean_tables(request: pytest.FixtureRequest) -> None:
    if "engine" not in request.fixturenames:
        return
    eng: Engine = request.getfixturevalue("engine")
    with eng.begin() as conn:
        conn.execute(
            text(f"TRUNCATE {TEST_SCHEMA}.jobs, {TEST_SCHEMA}.outbox, {TEST_SCHEMA}.orders")
        )


@pytest.fixture
async def async_engine(engine: Engine, database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(database_url)
    yield eng
    await eng.dispose()


@pytest.fixture(scope="session")
def pgbouncer_url(database_url: str) -> Iterator[str]:
    """A URL through a PgBouncer of the session's own, in transaction mode, in front of the
    test server (tests/pgbouncer.py); skips where the ``pgbouncer`` binary is absent."""
    from .pgbouncer import pgbouncer_binary, start_pgbouncer

    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer): no pooler tests")
    with start_pgbouncer(database_url) as url:
        yield url.render_as_string(hide_password=False)


# The worker tests' bed: a fake clock that also drives the worker's timer, a queue on it with
# no jitter, and workers that neither listen nor install signal handlers, closed at the end.
# A module overrides ``worker_options`` to change what every worker it makes gets.
WORKER_T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(WORKER_T0)


@pytest.fixture
def queue(clock: FakeClock) -> JobQueue:
    return JobQueue(Job, clock=clock, backoff=Backoff(base=1, max=300, jitter=0))


@pytest.fixture
def worker_options(clock: FakeClock) -> dict[str, Any]:
    return {
        "clock": clock,
        "timer": lambda: clock.now().timestamp(),
        "listen": False,
        "install_signal_handlers": False,
    }


@pytest.fixture
def make_worker(engine: Engine, worker_options: dict[str, Any]) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(app: JobApp, **options: Any) -> Worker:
        worker = Worker(app, engine, **{**worker_options, **options})
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


@pytest.fixture
async def make_async_worker(
    async_engine: AsyncEngine, worker_options: dict[str, Any]
) -> AsyncIterator[Callable[..., AsyncWorker]]:
    workers: list[AsyncWorker] = []

    def make(app: JobApp, **options: Any) -> AsyncWorker:
        worker = AsyncWorker(app, async_engine, **{**worker_options, **options})
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()
