"""``python -m benchmarks``: run the workloads on the systems, write and print the results."""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from benchmarks.core import BACKLOG, QUICK_BACKLOG, Context, Sample, SystemSpec, make_row
from benchmarks.database import BENCH_DATABASE, DEFAULT_URL, ENV_NAME, ENV_URL, Database

__all__ = ["DEFAULT_N", "QUICK_N", "SYSTEMS", "WORKLOADS", "main"]

#: The workloads, in the order they run and are reported.
WORKLOADS = {
    "W1": "enqueue one at a time, one transaction each",
    "W2": "enqueue from 16 concurrent producers",
    "W3": "bulk enqueue, batches of 1,000",
    "W4": "process pre-enqueued jobs, one worker at concurrency 1",
    "W5": "process pre-enqueued jobs at concurrency 8",
    "W5P": "W5 in processes: 2 worker processes x 4 handlers under one supervisor",
    "W4B": "W4 behind a backlog: n jobs processed of n + 1,000,000 pending",
    "W5B": "W5 behind a backlog: n jobs processed of n + 1,000,000 pending",
    "W6": "end-to-end latency enqueue → handler start at ~100 jobs/s",
    "W7": "claim throughput with 1,000,000 finished rows of history",
    "W8": "outbox: unit of work → relay → callable publisher",
    "MEM": "memory: one worker processing 1,000,000 jobs (not in the default set)",
}
DEFAULT_WORKLOADS = ["W1", "W2", "W3", "W4", "W5", "W5P", "W4B", "W5B", "W6", "W7", "W8"]
#: The workloads that run behind a backlog of `BACKLOG` (--quick: `QUICK_BACKLOG`) jobs.
BACKLOG_WORKLOADS = {"W4B", "W5B"}

#: Module of each system (imported lazily: peers are optional until selected).
SYSTEMS = {
    "raw": "benchmarks.raw",
    "pgbench": "benchmarks.pgbench",
    "sa-sync": "benchmarks.sa_sync",
    "sa-async": "benchmarks.sa_async",
    "procrastinate": "benchmarks.procrastinate_peer",
    "pgqueuer": "benchmarks.pgqueuer_peer",
}

#: Jobs (events) per run, the same for every system; --n overrides them all.
DEFAULT_N = {
    "W1": 5_000,
    "W2": 5_000,
    "W3": 100_000,
    "W4": 10_000,
    "W5": 10_000,
    "W5P": 10_000,
    "W4B": 10_000,
    "W5B": 10_000,
    "W6": 1_000,
    "W8": 10_000,
    "MEM": 1_000_000,
}
QUICK_N = {
    "W1": 500,
    "W2": 500,
    "W3": 2_000,
    "W4": 1_000,
    "W5": 1_000,
    "W5P": 1_000,
    "W4B": 1_000,
    "W5B": 1_000,
    "W6": 100,
    "W8": 500,
    "MEM": 20_000,
}
W7_MODULE = "benchmarks.w7_history"
DEFAULT_OUT = pathlib.Path(__file__).parent / "results"


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring of `benchmarks`)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="sa-outbox side by side with raw SQL, pgbench, Procrastinate and PGQueuer.",
    )
    parser.add_argument("--quick", action="store_true", help="small N, 1 run: proves it works (CI)")
    parser.add_argument(
        "--workloads",
        type=_csv,
        default=None,
        help=f"comma-separated, of {','.join(WORKLOADS)} (default: {','.join(DEFAULT_WORKLOADS)})",
    )
    parser.add_argument(
        "--systems",
        type=_csv,
        default=None,
        help=f"comma-separated, of {','.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument("--runs", type=int, default=None, help="runs each (default 3; quick 1)")
    parser.add_argument("--n", type=int, default=None, help="jobs per run, for every workload")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="results folder")
    parser.add_argument(
        "--database-url",
        default=None,
        help=f"the server to use (its database sa_outbox_bench); default ${ENV_URL}, "
        f"else {DEFAULT_URL}",
    )
    parser.add_argument(
        "--database-name",
        default=None,
        help=f"the database on that server to work in (default ${ENV_NAME}, else "
        f"{BENCH_DATABASE}): two suites at once on one server need one each",
    )
    args = parser.parse_args(argv)
    args.workloads = args.workloads or list(DEFAULT_WORKLOADS)
    args.systems = args.systems or list(SYSTEMS)
    for name in args.workloads:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    for name in args.systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.n is not None and args.n < 2:
        parser.error("--n must be at least 2")
    return args


def schema_of(system: str) -> str:
    """The schema a system's tables live in, inside sa_outbox_bench."""
    return "bench_" + system.replace("-", "_")


def load_system(name: str) -> SystemSpec:
    """Import a system's module (a peer's import error surfaces here, loudly)."""
    module = importlib.import_module(SYSTEMS[name])
    spec: SystemSpec = module.SYSTEM
    return spec


