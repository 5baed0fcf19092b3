"""The workflows list, one workflow's page, and cancelling or retrying a whole workflow."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, redirect
from sqlalchemy import Connection
from werkzeug.wrappers import Response as BaseResponse

from ..queue import JobQueue, get_workflow, list_workflows, workflow_depths
from ._pages import Pages, now_of, page, parse_uuid

__all__ = ["WORKFLOWS_SHOWN", "register"]

#: Workflows the workflows page lists (the most recently active first).
WORKFLOWS_SHOWN = 50
_UNFINISHED = ("waiting", "pending", "running")


def register(bp: Blueprint, pages: Pages) -> None:
    """Adds ``/workflows``, ``/workflows/<id>`` and its ``cancel`` and ``retry`` to ``bp``."""
    jobs, dependencies = pages.jobs, pages.dependencies

    @bp.get("/workflows")
    def workflow_list() -> str | Response:
        if dependencies is None:
            return page("this dashboard was not given the dependencies table", 404)
        with pages.get_engine().connect() as conn:
            now = now_of(conn)
            found = list_workflows(conn, jobs, dependencies, limit=WORKFLOWS_SHOWN)
        return pages.render("workflows.html", workflows=found, now=now, shown=WORKFLOWS_SHOWN)

    @bp.get("/workflows/<job_id>")
    def workflow_detail(job_id: str) -> str | Response:
        wanted = parse_uuid(job_id)
        members: list[Any] = []
        if wanted is not None and dependencies is not None:
            with pages.get_engine().connect() as conn:
                now = now_of(conn)
                workflow_id, members = get_workflow(conn, jobs, dependencies, wanted)
        if not members:
            return page(f"no workflow with a job {job_id}", 404)
        return pages.render(
            "workflow.html",
            workflow_id=workflow_id,
            members=members,
            depth=workflow_depths(members),
            unfinished=any(m.status in _UNFINISHED for m in members),
            retriable=any(m.status in ("failed", "cancelled") for m in members),
            now=now,
        )

    def on_workflow(
        job_id: str, act: Callable[[Connection, JobQueue, uuid.UUID, list[Any]], object]
    ) -> BaseResponse:
        wanted = parse_uuid(job_id)
        if wanted is None or dependencies is None:
            return page(f"no workflow with a job {job_id}", 404)
        with pages.get_engine().begin() as conn:
            workflow_id, members = get_workflow(conn, jobs, dependencies, wanted)
            if not members:
                return page(f"no workflow with a job {job_id}", 404)
            act(conn, JobQueue(jobs, dependencies=dependencies), workflow_id, members)
        return redirect(pages.url("workflow_detail", job_id=str(workflow_id)))

    @bp.post("/workflows/<job_id>/cancel")
    def cancel_workflow(job_id: str) -> BaseResponse:
        def cancel(conn: Connection, queue: JobQueue, _: uuid.UUID, members: list[Any]) -> None:
            unfinished = [m.id for m in members if m.status in _UNFINISHED]
            if unfinished:
                queue.cancel(conn, unfinished)

        return on_workflow(job_id, cancel)

    @bp.post("/workflows/<job_id>/retry")
    def retry_workflow(job_id: str) -> BaseResponse:
        return on_workflow(
            job_id, lambda conn, queue, workflow_id, _: queue.retry_workflow(conn, workflow_id)
        )
