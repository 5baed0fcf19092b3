"""Each publisher against its real broker, driven by `AsyncRelay` on a real PostgreSQL.

For RabbitMQ, NATS JetStream and Redis Streams: publish and confirm (what a consumer reads
back carries the outbox row's id), the broker down and back (a `TcpProxy` on loopback that
the test cuts and restores; the relay keeps the events, counts no attempt, and resumes),
and a poison message the broker itself keeps refusing (parked, the rest flows). The webhook
publisher posts to a real HTTP server in the test process. Every test counts the events at
the end. A test whose broker is absent skips and says so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import http.server
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import Backoff, FakeClock, Outbox
from sa_outbox.relay import AsyncRelay, RelayReport

from .brokers import NATS, RABBITMQ, REDIS, TcpProxy, proxy_to, require
from .conftest import OutboxEvent
from .helpers import event_rows

WAIT = 30.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))


@pytest.fixture
def tag() -> str:
    """A name no other test (or test run) uses, for queues, streams and keys."""
    return f"sa_outbox_test_{uuid.uuid4().hex[:12]}"


def append(engine: Engine, events: list[tuple[str, str, Any]]) -> list[uuid.UUID]:
    """Append (aggregate_id, event_type, payload) triples in one transaction."""
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        return [
            outbox.append(
                conn,
                event_type=event_type,
                aggregate_type="order",
                aggregate_id=aggregate,
                payload=payload,
                headers={"trace": f"t-{i}"},
            )
            for i, (aggregate, event_type, payload) in enumerate(events)
        ]


def counts(engine: Engine) -> dict[str, int]:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        published, parked, pending = conn.execute(
            select(
                func.count().filter(t.c.published_at.is_not(None)),
                func.count().filter(t.c.parked_at.is_not(None)),
                func.count().filter(t.c.published_at.is_(None), t.c.parked_at.is_(None)),
            )
        ).one()
    return {"published": published, "parked": parked, "pending": pending}


def relay_for(async_engine: AsyncEngine, publisher: Any, clock: FakeClock, **kw: Any) -> AsyncRelay:
    kw.setdefault("backoff", Backoff(base=5, max=5, jitter=0))
    kw.setdefault("max_attempts", 2)
    return AsyncRelay(async_engine, OutboxEvent, publisher, clock=clock, lease=30, **kw)


async def down_and_back(
    engine: Engine, relay: AsyncRelay, proxy: TcpProxy, ids: list[uuid.UUID]
) -> RelayReport:
    """Cut the broker, see the relay keep everything; restore it, see it resume."""
    proxy.stop()
    for _ in range(3):  # past max_attempts=2: an outage counts no attempt, parks nothing
        report = await relay.run_once()
        assert report.unavailable is not None and report.published == 0
        rows = event_rows(engine)
        assert all(r.attempts == 0 and r.published_at is None for r in rows)
        assert all(r.parked_at is None and r.relay_token is None for r in rows)
        assert all(r.last_error for r in rows)
    proxy.start()
    report = await relay.run_once()
    assert report.published == len(ids) and report.unavailable is None
    return report


# -- RabbitMQ -------------------------------------------------------------------------------


@pytest.fixture
async def rabbitmq(tag: str) -> AsyncIterator[Any]:
    require("RabbitMQ", RABBITMQ, "aio_pika")
    import aio_pika

    connection = await aio_pika.connect(f"amqp://guest:guest@{RABBITMQ}/")
    channel = await connection.channel()
    queue = await channel.declare_queue(
        tag,
        auto_delete=False,
        arguments={"x-max-length-bytes": 20_000, "x-overflow": "reject-publish"},
    )
    try:
        yield queue
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        await connection.close()


async def drain(queue: Any, n: int) -> list[Any]:
    messages = []
    async with queue.iterator() as it:
        async for message in it:
            await message.ack()
            messages.append(message)
            if len(messages) == n:
                break
    return messages


async def test_rabbitmq_confirms_then_marks(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, rabbitmq: Any, tag: str
) -> None:
    from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

    ids = append(engine, [("a", "OrderPlaced", {"n": 1}), ("b", "OrderPlaced", {"n": 2})])
    publisher = RabbitMQPublisher(f"amqp://guest:guest@{RABBITMQ}/", routing_key=tag)
    async with relay_for(async_engine, publisher, clock) as relay:
        report = await relay.run_once()
    assert report.published == 2
    messages = await asyncio.wait_for(drain(rabbitmq, 2), WAIT)
    assert sorted(uuid.UUID(m.message_id) for m in messages) == sorted(ids)
    first = next(m for m in messages if m.message_id == str(ids[0]))
    assert json.loads(first.body) == {"n": 1} and first.type == "OrderPlaced"
    assert first.headers["outbox-aggregate-id"] == "a" and first.headers["trace"] == "t-0"
    assert first.delivery_mode == 2  # persistent
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 0}


async def test_rabbitmq_down_and_back(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, rabbitmq: Any, tag: str
) -> None:
    from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

    ids = append(engine, [(f"a{i}", "E", {"i": i}) for i in range(5)])
    with proxy_to(RABBITMQ) as proxy:
        publisher = RabbitMQPublisher(
            f"amqp://guest:guest@{proxy.address}/", routing_key=tag, connect_timeout=5
        )
        async with relay_for(async_engine, publisher, clock) as relay:
            await down_and_back(engine, relay, proxy, ids)
    messages = await asyncio.wait_for(drain(rabbitmq, 5), WAIT)
    assert sorted(uuid.UUID(m.message_id) for m in messages) == sorted(ids)
    assert counts(engine) == {"published": 5, "parked": 0, "pending": 0}


async def test_rabbitmq_nack_parks_the_poison_event(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, rabbitmq: Any, tag: str
) -> None:
    from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

    too_big = {"blob": "x" * 30_000}  # over the queue's x-max-length-bytes: nacked
    ids = append(engine, [("a", "Big", too_big), ("b", "Small", {}), ("a", "After", {})])
    publisher = RabbitMQPublisher(f"amqp://guest:guest@{RABBITMQ}/", routing_key=tag)
    async with relay_for(async_engine, publisher, clock) as relay:
        first = await relay.run_once()
        assert (first.published, first.rejected, first.released) == (1, 1, 1)
        clock.advance(5)
        second = await relay.run_once()
        assert (second.rejected, second.parked) == (1, 1)
    [big] = [r for r in event_rows(engine) if r.id == ids[0]]
    assert big.parked_at is not None and "nack" in big.last_error
    messages = await asyncio.wait_for(drain(rabbitmq, 1), WAIT)
    assert [m.message_id for m in messages] == [str(ids[1])]
    assert counts(engine) == {"published": 1, "parked": 1, "pending": 1}


async def test_rabbitmq_unroutable_is_rejected(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, rabbitmq: Any, tag: str
) -> None:
    from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

    append(engine, [("a", "E", {})])
    publisher = RabbitMQPublisher(
        f"amqp://guest:guest@{RABBITMQ}/", routing_key=f"{tag}-no-such-queue"
    )
    async with relay_for(async_engine, publisher, clock) as relay:
        report = await relay.run_once()
    assert report.rejected == 1
    [row] = event_rows(engine)
    assert "unroutable" in row.last_error and row.published_at is None


# -- NATS JetStream -------------------------------------------------------------------------


@pytest.fixture
async def jetstream(tag: str) -> AsyncIterator[Any]:
    require("NATS", NATS, "nats")
    import nats

    client = await nats.connect(f"nats://{NATS}")
    js = client.jetstream()
    await js.add_stream(name=tag, subjects=[f"{tag}.>"], max_msg_size=4096)
    try:
        yield js
    finally:
        await js.delete_stream(tag)
        await client.close()


async def stream_messages(js: Any, stream: str) -> list[Any]:
    info = await js.stream_info(stream)
    return [await js.get_msg(stream, seq) for seq in range(1, info.state.messages + 1)]


async def test_nats_publishes_with_msg_id_and_the_broker_removes_duplicates(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, jetstream: Any, tag: str
) -> None:
    from sa_outbox.publishers.nats import NatsPublisher

    ids = append(engine, [("a", "OrderPlaced", {"n": 1}), ("b", "OrderPaid", {"n": 2})])
    publisher = NatsPublisher(f"nats://{NATS}", subject=lambda e: f"{tag}.{e.event_type}")
    async with relay_for(async_engine, publisher, clock) as relay:
        assert (await relay.run_once()).published == 2
        # As if a relay had died before marking: both are published again, and
        # JetStream keeps one copy of each (same Nats-Msg-Id within its duplicate window).
        with engine.begin() as conn:
            conn.execute(OutboxEvent.__table__.update().values(published_at=None))
        assert (await relay.run_once()).published == 2
    messages = await stream_messages(jetstream, tag)
    assert sorted(uuid.UUID(m.headers["Nats-Msg-Id"]) for m in messages) == sorted(ids)
    first = next(m for m in messages if m.headers["Nats-Msg-Id"] == str(ids[0]))
    assert json.loads(first.data) == {"n": 1} and first.subject == f"{tag}.OrderPlaced"
    assert first.headers["outbox-event-type"] == "OrderPlaced"
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 0}


async def test_nats_down_and_back(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, jetstream: Any, tag: str
) -> None:
    from sa_outbox.publishers.nats import NatsPublisher

    ids = append(engine, [(f"a{i}", "E", {"i": i}) for i in range(5)])
    with proxy_to(NATS) as proxy:
        publisher = NatsPublisher(
            f"nats://{proxy.address}",
            subject=lambda e: f"{tag}.{e.event_type}",
            connect_timeout=2,
            publish_timeout=2,
        )
        async with relay_for(async_engine, publisher, clock) as relay:
            await down_and_back(engine, relay, proxy, ids)
    messages = await stream_messages(jetstream, tag)
    assert sorted(uuid.UUID(m.headers["Nats-Msg-Id"]) for m in messages) == sorted(ids)
    assert counts(engine) == {"published": 5, "parked": 0, "pending": 0}


async def test_nats_message_over_the_stream_limit_is_parked(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, jetstream: Any, tag: str
) -> None:
    from sa_outbox.publishers.nats import NatsPublisher

    ids = append(engine, [("a", "Big", {"blob": "x" * 10_000}), ("b", "Small", {})])
    publisher = NatsPublisher(f"nats://{NATS}", subject=lambda e: f"{tag}.{e.event_type}")
    async with relay_for(async_engine, publisher, clock, max_attempts=1) as relay:
        report = await relay.run_once()
    assert (report.published, report.rejected, report.parked) == (1, 1, 1)
    [big] = [r for r in event_rows(engine) if r.id == ids[0]]
    assert "JetStream refused" in big.last_error or "size" in big.last_error
    assert counts(engine) == {"published": 1, "parked": 1, "pending": 0}


# -- Redis Streams --------------------------------------------------------------------------


@pytest.fixture
async def redis_client(tag: str) -> AsyncIterator[Any]:
    require("Redis", REDIS, "redis")
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(f"redis://{REDIS}/0", decode_responses=True)
    try:
        yield client
    finally:
        await client.delete(tag, f"{tag}:poison")
        await client.aclose()


async def test_redis_xadd_carries_the_event_id(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, redis_client: Any, tag: str
) -> None:
    from sa_outbox.publishers.redis import RedisStreamsPublisher

    ids = append(engine, [("a", "OrderPlaced", {"n": 1}), ("a", "OrderPaid", {"n": 2})])
    publisher = RedisStreamsPublisher(f"redis://{REDIS}/0", stream=tag)
    async with relay_for(async_engine, publisher, clock) as relay:
        assert (await relay.run_once()).published == 2
    entries = await redis_client.xrange(tag)
    assert [uuid.UUID(fields["id"]) for _, fields in entries] == ids  # in order
    fields = entries[0][1]
    assert json.loads(fields["payload"]) == {"n": 1} and fields["event_type"] == "OrderPlaced"
    assert json.loads(fields["headers"]) == {"trace": "t-0"} and fields["aggregate_id"] == "a"
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 0}


async def test_redis_down_and_back(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, redis_client: Any, tag: str
) -> None:
    from sa_outbox.publishers.redis import RedisStreamsPublisher

    ids = append(engine, [(f"a{i}", "E", {"i": i}) for i in range(5)])
    with proxy_to(REDIS) as proxy:
        publisher = RedisStreamsPublisher(
            f"redis://{proxy.address}/0", stream=tag, socket_timeout=2
        )
        async with relay_for(async_engine, publisher, clock) as relay:
            await down_and_back(engine, relay, proxy, ids)
    entries = await redis_client.xrange(tag)
    assert sorted(uuid.UUID(fields["id"]) for _, fields in entries) == sorted(ids)
    assert counts(engine) == {"published": 5, "parked": 0, "pending": 0}


async def test_redis_wrongtype_key_parks_the_poison_event(
    engine: Engine, async_engine: AsyncEngine, clock: FakeClock, redis_client: Any, tag: str
) -> None:
    from sa_outbox.publishers.redis import RedisStreamsPublisher

    await redis_client.set(f"{tag}:poison", "not a stream")
    ids = append(engine, [("a", "Poison", {}), ("b", "Fine", {}), ("a", "After", {})])
    publisher = RedisStreamsPublisher(
        f"redis://{REDIS}/0",
        stream=lambda e: f"{tag}:poison" if e.event_type == "Poison" else tag,
    )
    async with relay_for(async_engine, publisher, clock) as relay:
        await relay.run_once()
        clock.advance(5)
        report = await relay.run_once()
    assert report.parked == 1
    [poison] = [r for r in event_rows(engine) if r.id == ids[0]]
    assert "WRONGTYPE" in poison.last_error and poison.attempts == 2
    entries = await redis_client.xrange(tag)
    assert [uuid.UUID(f["id"]) for _, f in entries] == [ids[1]]  # "After" waits behind it
    assert counts(engine) == {"published": 1, "parked": 1, "pending": 1}


# -- webhook --------------------------------------------------------------------------------


class Hook(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: records requests; answers per the event type in the body."""

    received: list[tuple[dict[str, str], bytes]]
    release: threading.Event
    down: bool

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        event_type = json.loads(body)["event_type"]
        if event_type == "Slow":
            self.release.wait(WAIT)  # holds the request until the test lets it go
        status = 200
        if self.down:
            status = 503
        elif event_type == "Refused":
            status = 422
        elif event_type == "Moved":
            status = 302
        if status == 200:
            self.received.append((dict(self.headers), body))
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[tuple[str, type[Hook]]]:
    handler = type(
        "TestHook", (Hook,), {"received": [], "release": threading.Event(), "down": False}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


async def test_webhook_signs_sets_the_idempotency_key_and_counts_only_2xx(
    engine: Engine,
    async_engine: AsyncEngine,
    clock: FakeClock,
    hook_server: tuple[str, type[Hook]],
) -> None:
    pytest.importorskip("httpx", reason="httpx is not installed")
    from sa_outbox.publishers.webhook import WebhookPublisher

    url, hook = hook_server
    ids = append(
        engine,
        [("a", "OrderPlaced", {"n": 1}), ("b", "Refused", {}), ("c", "Moved", {})],
    )
    publisher = WebhookPublisher(url, secret="s3cret", timeout=5)
    async with relay_for(async_engine, publisher, clock) as relay:
        report = await relay.run_once()
    assert (report.published, report.rejected) == (1, 2)
    [(headers, body)] = hook.received
    assert headers["Idempotency-Key"] == str(ids[0])
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["X-Outbox-Signature"] == expected
    envelope = json.loads(body)
    assert envelope["id"] == str(ids[0]) and envelope["payload"] == {"n": 1}
    rows = {r.event_type: r for r in event_rows(engine)}
    assert "HTTP 422" in rows["Refused"].last_error
    assert "HTTP 302" in rows["Moved"].last_error  # not followed
    assert counts(engine) == {"published": 1, "parked": 0, "pending": 2}


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://hooks.example.com/outbox", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("hooks.example.com/outbox", "no scheme"),
        ("//hooks.example.com/outbox", "no scheme"),
        ("http://", "no host"),
        ("https:///outbox", "no host"),
        ("https://hooks.example .com/outbox", "whitespace"),
    ],
)
def test_webhook_refuses_a_url_it_could_never_post_to(url: str, words: str) -> None:
    pytest.importorskip("httpx", reason="httpx is not installed")
    from sa_outbox import InvalidArgument
    from sa_outbox.publishers.webhook import WebhookPublisher

    with pytest.raises(InvalidArgument, match="webhook url") as caught:
        WebhookPublisher(url)
    assert words in str(caught.value)


