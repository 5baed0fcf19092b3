"""Periodic jobs across an outage: every worker stops, the clock crosses several ticks, and
the workers start again.

One timeline for every test, with a schedule per missed-tick policy (all every minute):
two workers run from 00:00:59.5 to 00:02:59.5, looking at their schedules at three
positions; all stop; nothing runs while ticks 00:03 to 00:08 pass; two workers start again
at 00:08:59.5 and run to 00:10:59.5. What each policy must have run by then is `EXPECTED`:

- ``missed="skip"``: the ticks the workers were up for, nothing of the outage;
- ``missed="backfill"`` (``backfill=1``): also the latest tick before each start, once;
- ``backfill=3``: the three latest ticks before each start;
- ``backfill=10``, more than the outage: every missed tick, and ten before the first start.

Each tick's job is enqueued once, by one worker or the other (the deduplication key), and
run once. Three ways to stop and start: workers looking step by step as the keeper does
(`Worker.run_schedules`, new workers after the outage), running `Worker.run` /
`AsyncWorker.run` in this process (stopped, then the same objects run again: a worker run
again forgets what its scheduler saw, as a new one would), and worker processes, stopped
with SIGTERM and started anew. The clock is a `FakeClock` that the statements read (a
process's is set through its stdin); positions sit half a second before a tick, so a
running keeper looks again within half a second of real time; the tests wait for those
looks, never for a time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sa_outbox import AsyncWorker, FakeClock, JobApp, JobContext, Worker
from sa_outbox.worker.schedule import Tick

from .conftest import TEST_SCHEMA, Job
from .helpers import unfinished_jobs, wait_until

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)
#: Where the clock stands when the workers look: half a second before the next tick.
BEFORE_TICK = dt.timedelta(seconds=59.5)
FIRST_RUN = [T0 + BEFORE_TICK + n * MINUTE for n in range(3)]  # 00:00:59.5 … 00:02:59.5
SECOND_RUN = [T0 + BEFORE_TICK + n * MINUTE for n in range(8, 11)]  # 00:08:59.5 … 00:10:59.5
WAIT = 60.0  # the bound of every wait: proves nothing hangs, never how fast


def minute(m: int) -> dt.datetime:
    """The tick ``m`` minutes after 00:00 (negative: the evening before)."""
    return T0 + m * MINUTE


EXPECTED: dict[str, list[dt.datetime]] = {
    "skip": [minute(m) for m in (1, 2, 9, 10)],
    "latest": [minute(m) for m in (0, 1, 2, 8, 9, 10)],
    "last-3": [minute(m) for m in (-2, -1, 0, 1, 2, 6, 7, 8, 9, 10)],
    "catch-up": [minute(m) for m in range(-9, 11)],
}


def schedule_all(app: JobApp) -> None:
    app.schedule(kind="tick", name="skip", every=60)
    app.schedule(kind="tick", name="latest", every=60, missed="backfill")
    app.schedule(kind="tick", name="last-3", every=60, missed="backfill", backfill=3)
    app.schedule(kind="tick", name="catch-up", every=60, missed="backfill", backfill=10)


def outage_app() -> tuple[JobApp, list[str]]:
    """The schedules, and the deduplication keys of the jobs its handler ran, in order."""
    app = JobApp(Job)
    ran: list[str] = []
    lock = threading.Lock()

    def tick(job: JobContext) -> None:
        with lock:
            ran.append(str(job.deduplication_key))

    app.register("tick", tick)
    schedule_all(app)
    return app, ran


def key(name: str, tick: dt.datetime) -> str:
    return f"periodic:{name}@{tick.isoformat()}"


def expected_keys() -> list[str]:
    return sorted(key(name, tick) for name, ticks in EXPECTED.items() for tick in ticks)


def check_the_table(engine: Engine, ran: list[str], inserted: list[str]) -> None:
    """Every policy's ticks, each enqueued once (by one worker), run once, succeeded."""
    t = Job.__table__
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.deduplication_key, t.c.status, t.c.attempts)).all()
    by_name: dict[str, list[dt.datetime]] = {name: [] for name in EXPECTED}
    for row in rows:
        name, _, when = row.deduplication_key.removeprefix("periodic:").rpartition("@")
        by_name[name].append(dt.datetime.fromisoformat(when))

    def hours(found: dict[str, list[dt.datetime]]) -> dict[str, list[str]]:
        return {name: [f"{t:%H:%M}" for t in sorted(ticks)] for name, ticks in found.items()}

    assert hours(by_name) == hours(EXPECTED)
    assert {(str(r.status), r.attempts) for r in rows} == {("succeeded", 1)}
    assert sorted(inserted) == expected_keys()  # no tick inserted by two workers
    assert Counter(ran) == Counter(expected_keys())  # each job ran once
    assert unfinished_jobs(engine) == 0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(FIRST_RUN[0])


