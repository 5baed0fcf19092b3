"""The web dashboard (sa_outbox.dashboard), driven with Flask's test client on real PostgreSQL:
every page, the throughput chart and the running jobs, every action with the job and event
counts before and after, bad input, CSRF, read-only mode, authorisation, and XSS payloads
(in ``last_error``, kinds, queues, worker ids) rendered inert."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from sa_outbox import FakeClock, JobQueue
from sa_outbox.queue import list_running_jobs, throughput_by_minute
from sa_outbox.statements import NewJob

from .conftest import TEST_SCHEMA, Job, OutboxEvent
from .helpers import event_rows, job_row, jobs_by_status
from .helpers_admin import database_now, finish_at, make_scene

pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")

from flask import Flask

from sa_outbox import InvalidArgument
from sa_outbox.dashboard import (
    CSRF_COOKIE,
    TOKEN_COOKIE,
    TokenGate,
    allow_anyone,
    create_app,
    dashboard_blueprint,
)
from sa_outbox.dashboard._overview_page import CHART_MINUTES, RUNNING_SHOWN

ROOT = Path(__file__).resolve().parents[1]
_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


#: The standalone app's token in these tests.
SECRET = "a-test-token-of-some-length"


def client_of(app: Flask) -> Any:
    """A test client that carries the standalone app's token, as a logged-in browser does."""
    client = app.test_client()
    client.set_cookie(TOKEN_COOKIE, SECRET)
    return client


@pytest.fixture
def client(engine: Engine) -> Any:
    return client_of(create_app(engine, jobs=Job, outbox=OutboxEvent, token=SECRET))


def token(client: Any, path: str = "/") -> str:
    """Open a page as a browser would (which sets the CSRF cookie) and read its form token."""
    page = client.get(path)
    assert page.status_code == 200
    found = _TOKEN.search(page.get_data(as_text=True))
    assert found, "the page has no form"
    assert client.get_cookie(CSRF_COOKIE, path=path).value == found[1]
    return found[1]