def test_webhook_refuses_a_concurrency_that_would_never_send() -> None:
    pytest.importorskip("httpx", reason="httpx is not installed")
    from sa_outbox import InvalidArgument
    from sa_outbox.publishers.webhook import WebhookPublisher

    with pytest.raises(InvalidArgument, match="concurrency must be between 1 and"):
        WebhookPublisher("https://hooks.example.com/outbox", concurrency=0)


async def test_webhook_a_bad_url_from_the_url_function_rejects_that_event_only(
    engine: Engine,
    async_engine: AsyncEngine,
    clock: FakeClock,
    hook_server: tuple[str, type[Hook]],
) -> None:
    pytest.importorskip("httpx", reason="httpx is not installed")
    from sa_outbox.publishers.webhook import WebhookPublisher

    url, hook = hook_server
    append(engine, [("a", "E", {}), ("b", "Misrouted", {}), ("c", "E", {})])

    def url_of(event: Any) -> str:
        return "ftp://127.0.0.1/hook" if event.event_type == "Misrouted" else url

    async with relay_for(async_engine, WebhookPublisher(url_of), clock) as relay:
        first = await relay.run_once()
        clock.advance(5)  # the backoff
        second = await relay.run_once()
    assert first.unavailable is None and (first.published, first.rejected) == (2, 1)
    assert (second.rejected, second.parked) == (1, 1)  # max_attempts=2: parked, not retried
    [misrouted] = [r for r in event_rows(engine) if r.event_type == "Misrouted"]
    assert "scheme 'ftp'" in misrouted.last_error and misrouted.attempts == 2
    assert len(hook.received) == 2
    assert counts(engine) == {"published": 2, "parked": 1, "pending": 0}


async def test_webhook_503_and_timeouts_mean_unavailable(
    engine: Engine,
    async_engine: AsyncEngine,
    clock: FakeClock,
    hook_server: tuple[str, type[Hook]],
) -> None:
    pytest.importorskip("httpx", reason="httpx is not installed")
    from sa_outbox.publishers.webhook import WebhookPublisher

    url, hook = hook_server
    ids = append(engine, [("a", "Slow", {}), ("b", "E", {})])
    publisher = WebhookPublisher(url, timeout=0.5)
    async with relay_for(async_engine, publisher, clock) as relay:
        slow = await relay.run_once()  # the receiver holds "Slow" past the timeout
        assert slow.unavailable is not None and "POST" in slow.unavailable
        assert slow.published == 0
        hook.release.set()
        hook.down = True
        down = await relay.run_once()
        assert down.unavailable is not None and "503" in down.unavailable
        hook.down = False
        assert (await relay.run_once()).published == 2
    # A timeout and a 503 counted no attempt: only the publication that went through.
    assert all(r.parked_at is None and r.attempts == 1 for r in event_rows(engine))
    assert {json.loads(b)["id"] for _, b in hook.received} >= {str(i) for i in ids}
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 0}
