"""The dashboard in a real browser: Debian's chromium, driven by Selenium through
/usr/bin/chromedriver (no browser download), against a live server on a free port. The run
ends on the overview with half an hour of finished jobs and some running ones, and saves a
screenshot of it (docs/img/dashboard-overview.png is a copy)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sa_outbox import FakeClock, JobApp, JobQueue, Worker
from sa_outbox.statements import NewJob

from .conftest import Job, OutboxEvent
from .helpers import job_row, jobs_by_status
from .helpers_admin import database_now, finish_at
from .test_dependencies import JobDependency, dag_app, deps_table
from .test_steps import JobStep, steps_table

pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")
pytest.importorskip("selenium", reason="the browser test needs Selenium (the test extra has it)")

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait
from werkzeug.serving import make_server

from sa_outbox.dashboard import create_app
from sa_outbox.dashboard._overview_page import CHART_MINUTES

ROOT = Path(__file__).resolve().parents[1]
#: Where the screenshot of the run is kept (a test artefact; docs/img holds a copy).
ARTEFACTS = ROOT / "tmp" / "artefacts"
TOKEN = "browser-test-token-0123456789"
__all__ = ["deps_table", "steps_table"]  # fixtures, used below by name

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(
            "needs Debian's chromium and chromium-driver "
            "(apt-get install -y chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(10)  # waits for elements, never a fixed sleep
    yield driver
    driver.quit()


@pytest.fixture
def live_url(engine: Engine) -> Iterator[str]:
    server = make_server(
        "127.0.0.1", 0, create_app(engine, jobs=Job, outbox=OutboxEvent, token=TOKEN)
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


def test_see_a_failed_job_and_retry_it_in_a_browser(
    engine: Engine, live_url: str, browser: webdriver.Chrome
) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue(conn, "send-email", {"to": "ana@example.com"}, max_attempts=1)
    with engine.begin() as conn:
        [job] = queue.claim(conn, worker_id="w", batch=1)
        queue.fail(conn, job.id, job.lease_token, error="SMTPError: 550 <b>refused</b>")
    assert jobs_by_status(engine) == {"failed": 1}

    browser.get(live_url + "/")  # no token yet: refused
    assert "not authorised" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(f"{live_url}/?token={TOKEN}")  # the address the command prints
    assert browser.current_url == f"{live_url}/"  # the token left the address bar
    assert browser.find_element(By.ID, "count-failed").text == "1"
    browser.find_element(By.LINK_TEXT, "Failed jobs").click()
    row = browser.find_element(By.CSS_SELECTOR, f'tr.job[data-id="{job.id}"]')
    assert row.find_element(By.CSS_SELECTOR, "td.status").text == "failed"
    assert "SMTPError: 550 <b>refused</b>" in row.text  # shown as text, not markup

    # The same button with the form's CSRF field taken out: the POST is refused.
    browser.execute_script(
        "document.querySelectorAll('input[name=csrf_token]').forEach(e => e.remove())"
    )
    row.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # The refusal is a new page: wait for it to replace this one. The body's text is read by
    # a script, not through an element handle, which the navigation may detach between
    # finding it and reading it (chromium then reports a node "not in the document").
    refused = WebDriverWait(browser, 30)
    refused.until(lambda b: "CSRF token is missing or wrong" in _body_text(b))
    assert jobs_by_status(engine) == {"failed": 1}

    browser.get(f"{live_url}/jobs?status=failed")
    row = browser.find_element(By.CSS_SELECTOR, f'tr.job[data-id="{job.id}"]')
    row.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    status = browser.find_element(By.ID, "col-status")
    assert status.text == "pending"
    assert browser.current_url == f"{live_url}/jobs/{job.id}"
    assert str(job_row(engine, job.id).status) == "pending"
    assert jobs_by_status(engine) == {"pending": 1}

    # A worker runs it; the page, reloaded, says it succeeded.
    app = JobApp(Job)
    app.register("send-email", lambda job: None)
    worker = Worker(app, engine, listen=False, install_signal_handlers=False)
    try:
        assert worker.drain(timeout=60) == 1
    finally:
        worker.close()
    browser.refresh()
    assert browser.find_element(By.ID, "col-status").text == "succeeded"
    browser.get(f"{live_url}/")
    assert browser.find_element(By.ID, "count-succeeded").text == "1"
    assert jobs_by_status(engine) == {"succeeded": 1}

    # Half an hour of work, and jobs running now, for the chart, the list and the screenshot.
    finished = busy_half_hour(engine)
    running = jobs_running_now(engine)
    browser.set_window_size(1280, 1000)
    browser.refresh()
    chart = browser.find_element(By.ID, "throughput-chart")
    assert chart.is_displayed()
    assert len(chart.find_elements(By.CSS_SELECTOR, "g.minute")) == CHART_MINUTES
    bars = len(chart.find_elements(By.CSS_SELECTOR, "rect.succeeded"))
    numbers = browser.find_elements(By.CSS_SELECTOR, "#throughput-table td:nth-child(2)")
    assert bars == len([n for n in numbers if n.get_attribute("textContent") != "0"])
    assert len(numbers) == CHART_MINUTES and len(finished) <= bars <= len(finished) + 1
    shown = browser.find_element(By.ID, "throughput-succeeded").text
    assert shown == str(sum(ok for ok, _ in finished.values()) + 1)  # the retried job, too
    assert browser.find_element(By.ID, "throughput-failed").text == str(
        sum(bad for _, bad in finished.values())
    )
    listed = browser.find_element(By.ID, "running-jobs")
    assert listed.is_displayed()
    rows = listed.find_elements(By.CSS_SELECTOR, "tr.running-job")
    assert [row.get_attribute("data-id") for row in rows] == [str(i) for i in running]
    assert "expired" in (rows[0].get_attribute("class") or "")  # the expired lease leads, flagged
    assert rows[0].find_element(By.CSS_SELECTOR, "td.lease-left").text.startswith("expired ")
    rows[1].find_element(By.TAG_NAME, "a").click()  # a running job's detail
    assert browser.find_element(By.ID, "col-status").text == "running"
    assert browser.current_url == f"{live_url}/jobs/{running[1]}"
    browser.back()

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "dashboard-overview.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 0
    counts = jobs_by_status(engine)
    assert counts["running"] == len(running)
    assert counts["succeeded"] == 1 + sum(ok for ok, _ in finished.values())


def busy_half_hour(engine: Engine) -> dict[int, tuple[int, int]]:
    """Jobs finished in each of the last 28 minutes (``minutes ago -> (succeeded,
    failed)``), a few more at some minutes, a failure now and then. 28, not 30: a minute
    that turns before the page is read leaves them all in the chart."""
    now = database_now(engine)
    finished = {}
    for ago in range(1, 29):
        ok, bad = 6 + (ago * 7) % 11, (1 if ago % 5 == 0 else 0) + (3 if ago == 12 else 0)
        finish_at(
            engine, now - dt.timedelta(minutes=ago), succeeded=ok, failed=bad, kind="send-email"
        )
        finished[ago] = (ok, bad)
    return finished


def jobs_running_now(engine: Engine) -> list[uuid.UUID]:
    """One job whose worker vanished (its lease ran out minutes ago) and three held by live
    workers; their ids in the order the overview lists them, the soonest lease end first."""
    gone = JobQueue(Job, clock=FakeClock(database_now(engine) - dt.timedelta(minutes=8)))
    with engine.begin() as conn:
        gone.enqueue(conn, "resize-image", {"n": 0})
        [lost] = gone.claim(conn, worker_id="web-2:4107", batch=1, lease=60)
    queue = JobQueue(Job)
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob("resize-image", {"n": n}) for n in range(1, 4)])
    held = []
    for n, worker in enumerate(("web-1:3312", "web-1:3312", "web-3:998")):
        with engine.begin() as conn:
            [job] = queue.claim(conn, worker_id=worker, batch=1, lease=120 * (n + 1))
            held.append(job.id)
    return [lost.id, *held]


def _body_text(browser: webdriver.Chrome) -> str:
    text = browser.execute_script("return document.body ? document.body.innerText : ''")
    return str(text)


def test_a_failed_workflow_retried_from_its_page_in_a_browser(
    engine: Engine, browser: webdriver.Chrome, deps_table: None
) -> None:
    """A diamond whose first job failed: the workflow page shows the others cancelled under
    it; its retry button requeues it and makes them wait again; a worker finishes all."""
    queue = JobQueue(Job, steps=JobStep, dependencies=JobDependency)
    with engine.begin() as conn:
        a = queue.enqueue(conn, "node", {"name": "a"}).id
        b = queue.enqueue(conn, "node", {"name": "b"}, after=[a]).id
        d = queue.enqueue(conn, "node", {"name": "d"}, after=[b]).id
    app = create_app(engine, jobs=Job, steps=JobStep, dependencies=JobDependency, token=TOKEN)
    server = make_server("127.0.0.1", 0, app)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    live = f"http://127.0.0.1:{server.server_port}"
    try:
        worker = Worker(dag_app([], failing={"a"}), engine, listen=False)
        try:
            worker.drain(timeout=60)
        finally:
            worker.close()
        assert jobs_by_status(engine) == {"failed": 1, "cancelled": 2}
        browser.get(f"{live}/?token={TOKEN}")
        browser.find_element(By.LINK_TEXT, "Workflows").click()
        browser.find_element(By.CSS_SELECTOR, f'tr.workflow[data-id="{a}"] a').click()
        assert browser.current_url == f"{live}/workflows/{a}"
        statuses = {
            row.get_attribute("data-id"): row.find_element(By.CSS_SELECTOR, "td.status").text
            for row in browser.find_elements(By.CSS_SELECTOR, "tr.member")
        }
        assert statuses == {str(a): "failed", str(b): "cancelled", str(d): "cancelled"}
        browser.find_element(By.XPATH, "//button[starts-with(., 'retry what failed')]").click()
        WebDriverWait(browser, 30).until(
            lambda br: "pending" in _body_text(br) and "waiting" in _body_text(br)
        )
        assert job_row(engine, a).status == "pending"
        worker = Worker(dag_app([]), engine, listen=False)
        try:
            assert worker.drain(timeout=60) == 3
        finally:
            worker.close()
        browser.refresh()
        cells = browser.find_elements(By.CSS_SELECTOR, "tr.member td.status")
        assert [cell.text for cell in cells] == ["succeeded"] * 3
        assert jobs_by_status(engine) == {"succeeded": 3}
    finally:
        server.shutdown()
        thread.join()
