"""`create_app`: the dashboard alone, as ``sa-outbox dashboard`` serves it."""

from __future__ import annotations

from urllib.parse import urlencode

from flask import Flask, redirect, request
from sqlalchemy import Engine
from werkzeug.wrappers import Response

from ._auth import TOKEN_COOKIE, TokenGate
from ._blueprint import dashboard_blueprint


def create_app(
    engine: Engine,
    *,
    jobs: object,
    outbox: object | None = None,
    steps: object | None = None,
    dependencies: object | None = None,
    read_only: bool = False,
    token: str,
) -> Flask:
    """A Flask app serving only the dashboard, at ``/``, to requests that carry ``token``.

    ``steps`` and ``dependencies`` are `dashboard_blueprint`'s (a job's steps, the
    workflows' pages). A request is let in with ``Authorization: Bearer <token>``, or with
    the cookie a browser gets by opening any page once with ``?token=<token>`` (it is then
    sent to the same page without the token in its address). Anything else is a 403.

    Examples:
        >>> from sqlalchemy import create_engine
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> app = create_app(create_engine("postgresql+psycopg://"), jobs=Job, read_only=True,
        ...                  token="a-long-random-token")
        >>> app.name
        'sa_outbox.dashboard'
    """
    gate = TokenGate(token)
    app = Flask("sa_outbox.dashboard")

    @app.before_request
    def _log_in_from_the_address() -> Response | None:
        given = request.args.get("token")
        if given is None or not gate.accepts(given):
            return None  # the blueprint's gate answers 403 unless the request carries it
        rest = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
        response = redirect(request.path + ("?" + urlencode(rest) if rest else ""))
        response.set_cookie(
            TOKEN_COOKIE, given, httponly=True, samesite="Strict", secure=request.is_secure
        )
        return response

    app.register_blueprint(
        dashboard_blueprint(
            engine,
            jobs=jobs,
            outbox=outbox,
            steps=steps,
            dependencies=dependencies,
            read_only=read_only,
            authorize=gate,
        )
    )
    return app
