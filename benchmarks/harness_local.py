"""Run the portable benchmark harness's own orchestrator on a local PostgreSQL, no Docker.

hardbyte/postgresql-job-queue-benchmarking drives each adapter as a child process (JSONL on
its stdout, ``ENQUEUE <n>`` pacing tokens on its stdin, SIGTERM at the end) but manages
PostgreSQL with ``docker compose`` and launches most adapters with ``docker run``. This
script imports the harness unchanged from a checkout and swaps only those parts:

- ``pg_url`` points at ``--pg-url`` (its database name replaced by each system's
  ``db_name``); starting and stopping PostgreSQL become a reachability check and nothing.
  The ``postgres-restart`` chaos phase is refused: this script never stops a server;
- ``sa-outbox`` is registered as a native adapter (``benchmarks/harness_adapter.py`` under
  ``--adapter-python``), with its ``adapter.json`` written to a temporary directory;
- ``--native SYSTEM=PYTHON`` launches a Python adapter of the checkout (``<system>-bench/
  main.py``) with that interpreter instead of its Docker image, e.g. Procrastinate's.

Everything else is the harness's: phases and their hooks (idle-in-tx, active-readers,
high-load, kill-worker, pg-backend-kill, pool-exhaustion…), its pacer, the metrics daemon,
raw.csv, summary.json, plots and the HTML report (in ``--results``). The orchestrator always
runs with ``--fast --skip-build``: one server, each system's database dropped and created
anew before its run (so ``db_name`` must be a database of the benchmark's own).

Setup (once; the harness needs matplotlib and pandas, so it gets a venv of its own)::

    G=/work/.mirror/hardbyte+postgresql-job-queue-benchmarking/repo
    mkdir -p /tmp/hb && git --git-dir=$G archive HEAD bench_harness procrastinate-bench \\
        | tar -x -C /tmp/hb
    python3 -m venv /work/harnessvenv && /work/harnessvenv/bin/pip install \\
        "psycopg[binary]>=3.2" matplotlib pandas numpy "pydantic>=2"
    python3 -m venv /work/procvenv && /work/procvenv/bin/pip install \\
        procrastinate==3.8.1 "psycopg[binary]==3.3.3"    # only for --native procrastinate=…

Run (what follows ``--`` is the harness's ``bench run`` command line)::

    /work/harnessvenv/bin/python benchmarks/harness_local.py --harness-dir /tmp/hb \\
        --native procrastinate=/work/procvenv/bin/python -- \\
        --systems sa-outbox,procrastinate --producer-rate 100 --worker-count 8 \\
        --sample-every 5 --phase warmup=warmup:20s --phase clean_1=clean:30s \\
        --phase idle_1=idle-in-tx:30s --phase recovery_1=recovery:20s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

HERE = Path(__file__).resolve().parent
SA_OUTBOX_MANIFEST: dict[str, Any] = {
    "system": "sa-outbox",
    "display_name": "sa-outbox (Python, threads)",
    # Not sa_outbox_bench, the database of this repository's own suite (benchmarks/database.py):
    # the orchestrator drops and re-creates db_name before each run.
    "db_name": "sa_outbox_harness",
    "event_tables": ["sa_outbox_harness.jobs"],
    # The descriptor names every index of the table; the daemon polls these two.
    "event_indexes": ["sa_outbox_harness.jobs_pkey", "sa_outbox_harness.jobs_ready_idx"],
    "extensions": [],
    "shutdown_grace_s": 15.0,
}


def protected(pg_url: str) -> set[str]:
    """Databases never dropped: the orchestrator drops and re-creates each system's (--fast)."""
    names = {"postgres", "template0", "template1", "test", "sa_outbox_bench"}
    return names | {urlsplit(pg_url).path.lstrip("/")}


