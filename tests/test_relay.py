"""The relay against a real PostgreSQL, publishing in-process (`CallablePublisher`).

Claim → publish → mark, per-aggregate order (also across two concurrent writers), backoff and
parking of a poison event, a broker that is down, LISTEN/NOTIFY, batches, retention. Time
moves with a `FakeClock`; nothing sleeps to synchronise. Every failure path counts the
events at the end: nothing is lost.
"""

from __future__ import annotations

import collections
import datetime as dt
import queue as queue_module
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.orm import Session

from sa_outbox import Backoff, FakeClock, InvalidArgument, Outbox, VacuumPolicy
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.queue import ClaimedEvent
from sa_outbox.relay import EventsRejected, PublisherUnavailable, Relay

from .conftest import TEST_SCHEMA, OutboxEvent
from .helpers import event_rows

WAIT = 30.0  # seconds a test waits for something that should happen at once


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))


@pytest.fixture
def outbox(clock: FakeClock) -> Outbox:
    return Outbox(OutboxEvent, clock=clock)


class Recorder:
    """An in-process broker: records what it is given, refuses what it is told to."""

    def __init__(self) -> None:
        self.messages: list[ClaimedEvent] = []
        self.refuse: set[str] = set()  # event types it rejects
        self.down = False
        self.got_one = threading.Event()

    def __call__(self, event: ClaimedEvent) -> None:
        if self.down:
            raise PublisherUnavailable("connection refused")
        if event.event_type in self.refuse:
            raise ValueError(f"message {event.event_type} refused")
        self.messages.append(event)
        self.got_one.set()

    def ids(self) -> list[uuid.UUID]:
        return [m.id for m in self.messages]

    def by_aggregate(self) -> dict[str, list[int]]:
        seqs: dict[str, list[int]] = collections.defaultdict(list)
        for m in self.messages:
            seqs[m.aggregate_id].append(m.seq)
        return dict(seqs)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_relay(engine: Engine, clock: FakeClock) -> Iterator[Callable[..., Relay]]:
    relays: list[Relay] = []

    def make(publisher: Any, **options: Any) -> Relay:
        options.setdefault("clock", clock)
        options.setdefault("backoff", Backoff(base=10, max=10, jitter=0))
        relay = Relay(engine, OutboxEvent, publisher, **options)
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.close()


def append(engine: Engine, outbox: Outbox, events: list[tuple[str, str]]) -> list[uuid.UUID]:
    """Append (aggregate_id, event_type) pairs in one transaction, in order."""
    with Session(engine) as session, session.begin():
        return [
            outbox.append(
                session,
                event_type=event_type,
                aggregate_type="order",
                aggregate_id=aggregate,
                payload={"n": i},
            )
            for i, (aggregate, event_type) in enumerate(events)
        ]


def counts(engine: Engine) -> dict[str, int]:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                func.count().filter(t.c.published_at.is_not(None)),
                func.count().filter(t.c.parked_at.is_not(None)),
                func.count().filter(t.c.published_at.is_(None), t.c.parked_at.is_(None)),
            )
        ).one()
    return {"published": rows[0], "parked": rows[1], "pending": rows[2]}


def test_claim_publish_mark_keeps_each_aggregate_in_order(
    engine: Engine, outbox: Outbox, recorder: Recorder, make_relay: Callable[..., Relay]
) -> None:
    events = [(f"a{i % 7}", "OrderChanged") for i in range(60)]
    ids = append(engine, outbox, events)
    relay = make_relay(CallablePublisher(recorder), batch=25)

    reports = [relay.run_once() for _ in range(4)]

    assert [r.published for r in reports] == [25, 25, 10, 0]
    assert sorted(recorder.ids()) == sorted(ids)  # each exactly once
    for seqs in recorder.by_aggregate().values():
        assert seqs == sorted(seqs)
    assert counts(engine) == {"published": 60, "parked": 0, "pending": 0}
    assert all(r.relay_token is None and r.attempts == 1 for r in event_rows(engine))


