"""A TCP proxy in front of the test server that can stop forwarding without closing.

That is what a dropped network looks like from both ends: the sockets stay open, nothing
arrives, no error comes. ``blackhole()`` stops forwarding (and new connections hang after
their TCP handshake, as behind a firewall that drops packets); ``restore()`` resumes.

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
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = threading.Event()
        #: Set once the blackhole holds bytes, either way: a statement a client sent, or
        #: the answer to one it sent just before (its request passed, its answer is held).
        #: Either way that client now waits for an answer that does not come.
        self.holding = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def blackhole(self) -> None:
        self.holding.clear()
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
            selector.register(client, selectors.EVENT_READ)
            selector.register(server, selectors.EVENT_READ)
            while not self._closed.is_set():
                ready = selector.select(timeout=0.05)
                if not self._forwarding.is_set():
                    if ready:  # nothing is read: these bytes stay where they are
                        self.holding.set()
                    time.sleep(0.01)  # hold the bytes: nothing goes through, nothing closes
                    continue
                for key, _ in ready:
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                        if data:
                            peer[source].sendall(data)
                            continue
                    except OSError:
                        pass
                    client.close()
                    server.close()
                    return
