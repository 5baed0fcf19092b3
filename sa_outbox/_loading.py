"""Find the object a command names as ``module:attribute`` (workers, relays, models)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from ._exceptions import InvalidArgument

__all__ = ["import_target", "load_instance"]


def import_target(target: str, *, example: str = "myapp.tasks:app") -> object:
    """The object at ``module:attribute``; the attribute may be dotted, the cwd is importable.

    Examples:
        >>> import_target("json:dumps").__name__
        'dumps'
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise InvalidArgument(f"expected TARGET as module:attribute ({example}), got {target!r}")
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
    return found


def load_instance(
    target: str, kinds: type[Any] | tuple[type[Any], ...], what: str, *, example: str
) -> Any:
    """The instance of ``kinds`` at ``target``, or made by a function of no arguments there.

    Examples:
        >>> load_instance("json:loads", dict, "a dict", example="m:d")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: json:loads is not a dict (nor a function ...
    """
    found = import_target(target, example=example)
    if not isinstance(found, kinds) and inspect.isfunction(found) and _takes_no_arguments(found):
        found = found()
    if not isinstance(found, kinds):
        raise InvalidArgument(f"{target} is not {what} (nor a function returning one)")
    return found


def _takes_no_arguments(function: Any) -> bool:
    try:
        inspect.signature(function).bind()
    except TypeError:
        return False
    return True
