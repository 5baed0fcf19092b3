"""A TCP proxy in front of a test server that can stop forwarding without closing.

That is what a dropped network looks like from both ends: the sockets stay open, nothing
arrives, no error comes. ``blackhole()`` stops forwarding (and new connections hang after
their TCP handshake, as behind a firewall that drops packets); ``restore()`` resumes.

By default the bytes sent into the blackhole are held and delivered on ``restore()`` (TCP
retransmitting them once the network is back). ``blackhole(drop=True)`` reads and discards
them instead: what a connection the far end has forgotten looks like (a half-open
connection), whose client waits for answers to requests that never arrived. After a
dropping blackhole, ``restore()`` forwards again on every connection, new ones included,
but a connection that lost bytes is left desynchronised, as it would be.

It serves any TCP server: a database, a broker (``address`` is ``host:port`` for URLs).

Example:
    with BlackholeProxy(("127.0.0.1", 5432)) as proxy:
        url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
        proxy.blackhole()
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from types import TracebackType


class BlackholeProxy:
    def __init__(self, target: tuple[str, int] | str, port: int = 0) -> None:
        if isinstance(target, str):
            host, _, target_port = target.rpartition(":")
            target = (host, int(target_port))
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._dropping = False
        self._closed = threading.Event()
        #: Set once the blackhole holds bytes, either way: a statement a client sent, or
        #: the answer to one it sent just before (its request passed, its answer is held).
        #: Either way that client now waits for an answer that does not come.
        self.holding = threading.Event()
        #: How many bytes a dropping blackhole discarded, both ways, since it was built.
        self.dropped = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        """``host:port`` of the proxy, for a client's URL."""
        return f"127.0.0.1:{self.port}"

    def blackhole(self, *, drop: bool = False) -> None:
        """Stop forwarding; ``drop``: discard the bytes instead of holding them."""
        self.holding.clear()
        self._dropping = drop
        self._forwarding.clear()

    def restore(self) -> None:
        self._forwarding.set()

    def close(self) -> None:
        self._closed.set()
        self._forwarding.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def __enter__(self) -> BlackholeProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        self._forwarding.wait()  # a new connection behind the blackhole hangs here
        if self._closed.is_set():
            return
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets.append(server)
        peer = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            try:
                selector.register(client, selectors.EVENT_READ)
                selector.register(server, selectors.EVENT_READ)
            except (OSError, ValueError):  # `close` closed them meanwhile: nothing to pipe
                client.close()
                server.close()
                return
            while not self._closed.is_set():
                ready = selector.select(timeout=0.05)
                forwarding = self._forwarding.is_set()
                if not forwarding and not self._dropping:
                    if ready:  # nothing is read: these bytes stay where they are
                        self.holding.set()
                    time.sleep(0.01)  # hold the bytes: nothing goes through, nothing closes
                    continue
                for key, _ in ready:
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                        if data:
                            if forwarding:
                                peer[source].sendall(data)
                            else:  # dropped: read, so the sender's socket never blocks
                                self.holding.set()
                                self.dropped += len(data)
                            continue
                    except OSError:
                        pass
                    client.close()
                    server.close()
                    return
