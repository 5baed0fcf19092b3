"""Alembic environment of the example shop: the app's metadata, sa-outbox's operations."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

import alembic_ext  # noqa: F401  (sa-outbox's operations and autogenerate support)
from examples.flask_app.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:  # the app passes its own connection (upgrade_database)
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(os.environ["DATABASE_URL"])
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=os.environ.get("DATABASE_URL", "postgresql+psycopg://"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
