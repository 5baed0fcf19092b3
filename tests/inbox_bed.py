"""The inbox tests' bed: a consumer's tables, its one-transaction handler, and a relay to kill.

The consumer's models live on a base of their own, in the session's test schema: an
`InboxMixin` table, and ``applied``, the table the consumer's work writes, one row per
application of an event. ``applied.message_id`` is deliberately not unique, so an event
applied twice shows as two rows instead of an error.

``sa-outbox relay tests.inbox_bed:relay`` builds a relay publishing the session's outbox
(``SA_OUTBOX_TEST_DATABASE_URL``, ``RELAY_APP_SCHEMA``) with the publisher
``INBOX_APP_BROKER`` names (``rabbitmq``, ``nats``, ``redis`` or ``webhook``) to
``INBOX_APP_TARGET`` (a routing key, a subject, a stream or a URL; ``INBOX_APP_SECRET``
signs webhooks). With ``RELAY_APP_HANG_AFTER_PUBLISH`` set it prints ``published <ids>``
once the broker took a batch, then hangs: the test SIGKILLs it between publish and mark.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, Text, func, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sa_outbox import Inbox, InboxMixin
from sa_outbox.consumers import ReceivedMessage
from sa_outbox.queue import ClaimedEvent

from .brokers import NATS, RABBITMQ, REDIS
from .conftest import TEST_SCHEMA

#: The name the consumer gives the producer (the shop's outbox): the inbox key's first half.
SOURCE = "shop"


class ConsumerBase(DeclarativeBase):
    pass


class InboxEntry(InboxMixin, ConsumerBase):
    __tablename__ = "inbox"
    __table_schema__ = TEST_SCHEMA


class Applied(ConsumerBase):
    """The consumer's own table: one row each time it applied an event."""

    __tablename__ = "applied"
    __table_args__ = {"schema": TEST_SCHEMA}  # noqa: RUF012 - SQLAlchemy's own convention

    id: Mapped[int] = mapped_column(primary_key=True)
    message_id: Mapped[str] = mapped_column(Text)  # not unique: a second apply is a second row
    amount: Mapped[int]


INBOX = InboxEntry.__table__
APPLIED = Applied.__table__


def create_consumer_tables(engine: Engine) -> None:
    ConsumerBase.metadata.create_all(engine)


def drop_consumer_tables(engine: Engine) -> None:
    ConsumerBase.metadata.drop_all(engine)


def truncate_consumer_tables(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {INBOX.fullname}, {APPLIED.fullname}"))


def handle(engine: Engine, inbox: Inbox, message: ReceivedMessage) -> bool:
    """The consumer: in ONE transaction, accept the message and, only if it is new, apply
    it. Returns what `accept` said."""
    with Session(engine) as session, session.begin():
        accepted = inbox.accept(session, message.message_id, source=SOURCE)
        if accepted:
            session.add(Applied(message_id=message.message_id, amount=message.payload["amount"]))
    return accepted


def applied_counts(engine: Engine) -> collections.Counter[str]:
    """How many times each message id was applied."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(APPLIED.c.message_id, func.count()).group_by(APPLIED.c.message_id)
        ).all()
    return collections.Counter({message_id: n for message_id, n in rows})


def inbox_keys(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(INBOX.c.source, INBOX.c.message_id).order_by(INBOX.c.message_id, INBOX.c.source)
        ).all()
    return [(source, message_id) for source, message_id in rows]


def amounts_total(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.coalesce(func.sum(APPLIED.c.amount), 0))).scalar())


class HangAfterPublish:
    """Publishes with ``inner``; with ``RELAY_APP_HANG_AFTER_PUBLISH`` set, then prints the
    ids and never returns, so the relay never marks them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        await self.inner.publish(events)
        if os.environ.get("RELAY_APP_HANG_AFTER_PUBLISH"):
            print("published", " ".join(str(e.id) for e in events), flush=True)
            sys.stdout.flush()
            await asyncio.Event().wait()  # the test kills the process here

    async def aclose(self) -> None:
        await self.inner.aclose()


def publisher(broker: str, target: str, secret: str | None = None) -> Any:
    """The library's publisher for ``broker``, to ``target``."""
    if broker == "rabbitmq":
        from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(f"amqp://guest:guest@{RABBITMQ}/", routing_key=target)
    if broker == "nats":
        from sa_outbox.publishers.nats import NatsPublisher

        return NatsPublisher(f"nats://{NATS}", subject=target)
    if broker == "redis":
        from sa_outbox.publishers.redis import RedisStreamsPublisher

        return RedisStreamsPublisher(f"redis://{REDIS}/0", stream=target)
    if broker == "webhook":
        from sa_outbox.publishers.webhook import WebhookPublisher

        return WebhookPublisher(target, secret=secret, timeout=30.0)
    raise ValueError(f"unknown broker {broker!r}")


def relay() -> object:
    """The relay of ``sa-outbox relay tests.inbox_bed:relay`` (see the module's docs)."""
    from sqlalchemy import create_engine

    from sa_outbox import OutboxMixin
    from sa_outbox.relay import Relay

    class Base(DeclarativeBase):
        pass

    class OutboxEvent(OutboxMixin, Base):
        __tablename__ = "outbox"
        __table_schema__ = os.environ["RELAY_APP_SCHEMA"]

    inner = publisher(
        os.environ["INBOX_APP_BROKER"],
        os.environ["INBOX_APP_TARGET"],
        os.environ.get("INBOX_APP_SECRET"),
    )
    return Relay(
        create_engine(os.environ["SA_OUTBOX_TEST_DATABASE_URL"]),
        OutboxEvent,
        HangAfterPublish(inner),
        batch=100,
        lease=600,
        poll_interval=5,
    )
