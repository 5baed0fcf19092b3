"""`asgi_dashboard`: the dashboard for FastAPI, Starlette or any ASGI app."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask
from sqlalchemy import Engine

from .._exceptions import SaOutboxError
from ._blueprint import dashboard_blueprint

__all__ = ["asgi_dashboard"]


def asgi_dashboard(
    engine: Engine | Callable[[], Engine],
    *,
    jobs: object,
    outbox: object | None = None,
    steps: object | None = None,
    dependencies: object | None = None,
    read_only: bool = False,
    authorize: Callable[[], bool] | None = None,
) -> Any:
    """The dashboard as an ASGI app, to mount in FastAPI or Starlette under any prefix.

    The same pages and actions as `dashboard_blueprint` (its arguments, ``authorize``
    required), served by Flask behind ``a2wsgi``'s bridge (in the ``dashboard`` extra): each
    request runs in a thread of its pool, with the sync ``engine``. ``authorize`` is called
    in the request, where ``flask.request`` is the incoming one (its headers and cookies);
    or guard the mount with your own middleware and pass `allow_anyone`.

    Examples:
        api = FastAPI()
        api.mount(
            "/admin/queue",
            asgi_dashboard(engine, jobs=Job, authorize=lambda: is_admin(flask.request)),
        )
    """
    try:
        from a2wsgi import WSGIMiddleware
    except ImportError as exc:  # an install without the extra
        raise DashboardUnavailable(
            f'the ASGI dashboard needs a2wsgi ({exc}): pip install "sa-outbox[dashboard]"'
        ) from None
    app = Flask("sa_outbox.dashboard")
    app.register_blueprint(
        dashboard_blueprint(
            engine,
            jobs=jobs,
            outbox=outbox,
            steps=steps,
            dependencies=dependencies,
            read_only=read_only,
            authorize=authorize,
        )
    )
    return WSGIMiddleware(app)  # type: ignore[arg-type]


class DashboardUnavailable(SaOutboxError, ImportError):
    """The dashboard's optional dependencies are missing (the ``dashboard`` extra).

    Examples:
        >>> issubclass(DashboardUnavailable, ImportError)
        True
    """
