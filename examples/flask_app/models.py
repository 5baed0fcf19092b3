"""The shop's models: its own tables, and the job and outbox tables from sa-outbox."""

from __future__ import annotations

import datetime as dt

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import DateTime, ForeignKey, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sa_outbox import JobMixin, OutboxMixin, QueuePauseMixin


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    #: The client's idempotency key: placing the same order twice is refused.
    reference: Mapped[str] = mapped_column(unique=True)
    email: Mapped[str]
    total_cents: Mapped[int]
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class Job(JobMixin, db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "jobs"


class OutboxEvent(OutboxMixin, db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "outbox"


class PausedQueue(QueuePauseMixin, db.Model):  # type: ignore[name-defined,misc]
    """The queues paused by ``flask queues pause QUEUE``: the worker claims none of their jobs."""

    __tablename__ = "paused_queues"


class OrderPlaced(OutboxEvent):
    """Published to the outside world when an order commits."""

    order: Order
    email: str
    total_cents: int


class SentEmail(db.Model):  # type: ignore[name-defined,misc]
    """What the ``send-confirmation`` job did (the stand-in for an email provider)."""

    __tablename__ = "sent_emails"

    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), primary_key=True)
    email: Mapped[str]
    sent_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
