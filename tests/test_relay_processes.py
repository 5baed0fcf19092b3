"""``sa-outbox relay`` as real processes, publishing to a real Redis: killed with SIGKILL
between publish and mark (the consumer sees a duplicate, nothing is lost), and two relays
working one outbox of 10,000 events (each aggregate's events reach the stream in order).
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from sa_outbox import FakeClock, Outbox
from sa_outbox.statements import NewEvent, append_events

from .brokers import REDIS, require
from .conftest import TEST_SCHEMA, OutboxEvent

ROOT = Path(__file__).resolve().parents[1]
WAIT = 120.0


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


def start_relay(database_url: str, stream: str, name: str, **env: str) -> subprocess.Popen[str]:
    environment = {
        **os.environ,
        "SA_OUTBOX_TEST_DATABASE_URL": database_url,
        "RELAY_APP_SCHEMA": TEST_SCHEMA,
        "RELAY_APP_STREAM": stream,
        "RELAY_APP_NAME": name,
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "sa_outbox", "relay", "tests.relay_app:relay"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The process's next stdout line, or fail after ``timeout`` seconds (no sleeping)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not lines or not lines[0]:
        process.kill()
        _, err = process.communicate(timeout=30)
        pytest.fail(f"the relay printed nothing in {timeout} s; stderr:\n{err}")
    return lines[0]


def wait_for_listeners(engine: Engine, n: int) -> None:
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND query LIKE :s"
    )
    pause = threading.Event()
    for _ in range(int(WAIT * 20)):
        with engine.connect() as conn:
            if conn.execute(query, {"s": f"%{TEST_SCHEMA}.outbox%"}).scalar_one() >= n:
                return
        pause.wait(0.05)
    pytest.fail(f"fewer than {n} relays listening after {WAIT} s")


def test_relay_killed_between_publish_and_mark_republishes_and_loses_nothing(
    engine: Engine, database_url: str, redis_stream: tuple[Any, str]
) -> None:
    client, stream = redis_stream
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        ids = [
            outbox.append(
                conn, event_type="E", aggregate_type="order", aggregate_id=f"a{i}", payload={"i": i}
            )
            for i in range(3)
        ]
    relay = start_relay(database_url, stream, "doomed", RELAY_APP_HANG_AFTER_PUBLISH="1")
    try:
        line = read_line(relay, WAIT)
        assert line.split()[0] == "published"
        assert sorted(uuid.UUID(i) for i in line.split()[1:]) == sorted(ids)
    finally:
        relay.send_signal(signal.SIGKILL)  # after the publish, before the mark
        relay.communicate(timeout=WAIT)
    assert relay.returncode == -signal.SIGKILL
    with engine.connect() as conn:  # Redis has them; the outbox does not know it
        t = OutboxEvent.__table__
        assert conn.execute(select(func.count()).where(t.c.published_at.is_(None))).scalar() == 3
    assert client.xlen(stream) == 3

    # Another relay takes over once the lease (600 s) has run out: a FakeClock an hour ahead.
    from sa_outbox.publishers.redis import RedisStreamsPublisher
    from sa_outbox.relay import Relay

    later = FakeClock(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    with Relay(
        engine, OutboxEvent, RedisStreamsPublisher(f"redis://{REDIS}/0", stream=stream), clock=later
    ) as survivor:
        report = survivor.run_once()
    assert report.published == 3
    entries = [fields["id"] for _, fields in client.xrange(stream)]
    assert len(entries) == 6 and sorted(set(entries)) == sorted(str(i) for i in ids)
    assert collections.Counter(entries) == {str(i): 2 for i in ids}  # each seen twice
    with engine.connect() as conn:
        t = OutboxEvent.__table__
        assert conn.execute(select(func.count()).where(t.c.published_at.is_(None))).scalar() == 0


def test_two_relays_keep_each_aggregate_in_order_over_10000_events(
    engine: Engine, database_url: str, redis_stream: tuple[Any, str]
) -> None:
    client, stream = redis_stream
    relays = [start_relay(database_url, stream, f"relay-{n}") for n in (1, 2)]
    try:
        wait_for_listeners(engine, 2)
        rng = random.Random(20301)
        aggregates = [f"agg-{n}" for n in range(150)]
        expected: dict[str, list[str]] = collections.defaultdict(list)
        for _ in range(20):  # 20 transactions of 500 events, aggregates interleaved at random
            batch = [
                NewEvent("Changed", "order", rng.choice(aggregates), {"k": 0}) for _ in range(500)
            ]
            stmt, ids = append_events(OutboxEvent, batch)
            with engine.begin() as conn:
                conn.execute(stmt)
            for event, event_id in zip(batch, ids, strict=True):
                expected[str(event.aggregate_id)].append(str(event_id))

        seen: dict[str, dict[str, str]] = {}
        order: list[str] = []
        last = "0-0"
        while len(seen) < 10_000:  # a consumer blocking on the stream, not a sleep
            reply = client.xread({stream: last}, count=1000, block=int(WAIT * 1000))
            if not reply:
                pytest.fail(f"only {len(seen)} of 10,000 events published after {WAIT} s")
            for entry_id, fields in reply[0][1]:
                last = entry_id
                if fields["id"] not in seen:  # consumers de-duplicate on the event id
                    seen[fields["id"]] = fields
                    order.append(fields["id"])
    finally:
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
        outputs = [relay.communicate(timeout=WAIT) for relay in relays]
    assert [relay.returncode for relay in relays] == [0, 0], outputs

    assert len(seen) == 10_000
    by_aggregate: dict[str, list[str]] = collections.defaultdict(list)
    for event_id in order:
        by_aggregate[seen[event_id]["aggregate_id"]].append(event_id)
    assert by_aggregate == expected  # every aggregate, in commit order, complete
    publishers = collections.Counter(fields["relay"] for fields in seen.values())
    assert set(publishers) == {"relay-1", "relay-2"}, publishers  # both did work
    with engine.connect() as conn:
        t = OutboxEvent.__table__
        assert conn.execute(select(func.count()).where(t.c.published_at.is_(None))).scalar() == 0


def test_relay_command_once_prints_what_it_did(
    engine: Engine,
    database_url: str,
    redis_stream: tuple[Any, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sa_outbox.cli import main

    client, stream = redis_stream
    with engine.begin() as conn:
        Outbox(OutboxEvent).append(
            conn, event_type="E", aggregate_type="order", aggregate_id=1, payload={}
        )
    for name, value in {
        "SA_OUTBOX_TEST_DATABASE_URL": database_url,
        "RELAY_APP_SCHEMA": TEST_SCHEMA,
        "RELAY_APP_STREAM": stream,
        "RELAY_APP_NAME": "once",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["relay", "tests.relay_app:relay", "--once"]) == 0
    out = capsys.readouterr().out
    assert "relay once: 1 claimed, 1 published, 0 rejected (0 parked), 0 released" in out
    assert client.xlen(stream) == 1


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:relay", "cannot import 'no_such_module_xyz'"),
        ("json:nothing", "'json' has no attribute 'nothing'"),
        ("json:dumps", "json:dumps is not a Relay or an AsyncRelay"),
        ("json", "expected TARGET as module:attribute (myapp.outbox:relay)"),
    ],
)
def test_relay_command_explains_a_bad_target(
    target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sa_outbox.cli import main

    assert main(["relay", target]) == 1
    assert message in capsys.readouterr().err
