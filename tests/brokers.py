"""The real brokers the relay tests publish to, and a TCP proxy that can make one fail.

Brokers are on loopback (RabbitMQ 5672 guest/guest, Redis 6379, NATS with JetStream 4222;
``.ci/run`` starts them). A test that needs an absent broker skips and says which one and
where. `TcpProxy` stands between a publisher and its broker: `TcpProxy.stop` closes the
listening socket and cuts every connection (the broker looks down: connections are
refused), `TcpProxy.start` listens again on the same port (the broker is back). Stopping
and starting the shared brokers themselves could not be undone reliably on every machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

RABBITMQ = os.environ.get("SA_OUTBOX_TEST_RABBITMQ", "127.0.0.1:5672")
REDIS = os.environ.get("SA_OUTBOX_TEST_REDIS", "127.0.0.1:6379")
NATS = os.environ.get("SA_OUTBOX_TEST_NATS", "127.0.0.1:4222")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def reachable(address: str) -> bool:
    try:
        with socket.create_connection(_split(address), timeout=2):
            return True
    except OSError:
        return False


def require(name: str, address: str, module: str) -> None:
    """Skip the calling test, saying why, unless the broker and its client are there."""
    pytest.importorskip(module, reason=f"the {name} client ({module}) is not installed")
    if not reachable(address):
        pytest.skip(
            f"{name} is not reachable at {address}"
            " (bash .ci/run starts it: start_brokers_for_relay_tests)"
        )


class TcpProxy:
    """A loopback TCP proxy to ``target``, on a port of its own, that can be cut and restored.

    It runs an event loop in a thread of its own, so sync and async tests can use it.
    """

    def __init__(self, target: str) -> None:
        self.target = _split(target)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    def start(self) -> TcpProxy:
        self._call(self._start())
        return self

    def stop(self) -> None:
        self._call(self._stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._serve, sock=sock)

    async def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # The open connections first: from Python 3.12 on, wait_closed() also waits for them.
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if self._server is None:  # stopped while this connection was being opened
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))


@contextlib.contextmanager
def proxy_to(target: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy(target).start()
    try:
        yield proxy
    finally:
        proxy.close()
