"""Layer 5, integrations: a small server-rendered web dashboard for the job queue and the
outbox (Flask).

May import: ``sa_outbox.queue`` (`queue_status`, the listings, the retries by hand),
``sa_outbox.statements`` and everything below; not the CLI, which imports it.

Needs the ``dashboard`` extra (``pip install "sa-outbox[dashboard]"``); the rest of the
library imports without Flask. Mount `dashboard_blueprint` in a Flask app of your own, or
run `create_app` alone (``sa-outbox dashboard --port 8080``). docs/dashboard.md says how.

Examples:
    app.register_blueprint(
        dashboard_blueprint(lambda: db.engine, jobs=Job, outbox=OutboxEvent),
        url_prefix="/admin/queue",
    )
"""

from ._app import create_app
from ._blueprint import CSRF_COOKIE, dashboard_blueprint

__all__ = ["CSRF_COOKIE", "create_app", "dashboard_blueprint"]
