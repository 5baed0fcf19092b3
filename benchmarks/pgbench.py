"""``pgbench``: the raw system's claim and batched completion in a pgbench script.

The no-Python ceiling for W4 / W5: the article's table (see `benchmarks.raw`), N jobs
pre-enqueued with COPY, then ``pgbench -n -M prepared -f script -c C -j J -t T``. Each script
run claims 20 jobs (one statement, its own commit; ``\\gset`` keeps the claimed ids and tokens
as two arrays) and completes them with one ``UPDATE … FROM unnest`` (its own commit), as the
raw worker does. T is enough for every client to finish its share plus one empty claim; the
wall time of the pgbench process is the measure, and every job must end ``succeeded``.
"""

from __future__ import annotations

import math
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

from benchmarks.core import (
    CONCURRENCY,
    BenchmarkError,
    Context,
    Sample,
    SystemSpec,
    WorkloadSpec,
    throughput,
)
from benchmarks.raw import CLAIM_BATCH, copy_jobs, count_status, install_raw_schema

__all__ = ["SCRIPT", "SYSTEM"]

SCRIPT = f"""\
WITH claimed AS (
  SELECT id FROM jobs
  WHERE status = 'pending' AND run_at <= now()
  ORDER BY priority DESC, run_at, id
  LIMIT {CLAIM_BATCH}
  FOR UPDATE SKIP LOCKED
), taken AS (
  UPDATE jobs AS j
  SET status = 'running', attempts = j.attempts + 1,
      lease_until = now() + interval '30 seconds',
      lease_token = gen_random_uuid(), worker_id = 'pgbench', updated_at = now()
  FROM claimed
  WHERE j.id = claimed.id
  RETURNING j.id, j.lease_token
)
SELECT coalesce(array_agg(id), '{{}}') AS ids, coalesce(array_agg(lease_token), '{{}}') AS tokens
FROM taken
\\gset
UPDATE jobs AS j
SET status = 'succeeded', lease_until = NULL, lease_token = NULL, worker_id = NULL,
    updated_at = now()
FROM unnest(:ids::uuid[], :tokens::uuid[]) AS done(id, token)
WHERE j.id = done.id AND j.status = 'running' AND j.lease_token = done.token;
"""


def _process(ctx: Context, clients: int) -> Sample:
    import psycopg

    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise BenchmarkError("pgbench is not on PATH (PostgreSQL's client tools)")
    with psycopg.connect(ctx.conninfo, autocommit=True) as conn:
        copy_jobs(conn, ctx.n)
    runs_per_client = math.ceil(ctx.n / (CLAIM_BATCH * clients)) + 1
    with tempfile.TemporaryDirectory(prefix="sa-outbox-pgbench-") as tmp:
        script = pathlib.Path(tmp) / "claim_complete.sql"
        script.write_text(SCRIPT, encoding="utf-8")
        command = [
            pgbench,
            "-n",
            "-M",
            "prepared",
            "-f",
            str(script),
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-t",
            str(runs_per_client),
        ]
        env = {**os.environ, **ctx.db.libpq_env(ctx.schema)}
        started = time.perf_counter()
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=ctx.deadline(), check=False
        )
        elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise BenchmarkError(f"pgbench failed ({result.returncode}): {result.stderr.strip()}")
    succeeded = count_status(ctx, "succeeded")
    if succeeded != ctx.n:
        raise BenchmarkError(f"pgbench: {succeeded} jobs succeeded, expected {ctx.n}")
    return {"throughput": throughput(ctx.n, elapsed)}


def _versions() -> dict[str, str]:
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        return {}
    out = subprocess.run([pgbench, "--version"], capture_output=True, text=True, check=False)
    return {"pgbench": out.stdout.strip()}


SYSTEM = SystemSpec(
    name="pgbench",
    install=install_raw_schema,
    versions=_versions,
    workloads={
        "W4": WorkloadSpec(
            lambda ctx: _process(ctx, 1),
            f"pgbench -n -M prepared -c 1 -j 1: claim {CLAIM_BATCH} + 1 batched completion per "
            "script run, one commit each; wall time of the pgbench process",
        ),
        "W5": WorkloadSpec(
            lambda ctx: _process(ctx, CONCURRENCY),
            f"pgbench -n -M prepared -c {CONCURRENCY} -j 2: {CONCURRENCY} client connections, "
            f"claim {CLAIM_BATCH} + 1 batched completion each",
        ),
    },
)
