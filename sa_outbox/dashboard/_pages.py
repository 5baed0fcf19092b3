"""`Pages`: what every page module of the dashboard shares — its models, its engine, the
rendering with the CSRF token and the navigation's switches — and the small helpers they use.

Each page module (`_overview_page`, `_job_list`, `_job_page`, `_workflow_pages`,
`_outbox_pages`, …) has a ``register(bp, pages)`` that adds its routes to the blueprint
`dashboard_blueprint` builds.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from flask import Response, make_response, redirect, render_template, request, url_for
from sqlalchemy import Connection, Engine
from werkzeug.wrappers import Response as BaseResponse

from .. import statements as st
from .._exceptions import InvalidArgument
from ._csrf import CSRF_FIELD, token_of

__all__ = ["Pages", "now_of", "page", "parse_uuid"]


def page(message: str, code: int) -> Response:
    """The error page saying ``message``, with the HTTP status ``code``."""
    response = make_response(render_template("sa_outbox_dashboard/error.html", message=message))
    response.status_code = code
    return response


def now_of(conn: Connection) -> dt.datetime:
    """The database's time, which the pages' "… ago" count from (as the overview's do)."""
    now: Any = conn.execute(st.select_now()).scalar_one()
    return cast(dt.datetime, now)


def parse_uuid(value: str) -> uuid.UUID | None:
    """``value`` as a UUID, or None when it is not one.

    Examples:
        >>> parse_uuid("not-an-id") is None
        True
    """
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class Pages:
    """The dashboard's models and engine, and how its pages render (one per blueprint).

    Examples:
        >>> from sqlalchemy import create_engine
        >>> engine = create_engine("postgresql+psycopg://")
        >>> Pages("dash", lambda: engine, jobs=object()).endpoint("overview")
        'dash.overview'
    """

    name: str
    get_engine: Callable[[], Engine]
    jobs: object
    outbox: object | None = None
    steps: object | None = None
    dependencies: object | None = None
    read_only: bool = False

    def endpoint(self, view: str) -> str:
        """The blueprint's endpoint name of the view function ``view``."""
        return f"{self.name}.{view}"

    def url(self, view: str, **values: Any) -> str:
        """The URL of the page ``view`` (a view function's name) with ``values``."""
        return url_for(self.endpoint(view), **values)

    def render(self, template: str, **context: Any) -> str:
        """``template`` of the dashboard's folder, with what its base layout needs."""
        return render_template(
            f"sa_outbox_dashboard/{template}",
            bp=self.name,
            csrf_field=CSRF_FIELD,
            csrf_token=token_of(request)[0],
            read_only=self.read_only,
            has_outbox=self.outbox is not None,
            has_workflows=self.dependencies is not None,
            **context,
        )

    def retry_one(
        self,
        raw_id: str,
        noun: str,
        retry: Callable[[Connection, uuid.UUID], object],
        then: Callable[[uuid.UUID], str],
    ) -> BaseResponse:
        """Retry the job or event ``raw_id`` (all or nothing), then go to ``then(id)``; an
        unknown id is a 404 page, one that cannot be retried (not failed, not parked) a 409."""
        wanted = parse_uuid(raw_id)
        if wanted is None:
            return page(f"no {noun} {raw_id}", 404)
        try:
            with self.get_engine().begin() as conn:
                retry(conn, wanted)
        except InvalidArgument as exc:  # the library says "no job …" / "no event …" if unknown
            return page(str(exc), 404 if str(exc).startswith(f"no {noun} ") else 409)
        return redirect(then(wanted))
