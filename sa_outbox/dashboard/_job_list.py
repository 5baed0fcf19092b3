"""The jobs list (filtered, keyset-paginated) and the actions on many jobs at once."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from flask import Blueprint, Response, redirect, request
from werkzeug.wrappers import Response as BaseResponse

from .. import statements as st
from ..queue import JobRow, retry_failed
from ..schema import JobStatus
from ._pages import Pages, now_of, page, parse_uuid

__all__ = ["PAGE_SIZE", "register"]

#: Jobs per page of the jobs list.
PAGE_SIZE = 50
_STATUSES = tuple(str(s) for s in JobStatus)


def _cursor(value: str) -> tuple[dt.datetime, uuid.UUID] | None:
    """A jobs page's ``before``: ``updated_at`` (ISO 8601, with its offset) ``_`` ``id``."""
    at, _, job_id = value.rpartition("_")
    wanted = parse_uuid(job_id)
    try:
        moment = dt.datetime.fromisoformat(at)
    except ValueError:
        return None
    if wanted is None or moment.tzinfo is None:
        return None
    return moment, wanted


def register(bp: Blueprint, pages: Pages) -> None:
    """Adds ``/jobs`` and ``/jobs/retry-failed`` to ``bp``."""

    @bp.get("/jobs")
    def job_list() -> str | Response:
        status = request.args.get("status") or None
        kind = request.args.get("kind") or None
        queue = request.args.get("queue") or None
        if status is not None and status not in _STATUSES:
            return page(f"unknown status {status!r}: one of {', '.join(_STATUSES)}", 400)
        raw_before = request.args.get("before") or None
        before = None if raw_before is None else _cursor(raw_before)
        if raw_before is not None and before is None:
            return page(
                f"before must be a job's updated_at and id, as the older link gives them; "
                f"got {raw_before!r}",
                400,
            )
        stmt = st.select_jobs(
            pages.jobs,
            statuses=status,
            kinds=kind,
            queues=queue,
            limit=PAGE_SIZE + 1,
            before=before,
        )
        with pages.get_engine().connect() as conn:
            now = now_of(conn)
            found = [
                JobRow(**{**row._asdict(), "status": str(row.status)}) for row in conn.execute(stmt)
            ]
        shown = found[:PAGE_SIZE]
        filters = {"status": status or "", "kind": kind or "", "queue": queue or ""}
        skipped = request.args.get("skipped", "")
        older = None
        if len(found) > PAGE_SIZE and shown[-1].updated_at is not None:
            older = f"{shown[-1].updated_at.isoformat()}_{shown[-1].id}"
        return pages.render(
            "jobs.html",
            jobs=shown,
            first=before is None,
            older=older,
            filters=filters,
            statuses=_STATUSES,
            skipped=int(skipped) if skipped.isascii() and skipped.isdigit() else 0,
            now=now,
        )

    @bp.post("/jobs/retry-failed")
    def retry_all_failed() -> BaseResponse:
        kind = request.form.get("kind") or None
        with pages.get_engine().begin() as conn:
            retried = retry_failed(conn, pages.jobs, kinds=kind)
        # The failed list then says how many unique jobs stayed failed (their key is held).
        shown: dict[str, Any] = {"status": "failed"}
        if retried.skipped:
            shown["skipped"] = len(retried.skipped)
        return redirect(pages.url("job_list", **shown))
