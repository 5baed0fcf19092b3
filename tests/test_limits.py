"""The limits of docs/limits.md, on every enqueue path, against a real PostgreSQL.

What PostgreSQL cannot store — a NUL character (``\\u0000``) in text or jsonb, a lone
surrogate, a payload nested deeper than the library's limit, names and keys too long for
their btree index, blank names — is refused by the library with a clear error that names the
job kind (or event type) and the path of the bad value, before any SQL is sent: the caller's
transaction stays usable, which each test proves by running a statement after the error, in
the same transaction, and counting the rows at the end (the good ones, nothing else).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

import sa_outbox
from sa_outbox import (
    AsyncJobQueue,
    AsyncOutbox,
    FakeClock,
    InvalidArgument,
    JobApp,
    JobContext,
    JobQueue,
    NewJob,
    Outbox,
    PayloadNotSerializable,
    Worker,
)
from sa_outbox import statements as st
from sa_outbox._json import MAX_DEPTH, compact_json, nests_deeper
from sa_outbox._validation import (
    MAX_AGGREGATE_ID_LENGTH,
    MAX_DEDUPLICATION_KEY_LENGTH,
    MAX_NAME_LENGTH,
)

from .conftest import Job, Order, OutboxEvent
from .helpers import event_rows, jobs_by_status

NUL = "\x00"
WAIT = 10.0


def nested(depth: int) -> Any:
    """A payload ``depth`` levels deep: ``[[...[]...]]``."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def wide(n: int) -> str:
    """``n`` random characters of four UTF-8 bytes each (emoji and CJK Extension B), which
    compression cannot shrink: the widest a name or key of ``n`` characters can be."""
    rng = random.Random(n)
    return "".join(
        chr(rng.randrange(0x1F300, 0x1F5FF) if i % 2 else rng.randrange(0x20000, 0x2A6DF))
        for i in range(n)
    )


def job_count(conn: Connection) -> int:
    return conn.execute(select(func.count()).select_from(Job.__table__)).scalar_one()


# -- NUL characters ---------------------------------------------------------------------------

BAD_PAYLOADS = [
    ({"to": ["a@x", "b@x", "c\x00@x"]}, r"at \$\.to\[2\]: contains a NUL character"),
    (
        {"user": {"na\x00me": "ana"}},
        r'at \$\.user\["na\\u0000me"\]: the key "na\\u0000me" contains',
    ),
    ("text\x00", r"at \$: contains a NUL character"),
    ({"a b": [{"c": [1, "x\x00"]}]}, r'at \$\["a b"\]\[0\]\.c\[1\]: contains a NUL'),
]


@pytest.mark.parametrize(("payload", "where"), BAD_PAYLOADS)
def test_a_nul_in_a_job_payload_names_the_kind_and_the_path_on_every_path(
    engine: Engine, payload: Any, where: str
) -> None:
    queue = JobQueue(Job)
    message = rf"payload of job kind 'send-email' {where}"
    factory = sessionmaker(engine)
    sa_outbox.install(factory, job_model=Job)
    with factory() as session, session.begin():
        calls: list[Callable[[], object]] = [
            lambda: queue.enqueue(session, "send-email", payload),
            lambda: queue.enqueue(session, "send-email", payload, deduplication_key="k"),
            lambda: sa_outbox.enqueue(session, "send-email", payload),
            lambda: queue.enqueue_many(session, [NewJob("ok", {}), NewJob("send-email", payload)]),
            lambda: queue.enqueue_many(session, [NewJob("send-email", payload, delay=5)]),
            lambda: queue.enqueue_copy(session, [NewJob("ok", {}), NewJob("send-email", payload)]),
            lambda: queue.enqueue_copy(session, [NewJob("send-email", payload, priority=3)]),
        ]
        for call in calls:
            with pytest.raises(InvalidArgument, match=message):
                call()
            assert job_count(session.connection()) == 0  # nothing written, and still usable
        queue.enqueue(session, "after", {"fine": True})
    assert jobs_by_status(engine) == {"pending": 1}


def test_the_copy_error_also_names_the_jobs_index(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=r"^jobs\[1\]: payload of job kind 'b' at \$\.x"):
            JobQueue(Job).enqueue_copy(conn, [NewJob("a", {}), NewJob("b", {"x": NUL})])
        JobQueue(Job).enqueue_copy(conn, [NewJob("a", {})])
    assert jobs_by_status(engine) == {"pending": 1}