def test_two_claims_never_hold_events_of_one_aggregate(engine: Engine, outbox: Outbox) -> None:
    append(engine, outbox, [("a", "E")] * 5 + [("b", "E")] * 2 + [("a", "E")] + [("c", "E")])
    with engine.begin() as conn:
        first = outbox.claim(conn, batch=3)
    with engine.begin() as conn:
        second = outbox.claim(conn, batch=100)
    # The first takes a run from the head of "a" (and of "b"); "a" is then held whole.
    assert [(e.aggregate_id, e.seq) for e in first][:1] == [("a", first[0].seq)]
    held = {e.aggregate_id for e in first}
    assert not held & {e.aggregate_id for e in second}
    assert {e.aggregate_id for e in first} | {e.aggregate_id for e in second} == {"a", "b", "c"}
    # A run starts at the head and has no gap: a1, a2, a3 — never a2 without a1.
    a_seqs = [e.seq for e in first if e.aggregate_id == "a"]
    all_a = [r.seq for r in event_rows(engine) if r.aggregate_id == "a"]
    assert a_seqs == all_a[: len(a_seqs)]


def test_concurrent_claims_with_skip_locked_keep_aggregates_apart(
    engine: Engine, outbox: Outbox
) -> None:
    append(engine, outbox, [(f"g{i % 10}", "E") for i in range(200)])
    start = threading.Barrier(4)
    claimed: queue_module.Queue[list[ClaimedEvent]] = queue_module.Queue()

    def claimer() -> None:
        start.wait(WAIT)
        with engine.begin() as conn:
            claimed.put(outbox.claim(conn, batch=15))

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    batches = [claimed.get_nowait() for _ in range(4)]
    owners: dict[str, int] = {}
    for i, batch in enumerate(batches):
        for event in batch:
            assert owners.setdefault(event.aggregate_id, i) == i  # one holder per aggregate
    ids = [e.id for batch in batches for e in batch]
    assert len(ids) == len(set(ids))


