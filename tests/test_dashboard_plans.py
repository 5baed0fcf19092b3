"""The dashboard's throughput chart, running list and jobs pages stay cheap on a large job
table.

EXPLAIN ANALYZE, custom and generic plan (psycopg prepares a statement on its fifth run, and
a dashboard's overview is reloaded often), on a table of 200,000 finished jobs spread over
two weeks and 2,000 running ones: the chart reads the job table only through the retention
index ``(status, updated_at)``, bounded by its window, so it reads the window's rows and no
more; the running list walks the reclaimer's index in lease order and stops at its limit;
a jobs page, however deep, walks each status's part of the retention index from its cursor
and reads about a page's rows per status (keyset pagination: no OFFSET, no sort of all).
The table is built once for the module in a schema of its own, in a few seconds.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox.schema import JobMixin
from sa_outbox.statements import job_throughput_by_minute, select_jobs, select_running_jobs

from .test_claim_plans import nodes, plan_of

SCHEMA = f"dashboard_plans_{uuid.uuid4().hex[:8]}"
FINISHED = 200_000
RUNNING = 2_000
#: One finished job every 6 seconds over two weeks (200,000 of them): 10 a minute.
SPACING_SECONDS = 6
MINUTES = 30
SHOWN = 50


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA


@pytest.fixture(scope="module")
def big(database_url: str) -> Iterator[Engine]:
    """``FINISHED`` succeeded and failed jobs, one every few seconds back from now, and
    ``RUNNING`` running jobs whose leases end one a second from five minutes ago on."""
    eng = create_engine(database_url)
    with eng.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.jobs (id, kind, payload, status, run_at, created_at,"
                " updated_at)"
                " SELECT gen_random_uuid(), 'k', '{}',"
                " (CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END)::"
                f"{SCHEMA}.job_status, now(), now(), now() - make_interval(secs => i * :spacing)"
                " FROM generate_series(1, :n) AS i"
            ),
            {"n": FINISHED, "spacing": SPACING_SECONDS},
        )
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.jobs (id, kind, payload, status, run_at, created_at,"
                " updated_at, attempts, lease_until, lease_token, worker_id)"
                " SELECT gen_random_uuid(), 'k', '{}', 'running', now(), now(), now(), 1,"
                " now() - interval '5 minutes' + make_interval(secs => i), gen_random_uuid(),"
                " 'w' || (i % 8) FROM generate_series(1, :n) AS i"
            ),
            {"n": RUNNING},
        )
    with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {SCHEMA}.jobs"))
    yield eng
    with eng.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {SCHEMA} CASCADE"))
    eng.dispose()


def job_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes that read the job table or one of its indexes."""
    return [
        n
        for _, n in nodes(plan)
        if n.get("Relation Name") == "jobs" or n["Node Type"] == "Bitmap Index Scan"
    ]


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_the_chart_reads_only_its_window_through_the_retention_index(
    big: Engine, mode: str
) -> None:
    plan = plan_of(big, job_throughput_by_minute(Job, minutes=MINUTES), mode)
    shown = json.dumps(plan, indent=1)
    scans = job_scans(plan)
    assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], shown
    reads = [n for n in scans if "Index Name" in n]
    assert reads and all(n["Index Name"] == "jobs_retention_idx" for n in reads), shown
    assert all("updated_at >=" in n["Index Cond"] for n in reads), shown  # the window bounds it
    in_window = MINUTES * 60 // SPACING_SECONDS  # about 300 of the 200,000
    assert sum(n["Actual Rows"] for n in reads) <= in_window + 60 // SPACING_SECONDS, shown
    assert plan["Actual Rows"] == MINUTES, shown  # a row per minute


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_the_running_list_walks_the_lease_index_and_stops_at_its_limit(
    big: Engine, mode: str
) -> None:
    plan = plan_of(big, select_running_jobs(Job, limit=SHOWN), mode)
    shown = json.dumps(plan, indent=1)
    [scan] = job_scans(plan)
    assert scan["Node Type"] == "Index Scan", shown
    assert scan["Index Name"] == "jobs_expired_lease_idx", shown
    assert scan["Actual Rows"] <= SHOWN + 1, shown  # leases differ: the walk stops at the limit
    assert plan["Node Type"] == "Limit" and plan["Actual Rows"] == SHOWN, shown
    assert not [n for _, n in nodes(plan) if n["Node Type"] == "Sort"], shown  # never all sorted


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("deep", [False, True], ids=["first page", "deep page"])
def test_a_jobs_page_walks_the_retention_index_from_its_cursor(
    big: Engine, mode: str, deep: bool
) -> None:
    before = None
    if deep:  # the cursor of a page 150,000 jobs down
        with big.connect() as conn:
            before = tuple(
                conn.execute(
                    text(
                        f"SELECT updated_at, id FROM {SCHEMA}.jobs"
                        " ORDER BY updated_at DESC, id DESC OFFSET 150000 LIMIT 1"
                    )
                ).one()
            )
    stmt = select_jobs(Job, limit=SHOWN + 1, before=before)  # type: ignore[arg-type]
    plan = plan_of(big, stmt, mode)
    shown = json.dumps(plan, indent=1)
    scans = job_scans(plan)
    assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], shown
    # each status through an index (the retention one; for the pending and running ones the
    # planner may take their partial indexes, which hold only them), none sorted whole
    assert all(n["Node Type"] == "Index Scan" for n in scans), shown
    # a page's worth per status, not the rows above the cursor; on the first page, the 2,000
    # running jobs, which share one updated_at (made in one statement), are read whole to
    # order them by id
    ties = 0 if deep else RUNNING
    assert sum(n["Actual Rows"] for n in scans) <= ties + 5 * (SHOWN + 1), shown
    assert plan["Actual Rows"] == SHOWN + 1, shown