@pytest.mark.parametrize(
    ("job", "words"),
    [
        (NewJob("send\x00email", {}), r"kind 'send\\x00email' contains a NUL character"),
        (NewJob("k", {}, queue="q\x00"), r"queue 'q\\x00' contains a NUL character"),
        (NewJob("k", {}, deduplication_key="a\x00"), r"deduplication_key 'a\\x00' contains"),
    ],
)
def test_a_nul_in_a_name_or_key_is_refused_before_any_write(
    engine: Engine, job: NewJob, words: str
) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        for call in (
            lambda: queue.enqueue(
                conn,
                job.kind,
                job.payload,
                queue=job.queue,
                deduplication_key=job.deduplication_key,
            ),
            lambda: queue.enqueue_many(conn, [NewJob("ok", {}), job]),
            lambda: queue.enqueue_copy(conn, [NewJob("ok", {}), job]),
        ):
            with pytest.raises(InvalidArgument, match=words):
                call()
        queue.enqueue(conn, "after", {})
    assert jobs_by_status(engine) == {"pending": 1}


def test_outbox_append_refuses_a_nul_anywhere(engine: Engine) -> None:
    outbox = Outbox(OutboxEvent)
    good: dict[str, Any] = {
        "event_type": "OrderPlaced",
        "aggregate_type": "order",
        "aggregate_id": 7,
        "payload": {},
    }
    cases = [
        (
            {"payload": {"lines": ["a", "b\x00"]}},
            r"payload of event type 'OrderPlaced' at \$\.lines\[1\]",
        ),
        ({"headers": {"trace": "t\x00"}}, r"headers of event type 'OrderPlaced' at \$\.trace"),
        ({"event_type": "Order\x00Placed"}, r"event_type 'Order\\x00Placed' contains a NUL"),
        ({"aggregate_type": "or\x00der"}, r"aggregate_type 'or\\x00der' contains a NUL"),
        ({"aggregate_id": "7\x00"}, r"aggregate_id '7\\x00' contains a NUL"),
    ]
    with engine.begin() as conn:
        for change, words in cases:
            with pytest.raises(InvalidArgument, match=words):
                outbox.append(conn, **{**good, **change})
            with pytest.raises(InvalidArgument, match=words):
                conn.execute(st.append_events(OutboxEvent, [st.NewEvent(**{**good, **change})])[0])
        outbox.append(conn, **good)  # the transaction is still usable
    assert [r.event_type for r in event_rows(engine)] == ["OrderPlaced"]


class ItemsAdded(OutboxEvent):
    order: Order
    items: list[Any]


class NoteTaken(OutboxEvent):
    __aggregate__ = "topic"
    __aggregate_type__ = "topic"
    topic: str
    text: str


@pytest.mark.parametrize("aggregate_exists", [True, False])
def test_a_domain_event_with_a_nul_fails_its_flush_before_any_sql(
    engine: Engine, aggregate_exists: bool
) -> None:
    """Refused in before_flush, ahead of the flush's transaction: the session's transaction
    is untouched, the bad event is still in the session to be removed, nothing was written."""
    factory = sessionmaker(engine)
    sa_outbox.install(factory)
    with factory() as session, session.begin():
        order = Order(customer="ana")
        session.add(order)
        if aggregate_exists:
            session.flush()
        bad = ItemsAdded(order=order, items=[{"sku": "A-1"}, {"sku": "B\x00"}])
        session.add(bad)
        with pytest.raises(
            InvalidArgument, match=r"payload of event type 'ItemsAdded' at \$\.items\[1\]\.sku:"
        ):
            session.flush()
        assert bad in session  # not taken out of the session: the caller decides
        session.expunge(bad)
        session.add(ItemsAdded(order=order, items=[{"sku": "A-1"}]))
        session.add(NoteTaken(topic="t", text="fine"))
    assert [r.event_type for r in event_rows(engine)] == ["ItemsAdded", "NoteTaken"]


def test_a_domain_event_with_a_nul_in_a_plain_field_or_aggregate(engine: Engine) -> None:
    factory = sessionmaker(engine)
    sa_outbox.install(factory)
    with factory() as session, session.begin():
        for event, words in (
            (NoteTaken(topic="t", text="a\x00"), r"'NoteTaken' at \$\.text: contains a NUL"),
            (NoteTaken(topic="t\x00", text="a"), r"aggregate_id 't\\x00' contains a NUL"),
        ):
            session.add(event)
            with pytest.raises(InvalidArgument, match=words):
                session.flush()
            session.expunge(event)
        session.add(NoteTaken(topic="t", text="fine"))
    assert len(event_rows(engine)) == 1


