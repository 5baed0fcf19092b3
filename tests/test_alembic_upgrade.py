"""Upgrading an install made before the ``cancelled`` state (``op.add_job_status_values``)
or before unique jobs (autogenerate: two columns and an index).

The database is made by the library's operations through a real Alembic project, then made
as the previous release had it: its ``job_status`` type recreated (four labels, the
table's column and partial indexes on it), or the unique jobs' columns dropped. The
migration docs/alembic.md shows is run as written, then a job is enqueued and cancelled,
or enqueued as a unique job twice, on the upgraded table.
"""

from __future__ import annotations

import ast
import io
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import Script
from sqlalchemy import Engine, text
from sqlalchemy.orm import DeclarativeBase

import alembic_ext  # noqa: F401  (registers the operations)
from sa_outbox import JobMixin, JobQueue, JobStatus, Unique

from .test_alembic import (  # the Alembic project and database helpers those tests use
    LABELS,
    Project,
    Schemas,
    enum_labels,
    expected_indexes,
    indexes,
    make_project,
    offline,
    pg,
    schemas,
    snippet,
    statements,
)

__all__ = ["make_project", "pg", "schemas"]  # fixtures, imported for pytest

PREVIOUS_LABELS = ["pending", "running", "succeeded", "failed"]


def make_previous_release(pg: Engine, schema: str) -> None:
    """Recreate ``job_status`` without ``cancelled``, as the previous release's
    ``create_job_queue`` made it: the column, its default and its indexes on the old type."""
    with pg.begin() as conn:
        defs = conn.execute(
            text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s "
                "AND tablename = 'jobs' AND indexdef LIKE '%status%'"
            ),
            {"s": schema},
        ).all()
        for name, _ in defs:
            conn.execute(text(f"DROP INDEX {schema}.{name}"))
        labels = ", ".join(f"'{label}'" for label in PREVIOUS_LABELS)
        conn.execute(
            text(
                f"ALTER TABLE {schema}.jobs ALTER COLUMN status DROP DEFAULT;"
                f"ALTER TYPE {schema}.job_status RENAME TO job_status_current;"
                f"CREATE TYPE {schema}.job_status AS ENUM ({labels});"
                f"ALTER TABLE {schema}.jobs ALTER COLUMN status TYPE {schema}.job_status"
                f" USING status::text::{schema}.job_status;"
                f"ALTER TABLE {schema}.jobs ALTER COLUMN status SET DEFAULT 'pending';"
                # The column of unique jobs came later; here it follows the type.
                f"ALTER TABLE {schema}.jobs ALTER COLUMN unique_states"
                f" TYPE {schema}.job_status[] USING unique_states::text[]::{schema}.job_status[];"
                f"DROP TYPE {schema}.job_status_current"
            )
        )
        for _, definition in defs:
            conn.execute(text(definition))


def hand_written_revision(project: Project, message: str, body: str) -> Path:
    script = command.revision(project.config, message=message)
    assert isinstance(script, Script)
    path = Path(script.path)
    source = path.read_text()
    start = source.index("def upgrade() -> None:")
    end = source.index("def downgrade() -> None:")
    upgrade = f"def upgrade() -> None:\n{textwrap.indent(body, '    ')}\n\n"
    path.write_text(f"{source[:start]}{upgrade}{source[end:]}")
    return path


