"""Find the relay a ``sa-outbox relay module:attribute`` command names.

Example:
    >>> load_relay("json:dumps")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sa_outbox._exceptions.InvalidArgument: json:dumps is not a Relay or an AsyncRelay ...
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from .._exceptions import InvalidArgument
from ._async import AsyncRelay
from ._sync import Relay

__all__ = ["load_relay"]


def load_relay(target: str) -> Relay | AsyncRelay:
    """The `Relay` or `AsyncRelay` at ``module:attribute`` (the current directory is
    importable); the attribute may be dotted, or a function of no arguments returning one.

    Example:
        relay = load_relay("myapp.outbox:relay")
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise InvalidArgument(
            f"expected the relay as module:attribute (myapp.outbox:relay), got {target!r}"
        )
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise InvalidArgument(f"{module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, Relay | AsyncRelay) and inspect.isfunction(found):
        try:
            inspect.signature(found).bind()
        except TypeError:
            pass
        else:
            found = found()
    if not isinstance(found, Relay | AsyncRelay):
        raise InvalidArgument(
            f"{target} is not a Relay or an AsyncRelay (nor a function returning one)"
        )
    return found