async def test_the_async_paths_refuse_a_nul_too(engine: Engine, async_engine: AsyncEngine) -> None:
    queue, outbox = AsyncJobQueue(Job), AsyncOutbox(OutboxEvent)
    async with async_engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=r"job kind 'k' at \$\.a"):
            await queue.enqueue(conn, "k", {"a": NUL})
        with pytest.raises(InvalidArgument, match=r"job kind 'k' at \$\.a"):
            await queue.enqueue_many(conn, [NewJob("k", {"a": NUL})])
        with pytest.raises(InvalidArgument, match=r"job kind 'k' at \$\.a"):
            await queue.enqueue_copy(conn, [NewJob("k", {"a": NUL})])
        with pytest.raises(InvalidArgument, match=r"event type 'E' at \$\.a"):
            await outbox.append(
                conn, event_type="E", aggregate_type="a", aggregate_id=1, payload={"a": NUL}
            )
        await queue.enqueue(conn, "after", {})
    assert jobs_by_status(engine) == {"pending": 1} and event_rows(engine) == []


def test_an_escaped_nul_written_as_text_is_not_a_nul(engine: Engine) -> None:
    """The fast test looks for ``\\u0000`` in the JSON text; the six characters themselves
    (a backslash, then ``u0000``) are fine, and stored as written."""
    queue = JobQueue(Job)
    literal = "\\u0000"
    with engine.begin() as conn:
        queue.enqueue(conn, "a", {"s": literal})
        queue.enqueue_many(conn, [NewJob("b", {"s": literal})])
        queue.enqueue_copy(conn, [NewJob("c", {"s": literal})])
        jobs = queue.claim(conn, worker_id="w", batch=3)
    assert [j.payload for j in jobs] == [{"s": literal}] * 3


def test_a_custom_dumps_is_judged_by_what_it_wrote(engine: Engine) -> None:
    """With a ``dumps`` of the user's own (ASCII escapes), a NUL it writes is refused and an
    astral character it writes as a surrogate pair is fine."""
    import json

    queue = JobQueue(Job, dumps=lambda value: json.dumps(value, default=str))
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=r"job kind 'k' at \$\.a: contains a NUL"):
            queue.enqueue_many(conn, [NewJob("k", {"a": NUL})])
        queue.enqueue(conn, "k", {"a": "😀"})
        [job] = queue.claim(conn, worker_id="w")
    assert job.payload == {"a": "😀"}


# -- lone surrogates --------------------------------------------------------------------------


def test_lone_surrogates_are_refused_with_their_path(engine: Engine) -> None:
    queue, outbox = JobQueue(Job), Outbox(OutboxEvent)
    with engine.begin() as conn:
        for call in (
            lambda: queue.enqueue(conn, "k", {"a": ["x", "lone \ud800"]}),
            lambda: queue.enqueue_many(conn, [NewJob("k", {"a": ["x", "lone \ud800"]})]),
            lambda: queue.enqueue_copy(conn, [NewJob("k", {"a": ["x", "lone \ud800"]})]),
        ):
            with pytest.raises(
                PayloadNotSerializable,
                match=r"job kind 'k' at \$\.a\[1\]: is not valid UTF-8 text: a lone surrogate",
            ):
                call()
        with pytest.raises(
            PayloadNotSerializable, match=r'event type \'E\' at \$\["\\udfff"\]: the key'
        ):
            outbox.append(
                conn, event_type="E", aggregate_type="a", aggregate_id=1, payload={"\udfff": 1}
            )
        with pytest.raises(InvalidArgument, match=r"kind 'k\\udc00' is not valid UTF-8 text"):
            queue.enqueue(conn, "k\udc00", {})
        with pytest.raises(InvalidArgument, match=r"deduplication_key .* not valid UTF-8"):
            queue.enqueue(conn, "k", {}, deduplication_key="\ud800")
        queue.enqueue(conn, "after", {"fine": "é 😀"})
    assert jobs_by_status(engine) == {"pending": 1}


# -- nesting ----------------------------------------------------------------------------------


