"""OpenTelemetry: jobs and events continue the trace they were made in (docs/tracing.md).

Real PostgreSQL; a real `Worker` / `AsyncWorker` driven by ``drain()`` on a `FakeClock`; a
real `Relay` publishing to Redis Streams (the consumed entry is read back); spans collected
by the SDK's `InMemorySpanExporter`, set as OpenTelemetry's global provider for one test at
a time (`global_tracer_provider`). Every test counts the rows at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flask
import pytest
from alembic.autogenerate import render_python_code
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.operations.ops import AddColumnOp, ModifyTableOps
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import Engine, MetaData, Table, create_engine, select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

import alembic_ext  # noqa: F401  (registers the autogenerate comparators)
import sa_outbox
from alembic_ext._tables import kind_from_columns
from sa_outbox import (
    AsyncJobQueue,
    AsyncRelay,
    Backoff,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    JobMixin,
    JobQueue,
    NewJob,
    Outbox,
    PayloadTooLarge,
    PermanentError,
    Relay,
    Worker,
)
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.publishers.webhook import WebhookPublisher
from sa_outbox.queue import ClaimedEvent
from sa_outbox.statements import MAX_HEADERS_BYTES, claim_jobs

from .brokers import REDIS, require
from .conftest import Job, OutboxEvent
from .helpers import autogenerate_in, event_rows, global_tracer_provider, jobs_by_status, run_cli

ROOT = Path(__file__).resolve().parents[1]
NO_JITTER = Backoff(base=1, max=300, jitter=0)
WAIT = 10.0


class TracedOrderPlaced(OutboxEvent):
    """A domain event of these tests' own."""

    __aggregate__ = "order_id"
    __aggregate_type__ = "order"
    order_id: int


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with global_tracer_provider(provider):
        yield exporter


def tracer() -> trace.Tracer:
    return trace.get_tracer("tests")


