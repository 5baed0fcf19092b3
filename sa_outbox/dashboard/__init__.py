"""A small server-rendered web dashboard for the job queue and the outbox (Flask).

Needs the ``dashboard`` extra (``pip install "sa-outbox[dashboard]"``); the rest of the
library imports without Flask. Mount `dashboard_blueprint` in a Flask app of your own,
`asgi_dashboard` in a FastAPI or Starlette one, or run `create_app` alone (``sa-outbox
dashboard --port 8080``, guarded by a token); mounting it requires an ``authorize``
callable, so nothing is open by default. docs/dashboard.md says how.

Examples:
    app.register_blueprint(
        dashboard_blueprint(lambda: db.engine, jobs=Job, outbox=OutboxEvent,
                            authorize=lambda: current_user.is_admin),
        url_prefix="/admin/queue",
    )
"""

from ._app import create_app
from ._asgi import DashboardUnavailable, asgi_dashboard
from ._auth import TOKEN_COOKIE, TokenGate, allow_anyone
from ._blueprint import CSRF_COOKIE, dashboard_blueprint
from ._serving import make_server

__all__ = [
    "CSRF_COOKIE",
    "TOKEN_COOKIE",
    "DashboardUnavailable",
    "TokenGate",
    "allow_anyone",
    "asgi_dashboard",
    "create_app",
    "dashboard_blueprint",
    "make_server",
]
