"""The sa-outbox models of one benchmark schema: a job table, an outbox, orders, one event."""

# No `from __future__ import annotations` here: the models are declared inside a function,
# and SQLAlchemy and sa-outbox's event classes resolve their annotations, which must then be
# real objects rather than strings naming locals.
import dataclasses
import functools
from typing import Any

from benchmarks.core import BATCH, BenchmarkError, Context
from benchmarks.database import Database

__all__ = ["Models", "install_sa_schema", "models_for"]


@dataclasses.dataclass(frozen=True)
class Models:
    """Mapped classes on a declarative base of their own, all in one schema."""

    base: Any
    job: Any
    outbox: Any
    order: Any
    order_placed: Any


@functools.cache
def models_for(schema: str) -> Models:
    """The models of ``schema`` (built once per process: event types register per model)."""
    from sqlalchemy import MetaData
    from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

    from sa_outbox import JobMixin, OutboxMixin

    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(primary_key=True)
        total_cents: Mapped[int]

    class Job(JobMixin, Base):
        __tablename__ = "jobs"

    class OutboxEvent(OutboxMixin, Base):
        __tablename__ = "outbox"

    class OrderPlaced(OutboxEvent):
        order: Order
        total_cents: int

    return Models(Base, Job, OutboxEvent, Order, OrderPlaced)


def install_sa_schema(db: Database, schema: str) -> None:
    """``Base.metadata.create_all``: the tables, indexes, enum and NOTIFY triggers."""
    from sqlalchemy import create_engine

    engine = create_engine(db.sqlalchemy_url())
    try:
        models_for(schema).base.metadata.create_all(engine)
    finally:
        engine.dispose()


def make_engine(ctx: Context, pool_size: int = 20) -> Any:
    """A sync engine on the bench database, with room for W2's producers."""
    from sqlalchemy import create_engine

    return create_engine(ctx.db.sqlalchemy_url(), pool_size=pool_size, max_overflow=0)


def make_async_engine(ctx: Context, pool_size: int = 20) -> Any:
    """An asyncio engine (psycopg) on the bench database."""
    from sqlalchemy.ext.asyncio import create_async_engine

    return create_async_engine(ctx.db.sqlalchemy_url(), pool_size=pool_size, max_overflow=0)


def pre_enqueue(ctx: Context, count: int | None = None) -> None:
    """Enqueue no-op jobs with `JobQueue.enqueue_many`, batches of `BATCH` (not timed)."""
    from sa_outbox import JobQueue, NewJob

    total = ctx.n if count is None else count
    engine = make_engine(ctx, pool_size=1)
    queue = JobQueue(models_for(ctx.schema).job)
    try:
        for start in range(0, total, BATCH):
            size = min(BATCH, total - start)
            with engine.begin() as conn:
                queue.enqueue_many(conn, [NewJob("noop", {}) for _ in range(size)])
    finally:
        engine.dispose()
    if ctx.backlog:  # as autovacuum would after a bulk load (this CI server has it off)
        ctx.db.execute(ctx.schema, "VACUUM ANALYZE jobs")


def check_backlog(ctx: Context) -> None:
    """After a processing run: at least ``n`` jobs succeeded, all the others still pending."""
    succeeded, pending = count_jobs(ctx, "succeeded"), count_jobs(ctx, "pending")
    if succeeded < ctx.n or succeeded + pending != ctx.n + ctx.backlog:
        raise BenchmarkError(
            f"{ctx.system}: {succeeded} jobs succeeded and {pending} pending, expected "
            f"{ctx.n} or more succeeded of {ctx.n + ctx.backlog}, the rest pending"
        )


def count_jobs(ctx: Context, status: str) -> int:
    """How many jobs of this schema's table are in ``status``."""
    return int(ctx.db.scalar(ctx.schema, f"SELECT count(*) FROM jobs WHERE status = '{status}'"))


def check_jobs(ctx: Context, status: str, expected: int) -> None:
    """Raise unless exactly ``expected`` jobs are in ``status`` (read from the database)."""
    found = count_jobs(ctx, status)
    if found != expected:
        raise BenchmarkError(f"{ctx.system}: {found} {status} jobs, expected {expected}")


def versions() -> dict[str, str]:
    """sa-outbox's version and its stack's."""
    import psycopg
    import sqlalchemy

    import sa_outbox

    return {
        "sa-outbox": sa_outbox.__version__,
        "SQLAlchemy": sqlalchemy.__version__,
        "psycopg": psycopg.__version__,
    }
