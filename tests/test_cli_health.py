"""``sa-outbox health`` prints what an operator reads: durations as ``4m16s``, sizes as
``144 kB``, times to the second in UTC; the numbers themselves come from `table_health`."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import Engine

from sa_outbox import JobQueue
from sa_outbox.cli import main
from sa_outbox.cli._maintenance import _format_health
from sa_outbox.maintenance._health import HealthReport, TableHealth, XminHolder

from .conftest import Job

AT = dt.datetime(2026, 12, 4, 15, 26, 25, 123456, tzinfo=dt.UTC)


def test_the_report_in_human_units() -> None:
    jobs = TableHealth(
        table="public.jobs",
        rows={"pending": 10, "running": 0, "succeeded": 4990, "failed": 0, "cancelled": 0},
        live_tuples=5000,
        dead_tuples=4990,
        last_vacuum=AT,
        last_autovacuum=None,
        last_analyze=None,
        last_autoanalyze=AT.astimezone(dt.timezone(dt.timedelta(hours=2))),
        total_bytes=3_284_992,
        table_bytes=1_753_088,
        index_bytes=147_456,
        oldest_pending_age=dt.timedelta(minutes=4, seconds=16, microseconds=527_376),
    )
    holder = XminHolder(
        22990,
        "idle in transaction",
        1,
        AT - dt.timedelta(minutes=2),
        AT - dt.timedelta(minutes=2),
        dt.timedelta(hours=2, minutes=11, seconds=58),
    )
    report = HealthReport(jobs=jobs, outbox=None, xmin_holders=[holder])
    assert _format_health(report).splitlines() == [
        "public.jobs: pending 10, running 0, succeeded 4990, failed 0, cancelled 0",
        "  live tuples 5000, dead tuples 4990",
        "  last vacuum 2026-12-04 15:26:25 UTC, autovacuum never",
        "  last analyze never, autoanalyze 2026-12-04 15:26:25 UTC",
        "  size 3.1 MB (table 1.7 MB, indexes 144 kB)",
        "  oldest ready pending job: 4m16s",
        "xmin horizon held by pid 22990 (idle in transaction): 1 transactions old, "
        "transaction open for 2h11m, query started 2026-12-04 15:24:25 UTC",
    ]


def test_no_pending_job_and_no_holder() -> None:
    jobs = TableHealth("jobs", {"pending": 0}, 0, 0, None, None, None, None, 8192, 0, 8192)
    text = _format_health(HealthReport(jobs=jobs, outbox=None, xmin_holders=[]))
    assert "  size 8 kB (table 0 B, indexes 8 kB)" in text
    assert "  oldest ready pending job: none" in text
    assert text.endswith("xmin horizon: no other session holds a snapshot")


def test_the_command_prints_human_units(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with engine.begin() as conn:
        JobQueue(Job).enqueue(conn, "ping", {})
    assert main(["health", "--model", "tests.conftest:Job", "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    size = r"\d+(\.\d)? (B|kB|MB)"
    assert re.search(rf"^  size {size} \(table {size}, indexes {size}\)$", out, re.M), out
    assert re.search(r"^  oldest ready pending job: \d+(\.\d+)?s$", out, re.M), out
    assert "bytes" not in out and "+00:00" not in out
    with engine.connect() as conn:
        assert JobQueue(Job).counts(conn)["pending"] == 1  # only read
