"""Small helpers the tests share: reading rows back the way an operator would, running
``sa-outbox`` in process, listening to a job table's notifications, waiting for another
process's visible state, and OpenTelemetry's global tracer provider for one test."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from alembic.autogenerate import produce_migrations
from alembic.migration import MigrationContext
from sqlalchemy import Engine, func, select, text

from sa_outbox import JobQueue
from sa_outbox.cli import main
from sa_outbox.statements import listen_sql

from .conftest import Job, OutboxEvent

T = TypeVar("T")


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds.

    Only for what the fake clock cannot reach: the visible state of another process (a
    subprocess's rows, a server that starts listening). The deadline is a bound, never a
    guess of how long something takes.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(0.05)


def job_row(engine: Engine, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Job.__table__).where(Job.__table__.c.id == job_id)).one()


def jobs_by_status(engine: Engine) -> dict[str, int]:
    t = Job.__table__
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all()
    return {str(status): n for status, n in rows}


def event_rows(engine: Engine) -> list[Any]:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        return list(conn.execute(select(t).order_by(t.c.seq)).all())


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``sa-outbox *argv`` in this process: its exit status, what it printed, its errors."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_exit(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> tuple[str, str]:
    """``sa-outbox argv`` where argparse exits (``--help``: 0, a usage error: 2): checks the
    status and returns what it printed and its errors."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == code
    out, err = capsys.readouterr()
    return out, err


def assert_one_line_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """``sa-outbox argv`` fails with status 1 and one line, ``sa-outbox COMMAND: error: …``
    with ``message`` in it, and prints nothing else."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith(f"sa-outbox {argv[0]}: error: ") and message in err, err
    assert err.count("\n") == 1


def notifications_during(
    engine: Engine, model: Any, action: Callable[[], T]
) -> tuple[T, list[str]]:
    """What ``action()`` returned, and the payloads the NOTIFY channel of ``model``'s table
    received while it ran (what it committed)."""
    with engine.connect() as conn:
        channel = JobQueue(model).notify_channel(conn)
    assert channel is not None
    raw = engine.raw_connection()
    listener = raw.driver_connection
    raw.detach()
    assert isinstance(listener, psycopg.Connection)
    try:
        listener.autocommit = True
        listener.execute(listen_sql(channel))
        result = action()
        listener.execute("SELECT 1")  # the notifications of a committed write are in
        return result, [n.payload for n in listener.notifies(timeout=0)]
    finally:
        listener.close()


def unset_tracer_provider() -> None:
    # OpenTelemetry sets its global provider once per process; its own test utilities
    # (opentelemetry.test.globals_test) unset it this way between tests.
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextlib.contextmanager
def global_tracer_provider(provider: Any) -> Iterator[Any]:
    """``provider`` as OpenTelemetry's global tracer provider within the block only, so that
    tests (and the docs' pages, tests/test_docs.py) that set one do not see each other's."""
    from opentelemetry import trace

    unset_tracer_provider()
    trace.set_tracer_provider(provider)
    try:
        yield provider
    finally:
        provider.shutdown()
        unset_tracer_provider()


def autogenerate_in(connection: Any, metadata: Any, schema: str) -> Any:
    """The upgrade operations ``alembic revision --autogenerate`` would write for
    ``metadata`` against the database's ``schema`` alone (other schemas left out)."""

    def include_name(name: str | None, type_: str, _parents: object) -> bool:
        return name == schema if type_ == "schema" else True

    opts = {"include_schemas": True, "include_name": include_name}
    context = MigrationContext.configure(connection, opts=opts)
    return produce_migrations(context, metadata).upgrade_ops


def waits_on_advisory_lock(engine: Engine, pid: int | None) -> bool:
    """Whether the backend ``pid`` is waiting for an advisory lock (``pg_stat_activity``)."""
    with engine.connect() as conn:
        event = conn.execute(
            text("SELECT wait_event FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar()
    return bool(event == "advisory")


def database_clock(engine: Engine) -> float:
    """The server's ``clock_timestamp()`` as epoch seconds: one clock for every thread's
    ledger entries."""
    with engine.connect() as conn:
        return float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar())


def unfinished_jobs(engine: Engine) -> int:
    """How many jobs of the test table have not succeeded."""
    t = Job.__table__
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).where(t.c.status != "succeeded")).scalar_one())
