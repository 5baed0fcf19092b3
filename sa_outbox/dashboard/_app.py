"""`create_app`: the dashboard alone, as ``sa-outbox dashboard`` serves it."""

from __future__ import annotations

from flask import Flask
from sqlalchemy import Engine

from ._blueprint import dashboard_blueprint


def create_app(
    engine: Engine,
    *,
    jobs: object,
    outbox: object | None = None,
    read_only: bool = False,
) -> Flask:
    """A Flask app serving only the dashboard, at ``/``.

    Examples:
        >>> from sqlalchemy import create_engine
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> app = create_app(create_engine("postgresql+psycopg://"), jobs=Job, read_only=True)
        >>> app.name
        'sa_outbox.dashboard'
    """
    app = Flask("sa_outbox.dashboard")
    app.register_blueprint(
        dashboard_blueprint(engine, jobs=jobs, outbox=outbox, read_only=read_only)
    )
    return app
