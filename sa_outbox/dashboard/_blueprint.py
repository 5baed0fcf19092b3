"""`dashboard_blueprint`: the dashboard as a Flask blueprint — its guard (authorisation,
read-only, CSRF) and the page modules it registers."""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, Response, request, url_for
from sqlalchemy import Engine

from .._exceptions import InvalidArgument, InvalidArgumentType
from . import _job_list, _job_page, _outbox_pages, _overview_page, _workflow_pages
from ._csrf import CSRF_COOKIE, csrf_ok, token_of
from ._pages import Pages, page
from ._units import register as register_units

__all__ = ["CSRF_COOKIE", "PAGE_MODULES", "dashboard_blueprint"]

#: The page modules, each adding its routes with ``register(bp, pages)``.
PAGE_MODULES = (_overview_page, _job_list, _job_page, _workflow_pages, _outbox_pages)


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
    bp = Blueprint(name, __name__, template_folder="templates", static_folder="static")
    register_units(bp)  # the templates' sa_outbox_age, sa_outbox_moment, … filters
    pages = Pages(
        name=name,
        get_engine=engine if callable(engine) else (lambda: engine),
        jobs=jobs,
        outbox=outbox,
        steps=steps,
        dependencies=dependencies,
        read_only=read_only,
    )

    @bp.before_request
    def _guard() -> Response | None:
        if not authorize():
            return page("not authorised to see this dashboard", 403)
        if request.method == "POST":
            if read_only:
                return page("this dashboard is read-only", 403)
            if not csrf_ok(request):
                return page("the form's CSRF token is missing or wrong; reload the page", 403)
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
                path=url_for(pages.endpoint("overview")),
            )
        return response

    for module in PAGE_MODULES:
        module.register(bp, pages)
    return bp