def test_a_payload_at_the_depth_limit_is_stored_and_read_back(engine: Engine) -> None:
    queue = JobQueue(Job)
    payload = nested(MAX_DEPTH)
    with engine.begin() as conn:
        queue.enqueue(conn, "a", payload)
        queue.enqueue_many(conn, [NewJob("b", payload)])
        queue.enqueue_copy(conn, [NewJob("c", payload)])
        jobs = queue.claim(conn, worker_id="w", batch=3)
    assert [j.payload for j in jobs] == [payload] * 3


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 2_000, 100_000])
def test_a_payload_past_the_depth_limit_is_refused_not_a_recursion_error(
    engine: Engine, depth: int
) -> None:
    queue, outbox = JobQueue(Job), Outbox(OutboxEvent)
    payload = nested(depth)
    words = rf"job kind 'k' at \$(\[0\])+.*: is nested more than {MAX_DEPTH} levels deep"
    with engine.begin() as conn:
        for call in (
            lambda: queue.enqueue(conn, "k", payload),
            lambda: queue.enqueue_many(conn, [NewJob("ok", {}), NewJob("k", payload)]),
            lambda: queue.enqueue_copy(conn, [NewJob("ok", {}), NewJob("k", payload)]),
        ):
            with pytest.raises(InvalidArgument, match=words):
                call()
        with pytest.raises(InvalidArgument, match=rf"event type 'E' at \$.*{MAX_DEPTH} levels"):
            outbox.append(conn, event_type="E", aggregate_type="a", aggregate_id=1, payload=payload)
        queue.enqueue(conn, "after", {})
    assert jobs_by_status(engine) == {"pending": 1} and event_rows(engine) == []


def test_many_brackets_side_by_side_are_not_depth(engine: Engine) -> None:
    """A wide payload (thousands of small objects) passes the quick bracket count's doubt
    and is stored: only nesting counts."""
    payload = {"items": [{"sku": f"A-{i}", "tags": ["x", "[{"]} for i in range(2_000)]}
    with engine.begin() as conn:
        JobQueue(Job).enqueue_many(conn, [NewJob("k", payload)])
    assert jobs_by_status(engine) == {"pending": 1}


def test_a_domain_event_past_the_depth_limit(engine: Engine) -> None:
    factory = sessionmaker(engine)
    sa_outbox.install(factory)
    with factory() as session, session.begin():
        order = Order(customer="ana")
        session.add(order)
        session.add(ItemsAdded(order=order, items=nested(5_000)))
        with pytest.raises(InvalidArgument, match=rf"ItemsAdded\.items.* more than {MAX_DEPTH}"):
            session.flush()
        session.expunge_all()
    assert event_rows(engine) == []


# -- lengths and blank names ------------------------------------------------------------------


def test_names_and_keys_at_their_limits_fit_the_indexes_whatever_the_characters(
    engine: Engine,
) -> None:
    """Four-byte characters that do not compress, at every maximum at once: the btree
    entries (kind, deduplication_key) and (aggregate_type, aggregate_id, seq) still fit."""
    kind, dedup = wide(MAX_NAME_LENGTH), wide(MAX_DEDUPLICATION_KEY_LENGTH)
    aggregate_type, aggregate_id = wide(MAX_NAME_LENGTH - 1) + "t", wide(MAX_AGGREGATE_ID_LENGTH)
    queue, outbox = JobQueue(Job), Outbox(OutboxEvent)
    with engine.begin() as conn:
        first = queue.enqueue(conn, kind, {}, queue=wide(MAX_NAME_LENGTH), deduplication_key=dedup)
        again = queue.enqueue_many(conn, [NewJob(kind, {}, deduplication_key=dedup)])
        outbox.append(
            conn,
            event_type=wide(MAX_NAME_LENGTH),
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            payload={},
        )
    assert first.inserted and not again[0].inserted  # the index held the key and found it
    assert jobs_by_status(engine) == {"pending": 1} and len(event_rows(engine)) == 1


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda q, c: q.enqueue(c, "k", {}, deduplication_key="x" * 513),
            r"deduplication_key 'x+…' is 513 characters long, over the limit of 512",
        ),
        (
            lambda q, c: q.enqueue_many(c, [NewJob("k", {}, deduplication_key="x" * 10_000)]),
            "is 10000 characters long, over the limit of 512",
        ),
        (lambda q, c: q.enqueue(c, "k" * 10_000, {}), "kind 'k+…' is 10000 characters long"),
        (lambda q, c: q.enqueue(c, "k" * 129, {}), "over the limit of 128"),
        (lambda q, c: q.enqueue_copy(c, [NewJob("k" * 129, {})]), r"^jobs\[0\]: kind .* 128"),
        (lambda q, c: q.enqueue(c, "k", {}, queue="q" * 129), "queue 'q+…' is 129 characters"),
        (lambda q, c: q.enqueue(c, "k", {}, queue="   "), "queue must not be blank"),
        (lambda q, c: q.enqueue(c, "\t\n", {}), "kind must not be blank"),
        (lambda q, c: q.enqueue_many(c, [NewJob("k", {}, queue=" ")]), "queue must not be blank"),
        (lambda q, c: q.enqueue_copy(c, [NewJob("k", {}, queue="\u3000")]), "queue must not be"),
    ],
)
def test_over_long_and_blank_names_and_keys_are_refused(
    engine: Engine, call: Callable[[JobQueue, Connection], object], words: str
) -> None:
    queue = JobQueue(Job)
    with engine.begin() as conn:
        with pytest.raises(InvalidArgument, match=words):
            call(queue, conn)
        queue.enqueue(conn, "after", {})  # before the fix: ProgramLimitExceeded, tx aborted
    assert jobs_by_status(engine) == {"pending": 1}