def test_the_overview_counts_every_status_and_the_outbox(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    html = client.get("/").get_data(as_text=True)
    assert '<td id="count-failed">2</td>' in html
    assert '<td id="count-pending">2</td>' in html
    assert '<td id="count-running">2</td>' in html
    assert '<td id="count-succeeded">1</td>' in html
    assert '<td id="failed-recently">2</td>' in html
    assert '<td id="expired-leases">1</td>' in html
    assert '<td id="backlog">1</td>' in html and '<td id="parked">1</td>' in html
    assert str(scene.parked) in html and "broker said no" in html
    assert "retry all failed send-email" in html


def throughput_rows(html: str) -> list[tuple[str, int, int]]:
    """The chart's table of numbers: ``(minute, succeeded, failed)`` per row."""
    table = html[html.index('<table id="throughput-table">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr><td>([^<]*)</td><td>(\d+)</td><td>(\d+)</td></tr>", table)
    return [(minute, int(ok), int(bad)) for minute, ok, bad in rows]


def test_the_overview_charts_the_jobs_finished_per_minute(engine: Engine, client: Any) -> None:
    now = database_now(engine)
    finish_at(engine, now - dt.timedelta(minutes=10), succeeded=3)
    finish_at(engine, now - dt.timedelta(minutes=4), succeeded=2, failed=1)
    finish_at(engine, now - dt.timedelta(minutes=45), succeeded=5, failed=5)  # too old
    queue = JobQueue(Job)
    with engine.begin() as conn:  # retried: back to pending, so not a finished job
        queue.enqueue(conn, "flaky", {})
        [job] = queue.claim(conn, worker_id="w", kinds=["flaky"], batch=1)
        queue.retry(conn, job.id, job.lease_token, error="timeout", delay=60)
    assert jobs_by_status(engine) == {"succeeded": 10, "failed": 6, "pending": 1}

    html = client.get("/").get_data(as_text=True)
    rows = throughput_rows(html)
    assert len(rows) == CHART_MINUTES
    busy = {minute: (ok, bad) for minute, ok, bad in rows if ok or bad}
    assert busy == {
        (now - dt.timedelta(minutes=10)).strftime("%H:%M"): (3, 0),
        (now - dt.timedelta(minutes=4)).strftime("%H:%M"): (2, 1),
    }
    assert '<span id="throughput-succeeded">5</span>' in html
    assert '<span id="throughput-failed">1</span>' in html
    chart = html[html.index('<svg id="throughput-chart"') : html.index("</svg>")]
    assert 'role="img" aria-labelledby="throughput-title"' in chart
    assert "5 succeeded, 1 failed</title>" in chart
    assert chart.count('<rect class="succeeded"') == 2 and chart.count('<rect class="failed"') == 1
    assert chart.count('<g class="minute">') == CHART_MINUTES
    assert "<script" not in html and "src=" not in html  # no JavaScript, nothing fetched


def test_an_empty_table_charts_zeros(client: Any) -> None:
    html = client.get("/").get_data(as_text=True)
    rows = throughput_rows(html)
    assert len(rows) == CHART_MINUTES and all(ok == bad == 0 for _, ok, bad in rows)
    assert '<rect class="succeeded"' not in html and "0 succeeded, 0 failed</title>" in html
    assert "no running jobs" in html


def running_rows(html: str) -> list[str]:
    """The ``data-id`` of each row of the running jobs, in page order."""
    return re.findall(r'<tr class="running-job[^"]*" data-id="([^"]+)"', html)


def test_the_overview_lists_running_jobs_and_their_leases(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    html = client.get("/").get_data(as_text=True)
    assert running_rows(html) == [str(scene.expired), str(scene.running)]  # expired first
    section = html[html.index('<table id="running-jobs">') :]
    section = section[: section.index("</table>")]
    expired, live = section.split('<tr class="running-job')[1:]
    assert expired.startswith(' expired"') and not live.startswith(' expired"')
    assert f'<a href="/jobs/{scene.expired}">' in expired and "<td>w-dead</td>" in expired
    assert "<td>images</td><td>resize</td>" in expired and "<td>1/8</td>" in expired
    assert re.search(r'<td class="lease-left">expired 1m0\ds ago</td>', expired)
    assert "<td>w-live</td>" in live
    assert re.search(r'<td class="lease-left">9m5\ds</td>', live)  # about 10 minutes left
    assert jobs_by_status(engine)["running"] == 2


def test_the_running_list_is_limited_and_says_so(engine: Engine, client: Any) -> None:
    queue = JobQueue(Job)
    extra = RUNNING_SHOWN + 5
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("long", {"n": n}) for n in range(extra)])
    with engine.begin() as conn:
        queue.claim(conn, worker_id="w-busy", batch=extra)
    html = client.get("/").get_data(as_text=True)
    assert len(running_rows(html)) == RUNNING_SHOWN
    assert f"The {RUNNING_SHOWN} of {extra} whose lease ends first." in html
    assert jobs_by_status(engine) == {"running": extra}


#: What the dashboard must never print: a time or duration with microseconds
#: (``2026-12-05 07:57:50.346906+00:00``, ``0:04:24.903643``), a duration as ``H:MM:SS``
#: (``0:04:24``, ``1 day, 2:03:04``), Python's time with its offset, a size in bytes. A time
#: after its date (``2026-12-05 07:57:50``) and an ISO ``datetime=`` attribute are fine.
_RAW_UNITS = re.compile(
    r":\d\d\.\d{3,}|\d+ bytes|(?<!\d-\d\d )(?<![\d:T])\d{1,2}:\d\d:\d\d"
    r"|(?<![\dT])\d\d:\d\d:\d\d[+-]\d\d:\d\d"
)


@pytest.mark.parametrize(
    "text",
    [
        "0:04:24.903643",
        "2026-12-05 07:57:50.346906+00:00",
        "147456 bytes",
        "0:04:24",
        "1 day, 2:03:04",
        "2026-12-05 07:57:50+00:00",
    ],
)
def test_the_raw_units_pattern_catches_what_python_prints(text: str) -> None:
    assert _RAW_UNITS.search(text)
    for shown in ("2026-12-05 07:57:50", 'datetime="2026-12-05T07:57:50+00:00"', "4m16s"):
        assert not _RAW_UNITS.search(shown)


def test_every_page_shows_times_to_the_second_and_short_durations(
    engine: Engine, client: Any
) -> None:
    """Every page with data, as the browser gets it: times in UTC to the second, durations
    as ``4m16s``, relative times as ``3m10s ago``; never a microsecond or an ``H:MM:SS``."""
    scene = make_scene(engine)
    with engine.begin() as conn:  # a job waiting for minutes, so the oldest ready age shows
        conn.execute(
            text(
                f"UPDATE {TEST_SCHEMA}.jobs SET run_at = now() - interval '4 minutes 24.903643 "
                "seconds', created_at = now() - interval '5 minutes' WHERE id = :id"
            ),
            {"id": scene.pending[0]},
        )
    pages = {
        "/": "oldest ready job",
        "/jobs": "ago</time>",
        "/jobs?status=failed": "SMTPError",
        f"/jobs/{scene.failed[0]}": "SMTPError",
        f"/jobs/{scene.pending[0]}": "ago)",
        f"/jobs/{scene.expired}": "w-dead",
        f"/outbox/{scene.parked}": "broker said no",
    }
    for path, sign in pages.items():
        response = client.get(path)
        assert response.status_code == 200, path
        html = response.get_data(as_text=True)
        assert sign in html, path
        assert not _RAW_UNITS.findall(html), (path, _RAW_UNITS.findall(html))
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\b", html), path  # a time, whole
    overview = client.get("/").get_data(as_text=True)
    assert '<td id="oldest-ready">4m2' in overview  # 4m24s, or a second or two more
    assert "failed in the last 1h</th>" in overview
    assert re.search(r'<td id="oldest-backlog">\d+(\.\d+)?s</td>', overview)
    assert re.search(r'<time id="taken-at" datetime="[^"]+\+00:00">[\d -:]+</time>', overview)
    listing = client.get("/jobs").get_data(as_text=True)
    assert re.search(r">\d+(\.\d+)?s ago</time>", listing)  # updated seconds ago
    pending = client.get(f"/jobs/{scene.pending[0]}").get_data(as_text=True)
    assert re.search(r'<td id="col-run_at">[\d -:]+ \(4m2\ds ago\)</td>', pending)
    assert re.search(r'<td id="col-created_at">[\d -:]+ \(5m0\ds ago\)</td>', pending)
    assert jobs_by_status(engine) == {"pending": 2, "failed": 2, "running": 2, "succeeded": 1}


def test_the_minutes_and_leases_behind_the_overview_follow_the_given_clock(
    engine: Engine,
) -> None:
    """`throughput_by_minute` and `list_running_jobs` on a fake clock: exact minutes, an
    exact time left, and a lease that expires as the clock moves on."""
    noon = dt.datetime(2030, 1, 1, 12, 0, 30, tzinfo=dt.UTC)
    finish_at(engine, noon - dt.timedelta(seconds=140), succeeded=2)  # 11:58:10
    finish_at(engine, noon - dt.timedelta(seconds=40), failed=1)  # 11:59:50
    finish_at(engine, noon + dt.timedelta(seconds=60), succeeded=4)  # 12:01:30, to come
    clock = FakeClock(noon)
    queue = JobQueue(Job, clock=clock)
    with engine.begin() as conn:
        queue.enqueue(conn, "long", {})
        [held] = queue.claim(conn, worker_id="w1", kinds=["long"], batch=1, lease=60)
    with engine.connect() as conn:
        minutes = throughput_by_minute(conn, Job, minutes=3, clock=clock)
        [running] = list_running_jobs(conn, Job, clock=clock)
    shown = [(f"{m.minute.astimezone(dt.UTC):%H:%M}", m.succeeded, m.failed) for m in minutes]
    assert shown == [("11:58", 2, 0), ("11:59", 0, 1), ("12:00", 0, 0)]
    assert (running.id, running.worker_id, running.attempts) == (held.id, "w1", 1)
    assert running.lease_left == dt.timedelta(seconds=60) and not running.expired
    clock.advance(90)
    with engine.connect() as conn:
        [running] = list_running_jobs(conn, Job, clock=clock)
        later = throughput_by_minute(conn, Job, minutes=2, clock=clock)  # 12:01 and 12:02
    assert [(m.succeeded, m.failed) for m in later] == [(4, 0), (0, 0)]
    assert running.lease_left == dt.timedelta(seconds=-30) and running.expired
    assert jobs_by_status(engine) == {"succeeded": 6, "failed": 1, "running": 1}


def test_the_jobs_list_filters_and_pages(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    html = client.get("/jobs?status=failed").get_data(as_text=True)
    assert set(re.findall(r'data-id="([^"]+)"', html)) == {str(i) for i in scene.failed}
    assert "SMTPError: 550 refused" in html and "line 2" not in html  # the first line only
    html = client.get("/jobs?kind=ping&queue=default").get_data(as_text=True)
    assert set(re.findall(r'data-id="([^"]+)"', html)) == {str(i) for i in scene.pending}
    assert 'data-id="' not in client.get("/jobs?kind=ping&queue=emails").get_data(as_text=True)

    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("bulk", {"n": n}) for n in range(60)])
    first = client.get("/jobs?kind=bulk").get_data(as_text=True)
    older = re.search(r'rel="next" href="([^"]+)"', first)
    assert older is not None and "before=" in older[1]  # a keyset cursor, not an offset
    second = client.get(older[1].replace("&amp;", "&")).get_data(as_text=True)
    ids_1 = re.findall(r'data-id="([^"]+)"', first)
    ids_2 = re.findall(r'data-id="([^"]+)"', second)
    # one transaction: 60 jobs with the same updated_at, paged by id
    assert len(ids_1) == 50 and len(ids_2) == 10 and not set(ids_1) & set(ids_2)
    assert ids_1 + ids_2 == sorted(ids_1 + ids_2, reverse=True)
    assert 'rel="next"' not in second and 'rel="first"' in second and 'rel="first"' not in first


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("status=lost", "unknown status &#39;lost&#39;: one of pending, running"),
        ("before=two", "before must be a job&#39;s updated_at and id"),
        ("before=2030-01-01T00:00:00_x", "got &#39;2030-01-01T00:00:00_x&#39;"),
    ],
)
def test_a_bad_filter_is_a_400_that_says_why(client: Any, query: str, message: str) -> None:
    response = client.get(f"/jobs?{query}")
    assert response.status_code == 400
    assert message in response.get_data(as_text=True)