def test_a_later_seq_never_overtakes_an_earlier_one_still_in_flight(
    engine: Engine, outbox: Outbox, recorder: Recorder, make_relay: Callable[..., Relay]
) -> None:
    """Two real concurrent transactions write events of aggregate "a"; the second one's
    insert waits (the ordering trigger's advisory lock) until the first commits, so its
    ``seq`` is drawn after: commit order is seq order. Meanwhile another aggregate, written
    and committed by a third transaction, is published at once: nobody waits for "a"."""
    relay = make_relay(CallablePublisher(recorder))
    first = engine.connect()
    first_tx = first.begin()
    [a1] = [
        outbox.append(first, event_type="A1", aggregate_type="order", aggregate_id="a", payload={})
    ]
    a1_seq = first.execute(
        select(OutboxEvent.__table__.c.seq).where(OutboxEvent.__table__.c.id == a1)
    ).scalar_one()

    pids: queue_module.Queue[int] = queue_module.Queue()
    second_done = threading.Event()

    def second_writer() -> None:
        with engine.begin() as conn:
            pids.put(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            outbox.append(
                conn, event_type="A2", aggregate_type="order", aggregate_id="a", payload={}
            )
        second_done.set()

    writer = threading.Thread(target=second_writer)
    writer.start()
    second_pid = pids.get(timeout=WAIT)
    # Wait until the second writer is blocked behind the first (a condition, not a sleep).
    blocked = text("SELECT cardinality(pg_blocking_pids(:pid)) > 0")
    deadline = threading.Event()
    for _ in range(int(WAIT * 100)):
        with engine.connect() as conn:
            if conn.execute(blocked, {"pid": second_pid}).scalar_one():
                break
        deadline.wait(0.01)
    else:
        pytest.fail("the second writer never waited for the first")
    assert not second_done.is_set()

    # A third transaction writes aggregate "b" after "a1" was inserted, and commits first.
    append(engine, outbox, [("b", "B1")])
    report = relay.run_once()
    assert [m.event_type for m in recorder.messages] == ["B1"]  # "a" is not skipped…
    assert report.published == 1  # …nor does it hold "b" back

    first_tx.commit()
    first.close()
    writer.join(WAIT)
    assert second_done.is_set()
    relay.run_once()
    assert [m.event_type for m in recorder.messages] == ["B1", "A1", "A2"]
    a2 = recorder.messages[2]
    assert a2.seq > a1_seq  # drawn after the first transaction committed
    assert counts(engine) == {"published": 3, "parked": 0, "pending": 0}


def test_a_rolled_back_writer_releases_the_aggregate(engine: Engine, outbox: Outbox) -> None:
    with engine.connect() as conn:
        tx = conn.begin()
        outbox.append(conn, event_type="A1", aggregate_type="order", aggregate_id="a", payload={})
        tx.rollback()
    [a2] = append(engine, outbox, [("a", "A2")])
    with engine.begin() as conn:
        assert [e.id for e in outbox.claim(conn)] == [a2]


def test_poison_event_backs_off_then_parks_without_blocking_other_aggregates(
    engine: Engine,
    outbox: Outbox,
    clock: FakeClock,
    recorder: Recorder,
    make_relay: Callable[..., Relay],
) -> None:
    append(engine, outbox, [("a", "Poison"), ("b", "Fine"), ("a", "AfterPoison"), ("c", "Fine")])
    recorder.refuse.add("Poison")
    relay = make_relay(CallablePublisher(recorder), max_attempts=3)

    report = relay.run_once()
    assert (report.claimed, report.published, report.rejected, report.released) == (4, 2, 1, 1)
    rows = {r.event_type: r for r in event_rows(engine)}
    poison = rows["Poison"]
    assert poison.attempts == 1 and poison.parked_at is None
    assert poison.relay_until == clock.now() + dt.timedelta(seconds=10)  # backing off
    assert poison.last_error == "ValueError: message Poison refused"
    assert rows["AfterPoison"].attempts == 0  # given back untried, behind the poison

    assert relay.run_once().idle  # "a" waits for its backoff; the rest is published
    clock.advance(10)
    assert relay.run_once().rejected == 1
    clock.advance(10)
    third = relay.run_once()
    assert (third.rejected, third.parked) == (1, 1)

    [parked] = outbox.parked(engine.connect())
    assert (parked.event_type, parked.attempts) == ("Poison", 3)
    assert parked.last_error == "ValueError: message Poison refused"
    clock.advance(3600)
    assert relay.run_once().idle  # parked: never retried, and "a" keeps its order
    assert counts(engine) == {"published": 2, "parked": 1, "pending": 1}

    # The operator fixes the cause and requeues: the aggregate resumes, in order.
    recorder.refuse.clear()
    with engine.begin() as conn:
        assert outbox.requeue_parked(conn) == [parked.id]
    relay.run_once()
    assert [m.event_type for m in recorder.messages] == ["Fine", "Fine", "Poison", "AfterPoison"]
    assert counts(engine) == {"published": 4, "parked": 0, "pending": 0}


def test_broker_down_keeps_events_counts_no_attempt_and_resumes(
    engine: Engine, outbox: Outbox, recorder: Recorder, make_relay: Callable[..., Relay]
) -> None:
    ids = append(engine, outbox, [(f"a{i}", "E") for i in range(5)])
    relay = make_relay(CallablePublisher(recorder), max_attempts=2)
    recorder.down = True

    for _ in range(3):  # more cycles than max_attempts: an outage parks nothing
        report = relay.run_once()
        assert report.unavailable == "connection refused"
        assert (report.published, report.released) == (0, 5)
        rows = event_rows(engine)
        assert all(r.attempts == 0 and r.relay_token is None for r in rows)
        assert all(r.last_error == "connection refused" and r.parked_at is None for r in rows)
    assert counts(engine) == {"published": 0, "parked": 0, "pending": 5}

    recorder.down = False  # the broker is back
    assert relay.run_once().published == 5
    assert sorted(recorder.ids()) == sorted(ids)
    assert all(r.attempts == 1 for r in event_rows(engine))
    assert counts(engine) == {"published": 5, "parked": 0, "pending": 0}


def test_a_long_outage_uses_up_no_attempts_only_rejections_park(
    engine: Engine,
    outbox: Outbox,
    clock: FakeClock,
    recorder: Recorder,
    make_relay: Callable[..., Relay],
) -> None:
    """The broker is down for many cycles, then refuses one event: that event is parked
    only after ``max_attempts`` real rejections, not at the first one (issue 18.4)."""
    append(engine, outbox, [("a", "Refused"), ("b", "Fine"), ("a", "AfterRefused")])
    relay = make_relay(CallablePublisher(recorder), max_attempts=3)
    recorder.down = True
    for _ in range(12):  # four times max_attempts, a second apart
        report = relay.run_once()
        assert report.unavailable == "connection refused" and report.parked == 0
        clock.advance(1)
    assert all(r.attempts == 0 and r.parked_at is None for r in event_rows(engine))

    recorder.down = False  # back, but it refuses one event
    recorder.refuse.add("Refused")
    outcomes = []
    for _ in range(3):
        report = relay.run_once()
        refused = next(r for r in event_rows(engine) if r.event_type == "Refused")
        outcomes.append((report.rejected, report.parked, refused.attempts))
        clock.advance(10)  # the backoff (10 s)
    assert outcomes == [(1, 0, 1), (1, 0, 2), (1, 1, 3)]  # parked at the third rejection
    with engine.connect() as conn:
        [parked] = outbox.parked(conn)
    assert (parked.event_type, parked.last_error) == (
        "Refused",
        "ValueError: message Refused refused",
    )
    assert [m.event_type for m in recorder.messages] == ["Fine"]
    assert counts(engine) == {"published": 1, "parked": 1, "pending": 1}


def test_a_broker_error_holding_a_nul_is_recorded_escaped_not_a_crash(
    engine: Engine, outbox: Outbox, make_relay: Callable[..., Relay]
) -> None:
    """A broker's message with a NUL or a lone surrogate went into last_error as it was:
    the cycle's transaction failed and the relay stopped; now it is kept escaped."""
    ids = append(engine, outbox, [("a", "Raises"), ("b", "Nacked"), ("c", "Fine")])

    class Odd:
        async def publish(self, events: list[ClaimedEvent]) -> None:
            if any(e.event_type == "Raises" for e in events):
                raise ValueError("frame \x00\x01 from \udcff broker")
            raise EventsRejected({ids[1]: "nack \x00"})

        async def aclose(self) -> None:
            pass

    report = make_relay(Odd()).run_once()
    assert (report.published, report.rejected, report.parked) == (1, 2, 0)
    rows = {r.event_type: r for r in event_rows(engine)}
    assert rows["Raises"].last_error == "ValueError: frame \\x00\x01 from \\udcff broker"
    assert rows["Nacked"].last_error == "nack \\x00"
    assert counts(engine) == {"published": 1, "parked": 0, "pending": 2}


class FlakyBatch:
    """A publisher that fails a whole batch with an error it does not classify whenever the
    batch holds the poison event (what a buggy client library might do)."""

    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, events: list[ClaimedEvent]) -> None:
        if any(e.event_type == "Poison" for e in events):
            raise RuntimeError("client crashed")
        self.published.extend(e.event_type for e in events)

    async def aclose(self) -> None:
        pass


