"""The ``flask`` commands of the example: the worker and the relay."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import click
from flask import Flask

from sa_outbox import ClaimedEvent, Relay, Worker
from sa_outbox.publishers.callable import CallablePublisher

from .models import OutboxEvent, db
from .tasks import make_job_app


def _print_message(event: ClaimedEvent) -> None:
    """The stand-in broker: one JSON line per message, with the id consumers de-dup on."""
    message = {"message_id": event.message_id, "type": event.event_type, "body": event.payload}
    click.echo(json.dumps(message))


def _publisher() -> Any:
    url = os.environ.get("AMQP_URL")
    if url:  # e.g. amqp://guest:guest@127.0.0.1:5672/ (pip install "sa-outbox[rabbitmq]")
        from sa_outbox.publishers.rabbitmq import RabbitMQPublisher

        # The default exchange routes to the queue named by the routing key: declare that
        # durable queue first (an unroutable message is refused and retried, never lost).
        queue = os.environ.get("AMQP_QUEUE", "shop-events")
        return RabbitMQPublisher(url, exchange="", routing_key=queue)
    return CallablePublisher(_print_message)


def register(app: Flask) -> None:
    """Add the example's commands to ``app.cli``."""

    @app.cli.command("worker")
    @click.option("--concurrency", default=8, show_default=True, help="Jobs run at once.")
    @click.option("--drain", is_flag=True, help="Work until no job is ready, then exit.")
    def worker_command(concurrency: int, drain: bool) -> None:
        """Run the job worker (SIGTERM or Ctrl-C stops it gracefully)."""
        engine = db.engine
        worker = Worker(
            make_job_app(engine),
            engine,
            queues=["emails", "default"],
            concurrency=concurrency,
            listen=not drain,
            install_signal_handlers=not drain,
        )
        if drain:
            with worker:
                click.echo(f"worked {worker.drain()} job(s)")
        else:
            worker.run()

    @app.cli.command("relay")
    @click.option("--once", is_flag=True, help="Publish what is there, then exit.")
    def relay_command(once: bool) -> None:
        """Publish the outbox: to RabbitMQ when $AMQP_URL is set, else as JSON lines."""
        relay = Relay(db.engine, OutboxEvent, _publisher())
        try:
            if once:
                published = 0
                while (report := relay.run_once()).claimed:
                    published += report.published
                click.echo(f"published {published} event(s)")
            else:
                signal.signal(signal.SIGTERM, lambda *_: relay.stop())
                try:
                    relay.run()
                except KeyboardInterrupt:
                    relay.stop()
        finally:
            relay.close()
