"""`KafkaPublisher` against a real Kafka-protocol broker (tests/kafka.py), on a real PostgreSQL.

A relay publishes a real outbox table and a consumer reads the topic back: each key (the
aggregate id) in commit order, nothing lost, nothing twice. The broker down (its proxy cut)
keeps every event unpublished with no attempt counted, and they go out once it is back; a
producer with no broker at all reports the batch unavailable. A relay process killed with
SIGKILL between publish and mark is replaced by one that re-publishes: every event present,
at least once, each key still in order. Bad config is refused with errors naming it.
"""

from __future__ import annotations

import collections
import datetime as dt
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import Backoff, FakeClock, InvalidArgument, InvalidArgumentType, Outbox
from sa_outbox.relay import AsyncRelay

from .conftest import TEST_SCHEMA, OutboxEvent
from .helpers import event_rows
from .kafka import WAIT, KafkaBroker, consume, run_broker, start_relay
from .test_relay_processes import read_line

kafka_module = pytest.importorskip("sa_outbox.publishers.kafka", reason="confluent-kafka is absent")
KafkaPublisher = kafka_module.KafkaPublisher


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    yield from run_broker(tmp_path_factory)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> Iterator[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"sa_outbox_test_{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.address})
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(WAIT)
    yield name
    admin.delete_topics([name])[name].result(WAIT)


def append(engine: Engine, events: list[tuple[str, int]]) -> dict[str, list[str]]:
    """Append (aggregate_id, n) events in one transaction; each aggregate's ids in order."""
    outbox = Outbox(OutboxEvent)
    expected: dict[str, list[str]] = collections.defaultdict(list)
    with engine.begin() as conn:
        for aggregate, n in events:
            event_id = outbox.append(
                conn,
                event_type="Changed",
                aggregate_type="order",
                aggregate_id=aggregate,
                payload={"n": n},
                headers={"traceparent": f"00-{uuid.uuid4().hex}-{'0' * 15}1-01"},
            )
            expected[aggregate].append(str(event_id))
    return expected


def counts(engine: Engine) -> tuple[int, int]:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        published, pending = conn.execute(
            select(
                func.count().filter(t.c.published_at.is_not(None)),
                func.count().filter(t.c.published_at.is_(None)),
            )
        ).one()
    return published, pending


def relay_for(async_engine: AsyncEngine, publisher: Any, clock: FakeClock) -> AsyncRelay:
    return AsyncRelay(
        async_engine,
        OutboxEvent,
        publisher,
        clock=clock,
        lease=30,
        backoff=Backoff(base=5, max=5, jitter=0),
        max_attempts=2,
    )


def by_key(records: list[tuple[str, str, dict[str, str]]]) -> dict[str, list[str]]:
    """Each key's ids in the order the topic holds them, first sightings only (as a
    de-duplicating consumer sees them)."""
    seen: set[str] = set()
    result: dict[str, list[str]] = collections.defaultdict(list)
    for key, event_id, _headers in records:
        if event_id not in seen:
            seen.add(event_id)
            result[key].append(event_id)
    return dict(result)


async def test_relay_publishes_each_key_in_order_nothing_lost_nothing_twice(
    engine: Engine,
    async_engine: AsyncEngine,
    clock: FakeClock,
    kafka_broker: KafkaBroker,
    topic: str,
) -> None:
    expected = append(engine, [(f"agg-{i % 7}", i) for i in range(60)])
    publisher = KafkaPublisher(kafka_broker.address, topic=topic, publish_timeout=20)
    async with relay_for(async_engine, publisher, clock) as relay:
        total = 0
        while (report := await relay.run_once()).claimed:
            assert report.unavailable is None and report.rejected == 0
            total += report.published
    assert total == 60 and counts(engine) == (60, 0)

    records = consume(kafka_broker.address, topic, 60)
    assert len(records) == 60  # no duplicates
    assert by_key(records) == expected  # every key, in commit order, complete
    first = records[0][2]
    assert first["outbox-aggregate-id"] == records[0][0]
    assert first["traceparent"].startswith("00-") and first["outbox-event-type"] == "Changed"


# The cut leaves a socket of TcpProxy's (tests/brokers.py) to the garbage collector now and
# then, which pytest reports as an unraisable ResourceWarning in whatever test runs then.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_broker_down_keeps_events_then_publishes_them_once_back(
    engine: Engine,
    async_engine: AsyncEngine,
    clock: FakeClock,
    kafka_broker: KafkaBroker,
    topic: str,
) -> None:
    if kafka_broker.proxy is None:
        pytest.skip("an external broker (SA_OUTBOX_TEST_KAFKA) cannot be cut")
    expected = append(engine, [(f"agg-{i}", i) for i in range(5)])
    publisher = KafkaPublisher(kafka_broker.address, topic=topic, publish_timeout=2)
    async with relay_for(async_engine, publisher, clock) as relay:
        kafka_broker.proxy.stop()
        try:
            for _ in range(3):  # past max_attempts=2: an outage counts no attempt
                report = await relay.run_once()
                assert report.unavailable is not None and report.published == 0
                rows = event_rows(engine)
                assert all(r.attempts == 0 and r.published_at is None for r in rows)
                assert all(r.parked_at is None and r.last_error for r in rows)
                clock.advance(dt.timedelta(seconds=10))
        finally:
            kafka_broker.proxy.start()
        published = 0
        while (report := await relay.run_once()).claimed:  # the broker is back
            published += report.published
            clock.advance(dt.timedelta(seconds=10))
    assert published == 5 and counts(engine) == (5, 0)
    records = consume(kafka_broker.address, topic, 5)
    # Records that timed out while the broker was cut may have reached it after all:
    # at least once, each key in order.
    assert by_key(records) == expected


