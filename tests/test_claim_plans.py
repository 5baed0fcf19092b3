"""The claim never sorts the backlog: EXPLAIN ANALYZE on a table of 1,000,000 pending jobs.

For each shape a user gets — nothing named, one queue, several queues, one kind, several
kinds (the worker's default: the kinds it handles), queues and kinds together — and for
the worker's combined statement, the plan must read the jobs through a ready index in the
claim's order and stop after ``batch`` rows per name: every scan of the table is an index
scan of a ready index under a ``Limit``, reading at most ``batch`` rows per loop, with no
sequential or bitmap scan, and no ``Sort`` over anything but those bounded branches. Both
the custom plan and the generic one (psycopg prepares a statement on its fifth run) are
checked, by running the statement as a ``PREPARE``d one under each ``plan_cache_mode``.

The table is built once for the module in a schema of its own, in about half a minute.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.sql import ClauseElement

from sa_outbox.schema import JobDependencyMixin, JobMixin
from sa_outbox.statements import (
    claim_jobs,
    complete_and_claim_jobs,
    release_dependants,
    select_dependants,
    waiting_page,
)

SCHEMA = f"claim_plans_{uuid.uuid4().hex[:8]}"
PENDING = 1_000_000
BATCH = 50
QUEUES = [f"q{i}" for i in range(4)]
KINDS = [f"k{i}" for i in range(10)]
READY = {"jobs_ready_idx", "jobs_ready_kind_idx", "jobs_ready_order_idx"}


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA


@pytest.fixture(scope="module")
def big(database_url: str) -> Iterator[Engine]:
    """A job table with ``PENDING`` pending jobs over 4 queues, 10 kinds, 3 priorities."""
    eng = create_engine(database_url)
    with eng.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(eng)
    indexes = [
        row
        for row in eng.connect().execute(
            text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s"),
            {"s": SCHEMA},
        )
    ]
    with eng.begin() as conn:
        # The indexes are built after the rows, which is quicker than maintaining them.
        for name, _ in indexes:
            if name != "jobs_pkey":
                conn.execute(text(f"DROP INDEX {SCHEMA}.{name}"))
        conn.execute(text("SELECT setseed(0.42)"))
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.jobs (id, queue, kind, payload, status, priority, run_at,"
                " attempts, max_attempts, created_at, updated_at)"
                " SELECT gen_random_uuid(), 'q' || floor(random() * 4)::int,"
                " 'k' || floor(random() * 10)::int, '{}', 'pending', floor(random() * 3)::int,"
                " now() - make_interval(secs => i / 1000.0), 0, 25, now(), now()"
                " FROM generate_series(1, :n) AS i"
            ),
            {"n": PENDING},
        )
        for name, definition in indexes:
            if name != "jobs_pkey":
                conn.execute(text(definition))
    with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {SCHEMA}.jobs"))
    yield eng
    with eng.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {SCHEMA} CASCADE"))
    eng.dispose()


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list):
        of = "uuid" if value and isinstance(value[0], uuid.UUID) else "text"
        return "ARRAY[" + ", ".join(_literal(item) for item in value) + f"]::{of}[]"
    if isinstance(value, dt.timedelta):
        return f"'{value.total_seconds()} seconds'::interval"
    if isinstance(value, dt.datetime):
        return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, uuid.UUID | str | int):
        return f"'{value}'"
    raise AssertionError(f"no literal for {value!r}")


def plan_of(eng: Engine, statement: ClauseElement, mode: str) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``statement`` run as a prepared statement, rolled back."""
    compiled = statement.compile(dialect=eng.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.construct_params()
    sql = compiled.string
    for i, name in enumerate(params, 1):
        sql = sql.replace(f"%({name})s", f"${i}")
    arguments = ", ".join(_literal(value) for value in params.values())
    raw = eng.raw_connection()
    try:
        cur = raw.driver_connection.cursor()
        cur.execute("DEALLOCATE ALL", prepare=False)  # one a failed run left behind
        cur.execute("BEGIN")
        cur.execute(f"SET LOCAL plan_cache_mode = {mode}")
        cur.execute(f"PREPARE claim_plan AS {sql}", prepare=False)
        execute = f"EXECUTE claim_plan({arguments})" if arguments else "EXECUTE claim_plan"
        explained = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}", prepare=False)
        plan = explained.fetchone()[0]
        cur.execute("ROLLBACK")
        cur.execute("DEALLOCATE claim_plan", prepare=False)
    finally:
        raw.driver_connection.rollback()
        raw.close()
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def nodes(
    plan: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every node with the node types above it, outermost first."""
    yield path, plan
    for child in plan.get("Plans", []):
        yield from nodes(child, (*path, plan["Node Type"]))


def walked(
    plan: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """`nodes`, less the subplans (a filter's own query, run per row it is asked for)."""
    yield path, plan
    for child in plan.get("Plans", []):
        if child.get("Parent Relationship") != "SubPlan":
            yield from walked(child, (*path, plan["Node Type"]))


def assert_serial_check_idle(plan: dict[str, Any]) -> None:
    """The serial keys' check is a subplan on ``jobs_serial_idx``, run only for a job that
    has a ``lock_key``: with none in the table, never."""
    shown = json.dumps(plan, indent=1)
    for _, node in nodes(plan):
        if node.get("Parent Relationship") != "SubPlan":
            continue
        for _, inner in nodes(node):
            if inner.get("Relation Name") == "jobs":
                assert inner.get("Index Name") == "jobs_serial_idx", shown
                assert inner["Actual Loops"] == 0, shown


def assert_walks_a_ready_index(plan: dict[str, Any], names: int) -> None:
    shown = json.dumps(plan, indent=1)
    assert_serial_check_idle(plan)
    scans = [
        (path, n)
        for path, n in walked(plan)
        if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"
    ]
    picks = [(path, n) for path, n in scans if n.get("Index Name") != "jobs_pkey"]
    assert picks, shown
    assert len(picks) == 1, shown  # one pick; the update finds its rows by primary key
    path, scan = picks[0]
    assert scan["Node Type"] == "Index Scan" and scan["Index Name"] in READY, shown
    below_limit = path[len(path) - path[::-1].index("Limit") - 1 :] if "Limit" in path else ()
    assert below_limit, shown  # the walk stops at the limit
    assert "Sort" not in below_limit, shown  # nothing sorts what the index returns
    assert scan["Actual Rows"] <= BATCH, shown  # per loop: at most a batch per name
    assert scan["Actual Loops"] == names, shown
    assert scan.get("Rows Removed by Filter", 0) <= BATCH * 20, shown
    for _, node in nodes(plan):  # a sort only ever merges the bounded branches
        if node["Node Type"] == "Sort":
            assert node["Plans"][0]["Actual Rows"] <= BATCH * names, shown
    assert all(n["Node Type"] == "Index Scan" for _, n in scans), shown


SHAPES: dict[str, dict[str, Any]] = {
    "nothing named": {},
    "one queue": {"queues": "q1"},
    "several queues": {"queues": QUEUES[:3]},
    "one kind": {"kinds": "k3"},
    "several kinds": {"kinds": KINDS[:6]},
    "one queue and kinds": {"queues": "q2", "kinds": KINDS[:6]},
    "queues and kinds": {"queues": QUEUES[:2], "kinds": KINDS[:6]},
}


def _branches(shape: dict[str, Any]) -> int:
    named = shape.get("queues", shape.get("kinds"))
    return 1 if named is None or isinstance(named, str) else len(named)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_claim_walks_a_ready_index_behind_a_million_pending_jobs(
    big: Engine, shape: str, mode: str
) -> None:
    statement = claim_jobs(Job, worker_id="w", batch=BATCH, **SHAPES[shape])
    assert_walks_a_ready_index(plan_of(big, statement, mode), _branches(SHAPES[shape]))


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("shape", ["nothing named", "several kinds", "one queue and kinds"])
def test_the_workers_complete_and_claim_walks_it_too(big: Engine, shape: str, mode: str) -> None:
    pairs = [(uuid.uuid4(), uuid.uuid4())]  # completions of jobs long gone: nothing matches
    statement = complete_and_claim_jobs(Job, pairs, worker_id="w", batch=BATCH, **SHAPES[shape])
    plan = plan_of(big, statement, mode)
    claim = next(
        node
        for _, node in nodes(plan)
        if node.get("Subplan Name") == "CTE claimed" or node.get("CTE Name") == "claimed"
    )
    assert_walks_a_ready_index(claim, _branches(SHAPES[shape]))


def test_kinds_behind_a_backlog_of_other_kinds_are_found_without_walking_it(big: Engine) -> None:
    """The shape a single ``IN`` walk of the order index gets wrong: the handled kinds sit
    behind a million jobs of kinds this worker does not handle (lower priority, newer)."""
    with big.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.jobs (id, queue, kind, payload, status, priority, run_at,"
                " attempts, max_attempts, created_at, updated_at)"
                " SELECT gen_random_uuid(), 'q0', 'late' || (i % 2), '{}', 'pending', -1,"
                " now() - make_interval(secs => i / 1000.0), 0, 25, now(), now()"
                " FROM generate_series(1, 500) AS i"
            )
        )
        conn.execute(text(f"ANALYZE {SCHEMA}.jobs"))
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            statement = claim_jobs(Job, worker_id="w", batch=BATCH, kinds=["late0", "late1"])
            assert_walks_a_ready_index(plan_of(big, statement, mode), 2)
    finally:
        with big.begin() as conn:
            conn.execute(text(f"DELETE FROM {SCHEMA}.jobs WHERE kind LIKE 'late%'"))


WAITING = 100_000
#: What a waiting row holds until its release (`insert_dependant`).
WAITING_JOB = {
    "queue": "q0",
    "kind": "k0",
    "payload": {},
    "priority": 0,
    "max_attempts": 25,
    "headers": None,
    "lock_key": None,
    "not_before": "2026-01-01T00:00:00+00:00",
}


class DependencyBase(DeclarativeBase):  # created by `waiting`, after `big` built its indexes
    pass


class JobDependency(JobDependencyMixin, DependencyBase):
    __tablename__ = "job_dependencies"
    __table_schema__ = SCHEMA


@pytest.fixture(scope="module")
def waiting(big: Engine) -> Engine:
    """``WAITING`` jobs waiting for others beside the million pending ones."""
    DependencyBase.metadata.create_all(big)
    with big.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.job_dependencies"
                " (job_id, workflow_id, parents, on_failure, job)"
                " SELECT gen_random_uuid(), gen_random_uuid(),"
                " ARRAY[gen_random_uuid(), gen_random_uuid()], 'cancel', CAST(:job AS jsonb)"
                " FROM generate_series(1, :n)"
            ),
            {"n": WAITING, "job": json.dumps(WAITING_JOB)},
        )
    with big.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM ANALYZE {SCHEMA}.job_dependencies"))
    return big


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("shape", ["nothing named", "several kinds", "one queue and kinds"])
def test_jobs_waiting_for_others_change_nothing_in_the_claim(
    waiting: Engine, shape: str, mode: str
) -> None:
    """They are not in the job table: the claim never reads them, at any count."""
    statement = complete_and_claim_jobs(
        Job, [(uuid.uuid4(), uuid.uuid4())], worker_id="w", batch=BATCH, **SHAPES[shape]
    )
    assert "job_dependencies" not in str(statement)
    plan = plan_of(waiting, statement, mode)
    claim = next(
        node
        for _, node in nodes(plan)
        if node.get("Subplan Name") == "CTE claimed" or node.get("CTE Name") == "claimed"
    )
    assert_walks_a_ready_index(claim, _branches(SHAPES[shape]))


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_a_release_finds_the_dependants_of_finished_jobs_by_index(
    waiting: Engine, mode: str
) -> None:
    """After a write, the release looks up the waiting rows whose parents include the
    finished jobs through the GIN index, then takes them by id; a sweep's page walks the
    waiting rows' index."""
    with waiting.connect() as conn:
        parents = (
            conn.execute(text(f"SELECT parents[1] FROM {SCHEMA}.job_dependencies LIMIT 3"))
            .scalars()
            .all()
        )
        found = conn.execute(select_dependants(JobDependency, parents)).scalars().all()
    lookup = plan_of(waiting, select_dependants(JobDependency, parents), mode)
    shown = json.dumps(lookup, indent=1)
    picks = [n for _, n in nodes(lookup) if n.get("Index Name") == "job_dependencies_parents_idx"]
    assert picks and picks[0]["Node Type"] == "Bitmap Index Scan", shown
    assert picks[0]["Actual Rows"] <= 10, shown
    plan = plan_of(waiting, release_dependants(Job, JobDependency, job_ids=found), mode)
    shown = json.dumps(plan, indent=1)
    scans = [n for _, n in nodes(plan) if n.get("Relation Name") in ("job_dependencies", "jobs")]
    assert scans and all("Seq Scan" not in n["Node Type"] for n in scans), shown
    page = plan_of(waiting, waiting_page(JobDependency, after=None, limit=1000), mode)
    shown = json.dumps(page, indent=1)
    assert page["Node Type"] == "Limit", shown
    [walk] = [n for _, n in nodes(page) if n.get("Relation Name") == "job_dependencies"]
    assert walk["Index Name"] == "job_dependencies_waiting_idx", shown
    assert walk["Actual Rows"] == 1000, shown
