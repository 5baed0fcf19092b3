"""SIGTERM and SIGINT handed to a stop function, and the previous handlers put back after.

`Worker`, `Reclaimer` and `Supervisor` each stop on either signal when they run in the main
thread (Python delivers signals there only; elsewhere nothing is installed).

Examples:
    >>> import signal
    >>> restore = install_stop_signals(lambda signum: None)
    >>> signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    True
    >>> restore()
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

__all__ = ["install_stop_signals"]


def install_stop_signals(on_signal: Callable[[int], None]) -> Callable[[], None]:
    """SIGTERM and SIGINT call ``on_signal(signum)``; returns what restores the previous
    handlers (a no-op outside the main thread, where nothing is installed).

    Examples:
        restore = install_stop_signals(lambda signum: worker.stop())
        try:
            worker.run()
        finally:
            restore()
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: object) -> None:
        on_signal(signum)

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
