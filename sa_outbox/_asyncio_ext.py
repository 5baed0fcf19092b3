"""SQLAlchemy's asyncio extension, imported only when an async feature is used.

``sqlalchemy.ext.asyncio`` needs greenlet, which SQLAlchemy 2.1 no longer installs by default
(it comes with the ``asyncio`` extra). Nothing on the sync path may import it: a plain
``pip install sa-outbox`` must import and run the sync worker, relay and CLI.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeGuard

from ._exceptions import MissingExtra

if TYPE_CHECKING:
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["create_async_engine", "extension", "is_async_engine", "is_async_engine_class"]

_INSTALL = 'pip install "sa-outbox[asyncio]"'


def extension(feature: str = "asyncio") -> ModuleType:
    """``sqlalchemy.ext.asyncio``, or `MissingExtra` naming the extra to install.

    Examples:
        >>> extension().__name__
        'sqlalchemy.ext.asyncio'
    """
    try:
        # SQLAlchemy 2.0 imports the extension without greenlet and fails at the first
        # await; ask for greenlet first so both versions fail here, in one line.
        importlib.import_module("greenlet")
        return importlib.import_module("sqlalchemy.ext.asyncio")
    except ImportError as error:
        raise MissingExtra(
            f"{feature} needs SQLAlchemy's asyncio support (greenlet), which is not installed: "
            f"{_INSTALL}"
        ) from error


def create_async_engine(url: str | URL, **options: Any) -> AsyncEngine:
    """SQLAlchemy's ``create_async_engine``, or `MissingExtra` without the asyncio extra.

    Examples:
        >>> engine = create_async_engine("postgresql+psycopg://app@db.internal/app")
        >>> type(engine).__name__
        'AsyncEngine'
    """
    engine: AsyncEngine = extension("an async engine").create_async_engine(url, **options)
    return engine


def is_async_engine(value: object) -> TypeGuard[AsyncEngine]:
    """Whether ``value`` is an ``AsyncEngine``, without importing the extension: if it was
    never imported, nothing is one.

    Examples:
        >>> is_async_engine(object())
        False
    """
    aio = sys.modules.get("sqlalchemy.ext.asyncio")
    return aio is not None and isinstance(value, aio.AsyncEngine)


def is_async_engine_class(value: type) -> bool:
    """Whether ``value`` is ``AsyncEngine`` or a subclass, without importing the extension.

    Examples:
        >>> is_async_engine_class(int)
        False
    """
    aio = sys.modules.get("sqlalchemy.ext.asyncio")
    return aio is not None and issubclass(value, aio.AsyncEngine)
