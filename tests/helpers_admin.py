"""Rows in every state, for the tests of ``status``, ``queues``, ``jobs``, ``outbox`` and the
dashboard: made through the library's own API where one exists (enqueue, claim, fail,
append; a fake clock for jobs finished in the past), and by a plain UPDATE only for what
needs time to pass (an expired lease, a parked event)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text

from sa_outbox import FakeClock, JobQueue, Outbox
from sa_outbox.statements import NewJob, select_now

from .conftest import TEST_SCHEMA, Job, OutboxEvent

MODELS = ["--model", "tests.conftest:Job", "--outbox-model", "tests.conftest:OutboxEvent"]
JOB_MODEL = ["--model", "tests.conftest:Job"]
OUTBOX_MODEL = ["--outbox-model", "tests.conftest:OutboxEvent"]


@dataclass
class Scene:
    pending: list[uuid.UUID]
    failed: list[uuid.UUID]  # send-email, emails queue, exhausted (3 of 3)
    running: uuid.UUID  # held by worker w-live, lease alive
    expired: uuid.UUID  # held by worker w-dead, lease expired
    succeeded: uuid.UUID
    parked: uuid.UUID
    backlog: uuid.UUID


def make_scene(engine: Engine) -> Scene:
    """2 pending pings, 2 failed send-email, 1 running, 1 running past its lease, 1
    succeeded; in the outbox one parked event and one waiting."""
    queue = JobQueue(Job)
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        pending = [queue.enqueue(conn, "ping", {"n": n}).id for n in range(2)]
        for n in range(2):
            queue.enqueue(conn, "send-email", {"to": n}, queue="emails", max_attempts=1)
        queue.enqueue(conn, "report", {}, queue="reports")
    failed = []
    with engine.begin() as conn:
        for job in queue.claim(conn, worker_id="w-fail", kinds=["send-email"], batch=2):
            queue.fail(
                conn, job.id, job.lease_token, error=f"SMTPError: 550 refused\nline 2 {job.id}"
            )
            failed.append(job.id)
        [report] = queue.claim(conn, worker_id="w-done", kinds=["report"], batch=1)
        queue.complete(conn, report.id, report.lease_token)
    with engine.begin() as conn:
        queue.enqueue(conn, "resize", {}, queue="images")
        queue.enqueue(conn, "resize", {}, queue="images")
    with engine.begin() as conn:
        [live] = queue.claim(conn, worker_id="w-live", kinds=["resize"], batch=1, lease=600)
        [dead] = queue.claim(conn, worker_id="w-dead", kinds=["resize"], batch=1, lease=600)
        conn.execute(
            text(
                f"UPDATE {TEST_SCHEMA}.jobs SET lease_until = now() - interval '1 minute'"
                " WHERE id = :id"
            ),
            {"id": dead.id},
        )
        parked = outbox.append(
            conn, aggregate_type="order", aggregate_id="1", event_type="Paid", payload={}
        )
        backlog = outbox.append(
            conn, aggregate_type="order", aggregate_id="2", event_type="Paid", payload={}
        )
        conn.execute(
            text(
                f"UPDATE {TEST_SCHEMA}.outbox SET parked_at = now(), attempts = 10,"
                " last_error = E'broker said no\\ndetails' WHERE id = :id"
            ),
            {"id": parked},
        )
    return Scene(pending, failed, live.id, dead.id, report.id, parked, backlog)


def finish_at(
    engine: Engine, when: dt.datetime, *, succeeded: int = 0, failed: int = 0, kind: str = "k"
) -> None:
    """Enqueue, claim and finish jobs with a fake clock set to ``when`` (so their
    ``updated_at`` is ``when``): ``succeeded`` completed, ``failed`` failed for good."""
    queue = JobQueue(Job, clock=FakeClock(when))
    with engine.begin() as conn:
        queue.enqueue_many(conn, [NewJob(kind, {"n": n}) for n in range(succeeded + failed)])
        claimed = queue.claim(conn, worker_id="w", kinds=[kind], batch=succeeded + failed)
        for n, job in enumerate(claimed):
            if n < succeeded:
                queue.complete(conn, job.id, job.lease_token)
            else:
                queue.fail(conn, job.id, job.lease_token, error="boom")


def database_now(engine: Engine) -> dt.datetime:
    """The database's ``now()``: where jobs finished "minutes ago" are placed from."""
    with engine.connect() as conn:
        now = conn.execute(select_now()).scalar_one()
    assert isinstance(now, dt.datetime)
    return now
