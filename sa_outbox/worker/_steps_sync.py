# generated from _steps_async.py by tools/async_to_sync.py — do not edit
# (edit _steps_async.py and run `python tools/async_to_sync.py`)
"""Durable steps on an `Engine`: `Steps`, what `JobContext.step` runs on."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table

from .. import statements as st
from .._clock import Clock
from ..ops import DependencyOps, run
from ..schema import JobStatus
from ._steps import (
    SessionChoice,
    lease_lost,
    recorded_value,
    result_json,
    step_session,
)
from .errors import SignalTimeout, Slept, Snooze, StepsUnavailable

if TYPE_CHECKING:  # only for the annotations
    from sqlalchemy import Engine


class Steps:
    """Runs and records a job's named steps in the ``steps`` table (`JobStepMixin`).

    A worker builds one when its `JobApp` has a steps table (``JobApp(Job, steps=JobStep)``)
    and hands it to each job's context; handlers call `JobContext.step`.

    Examples:
        steps = Steps(engine, Job.__table__, JobStep.__table__)
        recorded = steps.recorded(job_id)
        total = steps.run(job_id, token, recorded, "total", lambda: 42, False)
        steps.sleep(job_id, token, recorded, "cool-off", dt.timedelta(hours=1))
    """

    def __init__(
        self,
        engine: Engine,
        jobs: Table,
        steps: Table,
        *,
        clock: Clock | None = None,
        dependencies: Table | None = None,
    ) -> None:
        self.engine = engine
        self.jobs = jobs
        self.steps = steps
        self.clock = clock
        self.dependencies = None if dependencies is None else DependencyOps(jobs, dependencies)

    def recorded(self, job_id: uuid.UUID) -> dict[str, Any]:
        """The results recorded so far for the job's steps, by name."""
        with self.engine.connect() as conn:
            rows = (conn.execute(st.select_job_steps(self.steps, job_id))).all()
        return {name: result for name, result in rows}

    def parent_results(self, job_id: uuid.UUID) -> dict[uuid.UUID, Any]:
        """What each job ``job_id`` waited for returned, in the order it named them."""
        if self.dependencies is None:
            raise StepsUnavailable(
                "job.parent_results() needs the dependencies table: JobApp(Job, steps=JobStep, "
                "dependencies=JobDependency)"
            )
        with self.engine.connect() as conn:
            return run(conn, self.dependencies.parent_results(self.steps, job_id))

    def parent_statuses(self, job_id: uuid.UUID) -> dict[uuid.UUID, JobStatus]:
        """The status of each job ``job_id`` waited for."""
        if self.dependencies is None:
            raise StepsUnavailable(
                "job.parent_statuses() needs the dependencies table: JobApp(Job, "
                "steps=JobStep, dependencies=JobDependency)"
            )
        with self.engine.connect() as conn:
            return run(conn, self.dependencies.parent_statuses(job_id))

    def run(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        recorded: dict[str, Any],
        name: str,
        fn: Callable[..., Any],
        session: SessionChoice,
    ) -> Any:
        """Step ``name``: its recorded result, or ``fn`` run and its result recorded, fenced
        by the lease ``token`` (`LeaseLost` when the job was taken away: nothing recorded,
        and what ``fn`` wrote in the step's Session rolled back)."""
        if name in recorded:
            return recorded[name]
        if session is False:
            value = fn()
            text = result_json(value, name, job_id)
            with self.engine.begin() as conn:
                stmt = st.record_job_step(self.jobs, self.steps, job_id, token, name, text)
                if (conn.execute(stmt)).first() is None:
                    raise lease_lost(job_id, token, name)
        else:
            with step_session(self.engine, session) as db, db.begin():
                value = fn(db)
                db.flush()
                text = result_json(value, name, job_id)
                stmt = st.record_job_step(self.jobs, self.steps, job_id, token, name, text)
                if (db.execute(stmt)).first() is None:
                    raise lease_lost(job_id, token, name)  # rolls the step's rows back
        recorded[name] = result = recorded_value(text)
        return result

    def sleep(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        recorded: dict[str, Any],
        name: str,
        delay: dt.timedelta,
    ) -> None:
        """Durable sleep ``name``: returns once its wake-up time (recorded at the first call,
        ``now + delay`` on the database's clock) has passed; until then raises `Snooze`
        for the time left, which ends this run and frees its worker."""
        wake = recorded.get(name)
        if wake is None:
            stmt = st.record_job_sleep(
                self.jobs, self.steps, job_id, token, name, delay, clock=self.clock
            )
            with self.engine.begin() as conn:
                row = (conn.execute(stmt)).first()
            if row is None:
                raise lease_lost(job_id, token, name)
            recorded[name] = row[1]
            left = delay.total_seconds()
        else:
            with self.engine.connect() as conn:
                found = conn.execute(st.sleep_left(str(wake), clock=self.clock))
                left = float(found.scalar_one())
        if left > 0:
            raise Snooze(left)

    def receive_signal(
        self,
        job_id: uuid.UUID,
        token: uuid.UUID,
        recorded: dict[str, Any],
        name: str,
        timeout: dt.timedelta,
    ) -> Any:
        """Signal ``name``'s payload once it was sent. Until then the job is sent back to
        ``pending`` until the wait's deadline (``timeout`` from the first wait), here, under
        the job's row lock, then `Slept` ends the run: a sender, who takes that lock too,
        comes before (its signal is seen here) or after (it finds the job asleep and wakes
        it). Past the deadline, `SignalTimeout`."""
        wait = st.WAIT_PREFIX + name
        with self.engine.begin() as conn:
            if (conn.execute(st.lock_held_job(self.jobs, job_id, token))).first() is None:
                raise lease_lost(job_id, token, wait)
            signal = st.select_job_signal(self.steps, job_id, name)
            sent = (conn.execute(signal)).first()
            if sent is not None:
                return sent[0]
            deadline = recorded.get(wait)
            if deadline is None:
                stmt = st.record_job_sleep(
                    self.jobs, self.steps, job_id, token, wait, timeout, clock=self.clock
                )
                deadline = (conn.execute(stmt)).one()[1]
                left = timeout.total_seconds()
            else:
                found = conn.execute(st.sleep_left(str(deadline), clock=self.clock))
                left = float(found.scalar_one())
            if left <= 0:
                raise SignalTimeout(
                    f"no signal {name!r} came for job {job_id} within {timeout.total_seconds():g} s"
                )
            release = st.snooze_job(self.jobs, job_id, token, delay=left, clock=self.clock)
            conn.execute(release)
        recorded[wait] = deadline
        raise Slept(left)
