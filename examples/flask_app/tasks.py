"""The shop's job handlers: what ``flask --app examples.flask_app worker`` runs."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert

from sa_outbox import InvalidPayload, JobApp, JobContext

from .models import Job, Order, SentEmail


def make_job_app(engine: Engine) -> JobApp:
    """The handlers, by kind, on the shop's engine."""
    app = JobApp(Job)

    @app.handler("send-confirmation", timeout=30)
    def send_confirmation(job: JobContext) -> None:
        order_id = job.payload.get("order_id")
        if not isinstance(order_id, int):
            raise InvalidPayload(f"send-confirmation needs an int order_id, got {order_id!r}")
        with engine.begin() as conn:
            email = conn.scalar(
                Order.__table__.select().with_only_columns(Order.email).where(Order.id == order_id)
            )
            if email is None:
                raise InvalidPayload(f"order {order_id} does not exist")
            # The "provider" call, made idempotent by its key (a job may run twice).
            conn.execute(
                insert(SentEmail.__table__)
                .values(order_id=order_id, email=email)
                .on_conflict_do_nothing(index_elements=["order_id"])
            )

    return app
