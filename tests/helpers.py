"""Small helpers the tests share: reading rows back the way an operator would."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, select

from .conftest import Job, OutboxEvent


def job_row(engine: Engine, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(Job.__table__).where(Job.__table__.c.id == job_id)).one()


def jobs_by_status(engine: Engine) -> dict[str, int]:
    t = Job.__table__
    from sqlalchemy import func

    with engine.connect() as conn:
        rows = conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all()
    return {str(status): n for status, n in rows}


def event_rows(engine: Engine) -> list[Any]:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        return list(conn.execute(select(t).order_by(t.c.seq)).all())
