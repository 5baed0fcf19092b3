"""The dashboard's workflow pages and a job's steps (``dashboard_blueprint(steps=,
dependencies=)``), with Flask's test client on real PostgreSQL: the overview's counts, the
workflows list, one workflow's jobs under what they wait for, cancel and retry the whole
(jobs counted before and after), a waiting job's address, XSS in a step's result."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine

from sa_outbox import JobQueue, Worker

from .conftest import Job
from .helpers import job_row, jobs_by_status
from .test_dependencies import JobDependency, dag_app, dag_queue, deps_table, waiting
from .test_steps import JobStep, steps_table

pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")

from sa_outbox.dashboard import create_app

from .test_dashboard import SECRET, client_of

__all__ = ["dag_queue", "deps_table", "steps_table"]  # fixtures, used below by name


@pytest.fixture
def client(engine: Engine, deps_table: None) -> Any:
    app = create_app(engine, jobs=Job, steps=JobStep, dependencies=JobDependency, token=SECRET)
    return client_of(app)


def diamond(engine: Engine, queue: JobQueue) -> dict[str, uuid.UUID]:
    with engine.begin() as conn:
        a = queue.enqueue(conn, "node", {"name": "a"}).id
        b = queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        c = queue.enqueue(conn, "node", {"name": "c"}, after=[a]).id
        d = queue.enqueue(conn, "node", {"name": "d"}, after=[b, c]).id
    assert a and b and c and d
    return {"a": a, "b": b, "c": c, "d": d}


def form_token(client: Any, path: str) -> str:
    """Open a page as a browser would (which sets the CSRF cookie); its forms' token."""
    page = client.get(path)
    assert page.status_code == 200
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True))
    assert found, "the page has no form"
    return found[1]


def members(html: str) -> dict[str, str]:
    """The workflow page's rows: job id → status."""
    rows = re.findall(r'<tr class="member" data-id="([^"]+)">(.*?)</tr>', html, re.S)
    return {job_id: re.search(r'class="status (\w+)"', row)[1] for job_id, row in rows}  # type: ignore[index]


def test_the_workflow_page_shows_each_job_under_what_it_waits_for(
    engine: Engine, client: Any, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    make_worker(dag_app([]), batch=1).run_once()  # a succeeds; b and c are released
    page = client.get(f"/workflows/{ids['d']}")  # any job of it will do
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f"<h1>Workflow {ids['a']}</h1>" in html
    assert members(html) == {
        str(ids["a"]): "succeeded",
        str(ids["b"]): "pending",
        str(ids["c"]): "pending",
        str(ids["d"]): "waiting",
    }
    assert "padding-left: 3.5rem" in html  # d sits two levels down
    assert "cancel the workflow" in html and "retry what failed" not in html

    listing = client.get("/workflows").get_data(as_text=True)
    assert f'data-id="{ids["a"]}"' in listing and "running" in listing
    overview = client.get("/").get_data(as_text=True)
    assert re.search(r'id="waiting-jobs">1<', overview)
    assert re.search(r'id="workflows-running">1<', overview)
    # a waiting job's own address leads to its workflow
    waiting_page = client.get(f"/jobs/{ids['d']}")
    assert waiting_page.status_code == 302
    assert waiting_page.location == f"/workflows/{ids['d']}"


def test_a_jobs_page_shows_its_steps_and_its_workflow(
    engine: Engine, client: Any, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    with engine.begin() as conn:
        alone = dag_queue.enqueue(conn, "node", {"name": "<script>alert(1)</script>"}).id
    make_worker(dag_app([])).drain(timeout=20)
    html = client.get(f"/jobs/{ids['d']}").get_data(as_text=True)
    assert re.search(r'<tr class="step"><td>@result</td>', html)
    assert '<pre>{"after": ["b", "c"], "name": "d"}</pre>' in html
    assert f'href="/workflows/{ids["a"]}"' in html
    lone = client.get(f"/jobs/{alone}").get_data(as_text=True)
    assert 'id="workflow-link"' not in lone  # a job on its own: no workflow
    assert "<script>alert(1)</script>" not in lone  # its result, escaped
    assert "\\u003cscript\\u003e" in lone


def test_cancel_and_retry_a_whole_workflow_from_its_page(
    engine: Engine, client: Any, dag_queue: JobQueue, make_worker: Callable[..., Worker]
) -> None:
    ids = diamond(engine, dag_queue)
    csrf = form_token(client, f"/workflows/{ids['a']}")
    response = client.post(f"/workflows/{ids['c']}/cancel", data={"csrf_token": csrf})
    assert response.status_code == 302 and response.location == f"/workflows/{ids['a']}"
    assert jobs_by_status(engine) == {"cancelled": 4} and waiting(engine) == 0

    html = client.get(f"/workflows/{ids['a']}").get_data(as_text=True)
    assert "retry what failed or was cancelled" in html and "cancel the workflow" not in html
    response = client.post(f"/workflows/{ids['a']}/retry", data={"csrf_token": csrf})
    assert response.status_code == 302
    assert job_row(engine, ids["a"]).status == "pending" and waiting(engine) == 3
    ran: list[str] = []
    make_worker(dag_app(ran)).drain(timeout=20)
    assert sorted(ran) == ["a", "b", "c", "d"] and jobs_by_status(engine) == {"succeeded": 4}


def test_unknown_workflows_and_posts_without_a_token_are_refused(
    engine: Engine, client: Any, dag_queue: JobQueue
) -> None:
    ids = diamond(engine, dag_queue)
    nobody = uuid.UUID(int=7)
    assert client.get(f"/workflows/{nobody}").status_code == 404
    assert client.get("/workflows/not-an-id").status_code == 404
    csrf = form_token(client, f"/workflows/{ids['a']}")
    assert client.post(f"/workflows/{nobody}/cancel", data={"csrf_token": csrf}).status_code == 404
    assert client.post(f"/workflows/{ids['a']}/cancel").status_code == 403  # no CSRF token
    assert jobs_by_status(engine) == {"pending": 1} and waiting(engine) == 3


def test_without_the_dependencies_table_there_are_no_workflow_pages(
    engine: Engine, deps_table: None
) -> None:
    plain = client_of(create_app(engine, jobs=Job, token=SECRET))
    assert plain.get("/workflows").status_code == 404
    assert "Workflows</a>" not in plain.get("/").get_data(as_text=True)
