"""A `JobApp` for the tests that run workers in processes of their own.

``python -m sa_outbox worker tests.worker_app:app`` loads it, as a user's ``myapp.tasks:app``;
``python -m tests.worker_app`` runs a `Worker` with options the CLI does not have (a
`FakeClock`, ``drain``). The schema comes from ``$SA_OUTBOX_WORKER_SCHEMA``, which the test
process sets (to a name of its own) before it starts any worker, so the children inherit it.

Each handler run appends ``job_id token attempts pid`` to the ledger file named by
``$SA_OUTBOX_WORKER_LEDGER`` with one ``os.write`` on an ``O_APPEND`` descriptor: the line is
in the kernel before the handler returns, so a SIGKILL after that cannot lose it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import threading
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sa_outbox import Backoff, FakeClock, JobApp, JobContext, JobMixin, JobStepMixin, Worker
from sa_outbox.schema import JobDependencyMixin

SCHEMA = os.environ.setdefault("SA_OUTBOX_WORKER_SCHEMA", f"sa_outbox_workers_{os.getpid()}")
#: The backoff of retries and of the reclaimer: short, so crash tests finish quickly.
BACKOFF = Backoff(base=0.2, max=1.0, jitter=0.1)


class Base(DeclarativeBase):
    pass


class Job(JobMixin, Base):
    __tablename__ = "jobs"
    __table_schema__ = SCHEMA


class JobStep(JobStepMixin, Base):
    __tablename__ = "job_steps"
    __table_schema__ = SCHEMA


class JobDependency(JobDependencyMixin, Base):
    __tablename__ = "job_dependencies"
    __table_schema__ = SCHEMA


class Effect(Base):
    """What a durable step wrote: one row per (job, step) run that committed."""

    __tablename__ = "effects"
    __table_args__ = {"schema": SCHEMA}  # noqa: RUF012 - SQLAlchemy's own convention
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[uuid.UUID]
    step: Mapped[str]


app = JobApp(Job, backoff=BACKOFF, steps=JobStep)
#: Workflows: jobs that wait for jobs (``tests.worker_app:flow_app``).
flow_app = JobApp(Job, backoff=BACKOFF, steps=JobStep, dependencies=JobDependency)
_ledger_fd: int | None = None


def record(job: JobContext) -> None:
    global _ledger_fd
    path = os.environ.get("SA_OUTBOX_WORKER_LEDGER")
    if not path:
        return
    if _ledger_fd is None:
        _ledger_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_ledger_fd, f"{job.id} {job.lease_token} {job.attempts} {os.getpid()}\n".encode())


@app.handler("noop")
def noop(job: JobContext) -> None:
    record(job)


@app.handler("hold")
def hold(job: JobContext) -> None:
    """Wait (on the cancel token) ``payload["seconds"]`` at the first attempt only."""
    record(job)
    if job.attempts == 1:
        job.cancel.wait(job.payload["seconds"])


@app.handler("stubborn")
def stubborn(job: JobContext) -> None:
    """Ignore the cancel token: sleep ``payload["seconds"]`` whatever happens."""
    record(job)
    threading.Event().wait(job.payload["seconds"])


@app.handler("kill-worker")
def kill_worker(job: JobContext) -> None:
    """A job that takes down every worker that runs it."""
    record(job)
    os.kill(os.getpid(), signal.SIGKILL)


@app.handler("stepped")
def stepped(job: JobContext) -> None:
    """Two durable steps, each writing an `Effect` row in its Session; with
    ``payload["die"]`` the first attempt SIGKILLs its worker between them."""
    record(job)

    def effect(name: str) -> Callable[[Session], str]:
        def write(db: Session) -> str:
            db.add(Effect(job_id=job.id, step=name))
            return name

        return write

    job.step("one", effect("one"), session=True)
    if job.payload.get("die") and job.attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    job.step("two", effect("two"), session=True)


@flow_app.handler("node")
def node(job: JobContext) -> str:
    """One node of a workflow: a step writing an `Effect` row in its Session, after
    checking that every job it waited for wrote its own; with ``payload["die"]`` the first
    attempt SIGKILLs its worker after the step."""
    record(job)
    parents = job.parent_results()
    if None in parents.values():
        raise RuntimeError(f"node {job.payload['name']} ran before its parents: {parents}")

    def write(db: Session) -> str:
        db.add(Effect(job_id=job.id, step=job.payload["name"]))
        return str(job.payload["name"])

    done = job.step("effect", write, session=True)
    if job.payload.get("die") and job.attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return done


AUDIT_SQL = """
CREATE TABLE {schema}.claims (
    seq bigserial PRIMARY KEY, job_id uuid NOT NULL, token uuid NOT NULL, attempts int NOT NULL
);
CREATE TABLE {schema}.completions (
    seq bigserial PRIMARY KEY, job_id uuid NOT NULL, token uuid NOT NULL, worker_id text
);
CREATE FUNCTION {schema}.audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'running' AND OLD.status = 'pending' THEN
        INSERT INTO {schema}.claims (job_id, token, attempts)
        VALUES (NEW.id, NEW.lease_token, NEW.attempts);
    END IF;
    IF NEW.status = 'succeeded' AND OLD.status <> 'succeeded' THEN
        INSERT INTO {schema}.completions (job_id, token, worker_id)
        VALUES (NEW.id, OLD.lease_token, OLD.worker_id);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER audit AFTER UPDATE ON {schema}.jobs
    FOR EACH ROW EXECUTE FUNCTION {schema}.audit();
"""


def create_schema(engine: Engine, *, audit: bool = True) -> None:
    """(Re)create the schema, the job table (with its NOTIFY trigger) and the audit tables:
    every claim (pending → running, with its token) and every completion (running →
    succeeded, with the token that completed it) leaves a row."""
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    Base.metadata.create_all(engine)
    if audit:
        with engine.begin() as conn:
            conn.exec_driver_sql(AUDIT_SQL.format(schema=SCHEMA))


def drop_schema(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.worker_app")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--clock", help="ISO time of a FakeClock (default: the database's)")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--mode", choices=["drain", "run"], default="drain")
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--quiet", action="store_true", help="no LISTEN, reclaimer nor vacuum")
    parser.add_argument("--worker-id", help="default: host:pid:random")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--grace", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    engine = create_engine(args.database_url)
    clock = FakeClock(dt.datetime.fromisoformat(args.clock)) if args.clock else None
    quiet = {"reclaim": False, "vacuum": None} if args.quiet else {}
    worker = Worker(
        app,
        engine,
        lease=args.lease,
        clock=clock,
        listen=args.mode == "run" and not args.quiet,
        poll_interval=args.poll_interval,
        worker_id=args.worker_id,
        concurrency=args.concurrency,
        grace=args.grace,
        **quiet,  # type: ignore[arg-type]
    )
    if args.mode == "drain":
        worker.drain()
    else:
        worker.run()


if __name__ == "__main__":
    main()
