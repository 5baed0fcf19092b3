"""Retrying a whole workflow (`JobQueue.retry_workflow`, ``sa-outbox workflows retry``)
against a real PostgreSQL: what failed or was cancelled runs again, what it cancelled waits
again and runs after it, what succeeded never runs twice; every job counted at the end."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from sa_outbox import InvalidArgument, JobQueue, Unique, Worker
from sa_outbox.cli import ENV_APP_DATABASE_URL, ENV_DATABASE_URL, main
from sa_outbox.statements import finish_cancelled_jobs

from .conftest import TEST_SCHEMA, Job
from .helpers import job_row, jobs_by_status
from .test_dependencies import dag_app, dag_queue, deps_table, in_jobs, waiting
from .test_steps import steps_table

__all__ = ["dag_queue", "deps_table", "steps_table"]  # fixtures, used below by name

WAIT = 20.0
TABLES = [
    "--jobs-table",
    f"{TEST_SCHEMA}.jobs",
    "--dependencies-table",
    f"{TEST_SCHEMA}.job_dependencies",
]


def diamond(engine: Engine, queue: JobQueue, *, d_policy: str = "cancel") -> dict[str, Any]:
    """a; b and c after a; d after b and c."""
    with engine.begin() as conn:
        a = queue.enqueue(conn, "node", {"name": "a"}).id
        b = queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        c = queue.enqueue(conn, "node", {"name": "c"}, after=[a]).id
        d = queue.enqueue(conn, "node", {"name": "d"}, after=[b, c], on_failure=d_policy).id
    return {"a": a, "b": b, "c": c, "d": d}


def statuses(engine: Engine, ids: dict[str, uuid.UUID]) -> dict[str, str]:
    """Each job's status, ``waiting`` for one out of the job table."""
    found = {}
    for name, job_id in ids.items():
        try:
            found[name] = job_row(engine, job_id).status
        except Exception:
            found[name] = "waiting"
    return found


def test_a_failed_root_runs_again_and_the_jobs_it_cancelled_run_after_it(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    ran: list[str] = []
    make_worker(dag_app(ran, failing={"a"})).drain(timeout=WAIT)
    assert ran == ["a"]
    assert statuses(engine, ids) == {
        "a": "failed",
        "b": "cancelled",
        "c": "cancelled",
        "d": "cancelled",
    }

    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["d"])  # any job of it will do
    assert retry.id == ids["a"] and retry.requeued == [ids["a"]]
    assert set(retry.waiting) == {ids["b"], ids["c"], ids["d"]} and retry.skipped == []
    root = job_row(engine, ids["a"])
    assert (root.status, root.attempts) == ("pending", 0)
    assert "a broke" in root.last_error  # kept for the record
    assert in_jobs(engine) == 1 and waiting(engine) == 3  # only a can be claimed

    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert ran[0:2] == ["a", "a"] and set(ran[2:4]) == {"b", "c"} and ran[4:] == ["d"]
    assert jobs_by_status(engine) == {"succeeded": 4} and waiting(engine) == 0
    with engine.connect() as conn:
        found = dag_queue.read_result(conn, ids["d"])
    assert found is not None and found.value == {"name": "d", "after": ["b", "c"]}


def test_a_failure_in_the_middle_reruns_it_and_what_follows_and_nothing_that_succeeded(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    ran: list[str] = []
    make_worker(dag_app(ran, failing={"b"})).drain(timeout=WAIT)
    assert statuses(engine, ids) == {
        "a": "succeeded",
        "b": "failed",
        "c": "succeeded",
        "d": "cancelled",
    }
    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["a"])
    assert (retry.requeued, retry.waiting) == ([ids["b"]], [ids["d"]])

    ran.clear()
    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert ran == ["b", "d"]  # a and c succeeded: never run again
    assert jobs_by_status(engine) == {"succeeded": 4} and waiting(engine) == 0


def test_a_dependant_that_failed_itself_runs_again_at_once(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    ran: list[str] = []
    make_worker(dag_app(ran, failing={"d"})).drain(timeout=WAIT)
    assert statuses(engine, ids)["d"] == "failed"
    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["b"])
    assert (retry.requeued, retry.waiting) == ([ids["d"]], [])  # its parents succeeded
    ran.clear()
    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert ran == ["d"] and jobs_by_status(engine) == {"succeeded": 4}


