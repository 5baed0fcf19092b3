"""W7: claim throughput after 1,000,000 jobs have flowed through, under default autovacuum.

Two designs, the same procedure, one after the other in one run:

- ``raw``: the article's schema and SQL with psycopg 3 (claim 20, one batched completion),
  the table as the article creates it: no storage settings, no vacuum but autovacuum's.
- ``sa-sync``: sa-outbox's table (its recommended storage settings) and its `Worker`, which
  vacuums the ready path itself past a dead-tuple threshold (docs/retention.md).

Procedure per design: a fresh table; **fresh**: enqueue ``probe`` jobs and time processing
them; **flow**: ``flow`` jobs through the table under continuous load (a producer keeps a
backlog, the consumer processes), sampling dead tuples, the ready index's size and
throughput every second; **after**: enqueue ``probe`` jobs again and time them. The row
``after_vs_fresh`` is after / fresh (the issue's target: ≥ 0.8 for sa-outbox); the samples
make ``w7_history.png`` (dead tuples and throughput over time, both designs).

The run needs autovacuum's defaults; when the given server runs without autovacuum (CI
configurations often do), it runs on a throwaway cluster with default settings
(`benchmarks.default_cluster`). A 1,000,000-job flow takes minutes per design, so the full
suite runs it once, whatever ``--runs`` says; ``--quick`` flows 20,000 jobs.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.core import BenchmarkError, make_row
from benchmarks.raw import CLAIM_BATCH, CLAIM_SQL, COMPLETE_SQL, DDL

__all__ = ["SCHEMA", "autovacuum_on", "connect", "conninfo_for", "dead_tuples_chart", "run"]

FLOW = 1_000_000
PROBE = 50_000
QUICK_FLOW = 20_000
QUICK_PROBE = 2_000
#: The producer tops the backlog up to this many pending jobs, in COPY batches of `CHUNK`.
BACKLOG = 20_000
CHUNK = 2_000
SAMPLE_EVERY = 1.0
SCHEMA = "w7"
CONCURRENCY = 8

_STATS = """
SELECT s.n_dead_tup, s.n_live_tup, s.autovacuum_count, s.vacuum_count,
       pg_relation_size(to_regclass('jobs_ready_idx'))
