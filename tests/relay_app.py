"""A relay for ``sa-outbox relay tests.relay_app:relay``, run as a real process by the tests.

It reads its settings from the environment the test gives the process:
``SA_OUTBOX_TEST_DATABASE_URL``, ``RELAY_APP_SCHEMA`` (the test schema of the outbox table),
``RELAY_APP_STREAM`` (the Redis stream it publishes to), ``RELAY_APP_NAME``,
``RELAY_APP_LEASE`` (seconds, default 600), and
``RELAY_APP_HANG_AFTER_PUBLISH`` — when set, the publisher writes ``published <ids>`` to
stdout once Redis took a batch, then hangs, so the test can SIGKILL the process between the
publish and the mark.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase

from sa_outbox import OutboxMixin
from sa_outbox.publishers.redis import RedisStreamsPublisher
from sa_outbox.queue import ClaimedEvent
from sa_outbox.relay import Relay

from .brokers import REDIS


class TaggedRedisPublisher(RedisStreamsPublisher):
    """Adds which relay published each entry, and can hang after publishing."""

    def fields(self, event: ClaimedEvent) -> dict[str, str]:
        return {**super().fields(event), "relay": os.environ.get("RELAY_APP_NAME", "")}

    async def publish(self, events: Sequence[ClaimedEvent]) -> None:
        await super().publish(events)
        if os.environ.get("RELAY_APP_HANG_AFTER_PUBLISH"):
            print("published", " ".join(str(e.id) for e in events), flush=True)
            sys.stdout.flush()
            await asyncio.Event().wait()  # never marks: the test kills the process here


def relay() -> Relay:
    """The relay, built when the command asks for it (the environment is read then)."""

    class Base(DeclarativeBase):
        pass

    class OutboxEvent(OutboxMixin, Base):
        __tablename__ = "outbox"
        __table_schema__ = os.environ["RELAY_APP_SCHEMA"]

    engine = create_engine(os.environ["SA_OUTBOX_TEST_DATABASE_URL"])
    return Relay(
        engine,
        OutboxEvent,
        TaggedRedisPublisher(f"redis://{REDIS}/0", stream=os.environ["RELAY_APP_STREAM"]),
        name=os.environ.get("RELAY_APP_NAME"),
        batch=100,
        lease=float(os.environ.get("RELAY_APP_LEASE", "600")),
        poll_interval=5,
    )
