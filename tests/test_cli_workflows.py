"""``sa-outbox workflows list / show / cancel`` on a real database: a workflow (a job and
the jobs enqueued after it) seen whole, and cancelled whole; its counts in ``sa-outbox
status`` and in the Prometheus gauges."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from sa_outbox import JobQueue, Worker
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL, main
from sa_outbox.metrics import QueueStatusCollector
from sa_outbox.queue import get_workflow, list_workflows, queue_status

from .conftest import TEST_SCHEMA, Job
from .helpers import job_row
from .test_dependencies import JobDependency, dag_app, dag_queue, deps_table, waiting
from .test_steps import steps_table

__all__ = ["dag_queue", "deps_table", "steps_table"]  # fixtures, used below by name

TABLES = [
    "--jobs-table",
    f"{TEST_SCHEMA}.jobs",
    "--dependencies-table",
    f"{TEST_SCHEMA}.job_dependencies",
]


@pytest.fixture(autouse=True)
def only_app_url(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)


def diamond(engine: Engine, queue: JobQueue) -> dict[str, Any]:
    with engine.begin() as conn:
        a = queue.enqueue(conn, "node", {"name": "a"}).id
        b = queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        c = queue.enqueue(conn, "node", {"name": "c"}, after=[a]).id
        d = queue.enqueue(conn, "node", {"name": "d"}, after=[b, c]).id
    return {"a": a, "b": b, "c": c, "d": d}


def test_show_prints_each_job_under_what_it_waits_for(
    engine: Engine,
    dag_queue: JobQueue,
    make_worker: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = diamond(engine, dag_queue)
    make_worker(dag_app([]), batch=1).run_once()  # a succeeds; b and c are released
    assert main(["workflows", "show", str(ids["d"]), *TABLES]) == 0  # any job of it will do
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"workflow {ids['a']}: 4 jobs"
    body = {line.split()[0]: line for line in out[2:]}
    short = {name: str(job_id)[-8:] for name, job_id in ids.items()}
    assert "node" in body[short["a"]] and "succeeded" in body[short["a"]]
    assert "  node" in body[short["b"]] and "pending" in body[short["b"]]
    assert "    node" in body[short["d"]] and "waiting" in body[short["d"]]
    assert f"{short['b']}, {short['c']}" in body[short["d"]]

    assert main(["workflows", "show", str(ids["b"]), *TABLES, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == str(ids["a"])
    assert [job["status"] for job in shown["jobs"]] == [
        "succeeded",
        "pending",
        "pending",
        "waiting",
    ]


def test_list_counts_each_workflows_jobs_by_state(
    engine: Engine,
    dag_queue: JobQueue,
    make_worker: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = diamond(engine, dag_queue), diamond(engine, dag_queue)
    make_worker(dag_app([])).drain()
    with engine.begin() as conn:
        diamond(engine, dag_queue)  # a third, not started
    with engine.connect() as conn:
        flows = {flow.id: flow for flow in list_workflows(conn, Job, JobDependency)}
        assert get_workflow(conn, Job, JobDependency, first["c"])[0] == first["a"]
    assert flows[first["a"]].states == {"succeeded": 4} and flows[first["a"]].done
    assert flows[second["a"]].jobs == 4 and len(flows) == 3
    third = next(flow for flow in flows.values() if not flow.done)
    assert third.states == {"waiting": 3, "pending": 1}
    assert main(["workflows", "list", *TABLES]) == 0
    out = capsys.readouterr().out
    assert "3 waiting, 1 pending" in out and out.count("4 succeeded") == 2


def test_cancel_ends_every_job_of_the_workflow_that_has_not_finished(
    engine: Engine,
    dag_queue: JobQueue,
    make_worker: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = diamond(engine, dag_queue)
    make_worker(dag_app([]), batch=1).run_once()  # a succeeds
    assert main(["workflows", "cancel", str(ids["c"]), *TABLES]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"workflow {ids['a']}:\ncancelled 3 waiting job(s):")
    assert [job_row(engine, ids[n]).status for n in "abcd"] == [
        "succeeded",
        "cancelled",
        "cancelled",
        "cancelled",
    ]
    assert waiting(engine) == 0
    assert main(["workflows", "cancel", str(ids["a"]), *TABLES]) == 0
    assert "every job has finished; nothing to cancel" in capsys.readouterr().out


def test_an_unknown_job_or_table_is_refused_in_one_line(
    engine: Engine, dag_queue: JobQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    nobody = "00000000-0000-0000-0000-000000000001"
    assert main(["workflows", "show", nobody, *TABLES]) != 0
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"no job {nobody} in {TEST_SCHEMA}.jobs or {TEST_SCHEMA}.job_dependencies")
    )
    wrong = [*TABLES[:3], f"{TEST_SCHEMA}.jobs"]
    assert main(["workflows", "list", *wrong]) != 0
    assert "is not a dependencies table" in capsys.readouterr().err


def four_outcomes(
    engine: Engine, queue: JobQueue, make_worker: Callable[..., Worker]
) -> dict[str, Any]:
    """One workflow in each state: succeeded, failed (its root failed, its dependant was
    cancelled), cancelled (by hand), and running (not started: 3 jobs waiting)."""
    succeeded = diamond(engine, queue)
    with engine.begin() as conn:
        broken = queue.enqueue(conn, "node", {"name": "x"}).id
        queue.enqueue(conn, "node", {"name": "y"}, after=[broken])
        dropped = queue.enqueue(conn, "node", {"name": "p"}).id
        queue.enqueue(conn, "node", {"name": "q"}, after=[dropped])
        queue.cancel(conn, [dropped])
    make_worker(dag_app([], failing={"x"})).drain()
    running = diamond(engine, queue)
    return {
        "succeeded": succeeded["a"],
        "failed": broken,
        "cancelled": dropped,
        "running": running["a"],
    }


def test_status_counts_the_waiting_jobs_and_the_workflows_by_state(
    engine: Engine,
    dag_queue: JobQueue,
    make_worker: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
) -> None:
    roots = four_outcomes(engine, dag_queue, make_worker)
    with engine.connect() as conn:
        flows = {flow.id: flow.state for flow in list_workflows(conn, Job, JobDependency)}
        found = queue_status(conn, jobs=Job, dependencies=JobDependency).workflows
        cheap = queue_status(
            conn, jobs=Job, dependencies=JobDependency, workflow_states=False
        ).workflows
    assert flows == {root: state for state, root in roots.items()}
    assert found is not None and cheap is not None
    assert (found.waiting, found.waiting_workflows) == (3, 1)
    assert found.by_state == {"running": 1, "succeeded": 1, "failed": 1, "cancelled": 1}
    assert (cheap.waiting, cheap.by_state) == (3, {})

    assert main(["status", *TABLES]) == 0
    out = capsys.readouterr().out
    assert f"workflows ({TEST_SCHEMA}.job_dependencies)" in out
    assert "waiting jobs       3 in 1 workflow(s)" in out
    assert "workflows          1 running, 1 succeeded, 1 failed, 1 cancelled" in out
    assert main(["status", *TABLES, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["workflows"]
    assert shown["waiting"] == 3 and shown["by_state"]["failed"] == 1
    assert main(["status", *TABLES[2:]]) != 0  # the dependencies without the job table
    assert "--dependencies-table goes with the job table" in capsys.readouterr().err


def test_the_prometheus_gauges_count_the_waiting_jobs_and_optionally_the_states(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    four_outcomes(engine, dag_queue, make_worker)
    cheap, full = CollectorRegistry(), CollectorRegistry()
    QueueStatusCollector(engine, jobs=Job, dependencies=JobDependency).register(cheap)
    QueueStatusCollector(
        engine, jobs=Job, dependencies=JobDependency, workflow_states=True
    ).register(full)
    for registry in (cheap, full):
        assert registry.get_sample_value("sa_outbox_jobs_waiting_for_jobs") == 3
        assert registry.get_sample_value("sa_outbox_workflows_waiting") == 1
    assert cheap.get_sample_value("sa_outbox_workflows", {"state": "running"}) is None
    for state in ("running", "succeeded", "failed", "cancelled"):
        assert full.get_sample_value("sa_outbox_workflows", {"state": state}) == 1
    with pytest.raises(Exception, match="needs jobs= too"):
        QueueStatusCollector(engine, dependencies=JobDependency)


def test_jobs_show_prints_a_jobs_steps_and_result_with_the_steps_table(
    engine: Engine,
    dag_queue: JobQueue,
    make_worker: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = diamond(engine, dag_queue)
    make_worker(dag_app([])).drain()
    steps = ["--steps-table", f"{TEST_SCHEMA}.job_steps"]
    assert main(["jobs", "show", str(ids["d"]), *TABLES[:2], *steps]) == 0
    out = capsys.readouterr().out
    assert "\nsteps (1)\n" in out
    [row] = [line for line in out.splitlines() if line.startswith("@result")]
    assert '{"name": "d", "after": ["b", "c"]}' in row  # as jsonb orders keys
    assert main(["jobs", "show", str(ids["d"]), *TABLES[:2], *steps, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [step["name"] for step in shown["steps"]] == ["@result"]
    assert shown["steps"][0]["result"] == {"name": "d", "after": ["b", "c"]}
    assert main(["jobs", "show", str(ids["d"]), *TABLES[:2]]) == 0  # no steps table: as before
    assert "steps (" not in capsys.readouterr().out