FROM pg_stat_user_tables AS s WHERE s.relid = to_regclass('jobs')"""


def conninfo_for(url: str) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    parts = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database,
    }
    info = " ".join(f"{k}={v}" for k, v in parts.items() if v is not None)
    return f"{info} options='-c search_path={SCHEMA}'"


def connect(conninfo: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(conninfo, **kwargs)


class _Counter:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class _Design:
    """One design under test: how to create its table and how to process ``n`` jobs."""

    name = ""
    setup = ""

    def __init__(self, conninfo: str, sqlalchemy_url: str) -> None:
        self.conninfo = conninfo
        self.url = sqlalchemy_url

    def create(self) -> None:
        raise NotImplementedError

    def process(self, n: int, processed: _Counter) -> None:
        """Process until ``n`` more jobs are done; add each acknowledged batch to ``processed``."""
        raise NotImplementedError


class _Raw(_Design):
    name = "raw"
    setup = (
        "the article's table (no storage settings) and SQL, psycopg 3, one connection: "
        "claim 20 + one batched completion per batch; autovacuum only"
    )

    def create(self) -> None:
        with connect(self.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            conn.execute(f"CREATE SCHEMA {SCHEMA}")
            conn.execute(DDL)

    def process(self, n: int, processed: _Counter) -> None:
        done = 0
        with connect(self.conninfo, prepare_threshold=0) as conn:
            while done < n:
                rows = conn.execute(CLAIM_SQL, (CLAIM_BATCH, "raw")).fetchall()
                conn.commit()
                if not rows:
                    time.sleep(0.001)  # the producer is behind; benchmark-only polling
                    continue
                conn.execute(COMPLETE_SQL, ([r[0] for r in rows], [r[4] for r in rows]))
                conn.commit()
                done += len(rows)
                processed.add(len(rows))


class _SaSync(_Design):
    name = "sa-sync"
    setup = (
        f"sa-outbox's table from the models (recommended storage settings) and its Worker "
        f"(threads, concurrency {CONCURRENCY}, default options: it vacuums the ready path "
        "past its dead-tuple threshold); autovacuum on with server defaults"
    )

    def __init__(self, conninfo: str, sqlalchemy_url: str) -> None:
        super().__init__(conninfo, sqlalchemy_url)
        from benchmarks.sa_models import models_for

        self.models = models_for(SCHEMA)

    def create(self) -> None:
        from sqlalchemy import create_engine

        with connect(self.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            conn.execute(f"CREATE SCHEMA {SCHEMA}")
        engine = create_engine(self.url)
        try:
            self.models.base.metadata.create_all(engine)
        finally:
            engine.dispose()

    def process(self, n: int, processed: _Counter) -> None:
        from sqlalchemy import create_engine

        from sa_outbox import JobApp, Worker
        from sa_outbox.worker import WorkerMetrics

        app = JobApp(self.models.job)
        app.register("noop", lambda job: None)
        engine = create_engine(self.url, pool_size=6, max_overflow=4)
        target = processed.value + n
        worker: Any = None

        class Count(WorkerMetrics):
            def batch_written(self, acknowledged: int, claimed: int, seconds: float) -> None:
                processed.add(acknowledged)
                if processed.value >= target:
                    worker.stop()

        worker = Worker(
            app,
            engine,
            concurrency=CONCURRENCY,
            metrics=Count(),
            install_signal_handlers=False,
        )
        try:
            worker.run()
        finally:
            engine.dispose()


def _copy_jobs(conn: Any, count: int) -> None:
    with conn.cursor() as cur, cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy:
        for _ in range(count):
            copy.write_row(("noop", "{}"))
    conn.commit()


def _enqueue(conninfo: str, count: int) -> None:
    with connect(conninfo) as conn:
        for start in range(0, count, CHUNK):
            _copy_jobs(conn, min(CHUNK, count - start))


def _timed(design: _Design, count: int) -> float:
    """Enqueue ``count`` jobs (not timed), then time processing them all: jobs/s."""
    _enqueue(design.conninfo, count)
    counter = _Counter()
    started = time.perf_counter()
    design.process(count, counter)
    return count / (time.perf_counter() - started)


@contextlib.contextmanager
def _background(target: Callable[[], None]) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    yield thread


def _flow(design: _Design, total: int) -> list[dict[str, float]]:
    """``total`` jobs through the table under continuous load; samples every second."""
    processed = _Counter()
    enqueued = 0
    stop = threading.Event()
    samples: list[dict[str, float]] = []
    errors: list[BaseException] = []

    def producer() -> None:
        nonlocal enqueued
        try:
            with connect(design.conninfo) as conn:
                while enqueued < total and not stop.is_set():
                    if enqueued - processed.value >= BACKLOG:
                        time.sleep(0.005)  # benchmark-only pacing: keep a bounded backlog
                        continue
                    size = min(CHUNK, total - enqueued)
                    _copy_jobs(conn, size)
                    enqueued += size
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def sampler() -> None:
        started = time.perf_counter()
        with connect(design.conninfo, autocommit=True) as conn:
            last_t, last_done = started, 0
            while not stop.wait(SAMPLE_EVERY):
                now, done = time.perf_counter(), processed.value
                row = conn.execute(_STATS).fetchone()
                if row is None:
                    continue
                dead, live, autovacuums, vacuums, index_bytes = row
                samples.append(
                    {
                        "t": round(now - started, 2),
                        "processed": done,
                        "rate": round((done - last_done) / (now - last_t), 1),
                        "dead_tuples": dead,
                        "live_tuples": live,
                        "autovacuums": autovacuums,
                        "vacuums": vacuums,
                        "ready_index_kb": (index_bytes or 0) // 1024,
                    }
                )
                last_t, last_done = now, done

    with _background(producer) as produce, _background(sampler) as sample:
        try:
            design.process(total, processed)
        finally:
            stop.set()
            produce.join()
            sample.join()
    if errors:
        raise BenchmarkError(f"W7 {design.name}: the producer failed: {errors[0]!r}")
    return samples


def _count_succeeded(design: _Design) -> int:
    with connect(design.conninfo) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()
        return int(row[0]) if row else 0


def _measure(design: _Design, flow: int, probe: int) -> dict[str, Any]:
    design.create()
    fresh = _timed(design, probe)
    print(f"   W7 {design.name}: fresh {fresh:,.0f} jobs/s; flowing {flow:,} jobs", flush=True)
    samples = _flow(design, flow)
    after = _timed(design, probe)
    succeeded = _count_succeeded(design)
    if succeeded != flow + 2 * probe:
        expected = flow + 2 * probe
        raise BenchmarkError(f"W7 {design.name}: {succeeded} succeeded, expected {expected}")
    print(f"   W7 {design.name}: after {after:,.0f} jobs/s ({after / fresh:.2f}x)", flush=True)
    return {"fresh": fresh, "after": after, "samples": samples}


def dead_tuples_chart(
    path: pathlib.Path,
    series: dict[str, tuple[list[float], list[float], list[float]]],
    *,
    title: str,
    xlabel: str,
    rate_label: str,
) -> None:
    """Dead tuples above, processing rate below, one line per name: ``(xs, dead, rates)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (dead_ax, rate_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for i, (name, (xs, dead, rates)) in enumerate(series.items()):
        dead_ax.plot(xs, dead, label=name, color=f"C{i}")
        rate_ax.plot(xs, rates, label=name, color=f"C{i}")
    dead_ax.set_ylabel("dead tuples (jobs table)")
    dead_ax.set_title(title)
    rate_ax.set_ylabel(rate_label)
    rate_ax.set_xlabel(xlabel)
    for ax in (dead_ax, rate_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _plot(out_dir: pathlib.Path, results: dict[str, list[dict[str, Any]]]) -> None:
    series = {}
    for name, measured in results.items():
        samples = measured[0]["samples"]
        series[name] = (
            [s["t"] for s in samples],
            [s["dead_tuples"] for s in samples],
            [s["rate"] for s in samples],
        )
    dead_tuples_chart(
        out_dir / "w7_history.png",
        series,
        title="W7: continuous load under default autovacuum (first run)",
        xlabel="seconds",
        rate_label="jobs/s processed",
    )


def autovacuum_on(url: str) -> bool:
    with connect(conninfo_for(url)) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        return bool(row and row[0] == "on")


def run(
    database_url: str, *, quick: bool, runs: int, out_dir: pathlib.Path
) -> list[dict[str, Any]]:
    """Run W7 on both designs; return result rows and write w7_history.{png,json}."""
    from benchmarks.default_cluster import default_cluster

    flow, probe = (QUICK_FLOW, QUICK_PROBE) if quick else (FLOW, PROBE)
    runs = 1 if not quick else max(1, min(runs, 1))
    with contextlib.ExitStack() as stack:
        url = database_url
        where = "the given server (autovacuum on)"
        if not autovacuum_on(url):
            cluster = stack.enter_context(default_cluster())
            url = cluster.replace("postgresql://", "postgresql+psycopg://")
            where = (
                "a throwaway cluster with default settings (the given server runs without "
                "autovacuum)"
            )
        print(f"-- W7 on {where}: flow {flow:,}, probe {probe:,}", flush=True)
        sa_url = _search_path_url(url)
        results: dict[str, list[dict[str, Any]]] = {}
        for design in (_Raw(conninfo_for(url), sa_url), _SaSync(conninfo_for(url), sa_url)):
            results[design.name] = [_measure(design, flow, probe) for _ in range(runs)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "w7_history.json").write_text(json.dumps(results, indent=None) + "\n")
    _plot(out_dir, results)
    rows = []
    for name, measured in results.items():
        design_setup = _Raw.setup if name == "raw" else _SaSync.setup
        setup = f"{design_setup}; {flow:,} jobs flowed, {probe:,}-job probes; on {where}"
        rows.append(make_row("W7", name, "throughput", [m["after"] for m in measured], setup))
        rows.append(make_row("W7", name, "throughput_fresh", [m["fresh"] for m in measured], setup))
        rows.append(
            make_row(
                "W7", name, "after_vs_fresh", [m["after"] / m["fresh"] for m in measured], setup
            )
        )
    return rows


def _search_path_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    parsed = make_url(url).set(drivername="postgresql+psycopg")
    parsed = parsed.update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    return parsed.render_as_string(hide_password=False)