def test_an_install_without_cancelled_gets_it_from_the_documented_migration(
    make_project: Callable[..., Project], pg: Engine, schemas: Schemas
) -> None:
    home = schemas.home
    project = make_project(snippet("models"))
    project.autogenerate("job queue and outbox")
    project.upgrade()
    make_previous_release(pg, home)
    assert enum_labels(pg, home) == PREVIOUS_LABELS
    assert indexes(pg, home) == expected_indexes(home)  # faithful: the same indexes

    body = snippet("job-status-upgrade")
    path = hand_written_revision(project, "job states", body)
    assert statements(path, "upgrade") == ["op.add_job_status_values('jobs')"]
    project.upgrade()
    assert enum_labels(pg, home) == LABELS
    assert indexes(pg, home) == expected_indexes(home)
    project.upgrade()  # already at head; and the op itself runs again without effect
    with pg.connect() as conn:  # the operation again, on its own: nothing to add
        Operations(MigrationContext.configure(conn)).add_job_status_values("jobs", schema=home)
    assert enum_labels(pg, home) == LABELS

    class Base(DeclarativeBase):
        pass

    class Job(JobMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = home

    queue = JobQueue(Job)
    with pg.begin() as conn:
        first = queue.enqueue(conn, "send", {}).id
        second = queue.enqueue(conn, "send", {}).id
    with pg.begin() as conn:
        [running] = queue.claim(conn, worker_id="w", batch=1)
        waiting = second if running.id == first else first
        result = queue.cancel(conn, [first, second, uuid.uuid4()])
    assert (result.cancelled, result.cancelling) == ([waiting], [running.id])
    with pg.connect() as conn:
        assert queue.counts(conn)[JobStatus.CANCELLED] == 2
    assert statements(project.autogenerate("nothing to do"), "upgrade") == ["pass"]


def test_offline_sql_adds_the_values_outside_the_transaction() -> None:
    buffer = io.StringIO()
    operations = offline(buffer)
    operations.add_job_status_values("jobs", schema="work")
    sql = buffer.getvalue()
    expected = snippet("job-status-upgrade-sql").replace(
        "ALTER TYPE job_status", "ALTER TYPE work.job_status"
    )
    assert [line for line in sql.splitlines() if line] == [
        line for line in expected.splitlines() if line
    ]
    assert sql.index("COMMIT;") < sql.index("'cancelled'") < sql.index("BEGIN;")


@pytest.mark.parametrize("migration", ["as rendered", "as the docs write it, to run on either"])
def test_an_install_without_unique_jobs_gets_them_from_autogenerate(
    make_project: Callable[..., Project], pg: Engine, schemas: Schemas, migration: str
) -> None:
    home = schemas.home
    project = make_project(snippet("models"))
    project.autogenerate("job queue and outbox")
    project.upgrade()
    with pg.begin() as conn:  # what the earlier release's create_job_queue made
        conn.execute(
            text(f"ALTER TABLE {home}.jobs DROP COLUMN unique_key, DROP COLUMN unique_states")
        )
    before = expected_indexes(home)
    del before["jobs_unique_idx"]
    assert indexes(pg, home) == before

    fix = project.autogenerate("unique jobs")
    rendered = ast.parse(snippet("unique-jobs-rendered")).body[0]
    assert isinstance(rendered, ast.FunctionDef)

    def same(lines: list[str]) -> list[str]:  # SQLAlchemy 2.0 leaves create_type out
        return [line.replace(", create_type=False", "") for line in lines]

    upgrade = statements(fix, "upgrade")
    assert same(upgrade) == same([ast.unparse(statement) for statement in rendered.body])
    if migration != "as rendered":
        source = fix.read_text()
        body = textwrap.indent(snippet("unique-jobs-upgrade"), "    ")
        start = source.index("def upgrade() -> None:")
        end = source.index("def downgrade() -> None:")
        fix.write_text(f"{source[:start]}def upgrade() -> None:\n{body}\n\n{source[end:]}")
    project.upgrade()
    assert indexes(pg, home) == expected_indexes(home)
    assert statements(project.autogenerate("nothing to do"), "upgrade") == ["pass"]

    class Base(DeclarativeBase):
        pass

    class Job(JobMixin, Base):
        __tablename__ = "jobs"
        __table_schema__ = home

    queue = JobQueue(Job)
    with pg.begin() as conn:
        assert queue.enqueue(conn, "sync", {"id": 1}, unique=Unique()).inserted
        assert not queue.enqueue(conn, "sync", {"id": 1}, unique=Unique()).inserted
    with pg.connect() as conn:
        assert queue.counts(conn)[JobStatus.PENDING] == 1
    if migration != "as rendered":  # the documented form runs again on the migrated table
        with pg.begin() as conn:
            conn.execute(text(f"SET LOCAL search_path TO {home}"))
            exec(
                snippet("unique-jobs-upgrade"), {"op": Operations(MigrationContext.configure(conn))}
            )
        assert indexes(pg, home) == expected_indexes(home)
