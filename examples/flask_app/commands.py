"""The ``flask`` commands of the example: the worker, the relay, and the commands that see and
steer the queue (``flask status``, ``flask queues``, ``flask jobs …``, ``flask outbox …``),
which are sa-outbox's own run on the app's engine and models."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import click
from flask import Flask

from sa_outbox import Relay, Worker
from sa_outbox.cli import run_admin
from sa_outbox.publishers.callable import CallablePublisher
from sa_outbox.queue import ClaimedEvent

from .models import Job, OutboxEvent, PausedQueue, db
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


#: sa-outbox's commands mounted under ``flask``, with what ``flask --help`` says of each.
ADMIN_COMMANDS = {
    "status": "The queue at a glance: counts, oldest ready job, failures, workers.",
    "queues": "Each queue's jobs by status and throughput; pause and resume one.",
    "jobs": "List, show and retry jobs (flask jobs list --status failed).",
    "outbox": "List, show and retry parked outbox events (flask outbox list --parked).",
}


def _add_admin_command(app: Flask, name: str, summary: str) -> None:
    @app.cli.command(
        name,
        help=f"{summary} See: flask {name} --help",
        short_help=summary,
        add_help_option=False,  # --help goes to sa-outbox's own parser, with its examples
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    @click.argument("argv", nargs=-1, type=click.UNPROCESSED)
    def admin_command(argv: tuple[str, ...]) -> None:
        code = run_admin(
            [name, *argv],
            engine=db.engine,
            jobs=Job,
            outbox=OutboxEvent,
            pauses=PausedQueue,
            prog="flask",
        )
        raise SystemExit(code)


def register(app: Flask) -> None:
    """Add the example's commands to ``app.cli``."""
    for name, summary in ADMIN_COMMANDS.items():
        _add_admin_command(app, name, summary)

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
            pauses=PausedQueue,
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