@pytest.fixture
def engines(database_url: str) -> Iterator[list[Engine]]:
    made = [create_engine(database_url, pool_size=3) for _ in range(2)]
    yield made
    for engine in made:
        engine.dispose()


def inserted_keys(ticks: list[Tick]) -> list[str]:
    return [key(t.schedule, t.at) for t in ticks if t.inserted]


# -- step by step: the keeper's look, by hand ---------------------------------------------


def test_every_policy_across_an_outage_step_by_step(
    engine: Engine, engines: list[Engine], clock: FakeClock
) -> None:
    app, ran = outage_app()
    inserted: list[str] = []

    def workers() -> list[Worker]:
        return [
            Worker(
                app,
                e,
                clock=clock,
                timer=lambda: clock.now().timestamp(),
                listen=False,
                install_signal_handlers=False,
            )
            for e in engines
        ]

    def first_looks_together(pair: list[Worker]) -> None:
        # Both start at the same moment: their first looks race for the same ticks.
        barrier = threading.Barrier(len(pair))
        found: list[list[Tick]] = [[] for _ in pair]

        def look(i: int) -> None:
            barrier.wait(WAIT)
            found[i] = pair[i].run_schedules()

        threads = [threading.Thread(target=look, args=(i,)) for i in range(len(pair))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not any(thread.is_alive() for thread in threads)
        for ticks in found:
            inserted.extend(inserted_keys(ticks))

    for run in (FIRST_RUN, SECOND_RUN):
        clock.set(run[0])
        pair = workers()  # after the outage: new workers, as new processes would be
        first_looks_together(pair)
        for position in run:
            clock.set(position)
            for worker in pair:
                inserted.extend(inserted_keys(worker.run_schedules()))
            for worker in pair:
                worker.drain()
            assert unfinished_jobs(engine) == 0
        for worker in pair:
            worker.close()  # every worker is down from here to the next run

    check_the_table(engine, ran, inserted)


# -- Worker.run in threads: stopped, then run again ---------------------------------------


class Looks:
    """What the workers' keepers looked at: ``(worker, now, inserted keys)``, in order."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.seen: list[tuple[int, dt.datetime, list[str]]] = []
        self.changed = threading.Condition()

    def record(self, worker: int, now: dt.datetime, ticks: list[Tick]) -> None:
        with self.changed:
            self.seen.append((worker, now, inserted_keys(ticks)))
            self.changed.notify_all()

    def watch(self, index: int, worker: Worker) -> None:
        """Record each of the keeper's looks (the clock read before it: never later than
        the "now" of its statement, as the clock only moves forward)."""
        real = worker.run_schedules

        def looked() -> list[Tick]:
            now = self.clock.now()
            ticks = real()
            self.record(index, now, ticks)
            return ticks

        worker.run_schedules = looked  # type: ignore[method-assign]

    def looked_at(self, position: dt.datetime, workers: int) -> bool:
        return {i for i, now, _ in self.seen if now == position} == set(range(workers))

    def wait(self, position: dt.datetime, workers: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.looked_at(position, workers), WAIT), (
                f"no look at {position} from every worker: {self.seen[-4:]}"
            )

    def inserted(self) -> list[str]:
        return [k for _, _, keys in self.seen for k in keys]


def run_worker_options(clock: FakeClock) -> dict[str, Any]:
    # The statements read the fake clock; the loop's own timing is real (time.monotonic),
    # so the keeper, half a second before each tick, looks again within half a second.
    return {
        "clock": clock,
        "listen": False,
        "poll_interval": 0.05,
        "lease": 600,
        "vacuum": None,
        "install_signal_handlers": False,
    }


def test_workers_run_again_after_stop_treat_the_outage_as_new_workers_do(
    engine: Engine, engines: list[Engine], clock: FakeClock
) -> None:
    app, ran = outage_app()
    looks = Looks(clock)
    pair = [Worker(app, e, **run_worker_options(clock)) for e in engines]
    for i, worker in enumerate(pair):
        looks.watch(i, worker)
    try:
        for run in (FIRST_RUN, SECOND_RUN):
            clock.set(run[0])
            threads = [threading.Thread(target=w.run, daemon=True) for w in pair]
            for thread in threads:
                thread.start()
            for position in run:
                clock.set(position)
                looks.wait(position, len(pair))
                wait_until(lambda: unfinished_jobs(engine) == 0, "the ticks' jobs to run", WAIT)
            for worker in pair:
                worker.stop()
            for thread in threads:
                thread.join(WAIT)
            assert not any(thread.is_alive() for thread in threads)
    finally:
        for worker in pair:
            worker.stop(now=True)
            worker.close()
    # Without the reset at run(), "skip" would have enqueued 00:08 at the restart.
    check_the_table(engine, ran, looks.inserted())


@pytest.fixture
async def async_engines(database_url: str) -> AsyncIterator[list[AsyncEngine]]:
    made = [create_async_engine(database_url, pool_size=3) for _ in range(2)]
    yield made
    for engine in made:
        await engine.dispose()


async def test_async_workers_run_again_after_stop(
    engine: Engine, async_engines: list[AsyncEngine], clock: FakeClock
) -> None:
    app, ran = outage_app()
    seen: list[tuple[int, dt.datetime, list[str]]] = []
    changed = asyncio.Condition()
    pair = [AsyncWorker(app, e, **run_worker_options(clock)) for e in async_engines]

    def watch(index: int, worker: AsyncWorker) -> None:
        real = worker.run_schedules

        async def looked() -> list[Tick]:
            now = clock.now()
            ticks = await real()
            async with changed:
                seen.append((index, now, inserted_keys(ticks)))
                changed.notify_all()
            return ticks

        worker.run_schedules = looked  # type: ignore[method-assign]

    for i, worker in enumerate(pair):
        watch(i, worker)

    async def finished() -> None:
        deadline = asyncio.get_running_loop().time() + WAIT
        while await asyncio.to_thread(unfinished_jobs, engine):
            assert asyncio.get_running_loop().time() < deadline, "the ticks' jobs never ran"
            await asyncio.sleep(0.05)

    try:
        for run in (FIRST_RUN, SECOND_RUN):
            clock.set(run[0])
            tasks = [asyncio.create_task(w.run()) for w in pair]
            for position in run:
                clock.set(position)
                async with changed:
                    await asyncio.wait_for(
                        changed.wait_for(
                            lambda p=position: {i for i, now, _ in seen if now == p} == {0, 1}
                        ),
                        WAIT,
                    )
                await finished()
            for worker in pair:
                worker.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
    finally:
        for worker in pair:
            worker.close()
    check_the_table(engine, ran, [k for _, _, keys in seen for k in keys])


# -- worker processes, stopped with SIGTERM and started anew ------------------------------

#: A worker process: `Worker.run` (SIGTERM stops it) on a FakeClock that each line of its
#: stdin sets; it prints each look of its keeper as a JSON line, and each job its handler
#: runs goes to the ledger file (one ``os.write``, ``O_APPEND``).
WORKER_PROCESS = """
import datetime as dt, json, os, sys, threading
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase
from sa_outbox import FakeClock, JobApp, JobMixin, Worker

