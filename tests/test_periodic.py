"""Periodic jobs: every worker runs the scheduler, yet each tick enqueues exactly one job.

Two workers, each with an engine of its own (and two worker processes, each with a
`FakeClock` of its own stepped through the same ticks), look at their schedules step by
step (`Worker.run_schedules`, the keeper's chore); the table's unique index on (kind,
deduplication_key) is all that keeps a tick from running twice. Nothing sleeps; the fake
clock is the only time there is.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sa_outbox import (
    AsyncWorker,
    FakeClock,
    InvalidArgument,
    InvalidArgumentType,
    JobApp,
    JobContext,
    Schedule,
    Worker,
    periodic_tick,
)
from sa_outbox.worker._driver import KeeperPlan

from .conftest import TEST_SCHEMA, Job

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def at(hour: int, minute: int = 0, *, day: int = 1, month: int = 1) -> dt.datetime:
    return dt.datetime(2030, month, day, hour, minute, tzinfo=dt.UTC)


def rows(engine: Engine, kind: str | None = None) -> list[Any]:
    t = Job.__table__
    query = select(t.c.kind, t.c.deduplication_key, t.c.run_at, t.c.queue, t.c.payload)
    if kind is not None:
        query = query.where(t.c.kind == kind)
    with engine.connect() as conn:
        return list(conn.execute(query.order_by(t.c.kind, t.c.run_at)).all())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def engines(database_url: str) -> Iterator[list[Engine]]:
    made = [create_engine(database_url, pool_size=2) for _ in range(2)]
    yield made
    for engine in made:
        engine.dispose()


@pytest.fixture
def make_worker(clock: FakeClock) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(app: JobApp, engine: Engine, **options: Any) -> Worker:
        options.setdefault("clock", clock)
        options.setdefault("timer", lambda: clock.now().timestamp())
        options.setdefault("listen", False)
        options.setdefault("install_signal_handlers", False)
        worker = Worker(app, engine, **options)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def reporting_app() -> tuple[JobApp, list[tuple[str, dt.datetime | None]]]:
    app = JobApp(Job)
    ran: list[tuple[str, dt.datetime | None]] = []

    @app.periodic(every=dt.timedelta(minutes=5), kind="report", queue="periodic")
    def report(job: JobContext) -> None:
        ran.append((job.kind, periodic_tick(job.deduplication_key)))

    @app.periodic("*/10 * * * *", kind="digest", tz="Europe/Lisbon", payload={"to": "ops"})
    def digest(job: JobContext) -> None:
        ran.append((job.kind, periodic_tick(job.deduplication_key)))

    return app, ran


# -- two workers, one job per tick -------------------------------------------------------


def test_two_workers_enqueue_each_tick_once(
    engine: Engine, engines: list[Engine], clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    app, ran = reporting_app()
    first, second = (make_worker(app, e) for e in engines)
    inserted: list[tuple[str, dt.datetime]] = []
    for step in range(13):  # 00:00 to 00:36, every 3 minutes: ticks are passed in between
        pair = (first, second) if step % 2 else (second, first)
        for worker in pair:
            inserted += [(t.kind, t.at) for t in worker.run_schedules() if t.inserted]
        clock.advance(3 * MINUTE)

    reports = [at(0, m) for m in range(0, 40, 5)]
    digests = [at(0, m) for m in range(0, 40, 10)]
    assert sorted(inserted) == sorted(
        [("digest", t) for t in digests] + [("report", t) for t in reports]
    )
    table = rows(engine)
    assert [(r.kind, r.run_at) for r in table] == [("digest", t) for t in digests] + [
        ("report", t) for t in reports
    ]
    assert {r.queue for r in table if r.kind == "report"} == {"periodic"}
    assert {r.deduplication_key for r in table if r.kind == "digest"} == {
        f"periodic:digest@{t.isoformat()}" for t in digests
    }
    assert all(r.payload == {"to": "ops"} for r in table if r.kind == "digest")

    # The jobs run like any other: run_at is the tick, already past.
    assert first.drain() + second.drain() == len(reports) + len(digests)
    assert sorted(ran) == sorted(inserted)


def test_the_keeper_looks_again_at_the_next_tick(
    engines: list[Engine], clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    app, _ = reporting_app()
    clock.set(at(0, 2))
    worker = make_worker(app, engines[0])
    plan = KeeperPlan(worker.settings, now=worker.timer())
    assert worker._schedule_is_due()  # at start
    assert plan.due(worker.timer(), vacuum=False, prune=False, schedule=True) == ["schedule"]
    assert worker.run_schedules() == []  # 00:00 passed before it started: skipped
    clock.advance(dt.timedelta(seconds=59))
    assert not worker._schedule_is_due()  # 00:02:59
    assert worker._keeper_wait(plan, None) <= 1.0
    clock.advance(dt.timedelta(seconds=1))
    assert worker._schedule_is_due()  # 00:03: it looks at least once a minute
    assert worker.run_schedules() == []
    clock.advance(dt.timedelta(seconds=59))
    assert not worker._schedule_is_due()  # 00:03:59
    clock.advance(dt.timedelta(seconds=1))
    assert worker._schedule_is_due()  # 00:04
    assert worker.run_schedules() == []
    clock.advance(dt.timedelta(seconds=59))
    assert not worker._schedule_is_due()  # 00:04:59
    clock.advance(dt.timedelta(seconds=1))
    assert worker._schedule_is_due()  # 00:05, the next tick
    assert [(t.kind, t.at) for t in worker.run_schedules()] == [("report", at(0, 5))]
    clock.advance(4 * MINUTE)
    assert worker._schedule_is_due()  # 00:09 (the minute), then 00:10 (the next tick)
    assert worker.run_schedules() == []
    clock.advance(MINUTE)
    assert worker._schedule_is_due()
    assert sorted(t.kind for t in worker.run_schedules()) == ["digest", "report"]


def test_schedules_false_leaves_them_to_other_workers(
    engine: Engine, clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    app, _ = reporting_app()
    worker = make_worker(app, engine, schedules=False)
    assert worker.scheduler is None
    assert not worker._schedule_is_due()
    assert worker.run_schedules() == []
    assert rows(engine) == []
    with pytest.raises(InvalidArgumentType, match="schedules must be a bool"):
        make_worker(app, engine, schedules="no")


# -- downtime ----------------------------------------------------------------------------


def downtime_app() -> JobApp:
    app = JobApp(Job)
    app.register("tick", lambda job: None)
    app.schedule(kind="tick", name="skip", every=60)
    app.schedule(kind="tick", name="backfill", every=60, missed="backfill", backfill=3)
    return app


def ticks(engine: Engine, name: str) -> list[dt.datetime]:
    return [
        r.run_at
        for r in rows(engine, "tick")
        if r.deduplication_key.startswith(f"periodic:{name}@")
    ]


def test_downtime_skip_or_backfill(
    engine: Engine, engines: list[Engine], clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    app = downtime_app()
    clock.set(at(0, 0) + dt.timedelta(seconds=30))
    before = make_worker(app, engines[0])
    before.run_schedules()  # started at 00:00:30: skip waits for 00:01, backfill takes the
    before.close()  # three latest ticks: 23:58 and 23:59 of the day before, and 00:00
    assert ticks(engine, "skip") == []
    assert ticks(engine, "backfill") == [T0 - 2 * MINUTE, T0 - MINUTE, T0]

    clock.advance(10 * MINUTE)  # 00:10:30: every worker was down since 00:00:30
    after = make_worker(app, engines[1])
    after.run_schedules()
    assert ticks(engine, "skip") == []  # the ticks of the downtime are skipped
    assert ticks(engine, "backfill")[3:] == [at(0, 8), at(0, 9), at(0, 10)]  # the last 3

    clock.advance(MINUTE)
    after.run_schedules()  # on time again
    assert ticks(engine, "skip") == [at(0, 11)]
    assert ticks(engine, "backfill")[-1] == at(0, 11)

    clock.advance(5 * MINUTE)  # a running worker fell behind (the database away, say)
    after.run_schedules()
    assert ticks(engine, "skip") == [at(0, 11), at(0, 16)]  # only the latest tick, once
    assert ticks(engine, "backfill")[-3:] == [at(0, 14), at(0, 15), at(0, 16)]

    # A worker started later changes nothing: its ticks are enqueued already.
    third = make_worker(app, engines[0])
    looked = third.run_schedules()
    assert len(looked) == 3  # skip: none (it starts at 00:16:30); backfill: the last three
    assert not any(t.inserted for t in looked)


# -- time zones --------------------------------------------------------------------------


def test_a_cron_schedule_follows_its_time_zone_across_dst(
    engine: Engine, engines: list[Engine], clock: FakeClock, make_worker: Callable[..., Worker]
) -> None:
    # Lisbon moves from UTC+0 to UTC+1 at 01:00 UTC on 2030-03-31: 09:00 local is 09:00 UTC
    # the day before and 08:00 UTC from that day on.
    app = JobApp(Job)
    app.register("morning", lambda job: None)
    app.schedule("0 9 * * *", kind="morning", tz="Europe/Lisbon")
    clock.set(at(12, day=29, month=3))
    workers = [make_worker(app, e) for e in engines]
    for _ in range(17):  # from the 29th, 12:00, to the 2nd, 12:00, every six hours
        for worker in workers:
            worker.run_schedules()
        clock.advance(dt.timedelta(hours=6))
    assert [r.run_at for r in rows(engine, "morning")] == [
        at(9, day=30, month=3),
        at(8, day=31, month=3),
        at(8, day=1, month=4),
        at(8, day=2, month=4),
    ]
    [schedule] = app.schedules
    assert schedule.next_tick(at(12, day=30, month=3)) == at(8, day=31, month=3)


def test_listing_the_schedules_and_their_next_tick() -> None:
    app, _ = reporting_app()
    listed = {s.name: s.next_tick(at(0, 7)) for s in app.schedules}
    assert listed == {"report": at(0, 10), "digest": at(0, 10)}
    assert "schedules=['report', 'digest']" in repr(app)
    assert (
        str(app.schedules[1]) == "digest: digest cron '*/10 * * * *' (Europe/Lisbon), missed=skip"
    )


# -- asyncio -----------------------------------------------------------------------------


@pytest.fixture
async def async_engines(database_url: str) -> AsyncIterator[list[AsyncEngine]]:
    made = [create_async_engine(database_url, pool_size=2) for _ in range(2)]
    yield made
    for engine in made:
        await engine.dispose()


async def test_two_async_workers_enqueue_each_tick_once(
    engine: Engine, async_engines: list[AsyncEngine], clock: FakeClock
) -> None:
    app = JobApp(Job)
    seen: list[dt.datetime | None] = []

    @app.periodic("*/5 * * * *", kind="async-report")
    async def report(job: JobContext) -> None:
        seen.append(periodic_tick(job.deduplication_key))

    workers = [
        AsyncWorker(
            app,
            e,
            clock=clock,
            timer=lambda: clock.now().timestamp(),
            listen=False,
            install_signal_handlers=False,
        )
        for e in async_engines
    ]
    try:
        inserted = 0
        for _ in range(8):  # 00:00 to 00:14, every 2 minutes
            for worker in workers:
                inserted += sum(t.inserted for t in await worker.run_schedules())
            clock.advance(2 * MINUTE)
        expected = [at(0, 0), at(0, 5), at(0, 10)]
        assert inserted == len(expected)
        assert [r.run_at for r in rows(engine, "async-report")] == expected
        assert await workers[0].drain() + await workers[1].drain() == len(expected)
        assert sorted(t for t in seen if t is not None) == expected
    finally:
        for worker in workers:
            worker.close()


# -- bad input, at registration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"cron": "*/5 * * *"},
            InvalidArgument,
            r"cron expression '\*/5 \* \* \*' of schedule 'r'",
        ),
        ({"cron": "61 * * * *"}, InvalidArgument, "is not valid: Bad minute"),
        ({"cron": "* * * * *", "tz": "Europe/Lisbin"}, InvalidArgument, "unknown time zone"),
        ({"cron": "* * * * *", "tz": 1}, InvalidArgumentType, "IANA time zone name"),
        ({"cron": 5}, InvalidArgumentType, "must be a str"),
        ({"every": 0}, InvalidArgument, "every= of schedule 'r' must be more than zero"),
        ({"every": -60}, InvalidArgument, "must be more than zero"),
        ({"every": dt.timedelta(0)}, InvalidArgument, "must be more than zero"),
        ({"every": "5m"}, InvalidArgumentType, "every= of schedule 'r' must be a timedelta"),
        ({}, InvalidArgument, "needs a cron expression or every=, exactly one"),
        ({"cron": "* * * * *", "every": 60}, InvalidArgument, "exactly one"),
        ({"every": 60, "tz": "Europe/Lisbon"}, InvalidArgument, "tz= applies to cron"),
        ({"every": 60, "missed": "latest"}, InvalidArgument, "'skip' or 'backfill'"),
        ({"every": 60, "backfill": 3}, InvalidArgument, "backfill= needs missed='backfill'"),
        ({"every": 60, "missed": "backfill", "backfill": 0}, InvalidArgument, "between 1"),
        ({"every": 60, "payload": {1, 2}}, InvalidArgumentType, "payload of schedule 'r'"),
        ({"every": 60, "queue": ""}, InvalidArgument, "queue of schedule 'r' must not be empty"),
    ],
)
def test_bad_schedules_raise_at_registration(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    app = JobApp(Job)
    with pytest.raises(error, match=message):
        app.schedule(kind="r", **options)
    with pytest.raises(error, match=message):
        app.periodic(kind="r", **options)
    assert app.schedules == ()
    assert app.kinds == ()


def test_duplicate_schedule_names() -> None:
    app = JobApp(Job)
    app.schedule(kind="report", every=60)
    with pytest.raises(InvalidArgument, match="a schedule named 'report' already exists"):
        app.schedule(kind="report", cron="0 * * * *")
    app.schedule(kind="report", cron="0 * * * *", name="report-hourly")

    with pytest.raises(InvalidArgument, match="'report' already exists"):

        @app.periodic(every=300, kind="report")
        def report(job: JobContext) -> None: ...

    assert app.kinds == ()  # the refused decorator registered no handler either
    assert [s.name for s in app.schedules] == ["report", "report-hourly"]


def test_periodic_above_handler_adds_only_the_schedule() -> None:
    app = JobApp(Job)

    @app.periodic(every=300, kind="export")
    @app.handler("export", timeout=60)
    def export(job: JobContext) -> None: ...

    assert app.kinds == ("export",)
    assert app["export"].timeout == 60
    assert [s.kind for s in app.schedules] == ["export"]
    with pytest.raises(InvalidArgument, match="already has a handler"):

        @app.periodic(every=300, kind="export", name="again")
        def other(job: JobContext) -> None: ...


def test_a_cron_schedule_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if cronsim were not installed
    app = JobApp(Job)
    with pytest.raises(InvalidArgument) as caught:
        app.schedule("*/5 * * * *", kind="report")
    assert str(caught.value).count("\n") == 0
    assert 'pip install "sa-outbox[cron]"' in str(caught.value)
    app.schedule(kind="report", every=300)  # an interval needs no extra
    assert Schedule.build("x", every=60).next_tick(T0) == T0 + MINUTE


def test_periodic_tick_reads_the_key_back() -> None:
    schedule = Schedule.build("report", "0 9 * * *", tz="Europe/Lisbon", name="a@b:c")
    tick = schedule.next_tick(at(12, day=30, month=3))
    assert periodic_tick(schedule.deduplication_key(tick)) == tick == at(8, day=31, month=3)
    assert periodic_tick(None) is None
    assert periodic_tick("periodic:broken") is None


#: One worker process of `test_two_worker_processes_enqueue_each_tick_once`: the same
#: schedules, its own FakeClock stepped through the same ticks, its inserted ticks printed.
SCHEDULER_PROCESS = """
import datetime as dt, json, sys
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase
from sa_outbox import FakeClock, JobApp, JobMixin, Worker

