"""One job's page and the actions on it: retry (failed) and cancel (pending or running)."""

from __future__ import annotations

import uuid

from flask import Blueprint, Response, redirect
from sqlalchemy import Connection
from werkzeug.wrappers import Response as BaseResponse

from .._exceptions import InvalidArgument
from ..queue import JobQueue, get_job, get_job_steps, get_workflow, retry_failed
from ._pages import Pages, now_of, page, parse_uuid

__all__ = ["register"]


def register(bp: Blueprint, pages: Pages) -> None:
    """Adds ``/jobs/<id>`` and its ``retry`` and ``cancel`` actions to ``bp``."""
    jobs = pages.jobs

    @bp.get("/jobs/<job_id>")
    def job_detail(job_id: str) -> str | BaseResponse:
        wanted = parse_uuid(job_id)
        found = None
        job_steps = None
        workflow_id = None
        if wanted is not None:
            with pages.get_engine().connect() as conn:
                now = now_of(conn)
                found = get_job(conn, jobs, wanted)
                if found is not None and pages.steps is not None:
                    job_steps = get_job_steps(conn, pages.steps, wanted)
                if pages.dependencies is not None:
                    workflow_id, members = get_workflow(conn, jobs, pages.dependencies, wanted)
                    if found is None and members:  # waiting: its workflow's page shows it
                        return redirect(pages.url("workflow_detail", job_id=job_id))
                    if len(members) < 2:
                        workflow_id = None
        if found is None:
            return page(f"no job {job_id}", 404)
        return pages.render(
            "job.html", job=found, now=now, steps=job_steps, workflow_id=workflow_id
        )

    def retry_failed_job(conn: Connection, wanted: uuid.UUID) -> None:
        retried = retry_failed(conn, jobs, ids=[wanted])
        if wanted in retried.skipped:  # a 409 page: the job stays failed
            raise InvalidArgument(
                f"job {wanted} was not retried: job {retried.skipped[wanted]} holds its "
                "unique key (a unique job, see docs/unique.md)"
            )

    @bp.post("/jobs/<job_id>/retry")
    def retry_job(job_id: str) -> BaseResponse:
        return pages.retry_one(
            job_id,
            "job",
            retry_failed_job,
            lambda wanted: pages.url("job_detail", job_id=str(wanted)),
        )

    @bp.post("/jobs/<job_id>/cancel")
    def cancel_job(job_id: str) -> Response | BaseResponse:
        wanted = parse_uuid(job_id)
        if wanted is None:
            return page(f"no job {job_id}", 404)
        with pages.get_engine().begin() as conn:
            result = JobQueue(jobs).cancel(conn, [wanted])
        if result.unknown:
            return page(f"no job {job_id}", 404)
        return redirect(pages.url("job_detail", job_id=str(wanted)))
