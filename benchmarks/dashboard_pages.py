"""How long the dashboard's pages take on a million-job table (issue 29's proof).

A schema of its own holds ``--jobs`` jobs (default 1,000,000): finished ones (one in ten
failed) one every second back from now over about two weeks, in three queues and four
kinds with a ``customer`` field in the payload, plus pending, scheduled and running ones,
and ``--events`` outbox events (a few unpublished, a few parked); VACUUM ANALYZE after
loading, as autovacuum would. Each page is then fetched through the dashboard app
(`create_app` with its token, in this process: the time is the server's, SQL and
rendering, not the network's) ``--repeat`` times after one warm-up fetch, and the report
gives the median and the slowest. A page that answers anything but 200 is reported as
such, not timed.

    python -m benchmarks.dashboard_pages --database-url postgresql+psycopg://postgres@127.0.0.1/test

Measured, never asserted: the tests check the plans (tests/test_dashboard_plans.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import JobMixin, OutboxMixin
from sa_outbox.dashboard import create_app
from sa_outbox.schema import JobDependencyMixin, JobStepMixin

SCHEMA = "bench_dashboard"
TOKEN = "bench-dashboard-token-0123456789"


def models(schema: str) -> tuple[Any, Any, Any, Any, Any]:
    """A declarative base and the four tables the dashboard can be given, in ``schema``."""

    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Job(JobMixin, Base):
        __tablename__ = "jobs"

    class Outbox(OutboxMixin, Base):
        __tablename__ = "outbox"

    class Step(JobStepMixin, Base):
        __tablename__ = "job_steps"

    class Dependency(JobDependencyMixin, Base):
        __tablename__ = "job_dependencies"

    return Base, Job, Outbox, Step, Dependency


def load(engine: Any, schema: str, jobs: int, events: int) -> dict[str, str]:
    """Fills the tables; returns ids the pages are fetched with."""
    finished = jobs - 20_000
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {schema}.jobs (id, queue, kind, payload, status, run_at,"
                " created_at, updated_at, attempts, last_error)"
                " SELECT gen_random_uuid(), 'q' || (i % 3), 'kind_' || (i % 4),"
                " jsonb_build_object('customer', i % 1000, 'pad', repeat('x', 64)),"
                f" (CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END)::{schema}.job_status,"
                " now() - make_interval(secs => i), now() - make_interval(secs => i + 1),"
                " now() - make_interval(secs => i), 1,"
                " CASE WHEN i % 10 = 0 THEN 'ValueError: bad input ' || i END"
                " FROM generate_series(1, :n) AS i"
            ),
            {"n": finished},
        )
        conn.execute(
            text(
                f"INSERT INTO {schema}.jobs (id, queue, kind, payload, status, run_at,"
                " created_at, updated_at, attempts, lease_until, lease_token, worker_id)"
                " SELECT gen_random_uuid(), 'q' || (i % 3), 'kind_' || (i % 4),"
                " jsonb_build_object('customer', i % 1000),"
                f" (CASE WHEN i <= 2000 THEN 'running' ELSE 'pending' END)::{schema}.job_status,"
                " now() + CASE WHEN i > 12000 THEN interval '1 hour' ELSE interval '0' END,"
                " now(), now(), CASE WHEN i <= 2000 THEN 1 ELSE 0 END,"
                " CASE WHEN i <= 2000 THEN now() + make_interval(secs => i) END,"
                " CASE WHEN i <= 2000 THEN gen_random_uuid() END,"
                " CASE WHEN i <= 2000 THEN 'worker-' || (i % 8) END"
                " FROM generate_series(1, 20000) AS i"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type,"
                " payload, headers, attempts, published_at, parked_at, last_error, created_at)"
                " SELECT gen_random_uuid(), 'agg_' || (i % 5), (i % 5000)::text, 'changed',"
                " '{}', '{}', CASE WHEN i % 1000 = 0 THEN 5 ELSE 0 END,"
                " CASE WHEN i > 500 THEN now() - make_interval(secs => i) END,"
                " CASE WHEN i % 1000 = 0 THEN now() END,"
                " CASE WHEN i % 1000 = 0 THEN 'broker refused' END,"
                " now() - make_interval(secs => i + 1)"
                " FROM generate_series(1, :n) AS i"
            ),
            {"n": events},
        )
        failed = conn.execute(
            text(f"SELECT id FROM {schema}.jobs WHERE status = 'failed' LIMIT 1")
        ).scalar_one()
        event = conn.execute(text(f"SELECT id FROM {schema}.outbox LIMIT 1")).scalar_one()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {schema}.jobs"))
        conn.execute(text(f"VACUUM ANALYZE {schema}.outbox"))
    return {"failed": str(failed), "event": str(event)}


def pages(ids: dict[str, str]) -> list[tuple[str, str]]:
    """The pages timed: a label and a path (with its query)."""
    week_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(days=7)).date().isoformat()
    return [
        ("overview", "/"),
        ("jobs, newest", "/jobs"),
        ("jobs, failed", "/jobs?status=failed"),
        ("jobs, one kind in one queue", "/jobs?kind=kind_1&queue=q2"),
        ("jobs, a payload field", "/jobs?field=customer&value=42"),
        ("jobs, a week ago", f"/jobs?to={week_ago}"),
        ("jobs, 20 pages deep", "deep:/jobs"),
        ("one failed job", f"/jobs/{ids['failed']}"),
        ("queues", "/queues"),
        ("outbox", "/outbox"),
        ("one event", f"/outbox/{ids['event']}"),
        ("live counts", "/live.json"),
        ("workflows", "/workflows"),
    ]


def _deep(get: Callable[[str], Any], path: str, depth: int = 20) -> str:
    """The address of the jobs page ``depth`` "older" links after ``path``."""
    for _ in range(depth):
        html = get(path).get_data(as_text=True)
        marker = 'rel="next" href="'
        if marker not in html:
            break
        start = html.index(marker) + len(marker)
        path = html[start : html.index('"', start)].replace("&amp;", "&")
    return path


def measure(app: Any, path: str, repeat: int) -> tuple[int, list[float]]:
    """The status of ``path`` and the seconds of ``repeat`` fetches after one warm-up; a
    ``deep:`` path is the page 20 "older" links after it (only that page is timed)."""
    client = app.test_client()
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def get(url: str) -> Any:
        return client.get(url, headers=headers)

    if path.startswith("deep:"):
        path = _deep(get, path.removeprefix("deep:"))
    first = get(path)
    if first.status_code != 200:
        return first.status_code, []
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        get(path)
        times.append(time.perf_counter() - began)
    return 200, times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard_pages")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/dashboard-pages.md")
    parser.add_argument("--keep", action="store_true", help="keep the schema afterwards")
    args = parser.parse_args(argv)

    engine = create_engine(args.database_url)
    schema = f"{SCHEMA}_{uuid.uuid4().hex[:6]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        base, job, outbox, step, dependency = models(schema)
        base.metadata.create_all(engine)
        began = time.perf_counter()
        ids = load(engine, schema, args.jobs, args.events)
        loaded = time.perf_counter() - began
        app = create_app(
            engine, jobs=job, outbox=outbox, steps=step, dependencies=dependency, token=TOKEN
        )
        rows = []
        for label, path in pages(ids):
            status, times = measure(app, path, args.repeat)
            if not times:
                rows.append(f"| {label} | `{path}` | HTTP {status} | | |")
                continue
            ms = sorted(t * 1000 for t in times)
            rows.append(
                f"| {label} | `{path.removeprefix('deep:')}`"
                f"{' (20 pages on)' if path.startswith('deep:') else ''}"
                f" | 200 | {statistics.median(ms):,.1f} | {ms[-1]:,.1f} |"
            )
            print(rows[-1], flush=True)
        with engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
    finally:
        if not args.keep:
            with engine.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()
    report = "\n".join(
        [
            "# Dashboard pages on a million-job table",
            "",
            f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, PostgreSQL {version}, "
            f"{args.jobs:,} jobs and {args.events:,} outbox events (loaded and vacuumed in "
            f"{loaded:.0f} s); each page fetched {args.repeat} times after one warm-up, "
            "through the app in this process (server time: SQL and rendering). "
            "Produced by `python -m benchmarks.dashboard_pages`.",
            "",
            "| page | path | status | median (ms) | slowest (ms) |",
            "|---|---|---|---:|---:|",
            *rows,
            "",
        ]
    )
    pathlib.Path(args.out).write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