def named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def traceparent_of(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def job_headers(engine: Engine) -> dict[str, Any]:
    """Each job's headers, by kind."""
    t = Job.__table__
    with engine.connect() as conn:
        return {kind: headers for kind, headers in conn.execute(select(t.c.kind, t.c.headers))}


def test_a_job_enqueued_in_a_request_runs_in_a_span_child_of_it(
    engine: Engine,
    spans: InMemorySpanExporter,
    make_worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    web = flask.Flask(__name__)

    @web.post("/orders/<int:n>")
    def place_order(n: int) -> tuple[str, int]:
        # As Flask's instrumentation would: the request runs in a SERVER span.
        with tracer().start_as_current_span("POST /orders", kind=SpanKind.SERVER) as span:
            span.set_attribute("order", n)
            with Session(engine) as session, session.begin():
                kind = "send-receipt" if n else "charge-card"
                sa_outbox.enqueue(session, kind, {"n": n}, model=Job)
        return "", 201

    client = web.test_client()
    assert client.post("/orders/1").status_code == 201
    assert client.post("/orders/0").status_code == 201
    requests = {s.attributes["order"]: s for s in spans.get_finished_spans()}  # type: ignore[index]

    seen: dict[str, Any] = {}
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("send-receipt")
    def send_receipt(job: JobContext) -> None:
        seen["current"] = trace.get_current_span().get_span_context()
        seen["headers"] = dict(job.headers)

    @app.handler("charge-card")
    def charge_card(job: JobContext) -> None:
        raise RuntimeError("card declined")

    with caplog.at_level(logging.INFO, logger="sa_outbox.worker"):
        assert make_worker(app).drain(timeout=WAIT) == 2

    receipt, charge = named(spans, "process send-receipt"), named(spans, "process charge-card")
    for job_span, request in ((receipt, requests[1]), (charge, requests[0])):
        assert job_span.kind is SpanKind.CONSUMER
        assert job_span.context.trace_id == request.context.trace_id
        assert parent_id(job_span) == request.context.span_id
        assert job_span.attributes is not None
        assert job_span.attributes["messaging.system"] == "sa-outbox"
        assert job_span.attributes["messaging.destination.name"] == "default"
        assert job_span.attributes["sa_outbox.job.attempt"] == 1
    # The handler ran with its job's span current, and saw the trace context it came with.
    assert seen["current"].span_id == receipt.context.span_id
    assert seen["headers"]["traceparent"].split("-")[2] == f"{requests[1].context.span_id:016x}"
    assert receipt.status.status_code is StatusCode.UNSET
    assert charge.status.status_code is StatusCode.ERROR
    assert "RuntimeError: card declined" in (charge.status.description or "")
    [exception] = [e for e in charge.events if e.name == "exception"]
    assert exception.attributes is not None
    assert exception.attributes["exception.type"] == "RuntimeError"
    # The outcome log lines carry the trace id.
    outcomes = {vars(r)["kind"]: vars(r) for r in caplog.records if hasattr(r, "outcome")}
    assert outcomes["send-receipt"]["trace_id"] == f"{requests[1].context.trace_id:032x}"
    assert outcomes["charge-card"]["outcome"] == "retried"
    assert jobs_by_status(engine) == {"succeeded": 1, "pending": 1}


async def test_the_async_worker_continues_the_trace_into_handlers_and_follow_ups(
    engine: Engine,
    async_engine: AsyncEngine,
    spans: InMemorySpanExporter,
    make_async_worker: Any,
) -> None:
    queue = AsyncJobQueue(Job)
    with tracer().start_as_current_span("request", kind=SpanKind.SERVER) as request:
        async with async_engine.begin() as conn:
            await queue.enqueue(conn, "coroutine", {})
            await queue.enqueue(conn, "refused", {}, headers={"tenant": "acme"})

    seen: dict[str, Any] = {}
    app = JobApp(Job, backoff=NO_JITTER)

    @app.handler("coroutine")
    async def coroutine(job: JobContext) -> None:
        await asyncio.sleep(0)
        seen["coroutine"] = trace.get_current_span().get_span_context().span_id
        job.enqueue("plain", {}, headers={"tenant": "acme"})

    @app.handler("plain")
    def plain(job: JobContext) -> None:  # runs in a thread of the worker's
        assert threading.current_thread() is not threading.main_thread()
        seen["plain"] = trace.get_current_span().get_span_context().span_id
        seen["plain headers"] = dict(job.headers)

    @app.handler("refused")
    async def refused(job: JobContext) -> None:
        seen["refused headers"] = dict(job.headers)
        raise PermanentError("never")

    assert await make_async_worker(app).drain(timeout=WAIT) == 3
    request_id = request.get_span_context().span_id
    first, follow_up = named(spans, "process coroutine"), named(spans, "process plain")
    failed = named(spans, "process refused")
    assert parent_id(first) == request_id and parent_id(failed) == request_id
    # The follow-up was enqueued in the first job's span: its span is that span's child.
    assert parent_id(follow_up) == first.context.span_id
    assert len({first.context.trace_id, follow_up.context.trace_id, failed.context.trace_id}) == 1
    assert seen["coroutine"] == first.context.span_id
    assert seen["plain"] == follow_up.context.span_id  # the thread ran in the job's span
    assert seen["plain headers"]["tenant"] == "acme"
    assert seen["refused headers"]["tenant"] == "acme"  # its own headers, beside the trace
    assert failed.status.status_code is StatusCode.ERROR
    assert jobs_by_status(engine) == {"succeeded": 2, "failed": 1}


def test_the_relay_publishes_each_event_in_a_span_and_the_message_carries_it(
    engine: Engine, spans: InMemorySpanExporter
) -> None:
    require("Redis", REDIS, "redis")
    import redis

    from sa_outbox.publishers.redis import RedisStreamsPublisher

    stream = f"sa_outbox_test_{uuid.uuid4().hex[:12]}"
    factory = sessionmaker(engine)
    sa_outbox.install(factory)
    request_span = tracer().start_as_current_span("POST /orders", kind=SpanKind.SERVER)
    with request_span as request, factory.begin() as session:
        session.add(TracedOrderPlaced(order_id=7))
        Outbox(OutboxEvent).append(
            session,
            event_type="OrderNoted",
            aggregate_type="order",
            aggregate_id=8,
            payload={},
            headers={"tenant": "acme"},
        )
    stored = {row.event_type: row.headers for row in event_rows(engine)}
    request_parent = traceparent_of(request)
    assert stored["TracedOrderPlaced"]["traceparent"] == request_parent
    assert stored["OrderNoted"] == {"traceparent": request_parent, "tenant": "acme"}

    client = redis.Redis.from_url(f"redis://{REDIS}/0", decode_responses=True)
    relay = Relay(engine, OutboxEvent, RedisStreamsPublisher(f"redis://{REDIS}/0", stream=stream))
    try:
        assert relay.run_once().published == 2
        consumed: Any = client.xrange(stream)  # what a consumer of the stream reads
        entries = {fields["event_type"]: fields for _, fields in consumed}
    finally:
        relay.close()
        client.delete(stream)
        client.close()

    trace_id = request.get_span_context().trace_id
    for event_type in ("TracedOrderPlaced", "OrderNoted"):
        publish = named(spans, f"publish {event_type}")
        assert publish.kind is SpanKind.PRODUCER
        assert publish.context.trace_id == trace_id
        assert parent_id(publish) == request.get_span_context().span_id
        headers = json.loads(entries[event_type]["headers"])
        # The message continues the trace from the relay's span, not from the request.
        assert headers["traceparent"] == traceparent_of(publish)
        assert publish.status.status_code is StatusCode.UNSET
    assert json.loads(entries["OrderNoted"]["headers"])["tenant"] == "acme"
    assert [row.published_at is not None for row in event_rows(engine)] == [True, True]


def test_a_rejected_event_fails_its_publish_span_and_is_retried_in_a_new_one(
    engine: Engine, spans: InMemorySpanExporter
) -> None:
    outbox = Outbox(OutboxEvent)
    with tracer().start_as_current_span("request") as request, engine.begin() as conn:
        for event_type in ("Good", "Poison"):
            outbox.append(
                conn, event_type=event_type, aggregate_type="t", aggregate_id=event_type, payload={}
            )
    received: list[ClaimedEvent] = []

    def send(event: ClaimedEvent) -> None:
        received.append(event)
        if event.event_type == "Poison":
            raise ValueError("no such route")

    relay = Relay(engine, OutboxEvent, CallablePublisher(send), max_attempts=1)
    try:
        report = relay.run_once()
    finally:
        relay.close()
    assert (report.published, report.parked) == (1, 1)
    good, poison = named(spans, "publish Good"), named(spans, "publish Poison")
    assert poison.status.status_code is StatusCode.ERROR
    assert "no such route" in (poison.status.description or "")
    assert good.status.status_code is StatusCode.UNSET
    by_type = {event.event_type: event for event in received}
    assert by_type["Poison"].headers["traceparent"].split("-")[2] == (
        f"{poison.context.span_id:016x}"
    )
    assert {parent_id(good), parent_id(poison)} == {request.get_span_context().span_id}
    rows = {row.event_type: row for row in event_rows(engine)}
    assert rows["Good"].published_at is not None and rows["Poison"].parked_at is not None


def test_every_enqueue_path_carries_the_trace_under_the_callers_own_headers(
    engine: Engine, spans: InMemorySpanExporter, queue: JobQueue
) -> None:
    fast = JobQueue(Job)  # no clock: the psycopg cursor path, and autocommit on the engine
    with tracer().start_as_current_span("request") as request:
        current = traceparent_of(request)
        with engine.begin() as conn:
            fast.enqueue(conn, "cursor", {}, headers={"tenant": "acme"})
            queue.enqueue(conn, "statement", {})  # a FakeClock: SQLAlchemy runs it
            fast.enqueue_many(
                conn,
                [NewJob("many", {}), NewJob("many-own", {}, headers={"traceparent": "mine"})],
            )
            fast.enqueue_copy(
                conn, [NewJob("copy", {}), NewJob("copy-own", {}, headers={"k": "v"})]
            )
        fast.enqueue(engine, "autocommit", {})
    found = job_headers(engine)
    assert found.pop("cursor") == {"traceparent": current, "tenant": "acme"}
    assert found.pop("many-own") == {"traceparent": "mine"}  # the caller's own wins
    assert found.pop("copy-own") == {"traceparent": current, "k": "v"}
    assert found == {kind: {"traceparent": current} for kind in found}
    assert len(found) == 4
    assert jobs_by_status(engine) == {"pending": 7}


def test_without_a_current_span_nothing_is_stored_and_nothing_traced(
    engine: Engine, spans: InMemorySpanExporter, make_worker: Any
) -> None:
    fast = JobQueue(Job)
    with engine.begin() as conn:
        fast.enqueue(conn, "a", {})
        fast.enqueue_many(conn, [NewJob("a", {})])
        fast.enqueue_copy(conn, [NewJob("a", {})])
        Outbox(OutboxEvent).append(
            conn, event_type="E", aggregate_type="t", aggregate_id=1, payload={}
        )
    with Session(engine) as session, session.begin():
        sa_outbox.enqueue(session, "a", {}, model=Job)
    t = Job.__table__
    with engine.connect() as conn:
        assert conn.execute(select(t.c.headers)).scalars().all() == [None] * 4
    assert [row.headers for row in event_rows(engine)] == [{}]
    app = JobApp(Job)
    app.register("a", lambda job: None)
    assert make_worker(app).drain(timeout=WAIT) == 4
    assert spans.get_finished_spans() == ()
    assert jobs_by_status(engine) == {"succeeded": 4}


def test_periodic_jobs_take_no_trace_context(
    engine: Engine, spans: InMemorySpanExporter, clock: FakeClock, make_worker: Any
) -> None:
    app = JobApp(Job)

    @app.periodic(every=60, kind="tick")
    def tick(job: JobContext) -> None:
        pass

    worker = make_worker(app)
    with tracer().start_as_current_span("whatever is current"):
        assert [t.inserted for t in worker.run_schedules()] == [True]
    assert job_headers(engine) == {"tick": None}
    assert worker.drain(timeout=WAIT) == 1
    assert [s.name for s in spans.get_finished_spans()] == ["whatever is current"]
    assert jobs_by_status(engine) == {"succeeded": 1}


@pytest.mark.parametrize(
    ("headers", "error", "message"),
    [
        (["tenant"], InvalidArgumentType, "must be a mapping of str to str, got list"),
        ({"attempt": 2}, InvalidArgumentType, "the value of 'attempt' is of type int"),
        ({1: "x"}, InvalidArgumentType, "the name 1 is of type int"),
        ({" ": "x"}, InvalidArgument, "a name must not be blank"),
        ({"k": "a\x00b"}, InvalidArgument, "the value of 'k' contains a NUL character"),
        (
            {"k": "x" * MAX_HEADERS_BYTES},
            PayloadTooLarge,
            f"over the limit of {MAX_HEADERS_BYTES}",
        ),
    ],
)
def test_bad_headers_are_refused_naming_the_job_before_any_sql(
    engine: Engine, headers: Any, error: type[Exception], message: str
) -> None:
    fast = JobQueue(Job)
    with engine.begin() as conn:
        with pytest.raises(error, match="headers of job kind 'send'") as raised:
            fast.enqueue(conn, "send", {}, headers=headers)
        assert message in str(raised.value)
        with pytest.raises(error, match=r"headers of job kind 'send'"):
            fast.enqueue_many(conn, [NewJob("ok", {}), NewJob("send", {}, headers=headers)])
        with pytest.raises(error, match=r"^jobs\[1\]: headers of job kind 'send'"):
            fast.enqueue_copy(conn, [NewJob("ok", {}), NewJob("send", {}, headers=headers)])
    assert jobs_by_status(engine) == {}


def test_the_webhook_sends_the_trace_context_as_http_headers() -> None:
    event = ClaimedEvent(
        uuid.UUID(int=1),
        1,
        "OrderPlaced",
        "order",
        "42",
        {},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": 1},
        1,
        None,
        uuid.UUID(int=2),
        None,
    )
    _, _, headers = WebhookPublisher("https://hooks.example.com/outbox").request_for(event)
    assert headers["traceparent"] == event.headers["traceparent"]
    assert "tracestate" not in headers and "n" not in headers


def test_the_cli_enqueues_a_job_with_headers(
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
) -> None:
    monkeypatch.setenv("SA_OUTBOX_DATABASE_URL", database_url)
    argv = ["jobs", "enqueue", "send", "--payload", "{}", "--model", "tests.conftest:Job"]
    code, _, _ = run_cli(capsys, *argv, "--header", "tenant=acme", "--header", "q=a=b")
    assert code == 0
    assert job_headers(engine) == {"send": {"tenant": "acme", "q": "a=b"}}
    with pytest.raises(SystemExit):
        run_cli(capsys, *argv, "--header", "tenant")
    assert "expected NAME=VALUE, got 'tenant'" in capsys.readouterr().err
    assert jobs_by_status(engine) == {"pending": 1}


def test_without_opentelemetry_the_library_works_and_traces_nothing() -> None:
    code = (
        "import sys, uuid\n"
        "sys.modules['opentelemetry'] = None\n"
        "import sa_outbox, sa_outbox.cli\n"
        "from sa_outbox import JobContext, statements as st\n"
        "from sa_outbox.queue import ClaimedEvent, ClaimedJob\n"
        "from sa_outbox._tracing import AVAILABLE, current_trace_headers\n"
        "from sa_outbox.relay._spans import traced_wave\n"
        "from sa_outbox.worker._spans import job_span\n"
        "parent = {'traceparent': '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'}\n"
        "job = ClaimedJob(uuid.uuid4(), 'default', 'k', {}, 0, None, 1, 8, None, uuid.uuid4(),\n"
        "                 'w', None, None, parent)\n"
        "event = ClaimedEvent(uuid.uuid4(), 1, 'E', 'a', '1', {}, parent, 1, None,\n"
        "                     uuid.uuid4(), None)\n"
        "context = JobContext(job)\n"
        "context.enqueue('next', {})\n"
        "values = st.enqueue_job_values('k', {}, headers={'tenant': 'acme'})\n"
        "print(AVAILABLE, current_trace_headers(), job_span(job, 'w'),\n"
        "      traced_wave([event]) == ([event], None), context.followups[0].headers,\n"
        "      values['job_headers'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == 'False None None True None {"tenant":"acme"}'


def test_autogenerate_adds_the_column_to_an_install_made_before_it(database_url: str) -> None:
    """A job table made before ``headers`` existed: it is still a job table (reflected, it
    enqueues and claims, and refuses headers clearly); autogenerate adds the column, then
    finds nothing; the model enqueues headers on it."""
    schema = f"otel_upgrade_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        metadata = MetaData()

    class Jobs(JobMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = schema

    def changes(connection: Any) -> Any:
        return autogenerate_in(connection, Base.metadata, schema)

    pg = create_engine(database_url)
    try:
        with pg.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        Base.metadata.create_all(pg)
        with pg.begin() as conn:  # as the previous release made it
            conn.execute(text(f"ALTER TABLE {schema}.jobs DROP COLUMN headers"))
        with pg.begin() as conn:
            old = Table("jobs", MetaData(), schema=schema, autoload_with=conn)
            assert kind_from_columns((c.name, c.type) for c in old.columns) == "job"
            JobQueue(old).enqueue(conn, "before", {})
            with pytest.raises(InvalidArgument, match="has no headers column"):
                JobQueue(old).enqueue(conn, "before", {}, headers={"k": "v"})
            [claimed] = conn.execute(claim_jobs(old, worker_id="w")).all()
            assert claimed.kind == "before" and claimed.headers is None
        with pg.begin() as conn:
            found = changes(conn)
            [table_ops] = found.ops
            assert isinstance(table_ops, ModifyTableOps)
            [add] = table_ops.ops
            assert isinstance(add, AddColumnOp) and add.column.name == "headers"
            assert add.column.nullable and add.column.server_default is None
            rendered = render_python_code(found)
            assert "op.add_column('jobs', sa.Column('headers', postgresql.JSONB(" in rendered
            operations = Operations(MigrationContext.configure(conn))
            operations.invoke(add)
            # The form docs/upgrading.md gives it, for a history replayed on a fresh
            # database (whose create_job_queue already made the column): a no-op here.
            operations.execute(f"ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS headers jsonb")
        with pg.begin() as conn:
            assert changes(conn).is_empty()
            JobQueue(Jobs).enqueue(conn, "after", {}, headers={"k": "v"})
            found = conn.execute(text(f"SELECT kind, headers FROM {schema}.jobs")).all()
        rows: dict[str, Any] = {kind: headers for kind, headers in found}
        assert rows == {"before": None, "after": {"k": "v"}}
    finally:
        with pg.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        pg.dispose()


def test_a_plain_outbox_row_added_to_a_session_takes_the_trace_under_its_own_headers(
    engine: Engine, spans: InMemorySpanExporter
) -> None:
    session = Session(engine)
    with tracer().start_as_current_span("request") as request, session, session.begin():
        for n, own in enumerate([None, {"traceparent": "mine", "k": "v"}]):
            session.add(
                OutboxEvent(
                    aggregate_type="t",
                    aggregate_id=str(n),
                    event_type="Plain",
                    payload={},
                    headers=own,
                )
            )
    first, second = (row.headers for row in event_rows(engine))
    assert first == {"traceparent": traceparent_of(request)}
    assert second == {"traceparent": "mine", "k": "v"}


def test_a_worker_without_the_sdk_provider_runs_traced_jobs(
    engine: Engine, make_worker: Any
) -> None:
    """With the API alone (no provider set): the no-op tracer; jobs run, nothing fails."""
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    parent = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with engine.begin() as conn:
        JobQueue(Job).enqueue(conn, "a", {}, headers=parent)
    ran: list[str] = []
    app = JobApp(Job)
    app.register("a", lambda job: ran.append(job.headers["traceparent"]))
    worker: Worker = make_worker(app)
    assert worker.drain(timeout=WAIT) == 1
    assert ran == [parent["traceparent"]]
    assert jobs_by_status(engine) == {"succeeded": 1}


def test_a_partitioned_job_table_stores_and_claims_headers(
    engine: Engine, spans: InMemorySpanExporter
) -> None:
    """On a table partitioned by created_at (its dedup trigger instead of ON CONFLICT) every
    enqueue path stores the headers, and the claim returns them."""
    schema = f"otel_parts_{uuid.uuid4().hex[:8]}"

    class Base(DeclarativeBase):
        metadata = MetaData()

    class Parts(JobMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = schema
        __partition_interval__ = "day"

    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        Base.metadata.create_all(engine)
        parts = JobQueue(Parts)
        with tracer().start_as_current_span("request") as request, engine.begin() as conn:
            parts.enqueue(conn, "one", {}, headers={"k": "v"}, deduplication_key="one")
            parts.enqueue(conn, "one", {}, deduplication_key="one")  # skipped by the trigger
            parts.enqueue_many(conn, [NewJob("many", {}, deduplication_key="many")])
            parts.enqueue_copy(conn, [NewJob("copy", {})])
        with engine.begin() as conn:
            claimed = parts.claim(conn, worker_id="w", batch=10)
        current = traceparent_of(request)
        assert {job.kind: job.headers for job in claimed} == {
            "one": {"traceparent": current, "k": "v"},
            "many": {"traceparent": current},
            "copy": {"traceparent": current},
        }
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))


async def test_the_async_relay_publishes_in_a_span_child_of_the_request(
    engine: Engine, async_engine: AsyncEngine, spans: InMemorySpanExporter
) -> None:
    with tracer().start_as_current_span("request") as request, engine.begin() as conn:
        Outbox(OutboxEvent).append(
            conn, event_type="Noted", aggregate_type="t", aggregate_id=1, payload={}
        )
    received: list[ClaimedEvent] = []
    async with AsyncRelay(async_engine, OutboxEvent, CallablePublisher(received.append)) as relay:
        assert (await relay.run_once()).published == 1
    publish = named(spans, "publish Noted")
    assert parent_id(publish) == request.get_span_context().span_id
    assert [event.headers["traceparent"] for event in received] == [traceparent_of(publish)]
    assert [row.published_at is not None for row in event_rows(engine)] == [True]
