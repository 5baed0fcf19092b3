"""What results and durable steps cost a worker, against plain jobs, in one run.

One `Worker` with the defaults a user gets (``Worker(app, engine).run()``, concurrency 1,
listening), on ``--n`` pre-enqueued jobs per variant, each in a fresh schema; the variants
run in turn, ``--rounds`` times, so that drift on the machine falls on all of them alike:

- ``plain``: ``JobApp(Job)``, the handler returns ``None`` (W4's shape);
- ``steps table``: ``JobApp(Job, steps=JobStep)``, the handler returns ``None`` (the worker
  announces each finished job on the done channel: its acknowledgement is a transaction of
  a few statements, not the single autocommit statement);
- ``result``: the same, the handler returns a small dict (recorded with the completion);
- ``1 step`` / ``3 steps``: the handler runs one / three durable steps without a Session
  (each a transaction that records it) and returns ``None``.

Throughput is jobs per second from the start of ``run()`` to the commit of the ``n``-th
acknowledgement; the report gives medians and each variant's ratio to ``plain``.

    python -m benchmarks.workflow_costs --database-url postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import JobApp, JobContext, JobMixin, JobQueue, JobStepMixin, NewJob, Worker
from sa_outbox.schema import JobDependencyMixin
from sa_outbox.worker import WorkerMetrics

VARIANTS = (
    "plain",
    "steps table",
    "result",
    "1 step",
    "3 steps",
    "dependencies, 100k waiting",
    "fan-out 10, fan-in 1",
)
#: Jobs that wait for a job that never runs, beside the measured ones.
WAITING = 100_000


def models(schema: str) -> tuple[Any, Any, Any, Any]:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Job(JobMixin, Base):
        __tablename__ = "jobs"

    class JobStep(JobStepMixin, Base):
        __tablename__ = "job_steps"

    class JobDependency(JobDependencyMixin, Base):
        __tablename__ = "job_dependencies"

    return Base, Job, JobStep, JobDependency


def app_for(variant: str, job: Any, step: Any, deps: Any) -> JobApp:
    if variant == "plain":
        app = JobApp(job)
    elif variant.startswith(("dependencies", "fan-out")):
        app = JobApp(job, steps=step, dependencies=deps)
    else:
        app = JobApp(job, steps=step)
    handlers: dict[str, Callable[[JobContext], Any]] = {
        "plain": lambda ctx: None,
        "steps table": lambda ctx: None,
        "result": lambda ctx: {"order": 7, "cents": 1290},
        "1 step": lambda ctx: ctx.step("charge", lambda: 1) and None,
        "3 steps": lambda ctx: [ctx.step(f"s{i}", lambda i=i: i) for i in range(3)] and None,
        "dependencies, 100k waiting": lambda ctx: None,
        "fan-out 10, fan-in 1": lambda ctx: None,
    }
    app.register("noop", handlers[variant])
    return app


def enqueue_for(variant: str, engine: Any, job: Any, deps: Any, n: int) -> None:
    """The ``n`` jobs a run processes (not timed); fan-out: n // 12 workflows of 12 jobs
    (a root, 10 after it, 1 after those), enqueued with ``after=`` in one transaction each."""
    queue = JobQueue(job, dependencies=deps)
    if variant.startswith("fan-out"):
        for _ in range(n // 12):
            with engine.begin() as conn:
                root = queue.enqueue(conn, "noop", {}).id
                assert root is not None
                fan = [queue.enqueue(conn, "noop", {}, after=[root]).id for _ in range(10)]
                queue.enqueue(conn, "noop", {}, after=[i for i in fan if i is not None])
        return
    for start in range(0, n, 1000):
        with engine.begin() as conn:
            queue.enqueue_many(conn, [NewJob("noop", {}) for _ in range(min(1000, n - start))])
    if variant.startswith("dependencies"):
        with engine.begin() as conn:  # jobs waiting for one that is never claimed
            later = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
            never = queue.enqueue(conn, "never", {}, run_at=later).id
            conn.execute(
                text(
                    f"INSERT INTO {deps.__table__.fullname} (job_id, workflow_id, parents,"
                    " on_failure, job) SELECT gen_random_uuid(), :p, ARRAY[CAST(:p AS uuid)],"
                    " 'cancel', '{}' FROM generate_series(1, :n)"
                ),
                {"p": never, "n": WAITING},
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM ANALYZE {deps.__table__.fullname}"))


#: Makes a run's jobs in the fresh tables: ``(engine, job, step, deps)`` → the app to run
#: and how many jobs it must finish.
Prepare = Callable[[Any, Any, Any, Any], tuple[JobApp, int]]


def timed_run(
    url: str, schema: str, prepare: Prepare, *, watchdog: float = 600
) -> tuple[int, float]:
    """Jobs finished and seconds for one ``Worker(app, engine).run()`` in a fresh ``schema``.

    The clock runs from the start of ``run()`` to the commit of the last expected
    acknowledgement; the worker is stopped there, every job is checked ``succeeded`` and the
    schema dropped. ``watchdog`` seconds stop a run that never finishes (an error).
    """
    engine = create_engine(url, pool_size=4, max_overflow=0)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    base, job, step, deps = models(schema)
    base.metadata.create_all(engine)
    app, expected = prepare(engine, job, step, deps)
    done: dict[str, Any] = {"acked": 0, "at": None}
    worker: Worker | None = None

    class Hook(WorkerMetrics):
        def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
            done["acked"] += acknowledged
            if done["acked"] >= expected and done["at"] is None:
                done["at"] = time.perf_counter()
                assert worker is not None
                worker.stop()

    worker = Worker(app, engine, metrics=Hook(), install_signal_handlers=False)
    timer = threading.Timer(watchdog, lambda: worker.stop(now=True))
    timer.daemon = True
    timer.start()
    started = time.perf_counter()
    try:
        worker.run()
    finally:
        timer.cancel()
    with engine.connect() as conn:
        succeeded = conn.execute(
            text(f"SELECT count(*) FROM {schema}.jobs WHERE status = 'succeeded'")
        ).scalar_one()
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    engine.dispose()
    if done["at"] is None or succeeded != expected:
        raise RuntimeError(f"{schema}: {succeeded} of {expected} jobs succeeded")
    return expected, float(done["at"]) - started


def one_run(url: str, variant: str, n: int, round_no: int) -> float:
    """Jobs per second of one run of ``variant`` over ``n`` jobs."""

    def prepare(engine: Any, job: Any, step: Any, deps: Any) -> tuple[JobApp, int]:
        enqueue_for(variant, engine, job, deps, n)
        expected = n // 12 * 12 if variant.startswith("fan-out") else n
        return app_for(variant, job, step, deps), expected

    schema = f"bench_wf_{VARIANTS.index(variant)}_{round_no}"
    finished, seconds = timed_run(url, schema, prepare)
    return finished / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflow_costs")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--only", default=None, help="variants separated by ; (plain is kept)")
    args = parser.parse_args(argv)
    chosen = VARIANTS if args.only is None else ("plain", *args.only.split(";"))
    rates: dict[str, list[float]] = {v: [] for v in chosen}
    for round_no in range(args.rounds):
        for variant in chosen:
            rate = one_run(args.database_url, variant, args.n, round_no)
            rates[variant].append(rate)
            print(f"round {round_no + 1} {variant}: {rate:,.0f} jobs/s", flush=True)
    plain = statistics.median(rates["plain"])
    lines = [
        f"| variant | jobs/s (median of {args.rounds}) | ratio to plain | runs |",
        "|---|---:|---:|---|",
    ]
    for variant in chosen:
        median = statistics.median(rates[variant])
        runs = ", ".join(f"{r:,.0f}" for r in rates[variant])
        lines.append(f"| {variant} | {median:,.0f} | {median / plain:.2f} | {runs} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
