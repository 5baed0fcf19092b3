"""Find the relay a ``sa-outbox relay module:attribute`` command names.

Examples:
    >>> load_relay("json:dumps")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sa_outbox._exceptions.InvalidArgument: json:dumps is not a Relay or an AsyncRelay ...
"""

from __future__ import annotations

from .._loading import load_instance
from ._async import AsyncRelay
from ._sync import Relay

__all__ = ["load_relay"]


def load_relay(target: str) -> Relay | AsyncRelay:
    """The `Relay` or `AsyncRelay` at ``module:attribute`` (the current directory is
    importable); the attribute may be dotted, or a function of no arguments returning one.

    Examples:
        relay = load_relay("myapp.outbox:relay")
    """
    relay: Relay | AsyncRelay = load_instance(
        target, (Relay, AsyncRelay), "a Relay or an AsyncRelay", example="myapp.outbox:relay"
    )
    return relay