def test_an_unclassified_batch_error_is_pinned_on_the_event_that_causes_it(
    engine: Engine, outbox: Outbox, make_relay: Callable[..., Relay]
) -> None:
    append(engine, outbox, [("a", "Fine"), ("b", "Poison"), ("c", "Fine")])
    publisher = FlakyBatch()
    report = make_relay(publisher).run_once()
    assert (report.published, report.rejected) == (2, 1)
    assert publisher.published == ["Fine", "Fine"]
    poison = next(r for r in event_rows(engine) if r.event_type == "Poison")
    assert poison.last_error == "RuntimeError: client crashed"
    assert counts(engine) == {"published": 2, "parked": 0, "pending": 1}


def test_rejections_reported_by_the_publisher_mark_the_others(
    engine: Engine, outbox: Outbox, make_relay: Callable[..., Relay]
) -> None:
    ids = append(engine, outbox, [("a", "E"), ("b", "E"), ("c", "E")])

    class Nacks:
        async def publish(self, events: list[ClaimedEvent]) -> None:
            raise EventsRejected({ids[1]: "nacked"})

        async def aclose(self) -> None:
            pass

    report = make_relay(Nacks()).run_once()
    assert (report.published, report.rejected) == (2, 1)
    assert [r.published_at is not None for r in event_rows(engine)] == [True, False, True]
    assert event_rows(engine)[1].last_error == "nacked"