schema, url, start, ledger = sys.argv[1:5]

class Base(DeclarativeBase):
    pass

class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = schema

fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
app = JobApp(Job)
app.register("tick", lambda job: os.write(fd, (job.deduplication_key + "\\n").encode()))
app.schedule(kind="tick", name="skip", every=60)
app.schedule(kind="tick", name="latest", every=60, missed="backfill")
app.schedule(kind="tick", name="last-3", every=60, missed="backfill", backfill=3)
app.schedule(kind="tick", name="catch-up", every=60, missed="backfill", backfill=10)
clock = FakeClock(dt.datetime.fromisoformat(start))
engine = create_engine(url)
worker = Worker(app, engine, clock=clock, listen=False, poll_interval=0.05, lease=600,
                vacuum=None)
real, out = worker.run_schedules, threading.Lock()

def looked():
    now = clock.now()
    ticks = real()
    inserted = [f"periodic:{t.schedule}@{t.at.isoformat()}" for t in ticks if t.inserted]
    with out:
        print(json.dumps({"now": now.isoformat(), "inserted": inserted}), flush=True)
    return ticks

worker.run_schedules = looked

def read_clock():
    for line in sys.stdin:
        clock.set(dt.datetime.fromisoformat(line.strip()))

threading.Thread(target=read_clock, daemon=True).start()
worker.run()
engine.dispose()
"""


class WorkerProcess:
    def __init__(self, database_url: str, start: dt.datetime, ledger: Path, log: Path) -> None:
        argv = [TEST_SCHEMA, database_url, start.isoformat(), str(ledger)]
        self.log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER_PROCESS, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.looks: queue.Queue[dict[str, Any]] = queue.Queue()
        self.inserted: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.looks.put(json.loads(line))

    def set_clock(self, when: dt.datetime) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(when.isoformat() + "\n")
        self.process.stdin.flush()

    def wait_for_look(self, when: dt.datetime) -> None:
        """Read its looks up to one at ``when`` (their inserted ticks are kept)."""
        while True:
            try:
                look = self.looks.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"the worker process never looked at {when}") from None
            self.inserted += look["inserted"]
            if dt.datetime.fromisoformat(look["now"]) == when:
                return

    def stop(self) -> str:
        """SIGTERM, as a deployment stops it; returns its log once it exited."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(WAIT)
        self.close()
        # The looks it printed before it stopped (the keeper goes on looking).
        while not self.looks.empty():
            self.inserted += self.looks.get()["inserted"]
        return Path(self.log.name).read_text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.reader.join(WAIT)
        self.process.stdout.close()
        self.log.close()


def test_worker_processes_stopped_and_started_again(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    ledger.touch()
    inserted: list[str] = []
    started: list[WorkerProcess] = []
    try:
        for number, run in enumerate((FIRST_RUN, SECOND_RUN)):
            pair = [
                WorkerProcess(database_url, run[0], ledger, tmp_path / f"worker-{number}-{i}.log")
                for i in range(2)
            ]
            started += pair
            for position in run:
                for process in pair:
                    process.set_clock(position)
                for process in pair:
                    process.wait_for_look(position)
                wait_until(lambda: unfinished_jobs(engine) == 0, "the ticks' jobs to run", WAIT)
            for process in pair:  # all down: the outage
                log = process.stop()
                assert process.process.returncode == 0, log
                assert "Traceback" not in log, log
                inserted += process.inserted
    finally:
        for process in started:
            process.close()
    ran = ledger.read_text().split()
    check_the_table(engine, ran, inserted)
