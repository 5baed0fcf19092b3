"""The inputs of docs/capacity.md: what one job and one outbox event cost PostgreSQL.

``python -m benchmarks.capacity [--n 5000] [--out benchmarks/results]`` starts a throwaway
cluster of its own (``initdb`` with default settings, as `benchmarks.default_cluster`), so
that every byte of WAL and every CPU tick of the server it counts is this script's, and
measures each step of a job's and an event's life with the library's defaults:

- ``wal_bytes``: ``pg_current_wal_lsn()`` before and after, divided by the count;
- ``commits``: write transactions (transaction ids handed out, read from the snapshot's
  ``xmax`` without taking one), per job or event;
- ``server_cpu_ms``: user + system CPU of every process of the cluster (``/proc``), per
  job or event; the backends stay connected while measured;
- ``client_cpu_ms``: ``time.process_time()`` of this process (all its threads).

CPU seconds, unlike wall-clock time, change little with what else the machine runs, and
WAL bytes not at all; both are what a capacity model needs. Results: ``capacity.json`` and
``capacity.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import pathlib
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.default_cluster import default_cluster
from benchmarks.sa_models import models_for

SCHEMA = "capacity"
TICK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class Cost:
    """What one unit (a job or an event) of a step cost, averaged over ``count``."""

    step: str
    count: int
    wal_bytes: float
    commits: float
    server_cpu_ms: float
    client_cpu_ms: float


def _cluster_cpu_seconds(postmaster: int) -> float:
    """User + system CPU of the postmaster and all its children, from /proc."""
    total = 0
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        pid, ppid = int(entry.name), int(fields[1])
        if pid == postmaster or ppid == postmaster:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


class Meter:
    """Reads the cluster's WAL position, commit count and CPU time on a connection of its own."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import text

        self._conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self._text = text
        pid = self._conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        self.postmaster = int(stat[1])

    def read(self) -> tuple[int, int, float, float]:
        row = self._conn.execute(
            self._text(
                "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,"
                " pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            )
        ).one()
        return int(row[0]), int(row[1]), _cluster_cpu_seconds(self.postmaster), time.process_time()

    @contextmanager
    def measure(self, step: str, count: int, into: list[Cost]) -> Iterator[None]:
        wal0, commits0, server0, client0 = self.read()
        yield
        wal1, commits1, server1, client1 = self.read()
        into.append(
            Cost(
                step,
                count,
                wal_bytes=(wal1 - wal0) / count,
                commits=(commits1 - commits0) / count,
                server_cpu_ms=1000 * (server1 - server0) / count,
                client_cpu_ms=1000 * (client1 - client0) / count,
            )
        )

    def close(self) -> None:
        self._conn.close()


def _steps(url: str, n: int) -> list[Cost]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import sessionmaker

    import sa_outbox
    from sa_outbox import JobApp, JobQueue, NewJob, Pruner, Relay, Retention, Worker
    from sa_outbox.publishers.callable import CallablePublisher

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    m = models_for(SCHEMA)
    m.base.metadata.create_all(engine)
    sessions = sessionmaker(engine)
    sa_outbox.install(sessions)
    queue = JobQueue(m.job)
    meter = Meter(engine)
    costs: list[Cost] = []
    try:
        warm(engine, queue, sessions, m)

        with meter.measure("enqueue: JobQueue.enqueue(engine, ...), autocommit", n, costs):
            for _ in range(n):
                queue.enqueue(engine, "noop", {})

        with meter.measure("unit of work: one ORM row (the baseline)", n, costs):
            for _ in range(n):
                with sessions.begin() as session:
                    session.add(m.order(total_cents=1))
        with meter.measure("unit of work: one ORM row + sa_outbox.enqueue", n, costs):
            for _ in range(n):
                with sessions.begin() as session:
                    session.add(m.order(total_cents=1))
                    sa_outbox.enqueue(session, "noop", {})

        with meter.measure("enqueue: enqueue_many, 100 per transaction", n, costs):
            for _ in range(0, n, 100):
                with engine.begin() as conn:
                    queue.enqueue_many(conn, [NewJob("noop", {}) for _ in range(100)])

        total = queue_count(engine, m)
        app = JobApp(m.job)
        app.register("noop", lambda job: None)
        worker = Worker(app, engine, listen=False, install_signal_handlers=False)
        try:
            with meter.measure(
                "process: claim, run a no-op, complete (Worker defaults)", total, costs
            ):
                done = worker.drain(timeout=600)
        finally:
            worker.close()
        if done != total:
            raise RuntimeError(f"the worker ran {done} of {total} jobs")

        with meter.measure("outbox: unit of work with one ORM row + one event", n, costs):
            for _ in range(n):
                with sessions.begin() as session:
                    order = m.order(total_cents=1)
                    session.add(order)
                    session.add(m.order_placed(order=order, total_cents=1))
        relay = Relay(engine, m.outbox, CallablePublisher(lambda event: None), listen=False)
        try:
            with meter.measure("outbox: relay claims, publishes (no-op), marks", n, costs):
                published = 0
                while published < n:
                    report = relay.run_once()
                    if report.idle:
                        raise RuntimeError(f"the relay is idle after {published} of {n}")
                    published += report.published
        finally:
            relay.close()

        pruner = Pruner(
            engine, jobs=m.job, outbox=m.outbox, retention=Retention(succeeded=0, published=0)
        )
        with meter.measure("retention: Pruner deletes the succeeded jobs", total, costs):
            pruned = pruner.run_once()
        vacuum = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        with vacuum, meter.measure("retention: VACUUM of the job table", total, costs):
            vacuum.exec_driver_sql(f"VACUUM {SCHEMA}.jobs")
        if pruned.succeeded != total or pruned.published != n:
            raise RuntimeError(f"the pruner deleted {pruned}, not {total} jobs and {n} events")
    finally:
        meter.close()
        engine.dispose()
    return costs


def warm(engine: Any, queue: Any, sessions: Callable[[], Any], m: Any) -> None:
    """One of each, so that caches and prepared statements are not counted."""
    import sa_outbox

    for _ in range(20):
        queue.enqueue(engine, "warm", {})
        with sessions() as session, session.begin():
            order = m.order(total_cents=1)
            session.add(order)
            sa_outbox.enqueue(session, "warm", {})
            session.add(m.order_placed(order=order, total_cents=1))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM {SCHEMA}.jobs; DELETE FROM {SCHEMA}.outbox")


def queue_count(engine: Any, m: Any) -> int:
    from sqlalchemy import func, select

    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(m.job)).scalar_one())


