"""A load run for issue 18's first defect: does a busy worker ever deadlock with itself?

16 producer threads enqueue 50,000 no-op jobs while 3 worker processes (32 handlers each,
a 1.5 s lease, so heartbeats come every 0.5 s and overlap the batched acknowledgements)
work them off. At the end it counts the jobs (all succeeded, none lost or doubled) and the
``deadlock detected`` lines the server logged during the run.

Run it on a quiet machine (it reads the server's log file, so it runs where the server
does)::

    python -m benchmarks.fault_load --database-url postgresql+psycopg://postgres@127.0.0.1/test \\
        --server-log /var/log/postgresql/postgresql-15-main.log

It prints one line of JSON and exits non-zero when a job is missing or a deadlock was logged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import JobApp, JobMixin, JobQueue, NewJob, Worker, connect_args

SCHEMA = "sa_outbox_fault_load"


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA


app = JobApp(Job, handlers={"noop": lambda job: None})


def _work(url: str, seconds: float) -> None:
    engine = create_engine(url, pool_size=4, connect_args=connect_args())
    worker = Worker(app, engine, concurrency=32, lease=1.5, install_signal_handlers=True)
    timer = threading.Timer(seconds, worker.stop)
    timer.daemon = True  # a worker stopped by SIGTERM first must not wait for it
    timer.start()
    worker.run()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fault_load")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--server-log", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--work", help=argparse.SUPPRESS)  # a worker child: its run time
    args = parser.parse_args()
    if args.work:
        _work(args.database_url, float(args.work))
        return 0

    engine = create_engine(args.database_url, pool_size=args.producers)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(engine)
    log_start = args.server_log.stat().st_size
    started = time.monotonic()
    budget = 600.0
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.fault_load",
                "--database-url",
                args.database_url,
                "--server-log",
                str(args.server_log),
                "--work",
                str(budget),
            ],
            env={**os.environ},
        )
        for _ in range(args.workers)
    ]
    queue = JobQueue(Job)
    per_producer = args.jobs // args.producers

    def produce() -> None:
        for _ in range(0, per_producer, 50):
            with engine.begin() as conn:
                queue.enqueue_many(conn, [NewJob("noop", {}) for _n in range(50)])

    producers = [threading.Thread(target=produce) for _ in range(args.producers)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    total = len(range(0, per_producer, 50)) * 50 * args.producers
    while time.monotonic() - started < budget:
        with engine.connect() as conn:
            done = conn.execute(
                text(f"SELECT count(*) FROM {SCHEMA}.jobs WHERE status = 'succeeded'")
            ).scalar_one()
        if done >= total:
            break
        time.sleep(0.5)
    for child in children:
        child.terminate()
    for child in children:
        child.wait(60)
    with engine.connect() as conn:
        counts = dict(
            conn.execute(
                text(f"SELECT status::text, count(*) FROM {SCHEMA}.jobs GROUP BY status")
            ).all()
        )
    with args.server_log.open("rb") as log:
        log.seek(log_start)
        deadlocks = log.read().decode(errors="replace").count("deadlock detected")
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    result = {
        "jobs": total,
        "counts": counts,
        "deadlocks_logged": deadlocks,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result))
    return 0 if counts == {"succeeded": total} and deadlocks == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
