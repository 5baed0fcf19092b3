"""A pool of daemon threads for handlers.

Daemon threads, unlike `concurrent.futures`' (which the interpreter joins at exit): a handler
that ignores its cancel token past the grace period, whose job was already released, must
not keep the process from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class DaemonPool:
    """``size`` daemon threads running the callables given to `submit`, in order.

    Examples:
        >>> import threading
        >>> done = threading.Event()
        >>> pool = DaemonPool(2, "example")
        >>> pool.submit(done.set)
        >>> done.wait(5)
        True
        >>> pool.close()
    """

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, task: Callable[[], object]) -> None:
        """Run ``task`` on the next free thread (it must catch its own exceptions)."""
        self._queue.put(task)

    def _work(self) -> None:
        while (task := self._queue.get()) is not None:
            task()

    def close(self) -> None:
        """Let each thread end after the tasks already submitted; does not wait."""
        for _ in self._threads:
            self._queue.put(None)