def test_over_long_and_blank_outbox_names_are_refused(engine: Engine) -> None:
    outbox = Outbox(OutboxEvent)
    good: dict[str, Any] = {
        "event_type": "E",
        "aggregate_type": "a",
        "aggregate_id": 1,
        "payload": {},
    }
    cases = [
        ({"event_type": "E" * 129}, "event_type 'E+…' is 129 characters long"),
        ({"event_type": " "}, "event_type must not be blank"),
        ({"aggregate_type": "a" * 10_000}, "aggregate_type .* is 10000 characters long"),
        ({"aggregate_type": "  "}, "aggregate_type must not be blank"),
        (
            {"aggregate_id": "1" * 513},
            "aggregate_id .* is 513 characters long, over the limit of 512",
        ),
    ]
    with engine.begin() as conn:
        for change, words in cases:
            with pytest.raises(InvalidArgument, match=words):
                outbox.append(conn, **{**good, **change})
        outbox.append(conn, **good)
    assert len(event_rows(engine)) == 1


def test_claim_filters_refuse_a_nul(engine: Engine) -> None:
    with pytest.raises(InvalidArgument, match="queues 'q\\\\x00' contains a NUL"):
        st.claim_jobs(Job, worker_id="w", queues="q\x00")


# -- follow-up jobs (issue 18.3, the library's side) ------------------------------------------


def test_a_bad_follow_up_job_is_refused_in_the_handler_as_an_invalid_argument(
    engine: Engine,
) -> None:
    """What the worker checks a handler's follow-up with (`st.enqueue_jobs`) refuses an
    over-long deduplication key and a NUL payload with `InvalidArgument`, so the worker
    can fail the job permanently; here the handler catches it and completes."""
    refused: list[BaseException] = []
    app = JobApp(Job)

    @app.handler("parent")
    def parent(job: JobContext) -> None:
        for kind, payload, key in (
            ("child", {"note": "a\x00"}, None),
            ("child", {}, "k" * (MAX_DEDUPLICATION_KEY_LENGTH + 1)),
        ):
            try:
                job.enqueue(kind, payload, deduplication_key=key)
            except InvalidArgument as exc:
                refused.append(exc)
        job.enqueue("child", {"note": "fine"})

    app.register("child", lambda job: None)
    clock = FakeClock()
    with engine.begin() as conn:
        JobQueue(Job, clock=clock).enqueue(conn, "parent", {})
    with Worker(app, engine, clock=clock, listen=False, install_signal_handlers=False) as worker:
        worker.drain(timeout=WAIT)
    assert [type(e) for e in refused] == [InvalidArgument, InvalidArgument]
    assert "payload of job kind 'child' at $.note: contains a NUL" in str(refused[0])
    assert "over the limit of 512" in str(refused[1])
    assert jobs_by_status(engine) == {"succeeded": 2}  # the parent and its one good child


def test_session_stays_usable_after_a_refused_enqueue(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(customer="bob"))
        with pytest.raises(InvalidArgument):
            sa_outbox.enqueue(session, "k", {"a": NUL}, model=Job)
        session.flush()  # the unit of work goes on
        sa_outbox.enqueue(session, "k", {"a": "fine"}, model=Job)
    assert jobs_by_status(engine) == {"pending": 1}


# -- the nesting count, against the real depth ------------------------------------------------


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


# Strings full of what could fool a count of brackets: brackets, quotes, backslashes.
_tricky = hs.text(alphabet='[]{}"\\\\,:ab \u00e9\U0001f600', max_size=8)
_documents = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | _tricky,
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(_tricky, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(document=_documents, limit=hs.integers(min_value=0, max_value=8))
def test_the_nesting_count_is_the_documents_depth(document: Any, limit: int) -> None:
    for text in (compact_json(document), json.dumps(document), json.dumps(document, indent=1)):
        assert nests_deeper(text, limit) == (_depth(document) > limit)
