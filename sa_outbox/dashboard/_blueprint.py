"""`dashboard_blueprint`: the pages and the actions of the dashboard, as a Flask blueprint."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any, cast

from flask import Blueprint, Response, make_response, redirect, render_template, request, url_for
from sqlalchemy import Connection, Engine
from werkzeug.wrappers import Response as BaseResponse

from .. import statements as st
from .._exceptions import InvalidArgument, InvalidArgumentType
from ..queue import (
    JobQueue,
    JobRow,
    get_event,
    get_job,
    get_job_steps,
    get_workflow,
    list_events,
    list_running_jobs,
    list_workflows,
    queue_status,
    retry_failed,
    retry_parked,
    throughput_by_minute,
    workflow_depths,
)
from ..schema import JobStatus
from ._chart import throughput_chart
from ._csrf import CSRF_COOKIE, CSRF_FIELD, csrf_ok, token_of
from ._units import register as register_units

__all__ = ["CSRF_COOKIE", "dashboard_blueprint"]

#: Jobs per page of the jobs list.
PAGE_SIZE = 50
#: Minutes the overview's throughput chart covers.
CHART_MINUTES = 30
#: Running jobs the overview lists (the soonest lease end first).
RUNNING_SHOWN = 50
#: Workflows the workflows page lists (the most recently active first).
WORKFLOWS_SHOWN = 50
_STATUSES = tuple(str(s) for s in JobStatus)


def _page(message: str, code: int) -> Response:
    response = make_response(render_template("sa_outbox_dashboard/error.html", message=message))
    response.status_code = code
    return response


def _now(conn: Connection) -> dt.datetime:
    """The database's time, which the pages' "… ago" count from (as the overview's do)."""
    now: Any = conn.execute(st.select_now()).scalar_one()
    return cast(dt.datetime, now)


def _cursor(value: str) -> tuple[dt.datetime, uuid.UUID] | None:
    """A jobs page's ``before``: ``updated_at`` (ISO 8601, with its offset) ``_`` ``id``."""
    at, _, job_id = value.rpartition("_")
    wanted = _uuid(job_id)
    try:
        moment = dt.datetime.fromisoformat(at)
    except ValueError:
        return None
    if wanted is None or moment.tzinfo is None:
        return None
    return moment, wanted


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def dashboard_blueprint(
    engine: Engine | Callable[[], Engine],
    *,
    jobs: object,
    outbox: object | None = None,
    steps: object | None = None,
    dependencies: object | None = None,
    read_only: bool = False,
    authorize: Callable[[], bool] | None = None,
    name: str = "sa_outbox_dashboard",
) -> Blueprint:
    """A Flask blueprint showing the job table (and the outbox, when given) and steering it.

    Given ``steps`` (the `JobStepMixin` model), a job's page lists its durable steps and
    its result; given ``dependencies`` (`JobDependencyMixin`), the workflows have pages of
    their own (each job, what it waits for, its state; cancel or retry the whole), and the
    overview counts the jobs waiting for others and the workflows by state.

    ``engine`` is an `Engine` or a callable returning one (``lambda: db.engine`` with
    Flask-SQLAlchemy, called in the request). ``read_only=True`` hides the buttons and
    refuses every POST with 403. ``authorize`` is required: it is called on every request and
    a false answer is a 403 (put your login check there; `allow_anyone` for a dashboard
    behind a gate of your own, `TokenGate` for a shared token). Every action is a POST with a CSRF
    token from a cookie of the dashboard's own: the host app needs no ``SECRET_KEY``.

    Examples:
        >>> from flask import Flask
        >>> from sqlalchemy import create_engine
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> app = Flask("shop")
        >>> app.register_blueprint(
        ...     dashboard_blueprint(create_engine("postgresql+psycopg://"), jobs=Job,
        ...                         authorize=lambda: True),  # your login check here
        ...     url_prefix="/admin/queue")
        >>> sorted(r.rule for r in app.url_map.iter_rules() if "retry" in r.rule)[0]
        '/admin/queue/jobs/<job_id>/retry'
    """
    if authorize is None:
        raise InvalidArgument(
            "dashboard_blueprint needs authorize=: a callable returning True when the current "
            "request may see the dashboard (your login check), or "
            "sa_outbox.dashboard.allow_anyone for a dashboard behind a gate of your own"
        )
    if not callable(authorize):
        raise InvalidArgumentType(f"authorize must be a callable, got {authorize!r}")
    bp = Blueprint(name, __name__, template_folder="templates")
    register_units(bp)  # the templates' sa_outbox_age, sa_outbox_moment, … filters
    get_engine: Callable[[], Engine] = engine if callable(engine) else (lambda: engine)

    @bp.before_request
    def _guard() -> Response | None:
        if not authorize():
            return _page("not authorised to see this dashboard", 403)
        if request.method == "POST":
            if read_only:
                return _page("this dashboard is read-only", 403)
            if not csrf_ok(request):
                return _page("the form's CSRF token is missing or wrong; reload the page", 403)
        return None

    @bp.after_request
    def _set_token(response: Response) -> Response:
        token, new = token_of(request)
        if new:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="Strict",
                secure=request.is_secure,
                path=url_for(f"{name}.overview"),
            )
        return response

    def render(template: str, **context: Any) -> str:
        return render_template(
            f"sa_outbox_dashboard/{template}",
            bp=name,
            csrf_field=CSRF_FIELD,
            csrf_token=token_of(request)[0],
            read_only=read_only,
            has_outbox=outbox is not None,
            has_workflows=dependencies is not None,
            **context,
        )

    @bp.get("/")
    def overview() -> str:
        with get_engine().connect() as conn:  # one transaction: one now() for every part
            status = queue_status(conn, jobs=jobs, outbox=outbox, dependencies=dependencies)
            minutes = throughput_by_minute(conn, jobs, minutes=CHART_MINUTES)
            running = list_running_jobs(conn, jobs, limit=RUNNING_SHOWN)
            parked = [] if outbox is None else list_events(conn, outbox, parked=True)
        return render(
            "overview.html",
            status=status,
            chart=throughput_chart(minutes),
            running=running,
            parked=parked,
            now=status.taken_at,
        )

    @bp.get("/jobs")
    def job_list() -> str | Response:
        status = request.args.get("status") or None
        kind = request.args.get("kind") or None
        queue = request.args.get("queue") or None
        if status is not None and status not in _STATUSES:
            return _page(f"unknown status {status!r}: one of {', '.join(_STATUSES)}", 400)
        raw_before = request.args.get("before") or None
        before = None if raw_before is None else _cursor(raw_before)
        if raw_before is not None and before is None:
            return _page(
                f"before must be a job's updated_at and id, as the older link gives them; "
                f"got {raw_before!r}",
                400,
            )
        stmt = st.select_jobs(
            jobs, statuses=status, kinds=kind, queues=queue, limit=PAGE_SIZE + 1, before=before
        )
        with get_engine().connect() as conn:
            now = _now(conn)
            found = [
                JobRow(**{**row._asdict(), "status": str(row.status)}) for row in conn.execute(stmt)
            ]
        shown = found[:PAGE_SIZE]
        filters = {"status": status or "", "kind": kind or "", "queue": queue or ""}
        skipped = request.args.get("skipped", "")
        older = None
        if len(found) > PAGE_SIZE and shown[-1].updated_at is not None:
            older = f"{shown[-1].updated_at.isoformat()}_{shown[-1].id}"
        return render(
            "jobs.html",
            jobs=shown,
            first=before is None,
            older=older,
            filters=filters,
            statuses=_STATUSES,
            skipped=int(skipped) if skipped.isascii() and skipped.isdigit() else 0,
            now=now,
        )

    @bp.get("/jobs/<job_id>")
    def job_detail(job_id: str) -> str | BaseResponse:
        wanted = _uuid(job_id)
        found = None
        job_steps = None
        workflow_id = None
        if wanted is not None:
            with get_engine().connect() as conn:
                now = _now(conn)
                found = get_job(conn, jobs, wanted)
                if found is not None and steps is not None:
                    job_steps = get_job_steps(conn, steps, wanted)
                if dependencies is not None:
                    workflow_id, members = get_workflow(conn, jobs, dependencies, wanted)
                    if found is None and members:  # waiting: its workflow's page shows it
                        return redirect(url_for(f"{name}.workflow_detail", job_id=job_id))
                    if len(members) < 2:
                        workflow_id = None
        if found is None:
            return _page(f"no job {job_id}", 404)
        return render("job.html", job=found, now=now, steps=job_steps, workflow_id=workflow_id)

    @bp.get("/workflows")
    def workflow_list() -> str | Response:
        if dependencies is None:
            return _page("this dashboard was not given the dependencies table", 404)
        with get_engine().connect() as conn:
            now = _now(conn)
            found = list_workflows(conn, jobs, dependencies, limit=WORKFLOWS_SHOWN)
        return render("workflows.html", workflows=found, now=now, shown=WORKFLOWS_SHOWN)

    @bp.get("/workflows/<job_id>")
    def workflow_detail(job_id: str) -> str | Response:
        wanted = _uuid(job_id)
        members: list[Any] = []
        if wanted is not None and dependencies is not None:
            with get_engine().connect() as conn:
                now = _now(conn)
                workflow_id, members = get_workflow(conn, jobs, dependencies, wanted)
        if not members:
            return _page(f"no workflow with a job {job_id}", 404)
        unfinished = any(m.status in ("waiting", "pending", "running") for m in members)
        retriable = any(m.status in ("failed", "cancelled") for m in members)
        return render(
            "workflow.html",
            workflow_id=workflow_id,
            members=members,
            depth=workflow_depths(members),
            unfinished=unfinished,
            retriable=retriable,
            now=now,
        )

    def on_workflow(
        job_id: str, act: Callable[[Connection, JobQueue, uuid.UUID], object]
    ) -> BaseResponse:
        wanted = _uuid(job_id)
        if wanted is None or dependencies is None:
            return _page(f"no workflow with a job {job_id}", 404)
        with get_engine().begin() as conn:
            workflow_id, members = get_workflow(conn, jobs, dependencies, wanted)
            if not members:
                return _page(f"no workflow with a job {job_id}", 404)
            act(conn, JobQueue(jobs, dependencies=dependencies), workflow_id)
        return redirect(url_for(f"{name}.workflow_detail", job_id=str(workflow_id)))

    @bp.post("/workflows/<job_id>/cancel")
    def cancel_workflow(job_id: str) -> BaseResponse:
        def cancel(conn: Connection, queue: JobQueue, workflow_id: uuid.UUID) -> None:
            _, members = get_workflow(conn, jobs, dependencies, workflow_id)
            unfinished = [m.id for m in members if m.status in ("waiting", "pending", "running")]
            if unfinished:
                queue.cancel(conn, unfinished)

        return on_workflow(job_id, cancel)

    @bp.post("/workflows/<job_id>/retry")
    def retry_workflow(job_id: str) -> BaseResponse:
        return on_workflow(
            job_id, lambda conn, queue, workflow_id: queue.retry_workflow(conn, workflow_id)
        )

    def retry_one(
        raw_id: str,
        noun: str,
        retry: Callable[[Connection, uuid.UUID], object],
        then: Callable[[uuid.UUID], str],
    ) -> BaseResponse:
        """Retry the job or event ``raw_id`` (all or nothing), then go to ``then(id)``; an
        unknown id is a 404 page, one that cannot be retried (not failed, not parked) a 409."""
        wanted = _uuid(raw_id)
        if wanted is None:
            return _page(f"no {noun} {raw_id}", 404)
        try:
            with get_engine().begin() as conn:
                retry(conn, wanted)
        except InvalidArgument as exc:  # the library says "no job …" / "no event …" if unknown
            return _page(str(exc), 404 if str(exc).startswith(f"no {noun} ") else 409)
        return redirect(then(wanted))

    def retry_failed_job(conn: Connection, wanted: uuid.UUID) -> None:
        retried = retry_failed(conn, jobs, ids=[wanted])
        if wanted in retried.skipped:  # a 409 page: the job stays failed
            raise InvalidArgument(
                f"job {wanted} was not retried: job {retried.skipped[wanted]} holds its "
                "unique key (a unique job, see docs/unique.md)"
            )

    @bp.post("/jobs/<job_id>/retry")
    def retry_job(job_id: str) -> BaseResponse:
        return retry_one(
            job_id,
            "job",
            retry_failed_job,
            lambda wanted: url_for(f"{name}.job_detail", job_id=str(wanted)),
        )

    @bp.post("/jobs/retry-failed")
    def retry_all_failed() -> BaseResponse:
        kind = request.form.get("kind") or None
        with get_engine().begin() as conn:
            retried = retry_failed(conn, jobs, kinds=kind)
        # The failed list then says how many unique jobs stayed failed (their key is held).
        shown: dict[str, Any] = {"status": "failed"}
        if retried.skipped:
            shown["skipped"] = len(retried.skipped)
        return redirect(url_for(f"{name}.job_list", **shown))

    @bp.post("/jobs/<job_id>/cancel")
    def cancel_job(job_id: str) -> BaseResponse:
        wanted = _uuid(job_id)
        if wanted is None:
            return _page(f"no job {job_id}", 404)
        with get_engine().begin() as conn:
            result = JobQueue(jobs).cancel(conn, [wanted])
        if result.unknown:
            return _page(f"no job {job_id}", 404)
        return redirect(url_for(f"{name}.job_detail", job_id=str(wanted)))

    @bp.get("/outbox/<event_id>")
    def event_detail(event_id: str) -> str | Response:
        wanted = _uuid(event_id)
        found = None
        if wanted is not None and outbox is not None:
            with get_engine().connect() as conn:
                now = _now(conn)
                found = get_event(conn, outbox, wanted)
        if found is None:
            return _page(f"no outbox event {event_id}", 404)
        return render("event.html", event=found, now=now)

    @bp.post("/outbox/<event_id>/retry")
    def retry_event(event_id: str) -> BaseResponse:
        if outbox is None:
            return _page(f"no outbox event {event_id}", 404)
        return retry_one(
            event_id,
            "event",
            lambda conn, wanted: retry_parked(conn, outbox, ids=[wanted]),
            lambda _: url_for(f"{name}.overview"),
        )

    return bp