async def test_no_broker_at_all_leaves_the_batch_unpublished(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock
) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    append(engine, [("a", 1), ("b", 2)])
    publisher = KafkaPublisher(f"127.0.0.1:{port}", topic="nowhere", publish_timeout=1)
    async with relay_for(async_engine, publisher, clock) as relay:
        report = await relay.run_once()
    assert report.unavailable is not None and "Kafka" in report.unavailable
    assert report.published == 0 and counts(engine) == (0, 2)
    assert all(r.attempts == 0 and r.parked_at is None for r in event_rows(engine))


def test_relay_killed_between_publish_and_mark_republishes_in_order(
    engine: Engine, database_url: str, kafka_broker: KafkaBroker, topic: str
) -> None:
    expected = append(engine, [(f"agg-{i % 3}", i) for i in range(9)])
    doomed = start_relay(database_url, TEST_SCHEMA, kafka_broker.address, topic)
    try:
        line = read_line(doomed, WAIT)
        assert line.split()[0] == "published"
        first_batch = line.split()[1:]
        assert len(first_batch) == 3  # one event per aggregate in a batch
    finally:
        doomed.send_signal(signal.SIGKILL)  # after Kafka acknowledged, before the mark
        doomed.communicate(timeout=WAIT)
    assert doomed.returncode == -signal.SIGKILL
    assert counts(engine) == (0, 9)  # Kafka has three; the outbox does not know it

    from sa_outbox.relay import Relay

    later = FakeClock(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))  # the lease ran out
    publisher = KafkaPublisher(kafka_broker.address, topic=topic, publish_timeout=20)
    with Relay(engine, OutboxEvent, publisher, clock=later) as survivor:
        total = 0
        while (report := survivor.run_once()).claimed:
            total += report.published
    assert total == 9 and counts(engine) == (9, 0)

    records = consume(kafka_broker.address, topic, 12)
    ids = collections.Counter(event_id for _key, event_id, _headers in records)
    assert set(ids) == {i for ids in expected.values() for i in ids}  # every event present
    assert {i for i, n in ids.items() if n == 2} == set(first_batch)  # those three twice
    assert len(records) == 12
    assert by_key(records) == expected  # each key still in commit order


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"bootstrap_servers": ""}, InvalidArgument, "bootstrap_servers must be a non-empty"),
        ({"bootstrap_servers": 9092}, InvalidArgument, "got 9092"),
        ({"config": {"acks": 1}}, InvalidArgument, "acks=1 would break"),
        ({"config": {"enable.idempotence": False}}, InvalidArgument, "enable.idempotence=False"),
        ({"config": {"message.timeout.ms": 5}}, InvalidArgument, "publish_timeout="),
        ({"config": {"no.such.setting": 1}}, InvalidArgument, "no.such.setting"),
        ({"config": ["acks"]}, InvalidArgumentType, "config must be a mapping"),
        ({"topic": 3}, InvalidArgumentType, "topic must be a str or a function"),
        ({"topic": ""}, InvalidArgument, "topic must not be empty"),
        ({"key": "id"}, InvalidArgumentType, "key must be a function"),
        ({"publish_timeout": 0}, InvalidArgument, "publish_timeout must be a positive"),
    ],
)
def test_bad_config_is_refused_naming_it(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace(".", r"\.")):
        KafkaPublisher(**kwargs)


def test_the_docs_kafka_snippet_publishes(
    engine: Engine, kafka_broker: KafkaBroker, topic: str
) -> None:
    from sa_outbox.relay import Relay

    doc = (Path(__file__).resolve().parents[1] / "docs" / "relay.md").read_text()
    found = re.search(r"<!-- snippet: kafka -->\n```python\n(.*?)```", doc, re.S)
    assert found, "docs/relay.md has no snippet 'kafka'"
    code = found.group(1).replace('"127.0.0.1:9092"', repr(kafka_broker.address))
    code = code.replace('topic="orders"', f"topic={topic!r}")
    expected = append(engine, [("a", 1)])
    namespace: dict[str, Any] = {"engine": engine, "OutboxEvent": OutboxEvent, "Relay": Relay}
    exec(compile(code, "docs/relay.md:kafka", "exec"), namespace)
    with namespace["relay"] as relay:
        assert relay.run_once().published == 1
    assert counts(engine) == (1, 0)
    assert by_key(consume(kafka_broker.address, topic, 1)) == expected
