"""The application factory: configuration, hooks, migrations at start-up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from flask import Flask

import sa_outbox

from .models import Job, db
from .views import bp

HERE = Path(__file__).parent


def create_app(database_url: str | None = None, *, migrate: bool = True) -> Flask:
    """Build the app on ``database_url``, ``$DATABASE_URL``, or an embedded PostgreSQL.

    With ``migrate`` (the default) the database is brought to the latest migration first.
    """
    url = database_url or os.environ.get("DATABASE_URL") or sa_outbox.embedded_database_url()
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = url
    db.init_app(app)
    # One line: domain events added to db.session become outbox rows at flush, and
    # sa_outbox.enqueue(db.session, ...) knows the job model.
    sa_outbox.install(db, job_model=Job)
    app.register_blueprint(bp)
    from .commands import register

    register(app)
    if migrate:
        with app.app_context():
            upgrade_database()
    return app


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
