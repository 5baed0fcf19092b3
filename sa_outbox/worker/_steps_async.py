"""Durable steps on an `AsyncEngine`: `AsyncSteps`, what `JobContext.astep` runs on."""

from __future__ import annotations

import datetime as dt
import inspect  # async-only
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table

from .. import statements as st
from .._clock import Clock
from ..ops import DependencyOps, arun
from ..schema import JobStatus
from ._steps import (
    SessionChoice,
    async_step_session,
    lease_lost,
    recorded_value,
    result_json,
)
from .errors import SignalTimeout, Slept, Snooze, StepsUnavailable

if TYPE_CHECKING:  # sqlalchemy.ext.asyncio needs greenlet, which a plain install may lack
    from sqlalchemy.ext.asyncio import AsyncEngine


class AsyncSteps:
    """Runs and records a job's named steps in the ``steps`` table (`JobStepMixin`).

    A worker builds one when its `JobApp` has a steps table (``JobApp(Job, steps=JobStep)``)
    and hands it to each job's context; handlers call `JobContext.astep`.

    Examples:
        steps = AsyncSteps(async_engine, Job.__table__, JobStep.__table__)
        recorded = await steps.recorded(job_id)
        total = await steps.run(job_id, token, recorded, "total", lambda: 42, False)
        await steps.sleep(job_id, token, recorded, "cool-off", dt.timedelta(hours=1))
    """

    def __init__(
        self,
        engine: AsyncEngine,
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

    async def recorded(self, job_id: uuid.UUID) -> dict[str, Any]:
        """The results recorded so far for the job's steps, by name."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(st.select_job_steps(self.steps, job_id))).all()
        return {name: result for name, result in rows}

    async def parent_results(self, job_id: uuid.UUID) -> dict[uuid.UUID, Any]:
        """What each job ``job_id`` waited for returned, in the order it named them."""
        if self.dependencies is None:
            raise StepsUnavailable(
                "job.parent_results() needs the dependencies table: JobApp(Job, steps=JobStep, "
                "dependencies=JobDependency)"
            )
        async with self.engine.connect() as conn:
            return await arun(conn, self.dependencies.parent_results(self.steps, job_id))

    async def parent_statuses(self, job_id: uuid.UUID) -> dict[uuid.UUID, JobStatus]:
        """The status of each job ``job_id`` waited for."""
        if self.dependencies is None:
            raise StepsUnavailable(
                "job.parent_statuses() needs the dependencies table: JobApp(Job, "
                "steps=JobStep, dependencies=JobDependency)"
            )
        async with self.engine.connect() as conn:
            return await arun(conn, self.dependencies.parent_statuses(job_id))

    async def run(
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
            if inspect.isawaitable(value):  # async-only
                value = await value
            text = result_json(value, name, job_id)
            async with self.engine.begin() as conn:
                stmt = st.record_job_step(self.jobs, self.steps, job_id, token, name, text)
                if (await conn.execute(stmt)).first() is None:
                    raise lease_lost(job_id, token, name)
        else:
            async with async_step_session(self.engine, session) as db, db.begin():
                value = fn(db)
                if inspect.isawaitable(value):  # async-only
                    value = await value
                await db.flush()
                text = result_json(value, name, job_id)
                stmt = st.record_job_step(self.jobs, self.steps, job_id, token, name, text)
                if (await db.execute(stmt)).first() is None:
                    raise lease_lost(job_id, token, name)  # rolls the step's rows back
        recorded[name] = result = recorded_value(text)
        return result

    async def sleep(
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
            async with self.engine.begin() as conn:
                row = (await conn.execute(stmt)).first()
            if row is None:
                raise lease_lost(job_id, token, name)
            recorded[name] = row[1]
            left = delay.total_seconds()
        else:
            async with self.engine.connect() as conn:
                found = await conn.execute(st.sleep_left(str(wake), clock=self.clock))
                left = float(found.scalar_one())
        if left > 0:
            raise Snooze(left)

    async def receive_signal(
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
        async with self.engine.begin() as conn:
            if (await conn.execute(st.lock_held_job(self.jobs, job_id, token))).first() is None:
                raise lease_lost(job_id, token, wait)
            signal = st.select_job_signal(self.steps, job_id, name)
            sent = (await conn.execute(signal)).first()
            if sent is not None:
                return sent[0]
            deadline = recorded.get(wait)
            if deadline is None:
                stmt = st.record_job_sleep(
                    self.jobs, self.steps, job_id, token, wait, timeout, clock=self.clock
                )
                deadline = (await conn.execute(stmt)).one()[1]
                left = timeout.total_seconds()
            else:
                found = await conn.execute(st.sleep_left(str(deadline), clock=self.clock))
                left = float(found.scalar_one())
            if left <= 0:
                raise SignalTimeout(
                    f"no signal {name!r} came for job {job_id} within {timeout.total_seconds():g} s"
                )
            release = st.snooze_job(self.jobs, job_id, token, delay=left, clock=self.clock)
            await conn.execute(release)
        recorded[wait] = deadline
        raise Slept(left)