def test_a_job_cancelled_while_waiting_waits_again(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    # Cancelled by hand before its parents finished: the retry puts it back to waiting,
    # and it runs once they have succeeded. A job that had not finished is left as it is.
    ids = diamond(engine, dag_queue)
    with engine.begin() as conn:
        dag_queue.cancel(conn, [ids["b"]])
    assert statuses(engine, ids) == {
        "a": "pending",
        "b": "cancelled",
        "c": "waiting",
        "d": "cancelled",
    }
    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["a"])
    assert retry.requeued == [] and set(retry.waiting) == {ids["b"], ids["d"]}
    ran: list[str] = []
    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert sorted(ran) == ["a", "b", "c", "d"] and ran[-1] == "d"
    assert jobs_by_status(engine) == {"succeeded": 4} and waiting(engine) == 0


def test_a_retry_with_nothing_to_retry_changes_nothing_and_bad_input_is_refused(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    make_worker(dag_app([])).drain(timeout=WAIT)
    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["c"])
        assert (retry.requeued, retry.waiting, retry.skipped) == ([], [], [])
        with pytest.raises(InvalidArgument, match=r"^retry_workflow needs the dependencies"):
            JobQueue(Job).retry_workflow(conn, ids["c"])
        with pytest.raises(InvalidArgument, match="job id"):
            dag_queue.retry_workflow(conn, "not-a-uuid")
    assert jobs_by_status(engine) == {"succeeded": 4}


def test_a_cancelled_job_its_worker_still_holds_is_left_until_it_has_stopped(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    with engine.begin() as conn:
        [held] = dag_queue.claim(conn, worker_id="busy", lease=30)
        dag_queue.cancel(conn, [held.id])  # running: cancelled, its lease kept until it stops
    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["a"])
    # a is left; what its cancel cancelled waits for it again
    assert retry.requeued == [] and set(retry.waiting) == {ids["b"], ids["c"], ids["d"]}
    assert job_row(engine, ids["a"]).status == "cancelled"
    with engine.begin() as conn:  # its worker stops it (the heartbeat found it cancelled)
        stopped = finish_cancelled_jobs(Job, [(held.id, held.lease_token)])
        assert conn.execute(stopped).all()
    with engine.begin() as conn:
        retry = dag_queue.retry_workflow(conn, ids["a"])
    assert retry.requeued == [ids["a"]]
    ran: list[str] = []
    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert sorted(ran) == ["a", "b", "c", "d"] and jobs_by_status(engine) == {"succeeded": 4}


def test_a_unique_root_whose_key_another_job_holds_is_skipped(
    engine: Engine, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    with engine.begin() as conn:
        root = dag_queue.enqueue(conn, "node", {"name": "a"}, unique=Unique()).id
        after = dag_queue.enqueue(conn, "node", {"name": "b"}, after=[root]).id
    ran: list[str] = []
    make_worker(dag_app(ran, failing={"a"})).drain(timeout=WAIT)
    with engine.begin() as conn:  # failed, it gave its key up: another job takes it
        holder = dag_queue.enqueue(conn, "node", {"name": "a"}, unique=Unique())
        assert holder.inserted
        retry = dag_queue.retry_workflow(conn, root)
    assert (retry.requeued, retry.waiting, retry.skipped) == ([], [after], [root])
    assert job_row(engine, root).status == "failed"
    assert in_jobs(engine) == 2 and waiting(engine) == 1  # b waits for root again

    with engine.begin() as conn:  # the holder cancelled, the key is free: the retry takes it
        dag_queue.cancel(conn, [holder.id])
        retry = dag_queue.retry_workflow(conn, root)
    assert (retry.requeued, retry.skipped) == ([root], [])
    make_worker(dag_app(ran)).drain(timeout=WAIT)
    assert jobs_by_status(engine) == {"succeeded": 2, "cancelled": 1} and waiting(engine) == 0


def test_the_cli_retries_a_workflow_and_says_what_it_did(
    engine: Engine,
    dag_queue: JobQueue,
    make_worker: Callable[..., Worker],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, database_url)
    ids = diamond(engine, dag_queue)
    make_worker(dag_app([], failing={"a"})).drain(timeout=WAIT)
    assert main(["workflows", "retry", str(ids["b"]), *TABLES]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"workflow {ids['a']}:\nrequeued 1 job(s), pending now:")
    assert "3 job(s) wait again for the jobs they wait for:" in out
    assert main(["workflows", "retry", str(ids["b"]), *TABLES, "--json"]) == 0
    assert '"requeued": []' in capsys.readouterr().out  # a is pending: nothing to retry
    make_worker(dag_app([])).drain(timeout=WAIT)
    assert jobs_by_status(engine) == {"succeeded": 4}
    nobody = "00000000-0000-0000-0000-000000000001"
    assert main(["workflows", "retry", nobody, *TABLES]) != 0
    assert f"no job {nobody} in" in capsys.readouterr().err