def test_the_job_page_shows_every_column_and_the_whole_error(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    failed = scene.failed[0]
    html = client.get(f"/jobs/{failed}").get_data(as_text=True)
    for column in ("queue", "kind", "status", "attempts", "max_attempts", "run_at", "lease_token"):
        assert f'id="col-{column}"' in html
    assert f"SMTPError: 550 refused\nline 2 {failed}" in html
    assert '"to":' in html  # the payload


@pytest.mark.parametrize("job_id", [str(uuid.UUID(int=7)), "not-a-uuid"])
def test_an_unknown_job_is_a_404_page(engine: Engine, client: Any, job_id: str) -> None:
    response = client.get(f"/jobs/{job_id}")
    assert response.status_code == 404
    assert f"no job {job_id}" in response.get_data(as_text=True)
    assert client.get(f"/outbox/{job_id}").status_code == 404


def test_an_xss_payload_in_last_error_renders_inert(engine: Engine, client: Any) -> None:
    queue = JobQueue(Job)
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    with engine.begin() as conn:
        queue.enqueue(conn, "evil<b>kind</b>", {"html": evil}, max_attempts=1)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w", batch=1)
        queue.fail(conn, job.id, job.lease_token, error=evil)
    for path in ("/", "/jobs", f"/jobs/{job.id}"):
        html = client.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>kind" not in html
    html = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


def test_xss_payloads_in_the_running_list_render_inert(engine: Engine, client: Any) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "<script>alert(1)</script>", {}, queue="<img src=x onerror=alert(2)>")
    with engine.begin() as conn:
        queue.claim(conn, worker_id='"><svg onload=alert(3)>', batch=1)
    html = client.get("/").get_data(as_text=True)
    assert len(running_rows(html)) == 1
    assert "<script>alert" not in html and "<img src=x" not in html and "<svg onload" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html
    assert "&#34;&gt;&lt;svg onload=alert(3)&gt;" in html