def _machine(url: str) -> dict[str, Any]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
            settings = {
                name: conn.execute(text(f"SHOW {name}")).scalar_one()
                for name in ("synchronous_commit", "wal_level", "full_page_writes", "autovacuum")
            }
    finally:
        engine.dispose()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "postgresql": version,
        **settings,
    }


def render(machine: dict[str, Any], costs: list[Cost]) -> str:
    lines = [
        "## What one job and one outbox event cost PostgreSQL",
        "",
        f"{machine['date']}, {machine['cpus']} CPUs ({machine['machine']}), a throwaway "
        f"PostgreSQL {machine['postgresql']} cluster with default settings "
        f"(synchronous_commit = {machine['synchronous_commit']}, wal_level = "
        f"{machine['wal_level']}, full_page_writes = {machine['full_page_writes']}), "
        f"Python {machine['python']}. Per job or per event; `python -m benchmarks.capacity`.",
        "",
        "| step | count | WAL bytes | commits | server CPU (ms) | client CPU (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for c in costs:
        lines.append(
            f"| {c.step} | {c.count:,} | {c.wal_bytes:,.0f} | {c.commits:.2f} | "
            f"{c.server_cpu_ms:.3f} | {c.client_cpu_ms:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__)
    parser.add_argument("--n", type=int, default=5000, help="jobs or events per step")
    parser.add_argument("--out", default="benchmarks/results", help="results folder")
    args = parser.parse_args(argv)
    if args.n < 100 or args.n % 100:
        parser.error("--n must be a multiple of 100, at least 100")
    with default_cluster() as url:
        costs = _steps(url, args.n)
        machine = _machine(url)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.json").write_text(
        json.dumps({"machine": machine, "costs": [dataclasses.asdict(c) for c in costs]}, indent=2)
        + "\n"
    )
    table = render(machine, costs)
    (out / "capacity.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