def run_pair(db: Database, spec: SystemSpec, workload: str, n: int, quick: bool) -> Sample:
    """One run: reset the system's schema, install it, run the workload."""
    schema = schema_of(spec.name)
    db.reset_schema(schema)
    spec.install(db, schema)
    backlog = (QUICK_BACKLOG if quick else BACKLOG) if workload in BACKLOG_WORKLOADS else 0
    ctx = Context(
        db=db, schema=schema, workload=workload, system=spec.name, n=n, quick=quick, backlog=backlog
    )
    return spec.workloads[workload].runner(ctx)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; exit 1 if any selected (workload, system) pair produced no row."""
    args = parse_args(argv)
    db = Database.from_url(args.database_url, args.database_name)
    db.ensure_database()
    started = time.time()

    systems: dict[str, SystemSpec] = {}
    failures: list[str] = []
    for name in args.systems:
        try:
            systems[name] = load_system(name)
        except Exception:
            failures.append(f"{name}: cannot be loaded")
            print(f"!! system {name} cannot be loaded:", file=sys.stderr)
            traceback.print_exc()

    rows: list[dict[str, Any]] = []
    expected: list[tuple[str, str]] = []
    notes: list[str] = []
    for workload in args.workloads:
        if workload == "W7":
            try:
                rows.extend(_run_w7(db, args, expected, notes))
            except Exception:
                failures.append("W7: failed")
                print("!! W7 failed:", file=sys.stderr)
                traceback.print_exc()
            continue
        n = args.n or (QUICK_N if args.quick else DEFAULT_N)[workload]
        pairs = [name for name in args.systems if _runs(systems.get(name), name, workload)]
        expected.extend((workload, name) for name in pairs)
        samples: dict[str, list[Sample]] = {name: [] for name in pairs}
        broken: set[str] = set()
        for run in range(args.runs):
            # Interleaved: run r of every system before run r + 1 of any, so a machine that
            # gets slower (or faster) during the suite skews no system more than another.
            for name in pairs:
                if name in broken or name not in systems:
                    continue
                label = f"{workload} {name} run {run + 1}/{args.runs} (n={n:,})"
                if workload in BACKLOG_WORKLOADS:
                    label += f" behind {QUICK_BACKLOG if args.quick else BACKLOG:,} pending"
                print(f"-- {label}", flush=True)
                try:
                    sample = run_pair(db, systems[name], workload, n, args.quick)
                except Exception:
                    broken.add(name)
                    failures.append(f"{workload} {name}: failed")
                    print(f"!! {label} failed:", file=sys.stderr)
                    traceback.print_exc()
                    continue
                print("   " + ", ".join(f"{k}={v:,.1f}" for k, v in sample.items()), flush=True)
                samples[name].append(sample)
        for name in pairs:
            if name in broken or not samples[name]:
                continue
            setup = systems[name].workloads[workload].setup
            for metric in samples[name][0]:
                values = [s[metric] for s in samples[name]]
                rows.append(make_row(workload, name, metric, values, setup))
        for name in pairs:
            if name in systems:
                db.drop_schema(schema_of(name))

    from benchmarks.report import machine_info, write_results

    info = machine_info(db, systems, args, started)
    info["notes"] = notes
    table = write_results(args.out, rows, info)
    print()
    print(table)
    for note in notes:
        print(f"note: {note}")

    produced = {(row["workload"], row["system"]) for row in rows}
    produced |= {(row["workload"], "*") for row in rows}
    missing = [pair for pair in expected if pair not in produced]
    for workload, name in missing:
        failures.append(f"{workload} {name}: no row")
    if failures:
        print("\nFAILED: " + "; ".join(dict.fromkeys(failures)), file=sys.stderr)
        return 1
    print(f"\nresults in {args.out} ({len(rows)} rows, {time.time() - started:.0f} s)")
    return 0


def _runs(spec: SystemSpec | None, name: str, workload: str) -> bool:
    if spec is None:
        # A system that failed to load still counts as expected where it would have run:
        # the missing rows make the run fail instead of silently shrinking the table.
        return workload in {"W1", "W2", "W3", "W4", "W5", "W6"} and name != "pgbench"
    return workload in spec.workloads


def _run_w7(
    db: Database,
    args: argparse.Namespace,
    expected: list[tuple[str, str]],
    notes: list[str],
) -> list[dict[str, Any]]:
    try:
        module = importlib.import_module(W7_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != W7_MODULE:
            raise
        notes.append(f"W7 skipped: {W7_MODULE} does not exist yet")
        print(f"-- W7 skipped: {W7_MODULE} does not exist yet", flush=True)
        return []
    print("-- W7", flush=True)
    expected.append(("W7", "*"))  # at least one row, whatever systems W7 measures
    # The URL of sa_outbox_bench itself (postgresql+psycopg://…): W7 uses its own schema there.
    url = db.sqlalchemy_url().render_as_string(hide_password=False)
    w7_rows: list[dict[str, Any]] = module.run(
        url, quick=args.quick, runs=args.runs, out_dir=args.out
    )
    return w7_rows