def test_relay_killed_between_publish_and_mark_republishes_after_the_lease(
    engine: Engine,
    outbox: Outbox,
    clock: FakeClock,
    recorder: Recorder,
    make_relay: Callable[..., Relay],
) -> None:
    """In-process version (tests/test_relay_processes.py kills a real process)."""
    [event_id] = append(engine, outbox, [("a", "E")])
    with engine.begin() as conn:  # a relay claims and publishes…
        [claimed] = outbox.claim(conn, lease=30)
    recorder(claimed)  # …and dies before marking
    relay = make_relay(CallablePublisher(recorder))
    assert relay.run_once().idle  # the lease still holds
    clock.advance(31)
    assert relay.run_once().published == 1
    assert recorder.ids() == [event_id, event_id]  # a duplicate, nothing lost
    assert counts(engine) == {"published": 1, "parked": 0, "pending": 0}
    with engine.begin() as conn, pytest.raises(Exception, match="lease token"):
        outbox.mark_published(conn, claimed.id, claimed.relay_token)  # the zombie is fenced


def test_run_wakes_up_on_notify(
    engine: Engine, outbox: Outbox, recorder: Recorder, make_relay: Callable[..., Relay]
) -> None:
    relay = make_relay(CallablePublisher(recorder), poll_interval=3600, clock=None)
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        listening = text(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %outbox%'"
            " AND query LIKE :schema"
        )
        waiter = threading.Event()
        for _ in range(int(WAIT * 100)):  # until the relay's LISTEN connection exists
            with engine.connect() as conn:
                if conn.execute(listening, {"schema": f"%{TEST_SCHEMA}%"}).scalar_one():
                    break
            waiter.wait(0.01)
        else:
            pytest.fail("the relay never listened")
        [event_id] = append(engine, outbox, [("a", "E")])
        # Polling would take an hour: only the NOTIFY can wake the relay in time.
        assert recorder.got_one.wait(WAIT)
        assert recorder.ids() == [event_id]
    finally:
        relay.stop()
        runner.join(WAIT)
    assert not runner.is_alive()


def test_run_polls_without_listen_and_takes_full_batches_back_to_back(
    engine: Engine, outbox: Outbox, recorder: Recorder, make_relay: Callable[..., Relay]
) -> None:
    ids = append(engine, outbox, [(f"a{i}", "E") for i in range(250)])
    all_in = threading.Event()
    published: list[uuid.UUID] = []

    def collect(event: ClaimedEvent) -> None:
        published.append(event.id)
        if len(published) == 250:
            all_in.set()

    relay = make_relay(
        CallablePublisher(collect), batch=100, listen=False, poll_interval=3600, clock=None
    )
    runner = threading.Thread(target=relay.run)
    runner.start()
    try:
        # 100 + 100 + 50 with no wait between full batches (a wait would last an hour).
        assert all_in.wait(WAIT)
    finally:
        relay.stop()
        runner.join(WAIT)
    assert not runner.is_alive()
    assert sorted(published) == sorted(ids)


