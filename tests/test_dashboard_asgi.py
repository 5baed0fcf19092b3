"""The dashboard mounted in a FastAPI app (`asgi_dashboard`), driven over ASGI with
httpx's ASGI transport on real PostgreSQL: the authorisation hook sees the request, pages
and links carry the mount's prefix, an action with its CSRF token changes the job, and the
job table is counted before and after."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine

from sa_outbox import JobQueue

from .conftest import Job
from .helpers import job_row, jobs_by_status

pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")
pytest.importorskip("a2wsgi", reason="the ASGI dashboard needs a2wsgi (the test extra has it)")
pytest.importorskip("fastapi", reason="the mount test needs FastAPI (the test extra has it)")

import flask
import httpx
from fastapi import FastAPI

from sa_outbox.dashboard import asgi_dashboard

ADMIN = {"X-Admin": "yes"}


async def test_a_fastapi_app_mounts_the_dashboard_and_acts_through_it(engine: Engine) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        pending = queue.enqueue(conn, "send-email", {"to": "ana@example.com"}).id
    api = FastAPI()
    api.mount(
        "/admin/queue",
        asgi_dashboard(
            engine, jobs=Job, authorize=lambda: flask.request.headers.get("X-Admin") == "yes"
        ),
    )
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        assert (await client.get("/admin/queue/")).status_code == 403  # no header: refused
        overview = await client.get("/admin/queue/", headers=ADMIN)
        assert overview.status_code == 200
        assert re.search(r'id="count-pending">1<', overview.text)
        assert 'href="/admin/queue/jobs"' in overview.text  # links under the mount
        page = await client.get(f"/admin/queue/jobs/{pending}", headers=ADMIN)
        assert page.status_code == 200
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        refused = await client.post(f"/admin/queue/jobs/{pending}/cancel", headers=ADMIN)
        assert refused.status_code == 403 and job_row(engine, pending).status == "pending"
        done = await client.post(
            f"/admin/queue/jobs/{pending}/cancel", data={"csrf_token": token[1]}, headers=ADMIN
        )
        assert done.status_code == 302
        assert done.headers["location"] == f"/admin/queue/jobs/{pending}"
    assert jobs_by_status(engine) == {"cancelled": 1}


def test_the_asgi_dashboard_requires_an_authorisation_callback(engine: Engine) -> None:
    with pytest.raises(Exception, match="needs authorize="):
        asgi_dashboard(engine, jobs=Job)
