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
import pathlib
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import JobApp, JobContext, JobMixin, JobQueue, JobStepMixin, NewJob, Worker
from sa_outbox.worker import WorkerMetrics

VARIANTS = ("plain", "steps table", "result", "1 step", "3 steps")


def models(schema: str) -> tuple[Any, Any, Any]:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Job(JobMixin, Base):
        __tablename__ = "jobs"

    class JobStep(JobStepMixin, Base):
        __tablename__ = "job_steps"

    return Base, Job, JobStep


def app_for(variant: str, job: Any, step: Any) -> JobApp:
    app = JobApp(job) if variant == "plain" else JobApp(job, steps=step)
    handlers: dict[str, Callable[[JobContext], Any]] = {
        "plain": lambda ctx: None,
        "steps table": lambda ctx: None,
        "result": lambda ctx: {"order": 7, "cents": 1290},
        "1 step": lambda ctx: ctx.step("charge", lambda: 1) and None,
        "3 steps": lambda ctx: [ctx.step(f"s{i}", lambda i=i: i) for i in range(3)] and None,
    }
    app.register("noop", handlers[variant])
    return app


def one_run(url: str, variant: str, n: int, round_no: int) -> float:
    schema = f"bench_wf_{VARIANTS.index(variant)}_{round_no}"
    engine = create_engine(url, pool_size=4, max_overflow=0)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    base, job, step = models(schema)
    base.metadata.create_all(engine)
    queue = JobQueue(job)
    for start in range(0, n, 1000):
        with engine.begin() as conn:
            queue.enqueue_many(conn, [NewJob("noop", {}) for _ in range(min(1000, n - start))])
    done = {"acked": 0, "at": None}
    worker: Worker | None = None

    class Hook(WorkerMetrics):
        def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
            done["acked"] += acknowledged
            if done["acked"] >= n and done["at"] is None:
                done["at"] = time.perf_counter()
                assert worker is not None
                worker.stop()

    worker = Worker(
        app_for(variant, job, step), engine, metrics=Hook(), install_signal_handlers=False
    )
    watchdog = threading.Timer(600, lambda: worker.stop(now=True))
    watchdog.daemon = True
    watchdog.start()
    started = time.perf_counter()
    try:
        worker.run()
    finally:
        watchdog.cancel()
    with engine.connect() as conn:
        succeeded = conn.execute(
            text(f"SELECT count(*) FROM {schema}.jobs WHERE status = 'succeeded'")
        ).scalar_one()
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    engine.dispose()
    if done["at"] is None or succeeded != n:
        raise RuntimeError(f"{variant}: {succeeded} of {n} jobs succeeded")
    return n / (float(done["at"]) - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflow_costs")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_no in range(args.rounds):
        for variant in VARIANTS:
            rate = one_run(args.database_url, variant, args.n, round_no)
            rates[variant].append(rate)
            print(f"round {round_no + 1} {variant}: {rate:,.0f} jobs/s", flush=True)
    plain = statistics.median(rates["plain"])
    lines = [
        f"| variant | jobs/s (median of {args.rounds}) | ratio to plain | runs |",
        "|---|---:|---:|---|",
    ]
    for variant in VARIANTS:
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
