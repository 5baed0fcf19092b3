"""Relay metrics on real PostgreSQL: `RelayMetrics` hooks called by `Relay` / `AsyncRelay`,
`PrometheusRelayMetrics` and the outbox gauges scraped over real HTTP, and
``sa-outbox relay --metrics-port`` as a real process publishing to a real Redis.

In-process relays publish through `CallablePublisher` on a `FakeClock` and are driven with
``run_once``; nothing sleeps to synchronise. Every test counts the events at the end.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import Backoff, FakeClock, InvalidArgumentType, Outbox
from sa_outbox.metrics import PrometheusRelayMetrics, QueueStatusCollector, serve_metrics
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.queue import ClaimedEvent
from sa_outbox.relay import (
    AsyncRelay,
    CountingRelayMetrics,
    PublisherUnavailable,
    PublishOutcome,
    Relay,
    RelayMetrics,
    RelayReport,
)

from .brokers import REDIS, require
from .conftest import TEST_SCHEMA, OutboxEvent
from .test_metrics import free_port, scrape
from .test_relay import append, counts

ROOT = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


class Broker:
    """An in-process broker: refuses the event types in ``refuse``, or is ``down``."""

    def __init__(self) -> None:
        self.refuse: set[str] = set()
        self.down = False
        self.taken: list[ClaimedEvent] = []

    def __call__(self, event: ClaimedEvent) -> None:
        if self.down:
            raise PublisherUnavailable("connection refused")
        if event.event_type in self.refuse:
            raise ValueError(f"{event.event_type} refused")
        self.taken.append(event)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def make_relay(engine: Engine, clock: FakeClock) -> Iterator[Callable[..., Relay]]:
    relays: list[Relay] = []

    def make(publisher: Any, **options: Any) -> Relay:
        options.setdefault("backoff", Backoff(base=10, max=10, jitter=0))
        relay = Relay(engine, OutboxEvent, publisher, clock=clock, listen=False, **options)
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.close()


def drain(relay: Relay) -> None:
    while not relay.run_once().idle:
        pass


def test_scraped_relay_metrics_count_each_fate_and_the_gauges_match_the_table(
    engine: Engine, clock: FakeClock, make_relay: Callable[..., Relay]
) -> None:
    outbox = Outbox(OutboxEvent, clock=clock)
    append(engine, outbox, [("1", "OrderPlaced"), ("2", "OrderPlaced"), ("3", "OrderPaid")])
    append(engine, outbox, [("4", "Poison"), ("5", "OrderPlaced")])
    append(engine, outbox, [("6", "Waiting")])  # claimed later: stays in the backlog
    broker = Broker()
    broker.refuse.add("Poison")
    registry = CollectorRegistry()
    relay = make_relay(
        CallablePublisher(broker),
        metrics=PrometheusRelayMetrics(registry),
        max_attempts=2,
        batch=5,
    )
    QueueStatusCollector(engine, outbox=OutboxEvent).register(registry)
    port = free_port()
    stop = serve_metrics(port, "127.0.0.1", registry)
    try:
        first = relay.run_once()  # 5 events: 4 taken, the poison refused (attempt 1 of 2)
        clock.advance(10)
        second = relay.run_once()  # the poison again (parked) and the waiting event
        found = scrape(port)
    finally:
        stop()

    assert (first.claimed, first.published, first.rejected) == (5, 4, 1)
    assert (second.rejected, second.parked, second.published) == (1, 1, 1)

    def value(name: str, **labels: str) -> float:
        return found.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("sa_outbox_events_published_total", event_type="OrderPlaced") == 3
    assert value("sa_outbox_events_published_total", event_type="OrderPaid") == 1
    assert value("sa_outbox_events_published_total", event_type="Waiting") == 1
    assert value("sa_outbox_event_publish_failures_total", event_type="Poison") == 2
    assert value("sa_outbox_events_parked_total", event_type="Poison") == 1
    assert value("sa_outbox_events_parked_total", event_type="OrderPlaced") == 0
    assert value("sa_outbox_relay_batch_size_count") == 2
    assert value("sa_outbox_relay_batch_size_sum") == 7
    lags = value("sa_outbox_relay_claim_to_publish_seconds_count", event_type="OrderPlaced")
    assert lags == 3
    # One call of the publisher per cycle (one wave: one event per aggregate), each of
    # which the broker answered with a rejection of the poison.
    assert value("sa_outbox_relay_publish_duration_seconds_count", outcome="rejected") == 2
    assert value("sa_outbox_relay_publish_duration_seconds_count", outcome="published") == 0
    assert value("sa_outbox_relay_backlog") == 0
    assert value("sa_outbox_outbox_parked") == 1
    assert counts(engine) == {"published": 5, "parked": 1, "pending": 0}


def test_a_broker_down_is_counted_unavailable_and_every_event_released(
    engine: Engine, clock: FakeClock, make_relay: Callable[..., Relay]
) -> None:
    outbox = Outbox(OutboxEvent, clock=clock)
    append(engine, outbox, [("1", "A"), ("2", "B"), ("1", "C")])
    broker = Broker()
    broker.down = True
    metrics = CountingRelayMetrics()
    relay = make_relay(CallablePublisher(broker), metrics=metrics)
    report = relay.run_once()
    assert report.unavailable == "connection refused"
    assert metrics.publishes == {PublishOutcome.UNAVAILABLE: 1}
    assert metrics.totals["claimed"] == 3 and metrics.totals["released"] == 3
    assert not metrics.published and not metrics.rejected
    broker.down = False
    drain(relay)
    assert metrics.published == {"A": 1, "B": 1, "C": 1}
    assert len(metrics.lags) == 3 and all(lag >= 0 for lag in metrics.lags)
    assert counts(engine) == {"published": 3, "parked": 0, "pending": 0}


def test_an_idle_claim_reports_nothing(engine: Engine, make_relay: Callable[..., Relay]) -> None:
    metrics = CountingRelayMetrics()
    relay = make_relay(CallablePublisher(Broker()), metrics=metrics)
    assert relay.run_once().idle
    assert metrics.totals == {} and metrics.publishes == {}
    assert counts(engine) == {"published": 0, "parked": 0, "pending": 0}


class Exploding(RelayMetrics):
    def __init__(self) -> None:
        self.cycles = 0

    def event_published(self, event: ClaimedEvent, lag: float) -> None:
        raise RuntimeError("the exporter broke")

    def cycle_finished(self, report: RelayReport, seconds: float) -> None:
        self.cycles += 1


def test_a_hook_that_raises_is_logged_and_the_events_still_published(
    engine: Engine,
    clock: FakeClock,
    make_relay: Callable[..., Relay],
    caplog: pytest.LogCaptureFixture,
) -> None:
    append(engine, Outbox(OutboxEvent, clock=clock), [("1", "A"), ("2", "B")])
    metrics = Exploding()
    relay = make_relay(CallablePublisher(Broker()), metrics=metrics)
    with caplog.at_level(logging.ERROR, logger="sa_outbox.relay"):
        assert relay.run_once().published == 2
    assert metrics.cycles == 1
    assert sum("event_published raised" in r.getMessage() for r in caplog.records) == 2
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 0}


def test_metrics_of_the_wrong_type_are_refused_before_anything_runs(engine: Engine) -> None:
    with pytest.raises(InvalidArgumentType, match="metrics must be a RelayMetrics"):
        Relay(engine, OutboxEvent, CallablePublisher(Broker()), metrics=object())  # type: ignore[arg-type]
    assert counts(engine) == {"published": 0, "parked": 0, "pending": 0}


async def test_the_async_relay_calls_the_same_hooks(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock
) -> None:
    outbox = Outbox(OutboxEvent, clock=clock)
    append(engine, outbox, [("1", "A"), ("2", "Poison"), ("1", "A")])
    broker = Broker()
    broker.refuse.add("Poison")
    metrics = CountingRelayMetrics()
    relay = AsyncRelay(
        async_engine,
        OutboxEvent,
        CallablePublisher(broker),
        clock=clock,
        listen=False,
        max_attempts=1,
        metrics=metrics,
    )
    try:
        report = await relay.run_once()
    finally:
        await relay.aclose()
    assert (report.published, report.parked) == (2, 1)
    assert metrics.published == {"A": 2}
    assert metrics.rejected == {"Poison": 1} and metrics.parked == {"Poison": 1}
    assert metrics.totals["claimed"] == 3 and metrics.totals["cycles"] == 1
    assert counts(engine) == {"published": 2, "parked": 1, "pending": 0}


@pytest.fixture
def redis_stream() -> Iterator[tuple[Any, str]]:
    require("Redis", REDIS, "redis")
    import redis

    client = redis.Redis.from_url(f"redis://{REDIS}/0", decode_responses=True)
    stream = f"sa_outbox_test_{uuid.uuid4().hex[:12]}"
    try:
        yield client, stream
    finally:
        client.delete(stream)
        client.close()


def test_the_relay_cli_serves_metrics_while_publishing_to_redis(
    engine: Engine, database_url: str, redis_stream: tuple[Any, str], tmp_path: Path
) -> None:
    client, stream = redis_stream
    append(engine, Outbox(OutboxEvent), [(str(n % 3), "OrderPlaced") for n in range(6)])
    port = free_port()
    env = {
        **os.environ,
        "SA_OUTBOX_TEST_DATABASE_URL": database_url,
        "RELAY_APP_SCHEMA": TEST_SCHEMA,
        "RELAY_APP_STREAM": stream,
        "RELAY_APP_NAME": "metrics",
    }
    log = tmp_path / "relay.log"
    argv = ["relay", "tests.relay_app:relay", "--metrics-port", str(port)]
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "sa_outbox", *argv], cwd=ROOT, env=env, stderr=err
        )
    key = ("sa_outbox_events_published_total", (("event_type", "OrderPlaced"),))
    found: dict[Any, float] = {}
    try:
        deadline = time.monotonic() + 60
        while found.get(key) != 6 or found.get(("sa_outbox_relay_backlog", ())) != 0:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no metrics in 60 s: {found}\n{log.read_text()}"
            try:
                found = scrape(port)
            except OSError:
                time.sleep(0.1)  # not listening yet: poll again
    finally:
        process.terminate()
        process.wait(30)
    assert process.returncode == 0, log.read_text()
    assert found[("sa_outbox_outbox_parked", ())] == 0
    assert found[("sa_outbox_relay_batch_size_sum", ())] == 6
    assert client.xlen(stream) == 6
    assert counts(engine) == {"published": 6, "parked": 0, "pending": 0}


def test_the_relay_cli_refuses_a_port_in_use_in_one_line(
    engine: Engine, database_url: str, redis_stream: tuple[Any, str]
) -> None:
    _, stream = redis_stream
    append(engine, Outbox(OutboxEvent), [("1", "E")])
    env = {
        **os.environ,
        "SA_OUTBOX_TEST_DATABASE_URL": database_url,
        "RELAY_APP_SCHEMA": TEST_SCHEMA,
        "RELAY_APP_STREAM": stream,
    }
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["relay", "tests.relay_app:relay", "--metrics-port", str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "sa_outbox", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"sa-outbox relay: error: --metrics-port {port}: ")
    assert done.stderr.count("\n") == 1
    assert counts(engine) == {"published": 0, "parked": 0, "pending": 1}


def test_the_relay_cli_serves_metrics_for_an_async_relay(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "async_relay_app.py").write_text(
        "from sqlalchemy.ext.asyncio import AsyncEngine\n"
        "from sqlalchemy.orm import DeclarativeBase\n"
        "from sa_outbox import OutboxMixin\n"
        "from sa_outbox.publishers.callable import CallablePublisher\n"
        "from sa_outbox.relay import AsyncRelay\n"
        "class Base(DeclarativeBase):\n"
        "    pass\n"
        "class OutboxEvent(OutboxMixin, Base):\n"
        "    __tablename__ = 'outbox'\n"
        f"    __table_schema__ = {TEST_SCHEMA!r}\n"
        "def make_relay(engine: AsyncEngine) -> AsyncRelay:\n"
        "    return AsyncRelay(engine, OutboxEvent, CallablePublisher(lambda event: None))\n"
    )
    append(engine, Outbox(OutboxEvent), [("1", "Paid"), ("2", "Paid")])
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env["SA_OUTBOX_DATABASE_URL"] = database_url
    log = tmp_path / "relay.log"
    argv = ["relay", "async_relay_app:make_relay", "--metrics-port", str(port)]
    with log.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "sa_outbox", *argv], cwd=tmp_path, env=env, stderr=err
        )
    key = ("sa_outbox_events_published_total", (("event_type", "Paid"),))
    found: dict[Any, float] = {}
    try:
        deadline = time.monotonic() + 60
        while found.get(key) != 2 or found.get(("sa_outbox_relay_backlog", ())) != 0:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no metrics in 60 s: {found}\n{log.read_text()}"
            try:
                found = scrape(port)
            except OSError:
                time.sleep(0.1)  # not listening yet: poll again
    finally:
        process.terminate()
        process.wait(30)
    assert process.returncode == 0, log.read_text()
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 0}