def url_for(base: str, dbname: str) -> str:
    """``base`` (a libpq URL) with its database replaced by ``dbname``."""
    parts = urlsplit(base.replace("postgresql+psycopg://", "postgresql://", 1))
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def patch_harness(
    harness_dir: Path,
    *,
    pg_url: str,
    adapter_python: str,
    native: dict[str, str],
    results: Path,
) -> Any:
    """Import the harness from ``harness_dir`` and make it local; returns its orchestrator."""
    sys.path.insert(0, str(harness_dir))
    from bench_harness import adapters, orchestrator, versions

    def local_pg_url(dbname: str, host: str = "localhost") -> str:
        return url_for(pg_url, dbname)

    def check_postgres(_image: str = "") -> None:
        with psycopg.connect(local_pg_url("postgres"), connect_timeout=5) as conn:
            conn.execute("SELECT 1")

    def refuse_restart(_image: str = "") -> None:
        raise RuntimeError("harness_local.py never stops or restarts PostgreSQL")

    preflight = orchestrator.preflight_database

    def guarded_preflight(manifest: Any, *, recreate: bool = False) -> None:
        if manifest.db_name in protected(pg_url):
            raise RuntimeError(f"refusing to drop and re-create database {manifest.db_name!r}")
        preflight(manifest, recreate=recreate)

    orchestrator.preflight_database = guarded_preflight
    adapters.pg_url = local_pg_url
    orchestrator.pg_url = local_pg_url
    orchestrator.start_postgres = check_postgres
    orchestrator.stop_postgres = lambda _image="": None
    orchestrator._compose_stop_postgres = refuse_restart
    orchestrator._compose_start_postgres = refuse_restart
    orchestrator._restart_postgres = refuse_restart
    orchestrator.RESULTS_ROOT = results

    def no_build(_skip: bool) -> None:
        return None

    def python_launcher(python: str, script: Path, pythonpath: str | None = None) -> Any:
        def launch(manifest: Any, overrides: dict[str, str]) -> Any:
            env = adapters._base_env(manifest, overrides)
            if pythonpath:
                env["PYTHONPATH"] = pythonpath
            return adapters.LaunchSpec(argv=[python, str(script)], env=env, cwd=str(script.parent))

        return launch

    bench_dir = Path(tempfile.mkdtemp(prefix="sa-outbox-bench-"))
    (bench_dir / "adapter.json").write_text(json.dumps(SA_OUTBOX_MANIFEST, indent=2))
    adapters.ADAPTERS["sa-outbox"] = adapters.AdapterEntry(
        bench_dir=bench_dir,
        builder=no_build,
        # sa_outbox from this checkout (the repository root), whatever the venv holds.
        launcher=python_launcher(adapter_python, HERE / "harness_adapter.py", str(HERE.parent)),
    )
    versions._CAPTURE["sa-outbox"] = lambda: {
        "source": "sa-outbox checkout",
        "git_short": versions._git(["rev-parse", "--short", "HEAD"], cwd=HERE.parent),
        "dirty": bool((versions._git(["status", "--porcelain"], cwd=HERE.parent) or "").strip()),
    }
    for system, python in native.items():
        entry = adapters.ADAPTERS[system]
        adapters.ADAPTERS[system] = adapters.AdapterEntry(
            bench_dir=entry.bench_dir,
            builder=no_build,
            launcher=python_launcher(python, entry.bench_dir / "main.py"),
        )
    return orchestrator


def drop_databases(pg_url: str, names: list[str]) -> None:
    """Drop the benchmark's databases (``--drop-after``)."""
    with psycopg.connect(url_for(pg_url, "postgres"), autocommit=True) as conn:
        for name in set(names) - protected(pg_url):
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness-dir", type=Path, required=True, help="a harness checkout")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="the local server (its database part is replaced per system)",
    )
    parser.add_argument("--adapter-python", default="/work/venv/bin/python")
    parser.add_argument(
        "--native",
        action="append",
        default=[],
        metavar="SYSTEM=PYTHON",
        help="run the checkout's <system>-bench/main.py with PYTHON instead of Docker",
    )
    parser.add_argument("--results", type=Path, default=Path("/tmp/harness-runs"))
    parser.add_argument(
        "--drop-after", action="store_true", help="drop the systems' databases afterwards"
    )
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then `bench run` args")
    args = parser.parse_args(argv)
    bench_args = [a for a in args.bench_args if a != "--"] if args.bench_args else []
    native = dict(item.split("=", 1) for item in args.native)
    orchestrator = patch_harness(
        args.harness_dir.resolve(),
        pg_url=args.pg_url,
        adapter_python=args.adapter_python,
        native=native,
        results=args.results.resolve(),
    )
    try:
        return int(orchestrator.main(["run", "--fast", "--skip-build", *bench_args]) or 0)
    finally:
        if args.drop_after:
            from bench_harness import adapters

            systems = next(
                (bench_args[i + 1] for i, a in enumerate(bench_args[:-1]) if a == "--systems"),
                "",
            )
            names = [
                adapters.AdapterManifest.load(adapters.ADAPTERS[s].bench_dir).db_name
                for s in systems.split(",")
                if s in adapters.ADAPTERS
            ]
            drop_databases(args.pg_url, names)


if __name__ == "__main__":
    raise SystemExit(main())