def test_retry_a_failed_job(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    assert jobs_by_status(engine)["failed"] == 2
    failed = scene.failed[0]
    response = client.post(f"/jobs/{failed}/retry", data={"csrf_token": token(client)})
    assert response.status_code == 302 and response.location == f"/jobs/{failed}"
    assert str(job_row(engine, failed).status) == "pending"
    assert jobs_by_status(engine)["failed"] == 1 and jobs_by_status(engine)["pending"] == 3


def test_retry_a_job_that_is_not_failed_changes_nothing(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    before = jobs_by_status(engine)
    csrf = token(client)
    response = client.post(f"/jobs/{scene.running}/retry", data={"csrf_token": csrf})
    assert response.status_code == 409
    assert "is running, not failed; nothing retried" in response.get_data(as_text=True)
    response = client.post(f"/jobs/{uuid.UUID(int=9)}/retry", data={"csrf_token": csrf})
    assert response.status_code == 404
    assert jobs_by_status(engine) == before


def test_retry_all_failed_of_one_kind(engine: Engine, client: Any) -> None:
    make_scene(engine)
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "other", {}, max_attempts=1)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w", kinds=["other"], batch=1)
        queue.fail(conn, job.id, job.lease_token, error="no")
    assert jobs_by_status(engine)["failed"] == 3
    response = client.post(
        "/jobs/retry-failed", data={"csrf_token": token(client), "kind": "send-email"}
    )
    assert response.status_code == 302
    assert jobs_by_status(engine)["failed"] == 1
    assert str(job_row(engine, job.id).status) == "failed"


def test_cancel_a_pending_job(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    pending = scene.pending[0]
    response = client.post(f"/jobs/{pending}/cancel", data={"csrf_token": token(client)})
    assert response.status_code == 302
    assert str(job_row(engine, pending).status) == "cancelled"
    assert jobs_by_status(engine)["pending"] == 1 and jobs_by_status(engine)["cancelled"] == 1
    response = client.post(f"/jobs/{uuid.UUID(int=3)}/cancel", data={"csrf_token": token(client)})
    assert response.status_code == 404
    assert jobs_by_status(engine)["cancelled"] == 1


def test_retry_a_parked_event(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    response = client.post(f"/outbox/{scene.parked}/retry", data={"csrf_token": token(client)})
    assert response.status_code == 302
    events = {row.id: row for row in event_rows(engine)}
    assert len(events) == 2 and events[scene.parked].parked_at is None
    response = client.post(f"/outbox/{scene.backlog}/retry", data={"csrf_token": token(client)})
    assert response.status_code == 409
    assert "is not parked; nothing retried" in response.get_data(as_text=True)
    for unknown in (str(uuid.UUID(int=5)), "not-a-uuid"):
        response = client.post(f"/outbox/{unknown}/retry", data={"csrf_token": token(client)})
        assert response.status_code == 404
        assert f"no event {unknown}" in response.get_data(as_text=True)
    events = {row.id: row for row in event_rows(engine)}
    assert len(events) == 2 and events[scene.backlog].parked_at is None


def test_a_post_without_the_csrf_token_is_refused(engine: Engine, client: Any) -> None:
    scene = make_scene(engine)
    failed = scene.failed[0]
    csrf = token(client)
    for data in ({}, {"csrf_token": "forged"}):
        response = client.post(f"/jobs/{failed}/retry", data=data)
        assert response.status_code == 403
        assert "CSRF token is missing or wrong" in response.get_data(as_text=True)
    other = client_of(create_app(engine, jobs=Job, outbox=OutboxEvent, token=SECRET))  # no cookie
    assert other.post(f"/jobs/{failed}/retry", data={"csrf_token": csrf}).status_code == 403
    assert jobs_by_status(engine)["failed"] == 2


@pytest.mark.parametrize(
    "forged", ["é-forged", "токен", "\u2603" * 43], ids=["latin", "cyrillic", "snowmen"]
)
def test_a_csrf_token_that_is_not_ascii_is_refused_not_an_error(
    engine: Engine, client: Any, forged: str
) -> None:
    """A form token in any script is compared, not crashed on: 403, and nothing retried."""
    scene = make_scene(engine)
    before = jobs_by_status(engine)
    token(client)  # the browser has its CSRF cookie
    for path in (f"/jobs/{scene.failed[0]}/retry", "/jobs/retry-failed"):
        response = client.post(path, data={"csrf_token": forged})
        assert response.status_code == 403, path
        assert "CSRF token is missing or wrong" in response.get_data(as_text=True)
    other = client_of(create_app(engine, jobs=Job, outbox=OutboxEvent, token=SECRET))
    other.set_cookie(CSRF_COOKIE, forged)  # a cookie in another script, and a form to match
    response = other.post("/jobs/retry-failed", data={"csrf_token": "ascii-token"})
    assert response.status_code == 403
    assert jobs_by_status(engine) == before
    assert before["failed"] == 2


def test_read_only_mode_shows_no_buttons_and_refuses_posts(engine: Engine) -> None:
    scene = make_scene(engine)
    client = client_of(
        create_app(engine, jobs=Job, outbox=OutboxEvent, read_only=True, token=SECRET)
    )
    for path in ("/", "/jobs", f"/jobs/{scene.failed[0]}"):
        html = client.get(path).get_data(as_text=True)
        assert '<form class="inline" method="post"' not in html and "read-only" in html
    csrf = client.get_cookie(CSRF_COOKIE).value
    response = client.post(f"/jobs/{scene.failed[0]}/retry", data={"csrf_token": csrf})
    assert response.status_code == 403 and "read-only" in response.get_data(as_text=True)
    assert jobs_by_status(engine)["failed"] == 2


def test_mounted_under_a_prefix_with_an_authorisation_callback(engine: Engine) -> None:
    make_scene(engine)
    allowed = {"yes": False}
    app = Flask("host")  # no SECRET_KEY: the dashboard needs none
    app.register_blueprint(
        dashboard_blueprint(
            lambda: engine, jobs=Job, outbox=OutboxEvent, authorize=lambda: allowed["yes"]
        ),
        url_prefix="/admin/queue",
    )
    client = app.test_client()
    assert client.get("/admin/queue/").status_code == 403
    allowed["yes"] = True
    csrf = token(client, "/admin/queue/")
    assert client.get_cookie(CSRF_COOKIE, path="/admin/queue/").value == csrf
    response = client.post(
        "/admin/queue/jobs/retry-failed", data={"csrf_token": csrf}, follow_redirects=True
    )
    assert response.status_code == 200 and response.request.path == "/admin/queue/jobs"
    assert jobs_by_status(engine).get("failed", 0) == 0


def test_mounting_requires_an_authorisation_callback(engine: Engine) -> None:
    with pytest.raises(InvalidArgument, match="needs authorize=") as raised:
        dashboard_blueprint(engine, jobs=Job)
    assert "allow_anyone" in str(raised.value)
    with pytest.raises(TypeError, match="authorize must be a callable"):
        dashboard_blueprint(engine, jobs=Job, authorize=True)  # type: ignore[arg-type]
    app = Flask("host")
    app.register_blueprint(dashboard_blueprint(engine, jobs=Job, authorize=allow_anyone))
    assert app.test_client().get("/").status_code == 200


def test_the_standalone_app_refuses_a_request_without_its_token(engine: Engine) -> None:
    scene = make_scene(engine)
    app = create_app(engine, jobs=Job, outbox=OutboxEvent, token=SECRET)
    anonymous = app.test_client()
    for path in ("/", "/jobs", f"/jobs/{scene.failed[0]}", "/?token=wrong-token-but-long"):
        assert anonymous.get(path).status_code == 403, path
    assert anonymous.post(f"/jobs/{scene.failed[0]}/retry").status_code == 403
    bearer = {"Authorization": f"Bearer {SECRET}"}
    assert anonymous.get("/", headers=bearer).status_code == 200
    assert anonymous.get("/", headers={"Authorization": "Bearer nope"}).status_code == 403
    # Opening an address that carries the token logs a browser in, then drops it from the URL.
    browser = app.test_client()
    response = browser.get(f"/jobs?status=failed&token={SECRET}")
    assert response.status_code == 302 and response.location == "/jobs?status=failed"
    assert browser.get_cookie(TOKEN_COOKIE).value == SECRET
    assert browser.get("/jobs?status=failed").status_code == 200
    assert jobs_by_status(engine)["failed"] == 2  # nothing written by any of it


def test_a_short_or_padded_token_is_refused(engine: Engine) -> None:
    for bad in ("short", " " + SECRET):
        with pytest.raises(InvalidArgument, match="at least 16 characters"):
            create_app(engine, jobs=Job, token=bad)
    assert repr(TokenGate(SECRET)) == "TokenGate(<hidden>)"


def test_the_dashboard_without_an_outbox(engine: Engine) -> None:
    make_scene(engine)
    client = client_of(create_app(engine, jobs=Job, token=SECRET))
    html = client.get("/").get_data(as_text=True)
    assert "Parked outbox events" not in html and '<td id="count-failed">2</td>' in html
    with engine.connect() as conn:
        [[n]] = conn.execute(text(f"SELECT count(*) FROM {TEST_SCHEMA}.outbox")).all()
    assert n == 1 + 1


def test_the_library_and_its_cli_import_without_flask() -> None:
    code = (
        "import sys; import sa_outbox, sa_outbox.cli; "
        "assert 'flask' not in sys.modules, 'flask imported'; "
        "sa_outbox.cli.build_parser().parse_args(['dashboard', '--port', '9'])"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