def test_retention_prunes_only_old_published_events(
    engine: Engine,
    outbox: Outbox,
    clock: FakeClock,
    recorder: Recorder,
    make_relay: Callable[..., Relay],
) -> None:
    append(engine, outbox, [("a", "Old"), ("b", "Poison")])
    recorder.refuse.add("Poison")
    relay = make_relay(CallablePublisher(recorder), retention=dt.timedelta(days=1), max_attempts=1)
    relay.run_once()  # "Old" published, "Poison" parked at once
    clock.advance(dt.timedelta(hours=12))
    append(engine, outbox, [("c", "Recent")])
    relay.run_once()
    assert relay.prune_once() == 0  # nothing published a day ago yet
    clock.advance(dt.timedelta(hours=13))
    assert relay.prune_once() == 1
    assert sorted(r.event_type for r in event_rows(engine)) == ["Poison", "Recent"]
    assert make_relay(CallablePublisher(recorder), retention=None).prune_once() == 0


def test_the_relay_vacuums_the_outbox_past_its_dead_tuple_threshold(
    engine: Engine, outbox: Outbox, recorder: Recorder, clock: FakeClock, database_url: str
) -> None:
    # Each published event leaves a dead entry in the claim's partial index. One pooled
    # connection does all the relay's writes, so forcing its statistics out is enough to
    # read exact counts (see tests/test_vacuum.py).
    append(engine, outbox, [(f"agg-{i}", "Placed") for i in range(300)])
    one = create_engine(database_url, pool_size=1, max_overflow=0)
    policy = VacuumPolicy(threshold=200)
    relay = Relay(
        one, OutboxEvent, CallablePublisher(recorder), batch=100, clock=clock, vacuum=policy
    )
    try:
        while relay.run_once().published:
            pass
        with one.connect() as conn:
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
        report = relay.vacuum_once()
    finally:
        relay.close()
        one.dispose()
    assert report is not None
    assert report.vacuumed == [f"{TEST_SCHEMA}.outbox"]
    assert counts(engine) == {"published": 300, "parked": 0, "pending": 0}
    off = Relay(engine, OutboxEvent, CallablePublisher(recorder), vacuum=None)
    assert off.vacuum_once() is None
    off.close()


def test_stop_ends_a_relay_that_backs_off_from_a_down_broker(
    engine: Engine, outbox: Outbox, recorder: Recorder, make_relay: Callable[..., Relay]
) -> None:
    append(engine, outbox, [("a", "E")])
    recorder.down = True
    tried = threading.Event()

    def down(event: ClaimedEvent) -> None:
        tried.set()
        recorder(event)

    relay = make_relay(CallablePublisher(down), retry_initial=3600, retry_max=3600, clock=None)
    runner = threading.Thread(target=relay.run)
    runner.start()
    assert tried.wait(WAIT)
    relay.stop()  # interrupts the hour-long backoff
    runner.join(WAIT)
    assert not runner.is_alive()
    [row] = event_rows(engine)
    assert row.published_at is None and row.relay_token is None
    assert (row.attempts, row.last_error) == (0, "connection refused")  # tried, not counted


def test_bad_options_are_refused_before_anything_runs(engine: Engine) -> None:
    publisher = CallablePublisher(print)
    with pytest.raises(InvalidArgument, match="publish_timeout"):
        Relay(engine, OutboxEvent, publisher, lease=10, publish_timeout=10)
    with pytest.raises(InvalidArgument, match="batch"):
        Relay(engine, OutboxEvent, publisher, batch=0)
    with pytest.raises(TypeError, match="publisher"):
        Relay(engine, OutboxEvent, object())  # type: ignore[arg-type]