schema, url, start = sys.argv[1], sys.argv[2], dt.datetime.fromisoformat(sys.argv[3])

class Base(DeclarativeBase):
    pass

class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = schema

app = JobApp(Job)
app.periodic(every=dt.timedelta(minutes=5), kind="report", queue="periodic")(lambda job: None)
app.periodic("*/10 * * * *", kind="digest", tz="Europe/Lisbon", payload={"to": "ops"})(
    lambda job: None
)
clock = FakeClock(start)
engine = create_engine(url)
worker = Worker(app, engine, clock=clock, timer=lambda: clock.now().timestamp(),
                listen=False, install_signal_handlers=False)
inserted = []
for step in range(13):
    inserted += [[t.kind, t.at.isoformat()] for t in worker.run_schedules() if t.inserted]
    clock.advance(dt.timedelta(minutes=3))
worker.close()
engine.dispose()
print(json.dumps(inserted))
"""


def test_two_worker_processes_enqueue_each_tick_once(engine: Engine, database_url: str) -> None:
    command = [sys.executable, "-c", SCHEDULER_PROCESS, TEST_SCHEMA, database_url, T0.isoformat()]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    inserted = [tuple(tick) for out, _ in outputs for tick in json.loads(out)]
    reports = [at(0, m) for m in range(0, 40, 5)]
    digests = [at(0, m) for m in range(0, 40, 10)]
    expected = [("digest", t) for t in digests] + [("report", t) for t in reports]
    # Each tick went in once, from one process or the other, never from both.
    assert sorted(inserted) == sorted((kind, t.isoformat()) for kind, t in expected)
    assert [(r.kind, r.run_at) for r in rows(engine)] == expected
