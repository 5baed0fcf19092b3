"""The application factory: configuration, hooks, migrations at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from flask import Flask, request

import sa_outbox
from sa_outbox.cli import given_database_url
from sa_outbox.dashboard import dashboard_blueprint

from .commands import register
from .models import Job, OutboxEvent, db
from .views import bp

HERE = Path(__file__).parent
#: Where the app keeps its embedded PostgreSQL when no database URL is given.
INSTANCE = HERE / "instance"


def create_app(
    database_url: str | None = None, *, migrate: bool = True, instance_path: str | None = None
) -> Flask:
    """Build the app on a database, and bring it to the latest migration (``migrate``).

    The database is ``database_url``, else ``$SA_OUTBOX_DATABASE_URL``, else
    ``$DATABASE_URL`` (the order every ``sa-outbox`` command follows), else an embedded
    PostgreSQL in ``instance_path/pgdata`` (default: ``examples/flask_app/instance``),
    shared by every ``flask`` process of the app: the web process and the worker in
    another terminal see the same rows. It stops when the last of them ends; its data
    stays there for the next run (delete the folder to start afresh).
    """
    app = Flask(__name__, instance_path=instance_path or str(INSTANCE))
    url = given_database_url(database_url) or sa_outbox.embedded_database_url(
        Path(app.instance_path) / "pgdata"
    )
    app.config["SQLALCHEMY_DATABASE_URI"] = url
    db.init_app(app)
    # One line: domain events added to db.session become outbox rows at flush, and
    # sa_outbox.enqueue(db.session, ...) knows the job model.
    sa_outbox.install(db, job_model=Job)
    app.register_blueprint(bp)
    # The queue's dashboard (docs/dashboard.md), for requests from this machine only; a real
    # app passes authorize= its own admin check.
    app.register_blueprint(
        dashboard_blueprint(lambda: db.engine, jobs=Job, outbox=OutboxEvent, authorize=local),
        url_prefix="/admin/queue",
    )
    register(app)
    if migrate:
        with app.app_context():
            upgrade_database()
    return app


def local() -> bool:
    """The shop's stand-in for an admin check: the dashboard answers this machine only."""
    return request.remote_addr in ("127.0.0.1", "::1")


def upgrade_database(revision: str = "head") -> None:
    """Run the shop's Alembic migrations on the app's database (inside an app context)."""
    config = Config(str(HERE / "alembic.ini"))
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def alembic_config(**attributes: Any) -> Config:
    """The example's Alembic configuration, for tests and tools."""
    config = Config(str(HERE / "alembic.ini"))
    config.attributes.update(attributes)
    return config
