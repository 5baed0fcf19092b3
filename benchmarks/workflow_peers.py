"""sa-outbox's workflows beside DBOS Transact's, on the same PostgreSQL, in one run.

Both sides process work enqueued beforehand (not timed) and are timed from the start of
processing until all of it is durably finished:

- **three-step**: ``--n`` workflows of three steps that only return a small value.
  sa-outbox: one job whose handler runs three ``ctx.step(...)`` (``JobApp(Job,
  steps=JobStep)``, benchmarks.workflow_costs' ``3 steps``); also, with ``--chain``, three
  no-op jobs chained A→B→C with ``after=`` (``JobApp(..., dependencies=JobDependency)``).
  DBOS: a ``@DBOS.workflow`` calling three ``@DBOS.step`` functions, on a ``Queue``.
- **fan-out**: ``--graphs`` graphs of a root, 10 children after it and a final one after
  the 10. sa-outbox: 12 no-op jobs with ``after=`` (workflow_costs' ``fan-out 10, fan-in
  1``). DBOS: a parent workflow on a queue that enqueues 10 child workflows on the same
  queue, waits for their results, then runs one step.

sa-outbox runs in this process: one ``Worker(app, engine).run()`` with the defaults a user
gets, in a fresh schema per run, timed from the start of ``run()`` to the commit of the
last acknowledgement (as benchmarks/workflow_costs.py does). DBOS runs in a subprocess of
``--dbos-python`` (a virtualenv with ``dbos`` installed), benchmarks/dbos_peer.py: its
system database is a database of its own on the same server (``--sys-database``, dropped
and created again for each run, dropped at the end); see that file for what it times.
Each round runs every row of every workload once, sa-outbox first in odd rounds and DBOS
first in even ones; the table gives medians of ``--rounds`` rounds and the ratio of each
sa-outbox row to DBOS's.

After the rounds, ``--backlog`` (0 to skip) runs each side once on a larger three-step
backlog, DBOS with its defaults given ``--backlog-timeout`` seconds and, with
``--dbos-worker-concurrency``, once more with that ``worker_concurrency`` on its queue,
given ``--tuned-timeout`` seconds. ``--dbos-logs DIR`` keeps each DBOS run's stderr.

    python -m benchmarks.workflow_peers \\
        --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        --dbos-python /work/dbosvenv/bin/python --dbos-worker-concurrency 500
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, create_engine, text

from benchmarks.workflow_costs import app_for, enqueue_for, timed_run
from sa_outbox import JobApp, JobQueue

PEER = pathlib.Path(__file__).with_name("dbos_peer.py")
#: Chains enqueued per transaction (not timed).
CHAINS_PER_TRANSACTION = 100


@dataclass(frozen=True)
class Side:
    """One row of the table: who runs what."""

    key: str
    workload: str
    system: str
    shape: str


@dataclass
class Runs:
    rates: list[float | None] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


SA_THREE = Side("sa-3", "three-step", "sa-outbox", "1 job, 3 `ctx.step`")
SA_CHAIN = Side("sa-chain", "three-step", "sa-outbox", "3 no-op jobs A→B→C, `after=`")
DBOS_THREE = Side("dbos-3", "three-step", "DBOS", "1 workflow, 3 `@DBOS.step`")
SA_FAN = Side("sa-fan", "fan-out", "sa-outbox", "12 no-op jobs, `after=`")
DBOS_FAN = Side("dbos-fan", "fan-out", "DBOS", "parent enqueues 10 child workflows, 1 step")


def chain_enqueue(engine: Engine, job: Any, deps: Any, n: int) -> None:
    """``n`` chains A→B→C of no-op jobs, ``CHAINS_PER_TRANSACTION`` chains a transaction."""
    queue = JobQueue(job, dependencies=deps)
    for start in range(0, n, CHAINS_PER_TRANSACTION):
        with engine.begin() as conn:
            for _ in range(min(CHAINS_PER_TRANSACTION, n - start)):
                first = queue.enqueue(conn, "noop", {}).id
                assert first is not None
                second = queue.enqueue(conn, "noop", {}, after=[first]).id
                assert second is not None
                queue.enqueue(conn, "noop", {}, after=[second])


def sa_run(url: str, side: Side, n: int, label: str) -> float:
    """Seconds for one ``Worker(app, engine).run()`` to finish ``n`` workflows of ``side``."""

    def prepare(engine: Any, job: Any, step: Any, deps: Any) -> tuple[JobApp, int]:
        if side is SA_THREE:  # a handler running three durable steps, n jobs
            enqueue_for("3 steps", engine, job, deps, n)
            return app_for("3 steps", job, step, deps), n
        # "fan-out"'s app: a no-op handler, with the dependencies table
        app = app_for("fan-out 10, fan-in 1", job, step, deps)
        if side is SA_CHAIN:
            chain_enqueue(engine, job, deps, n)
            return app, 3 * n
        enqueue_for("fan-out 10, fan-in 1", engine, job, deps, 12 * n)
        return app, 12 * n

    schema = f"bench_peer_{side.key.replace('-', '_')}_{label}"
    return timed_run(url, schema, prepare, watchdog=900)[1]


def dbos_run(
    args: argparse.Namespace,
    workload: str,
    n: int,
    timeout: float,
    worker_concurrency: int | None = None,
) -> dict[str, Any]:
    """One run of benchmarks/dbos_peer.py; its ``RESULT`` line."""
    command = [
        args.dbos_python,
        str(PEER),
        "--database-url",
        args.database_url,
        "--sys-database",
        args.sys_database,
        "--workload",
        workload,
        "--n",
        str(n),
        "--timeout",
        str(timeout),
    ]
    if worker_concurrency is not None:
        command += ["--worker-concurrency", str(worker_concurrency)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 300)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            warnings = [x for x in done.stderr.splitlines() if "WARNING" in x]
            result["warnings"] = len(warnings)
            if args.dbos_logs is not None:  # DBOS's stderr, for reading afterwards
                args.dbos_logs.mkdir(parents=True, exist_ok=True)
                runs = len(list(args.dbos_logs.iterdir()))
                name = f"{runs + 1:02d}-{workload}-{n}-{worker_concurrency}.log"
                (args.dbos_logs / name).write_text(done.stderr, encoding="utf-8")
            return result
    raise RuntimeError(f"dbos_peer.py failed ({done.returncode}):\n{done.stderr[-3000:]}")


def record(runs: Runs, side: Side, n: int, seconds: float, note: str = "") -> str:
    runs.rates.append(n / seconds)
    runs.seconds.append(seconds)
    if note:
        runs.notes.append(note)
    return f"{side.system} {side.workload} ({side.shape}): {n / seconds:,.1f}/s, {seconds:.1f} s"


def one(args: argparse.Namespace, side: Side, runs: Runs, label: str) -> str:
    n = args.n if side.workload == "three-step" else args.graphs
    if side.system == "sa-outbox":
        return record(runs, side, n, sa_run(args.database_url, side, n, label))
    result = dbos_run(args, side.workload, n, args.dbos_timeout)
    if not result["finished"]:
        runs.rates.append(None)
        runs.seconds.append(result["seconds"])
        note = f"did not finish: {result['succeeded']:,} of {result['workflows']:,}"
        runs.notes.append(f"run {len(runs.rates)}: {note}")
        return f"DBOS {side.workload}: {note} workflows in {result['seconds']:.0f} s"
    args.dbos_version = result["dbos"]
    warned = result["warnings"]
    note = f"run {len(runs.rates) + 1}: {warned} warnings on stderr" if warned else ""
    line = record(runs, side, n, result["seconds"], note)
    return f"{line}, first completion at {result['first_completion']:.1f} s"


def fmt(rate: float | None) -> str:
    if rate is None:
        return "n/f"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:,.1f}"


def table(args: argparse.Namespace, sides: list[Side], results: dict[Side, Runs]) -> str:
    lines = [
        f"| workload | system | what one workflow is | workflows/s (median of {args.rounds})"
        " | runs (workflows/s) | s (median) | sa-outbox / DBOS |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    medians: dict[Side, float | None] = {}
    for side in sides:
        rates = results[side].rates
        medians[side] = None if None in rates else statistics.median(r for r in rates if r)
    for side in sides:
        runs = results[side]
        peer = DBOS_THREE if side.workload == "three-step" else DBOS_FAN
        ratio = ""
        own, theirs = medians[side], medians.get(peer)
        if side.system == "sa-outbox" and own is not None and theirs:
            ratio = f"{own / theirs:.2f}"
        n = args.n if side.workload == "three-step" else args.graphs
        notes = f" ({'; '.join(runs.notes)})" if runs.notes else ""
        lines.append(
            f"| {side.workload} ({n:,}) | {side.system} | {side.shape} | {fmt(medians[side])}"
            f" | {', '.join(fmt(r) for r in runs.rates)}{notes}"
            f" | {statistics.median(runs.seconds):.1f} | {ratio} |"
        )
    return "\n".join(lines)


def backlog(args: argparse.Namespace) -> str:
    """One run per side on ``--backlog`` three-step workflows."""
    n = args.backlog
    lines = [
        f"| {n:,} three-step workflows, one run | workflows/s | s | note |",
        "|---|---:|---:|---|",
    ]
    seconds = sa_run(args.database_url, SA_THREE, n, "backlog")
    print(f"backlog sa-outbox: {n / seconds:,.1f}/s, {seconds:.1f} s", flush=True)
    lines.append(f"| sa-outbox, 1 job, 3 `ctx.step` | {fmt(n / seconds)} | {seconds:.1f} | |")
    tries: list[tuple[str, int | None]] = [("DBOS, its defaults", None)]
    if args.dbos_worker_concurrency is not None:
        k = args.dbos_worker_concurrency
        tries.append((f"DBOS, queue `worker_concurrency={k}`", k))
    for name, k in tries:
        timeout = args.backlog_timeout if k is None else args.tuned_timeout
        result = dbos_run(args, "three-step", n, timeout, k)
        print(f"backlog {name}: {json.dumps(result)}", flush=True)
        note = f"{result['warnings']:,} warnings on stderr" if result["warnings"] else ""
        if not result["finished"]:
            note = (
                f"did not finish: {result['succeeded']:,} of {n:,} succeeded in"
                f" {result['seconds']:.0f} s; {note}"
            )
        lines.append(f"| {name} | {fmt(result['rate'])} | {result['seconds']:.1f} | {note} |")
    return "\n".join(lines)


def drop_sys_database(args: argparse.Namespace) -> None:
    admin = create_engine(args.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{args.sys_database}" WITH (FORCE)'))
    admin.dispose()


def git_rev() -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).parent,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflow_peers")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--dbos-python", default="/work/dbosvenv/bin/python")
    parser.add_argument("--sys-database", default="dbos_bench_sys")
    parser.add_argument("--n", type=int, default=2000, help="three-step workflows a run")
    parser.add_argument("--graphs", type=int, default=500, help="fan-out graphs a run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="three-step,fan-out")
    parser.add_argument("--no-chain", dest="chain", action="store_false")
    parser.add_argument("--dbos-timeout", type=float, default=300.0)
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--backlog-timeout", type=float, default=120.0)
    parser.add_argument("--tuned-timeout", type=float, default=300.0)
    parser.add_argument("--dbos-worker-concurrency", type=int, default=None)
    parser.add_argument("--dbos-logs", type=pathlib.Path, default=None, help="keep its stderr")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    args.dbos_version = "?"
    rev = git_rev()  # before the run: the tree may change while it runs
    workloads = args.workloads.split(",")
    sa_sides = [SA_THREE, *([SA_CHAIN] if args.chain else [])] * ("three-step" in workloads)
    sa_sides += [SA_FAN] * ("fan-out" in workloads)
    dbos_sides = [DBOS_THREE] * ("three-step" in workloads) + [DBOS_FAN] * ("fan-out" in workloads)
    sides = sorted(sa_sides + dbos_sides, key=lambda s: s.workload != "three-step")
    results = {side: Runs() for side in sides}
    began = time.monotonic()
    try:
        for round_no in range(args.rounds):
            order = sa_sides + dbos_sides if round_no % 2 == 0 else dbos_sides + sa_sides
            for side in order:
                line = one(args, side, results[side], f"r{round_no}")
                print(f"round {round_no + 1} {line}", flush=True)
        report = table(args, sides, results)
        if args.backlog:
            report += "\n\n" + backlog(args)
    finally:
        drop_sys_database(args)
    minutes = (time.monotonic() - began) / 60
    given = " ".join(sys.argv[1:] if argv is None else argv)
    header = (
        f"sa-outbox {rev}, dbos {args.dbos_version}; {minutes:.1f} min;"
        f" command: python -m benchmarks.workflow_peers {given}"
    )
    print(header)
    print(report)
    if args.out is not None:
        args.out.write_text(header + "\n\n" + report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
