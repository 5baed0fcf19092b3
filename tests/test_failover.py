"""Failover: the primary killed mid-run and its synchronous standby promoted (issue 28).

Two throwaway clusters: a primary and a streaming standby listed in the primary's
``synchronous_standby_names``, so a commit returns only once the standby has it. Worker
processes and the producer are given one multi-host URL with
``target_session_attrs=read-write``: libpq tries the hosts in turn and keeps the one that
accepts writes. Mid-run the primary is killed (``pg_ctl -m immediate``: no checkpoint, no
goodbye) and the standby promoted; nobody restarts a worker or changes its URL. A second
worker started between the two finds no writable server: it waits for one, not exits.

Each unit of work commits a job and an outbox event in one transaction; a relay process
publishes the events to a real Redis stream.

What must hold: every job whose transaction committed runs and ends ``succeeded`` on the new
primary, and every committed event reaches the stream; the workers and the relay carry on
without a restart; nothing is left ``pending``, ``running`` or unpublished. A job or event
taken on the old primary but not finished there may run or be published again (at least
once, as after any crash); none is lost. Needs the server binaries and Redis; skipped
elsewhere.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.exc import OperationalError

from sa_outbox import JobQueue, Outbox

from . import worker_app
from .clusters import Cluster, cluster, standby, wait_streaming
from .conftest import TEST_SCHEMA, Base, OutboxEvent
from .helpers import wait_until
from .test_relay_processes import redis_stream, start_relay  # noqa: F401 (a fixture)
from .test_worker_faults import ledger_lines, start, stop
from .worker_app import Job

JOBS = 300
STANDBY = "failover_standby"
#: libpq gives up on a host that does not answer after this many seconds and tries the next.
CONNECT_TIMEOUT = 2


def _multi_host_url(*nodes: Cluster) -> str:
    hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in nodes)
    return (
        f"postgresql+psycopg://postgres@/postgres?{hosts}"
        f"&target_session_attrs=read-write&connect_timeout={CONNECT_TIMEOUT}"
    )


@pytest.fixture
def pair() -> Iterator[tuple[Cluster, Cluster]]:
    settings = {
        "wal_level": "replica",
        "max_wal_senders": "4",
        "synchronous_standby_names": STANDBY,
    }
    hba = ["host replication all 127.0.0.1/32 trust"]
    with cluster(settings=settings, hba=hba) as primary, standby(primary, name=STANDBY) as replica:
        wait_streaming(primary.url(), STANDBY)
        yield primary, replica


def _commit_unit(engine: Engine, n: int) -> None:
    """Commits job ``n`` and event ``n`` in one transaction, again until one attempt returns.

    An error mid-commit (the server died) leaves the outcome unknown: the job's
    deduplication key tells the retry whether the first attempt committed (then both are
    there and nothing is written again)."""

    def done() -> bool:
        try:
            with engine.begin() as conn:
                job = JobQueue(Job).enqueue(conn, "noop", {"n": n}, deduplication_key=f"job-{n}")
                if job.inserted:
                    Outbox(OutboxEvent).append(
                        conn,
                        event_type="E",
                        aggregate_type="order",
                        aggregate_id=f"a{n % 7}",
                        payload={"n": n},
                    )
        except OperationalError:
            return False
        return True

    wait_until(done, f"unit {n} committed on a writable server")


def _unpublished(engine: Engine) -> int | None:
    t = OutboxEvent.__table__
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).where(t.c.published_at.is_(None))).scalar()
    except OperationalError:
        return None


def _statuses(engine: Engine) -> dict[str, int]:
    try:
        with engine.connect() as conn:
            t = Job.__table__
            rows = conn.execute(select(t.c.status, func.count()).group_by(t.c.status))
            return {str(status): count for status, count in rows}
    except OperationalError:
        return {}


def test_workers_and_a_relay_follow_a_promoted_standby_and_lose_nothing_committed(
    pair: tuple[Cluster, Cluster],
    redis_stream: tuple[Any, str],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    primary, replica = pair
    client, stream = redis_stream
    url = _multi_host_url(primary, replica)
    engine = create_engine(url, pool_pre_ping=True)
    ledger, log = tmp_path / "ledger", tmp_path / "workers.log"
    try:
        worker_app.create_schema(engine)
        with engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {TEST_SCHEMA}"))
        Base.metadata.create_all(engine, tables=[OutboxEvent.__table__])
        # As a user runs them: the command, its defaults, the URL; a short lease.
        args = ["-m", "sa_outbox", "worker", "tests.worker_app:app", "--database-url", url]
        args += ["--lease", "2", "--concurrency", "4"]
        workers = [start(args, log, ledger)]
        relay = start_relay(url, stream, "survivor", RELAY_APP_LEASE="3")
        producer = threading.Thread(target=lambda: [_commit_unit(engine, n) for n in range(JOBS)])
        producer.start()
        try:
            wait_until(lambda: len(ledger_lines(ledger)) >= JOBS // 4, "the first jobs run")
            primary.kill()  # mid-run: the producer, the worker and the relay all busy
            # A worker started now finds only a read-only standby: it waits, not exits.
            workers.append(start(args, log, ledger))
            wait_until(lambda: "cannot take connections yet" in log.read_text(), "B to wait")
            assert workers[1].poll() is None, log.read_text()
            replica.promote()
            producer.join(120.0)
            assert not producer.is_alive(), "the producer never found a writable server"
            wait_until(
                lambda: _statuses(engine) == {"succeeded": JOBS},
                "every job to succeed on the promoted standby",
                timeout=120.0,
            )
            wait_until(lambda: _unpublished(engine) == 0, "every event published", timeout=120.0)
            assert all(worker.poll() is None for worker in workers), log.read_text()
            assert relay.poll() is None
        finally:
            codes = [stop(worker, log) for worker in workers]
            relay.send_signal(signal.SIGTERM)
            _, relay_log = relay.communicate(timeout=60)
        assert codes == [0, 0], log.read_text()
        assert relay.returncode == 0, relay_log
        with engine.connect() as conn:
            in_recovery = conn.execute(text("SELECT pg_is_in_recovery()")).scalar()
            port = conn.execute(text("SELECT current_setting('port')")).scalar()
            payloads = conn.execute(select(Job.__table__.c.payload)).scalars().all()
            events = conn.execute(select(OutboxEvent.__table__.c.id)).scalars().all()
        assert (in_recovery, int(str(port))) == (False, replica.port)
        assert sorted(p["n"] for p in payloads) == list(range(JOBS))
        assert len({job_id for job_id, *_ in ledger_lines(ledger)}) == JOBS
        assert len(events) == JOBS
        assert {fields["id"] for _, fields in client.xrange(stream)} == {str(e) for e in events}
    finally:
        engine.dispose()
