"""DBOS Transact's side of benchmarks/workflow_peers.py: one run, in DBOS's own virtualenv.

Runs with the interpreter of a virtualenv that has ``dbos`` installed (not sa-outbox's: it
imports nothing from this repository), as a subprocess of the driver:

    /work/dbosvenv/bin/python benchmarks/dbos_peer.py \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --workload three-step --n 2000

One run, all of it on the server of ``--database-url``:

1. DBOS's system database (``--sys-database``, a database of its own on that server, as
   DBOS requires) is dropped and created again by ``DBOS.migrate``;
2. a queue is registered with ``DBOSClient.register_queue`` and its defaults (no concurrency
   limit, polled every second), and the work is enqueued with
   ``DBOSClient.enqueue_in_transaction``, 1,000 workflows a transaction; none of this is
   timed, and no DBOS process is running yet, so nothing is dequeued;
3. ``DBOS(config={"name", "system_database_url"})`` (its defaults otherwise) is launched;
   the time runs from just before ``DBOS.launch()`` to the last ``completed_at`` (the
   database's clock, on this host) of the workflows, once all of them are ``SUCCESS`` in
   ``dbos.workflow_status``, which another connection polls every 0.2 s.

Workloads:

- ``three-step``: ``--n`` workflows of three ``@DBOS.step`` functions returning a small
  int; the workflow returns ``None``;
- ``fan-out``: ``--n`` parent workflows; each enqueues 10 child workflows (no steps,
  returning 1) on the same queue, waits for them with ``handle.get_result()``, and then
  runs one ``@DBOS.step``: 11 workflows per graph, all of which must succeed.

Prints one line ``RESULT {json}`` on stdout (DBOS logs on stderr). A run that has not
finished after ``--timeout`` seconds reports ``"finished": false`` and how many workflows
succeeded, and exits without waiting for DBOS's threads.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSClient, EnqueueOptions, Queue

APP = "sa_outbox_bench"
QUEUE = "bench"
THREE_STEP = "three_step"
FAN_OUT = "fan_out"
FAN_CHILD = "fan_child"
BATCH = 1000


@DBOS.step()
def small_step(i: int) -> int:
    return i


@DBOS.workflow(name=THREE_STEP)
def three_step() -> None:
    for i in range(3):
        small_step(i)


@DBOS.workflow(name=FAN_CHILD)
def fan_child() -> int:
    return 1


@DBOS.step()
def fan_in(total: int) -> int:
    return total


_queue: list[Queue] = []


def bench_queue() -> Queue:
    """The registered queue, looked up once (it can only be read once DBOS is launched)."""
    if not _queue:
        found = DBOS.retrieve_queue(QUEUE)
        assert found is not None, "the benchmark's queue is not registered"
        _queue.append(found)
    return _queue[0]


@DBOS.workflow(name=FAN_OUT)
def fan_out() -> None:
    handles = [bench_queue().enqueue(fan_child) for _ in range(10)]
    fan_in(sum(handle.get_result() for handle in handles))


def sys_url(database_url: str, name: str) -> str:
    return sa.make_url(database_url).set(database=name).render_as_string(hide_password=False)


def recreate(database_url: str, name: str) -> None:
    admin = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def enqueue(url: str, workflow: str, n: int, worker_concurrency: int | None) -> None:
    DBOS.migrate(url)  # creates the database and DBOS's schema, as launch() would
    client = DBOSClient(system_database_url=url, application_name=APP)
    client.register_queue(QUEUE, worker_concurrency=worker_concurrency)
    engine = sa.create_engine(url)
    options: EnqueueOptions = {"workflow_name": workflow, "queue_name": QUEUE}
    for start in range(0, n, BATCH):
        with engine.begin() as conn:
            for _ in range(min(BATCH, n - start)):
                client.enqueue_in_transaction(conn, options)
    engine.dispose()
    client.destroy()


def counts(engine: sa.Engine) -> tuple[int, int, int | None, int | None]:
    """Workflows succeeded, workflows in a terminal state other than success, and the
    first and last completions (epoch ms)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE status = 'SUCCESS'),"
                " count(*) FILTER (WHERE status NOT IN"
                " ('SUCCESS', 'PENDING', 'ENQUEUED', 'DELAYED')),"
                " min(completed_at), max(completed_at) FROM dbos.workflow_status"
            )
        ).one()
    first, last = (None if x is None else int(x) for x in row[2:4])
    return int(row[0]), int(row[1]), first, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbos_peer.py")
    parser.add_argument("--database-url", required=True, help="any database on the server")
    parser.add_argument("--sys-database", default="dbos_bench_sys")
    parser.add_argument("--workload", choices=("three-step", "fan-out"), required=True)
    parser.add_argument("--n", type=int, required=True, help="workflows (fan-out: graphs)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=None,
        help="the queue's worker_concurrency (DBOS's default: none)",
    )
    args = parser.parse_args(argv)
    url = sys_url(args.database_url, args.sys_database)
    workflow = THREE_STEP if args.workload == "three-step" else FAN_OUT
    expected = args.n if args.workload == "three-step" else args.n * 11
    recreate(args.database_url, args.sys_database)
    enqueue(url, workflow, args.n, args.worker_concurrency)

    watcher = sa.create_engine(url, pool_size=1, max_overflow=0)
    DBOS(config={"name": APP, "system_database_url": url})
    started = time.time()
    DBOS.launch()
    deadline = started + args.timeout
    while True:
        succeeded, failed, first_ms, last_ms = counts(watcher)
        if succeeded >= expected or failed or time.time() > deadline:
            break
        time.sleep(0.2)
    finished = succeeded == expected and not failed
    seconds = (last_ms / 1000 - started) if finished and last_ms else time.time() - started
    with watcher.connect() as conn:
        checkpoints = conn.execute(sa.text("SELECT count(*) FROM dbos.operation_outputs"))
        steps = int(checkpoints.scalar_one())
    watcher.dispose()
    result: dict[str, Any] = {
        "workload": args.workload,
        "n": args.n,
        "workflows": expected,
        "succeeded": succeeded,
        "failed": failed,
        "finished": finished,
        "seconds": seconds,
        "rate": args.n / seconds if finished else None,
        "first_completion": None if first_ms is None else first_ms / 1000 - started,
        "operation_outputs": steps,
        "worker_concurrency": args.worker_concurrency,
        "dbos": importlib.metadata.version("dbos"),
    }
    print("RESULT " + json.dumps(result), flush=True)
    if not finished:  # threads may be stuck waiting for the pool: do not wait for them
        sys.stderr.flush()
        os._exit(1)
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
