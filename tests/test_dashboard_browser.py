"""The dashboard in a real browser: Debian's chromium, driven by Selenium through
/usr/bin/chromedriver (no browser download), against a live server on a free port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sa_outbox import JobApp, JobQueue, Worker

from .conftest import Job, OutboxEvent
from .helpers import job_row, jobs_by_status

pytest.importorskip("flask", reason="the dashboard needs Flask (the test extra has it)")
pytest.importorskip("selenium", reason="the browser test needs Selenium (the test extra has it)")

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from werkzeug.serving import make_server

from sa_outbox.dashboard import create_app

ROOT = Path(__file__).resolve().parents[1]
#: Where the screenshot of the run is kept (a test artefact; docs/img holds a copy).
ARTEFACTS = ROOT / "tmp" / "artefacts"
TOKEN = "browser-test-token-0123456789"

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
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "dashboard-overview.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 0
    assert jobs_by_status(engine) == {"succeeded": 1}
