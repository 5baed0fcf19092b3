"""The example shop (examples/flask_app) mounts the dashboard at /admin/queue: a failed job
shows there with its error, and its retry button sends it back to pending."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("flask", reason="the example needs Flask (the test extra has it)")

from examples.flask_app.models import Job, db
from sa_outbox import JobQueue

from .test_flask_app import app, rows, shop_url  # noqa: F401 - fixtures and a helper


def test_the_shop_mounts_the_dashboard(app: Any) -> None:  # noqa: F811 - the fixture
    queue = JobQueue(Job)
    with app.app_context():
        with db.engine.begin() as conn:
            queue.enqueue(conn, "send-confirmation", {"order_id": 1}, max_attempts=1)
        with db.engine.begin() as conn:
            [job] = queue.claim(conn, worker_id="w", batch=1)
            queue.fail(conn, job.id, job.lease_token, error="mailbox full")
    client = app.test_client()
    page = client.get("/admin/queue/jobs?status=failed")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'data-id="{job.id}"' in html and "mailbox full" in html
    [csrf] = re.findall(r'name="csrf_token" value="([^"]+)"', html)
    response = client.post(f"/admin/queue/jobs/{job.id}/retry", data={"csrf_token": csrf})
    assert response.status_code == 302
    assert rows(app, "SELECT status::text, count(*) FROM jobs GROUP BY 1") == [("pending", 1)]
