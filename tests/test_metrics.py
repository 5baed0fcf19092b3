"""Prometheus metrics and outcome log lines from a real `Worker` on real PostgreSQL.

The worker runs on a `FakeClock` (SQL clock and timer) and is driven with ``drain``; the
metrics are scraped over real HTTP from `serve_metrics`, and the gauges of
`QueueStatusCollector` are compared with the table. Every test counts the jobs at the end.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from sa_outbox import (
    Backoff,
    FakeClock,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    PermanentError,
    Snooze,
    Worker,
)
from sa_outbox.metrics import JsonFormatter, PrometheusMetrics, QueueStatusCollector, serve_metrics

from .conftest import Job
from .helpers import jobs_by_status

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NO_JITTER = Backoff(base=1, max=300, jitter=0)
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def outcomes_app() -> JobApp:
    app = JobApp(Job, backoff=NO_JITTER)
    app.register("ok", lambda job: None)

    @app.handler("flaky")
    def flaky(job: JobContext) -> None:
        raise ConnectionError("the API is down\nsecond line")

    @app.handler("bad")
    def bad(job: JobContext) -> None:
        raise PermanentError("no such customer")

    @app.handler("later")
    def later(job: JobContext) -> Snooze:
        return Snooze(60)

    return app


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def worker(engine: Engine, clock: FakeClock) -> Iterator[Any]:
    made: list[Worker] = []

    def make(app: JobApp, **options: Any) -> Worker:
        w = Worker(
            app,
            engine,
            clock=clock,
            timer=lambda: clock.now().timestamp(),
            listen=False,
            install_signal_handlers=False,
            **options,
        )
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def enqueue_outcomes(engine: Engine, clock: FakeClock) -> None:
    queue = JobQueue(Job, clock=clock)
    with engine.begin() as conn:
        queue.enqueue_many(
            conn,
            [
                NewJob("ok", {}, queue="mail"),
                NewJob("ok", {}, queue="mail"),
                NewJob("flaky", {}, max_attempts=3),
                NewJob("bad", {}),
                NewJob("later", {}),
            ],
        )


def test_scraped_metrics_count_each_outcome_and_the_gauges_match_the_table(
    engine: Engine, clock: FakeClock, worker: Any
) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    QueueStatusCollector(engine, jobs=Job).register(registry)
    port = free_port()
    stop = serve_metrics(port, "127.0.0.1", registry)
    try:
        enqueue_outcomes(engine, clock)
        assert worker(outcomes_app(), metrics=metrics).drain(timeout=30) == 5
        found = scrape(port)
    finally:
        stop()

    def jobs(queue: str, kind: str, outcome: str) -> float:
        key = (("kind", kind), ("outcome", outcome), ("queue", queue))
        return found.get(("sa_outbox_jobs_total", key), 0.0)

    assert jobs("mail", "ok", "succeeded") == 2
    assert jobs("default", "flaky", "retried") == 1
    assert jobs("default", "bad", "failed") == 1
    assert jobs("default", "later", "snoozed") == 1
    assert found[("sa_outbox_jobs_claimed_total", (("kind", "ok"), ("queue", "mail")))] == 2
    ok = (("kind", "ok"), ("outcome", "succeeded"), ("queue", "mail"))
    assert found[("sa_outbox_job_duration_seconds_count", ok)] == 2
    delay = (("kind", "ok"), ("queue", "mail"))
    assert found[("sa_outbox_job_start_delay_seconds_count", delay)] == 2

    table = jobs_by_status(engine)
    assert table == {"succeeded": 2, "pending": 2, "failed": 1}
    gauges: dict[str, float] = {}
    for (name, labels), value in found.items():
        if name == "sa_outbox_jobs_in_status":
            status = dict(labels)["status"]
            gauges[status] = gauges.get(status, 0) + value
    assert gauges == table
    # The retried job is ready at T0 + 1 s, the snoozed one later: nothing is ready yet.
    assert found[("sa_outbox_oldest_ready_job_age_seconds", ())] == 0
    assert found[("sa_outbox_expired_leases", ())] == 0


def test_each_outcome_logs_one_json_line_with_the_jobs_fields(
    engine: Engine, clock: FakeClock, worker: Any
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("sa_outbox.worker")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        enqueue_outcomes(engine, clock)
        assert worker(outcomes_app()).drain(timeout=30) == 5
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    settled = [line for line in lines if "outcome" in line]
    assert sorted((line["kind"], line["outcome"]) for line in settled) == [
        ("bad", "failed"),
        ("flaky", "retried"),
        ("later", "snoozed"),
        ("ok", "succeeded"),
        ("ok", "succeeded"),
    ]
    with engine.connect() as conn:
        rows = {str(r.id): r for r in conn.execute(Job.__table__.select())}
    for line in settled:
        row = rows[line["job_id"]]
        assert (line["kind"], line["queue"], line["attempt"]) == (row.kind, row.queue, 1)
        assert line["lease_token"] and isinstance(line["duration"], float)
        assert line["logger"] == "sa_outbox.worker" and line["level"] in {"INFO", "WARNING"}
    errors = {line["kind"]: line["error"] for line in settled}
    assert errors["flaky"] == "ConnectionError: the API is down"
    assert errors["bad"].endswith("PermanentError: no such customer")
    assert errors["ok"] is None
    assert jobs_by_status(engine) == {"succeeded": 2, "pending": 2, "failed": 1}


def test_the_worker_cli_serves_metrics_and_logs_json(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "metrics_app.py").write_text(
        "from sqlalchemy.orm import DeclarativeBase\n"
        "from sa_outbox import JobApp, JobMixin\n"
        "class Base(DeclarativeBase):\n"
        "    pass\n"
        "class Job(JobMixin, Base):\n"
        "    __tablename__ = 'jobs'\n"
        f"    __table_schema__ = {Job.__table__.schema!r}\n"
        "app = JobApp(Job)\n"
        "app.register('ok', lambda job: None)\n"
    )
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("ok", {}) for _ in range(3)])
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env["SA_OUTBOX_DATABASE_URL"] = database_url
    log = tmp_path / "worker.log"
    argv = ["worker", "metrics_app:app", "--metrics-port", str(port), "--log-format", "json"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sa_outbox", *argv], cwd=tmp_path, env=env, stderr=out
        )
    key = ("sa_outbox_jobs_total", (("kind", "ok"), ("outcome", "succeeded"), ("queue", "default")))
    found: dict[Any, float] = {}
    try:
        deadline = time.monotonic() + 60
        while found.get(key) != 3:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no metrics in 60 s: {found}\n{log.read_text()}"
            try:
                found = scrape(port)
            except OSError:
                time.sleep(0.1)  # not listening yet: poll again
    finally:
        process.terminate()
        process.wait(30)
    assert (
        found[
            (
                "sa_outbox_jobs_in_status",
                (("kind", "ok"), ("queue", "default"), ("status", "succeeded")),
            )
        ]
        == 3
    )
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["outcome"] for line in lines if "outcome" in line] == ["succeeded"] * 3
    assert jobs_by_status(engine) == {"succeeded": 3}


def test_without_prometheus_client_the_library_imports_and_metrics_name_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "import sa_outbox, sa_outbox.cli\n"
        "from sa_outbox.metrics import JsonFormatter, MetricsUnavailable, PrometheusMetrics\n"
        "try:\n"
        "    PrometheusMetrics()\n"
        "except MetricsUnavailable as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == (
        'Prometheus metrics need prometheus_client: pip install "sa-outbox[prometheus]"'
    )
