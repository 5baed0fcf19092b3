"""Issue 6's dead-tuple design options, side by side: ``python -m benchmarks.bloat_options``.

Each option flows the same number of jobs through a fresh table with the article's claim
(batch 20) and one batched completion per batch, on one connection, in COPY batches of
2,000, under default autovacuum (on a throwaway cluster when the given server runs without
it). Every 20,000 jobs it records the claim+complete rate of that window, the table's dead
tuples and the ready index's size. Options:

- ``article``: the article's table as is; autovacuum with the server's defaults.
- ``tuned``: per-table autovacuum settings (scale factor 0, threshold 1,000, no cost delay).
- ``delete``: ``tuned``, and completion deletes the row instead of marking it succeeded
  (graphile-worker's choice; the table holds only pending and running jobs).
- ``tuned+vacuum`` / ``delete+vacuum``: the same, plus a ``VACUUM (SKIP_LOCKED,
  INDEX_CLEANUP ON)`` every 2 s past 10,000 dead tuples, from another connection: what
  sa-outbox's worker does (`sa_outbox.Vacuumer`).

Results: ``bloat_options.json``, ``bloat_options.md`` and ``bloat_options.png`` in ``--out``.

Example::

    python -m benchmarks.bloat_options --jobs 500000 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import threading
import time
from typing import Any

from benchmarks.database import Database
from benchmarks.raw import CLAIM_BATCH, CLAIM_SQL, COMPLETE_SQL, DDL
from benchmarks.w7_history import (
    SCHEMA,
    autovacuum_on,
    connect,
    conninfo_for,
    dead_tuples_chart,
)

__all__ = ["OPTIONS", "main", "measure"]

OPTIONS = ["article", "tuned", "delete", "tuned+vacuum", "delete+vacuum"]
WINDOW = 20_000
CHUNK = 2_000
TUNED = (
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_cost_delay = 0, autovacuum_vacuum_insert_scale_factor = 0, "
    "autovacuum_vacuum_insert_threshold = 1000, autovacuum_analyze_scale_factor = 0.02"
)
_DELETE = """
DELETE FROM jobs AS j USING unnest(%s::uuid[], %s::uuid[]) AS d(id, token)
WHERE j.id = d.id AND j.lease_token = d.token AND j.status = 'running'"""
_STATS = """
SELECT s.n_dead_tup, pg_relation_size(to_regclass('jobs_ready_idx'))
FROM pg_stat_user_tables AS s WHERE s.relid = to_regclass('jobs')"""


def _vacuum_loop(conninfo: str, stop: threading.Event, count: list[int]) -> None:
    with connect(conninfo, autocommit=True) as conn:
        while not stop.wait(2.0):
            row = conn.execute(_STATS).fetchone()
            if row and row[0] >= 10_000:
                conn.execute("VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) jobs")
                count[0] += 1


def measure(conninfo: str, option: str, jobs: int) -> list[dict[str, Any]]:
    """Flow ``jobs`` jobs through a fresh table set up as ``option``; one sample per window."""
    with connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(DDL)
        if option != "article":
            conn.execute(f"ALTER TABLE jobs SET ({TUNED})")
    complete = _DELETE if option.startswith("delete") else COMPLETE_SQL
    stop = threading.Event()
    vacuums = [0]
    vacuumer = threading.Thread(target=_vacuum_loop, args=(conninfo, stop, vacuums), daemon=True)
    if option.endswith("+vacuum"):
        vacuumer.start()
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    done = in_window = 0
    busy = 0.0
    try:
        with connect(conninfo, prepare_threshold=0) as conn:
            while done < jobs:
                with conn.cursor() as cur, cur.copy("COPY jobs (kind, payload) FROM STDIN") as cp:
                    for _ in range(CHUNK):
                        cp.write_row(("noop", "{}"))
                conn.commit()
                while rows := conn.execute(CLAIM_SQL, (CLAIM_BATCH, "w")).fetchall():
                    t0 = time.perf_counter()
                    conn.commit()
                    conn.execute(complete, ([r[0] for r in rows], [r[4] for r in rows]))
                    conn.commit()
                    busy += time.perf_counter() - t0
                    done += len(rows)
                    in_window += len(rows)
                if in_window >= WINDOW:
                    dead, index_bytes = conn.execute(_STATS).fetchone() or (0, 0)
                    conn.commit()
                    samples.append(
                        {
                            "t": round(time.perf_counter() - started, 1),
                            "done": done,
                            "rate": round(in_window / busy),
                            "dead_tuples": dead,
                            "ready_index_kb": (index_bytes or 0) // 1024,
                            "library_vacuums": vacuums[0],
                        }
                    )
                    in_window, busy = 0, 0.0
    finally:
        stop.set()
    return samples


def _summary(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| option | first window (jobs/s) | median window | worst window | max dead tuples "
        "| ready index at end |",
        "|---|---|---|---|---|---|",
    ]
    for option, samples in results.items():
        rates = [s["rate"] for s in samples]
        lines.append(
            f"| {option} | {rates[0]:,} | {statistics.median(rates):,.0f} | {min(rates):,} "
            f"| {max(s['dead_tuples'] for s in samples):,} "
            f"| {samples[-1]['ready_index_kb']:,} kB |"
        )
    return "\n".join(lines) + "\n"


def _plot(out: pathlib.Path, results: dict[str, list[dict[str, Any]]]) -> None:
    series = {
        option: (
            [s["done"] / 1000 for s in samples],
            [s["dead_tuples"] for s in samples],
            [s["rate"] for s in samples],
        )
        for option, samples in results.items()
    }
    dead_tuples_chart(
        out / "bloat_options.png",
        series,
        title="Dead tuples and claim rate while jobs flow, default autovacuum",
        xlabel="thousands of jobs processed",
        rate_label="claim + complete, jobs/s",
    )


def main(argv: list[str] | None = None) -> int:
    """Measure every option; write the JSON, Markdown table and chart."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bloat_options")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--jobs", type=int, default=500_000)
    parser.add_argument("--options", default=",".join(OPTIONS))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    args = parser.parse_args(argv)
    from benchmarks.default_cluster import default_cluster

    db = Database.from_url(args.database_url)
    url = db.sqlalchemy_url().render_as_string(hide_password=False)
    results: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        if not autovacuum_on(url):
            url = stack.enter_context(default_cluster())
        for option in args.options.split(","):
            print(f"-- {option}: {args.jobs:,} jobs", flush=True)
            results[option] = measure(conninfo_for(url), option, args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bloat_options.json").write_text(json.dumps(results) + "\n")
    table = _summary(results)
    (args.out / "bloat_options.md").write_text(table)
    _plot(args.out, results)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
