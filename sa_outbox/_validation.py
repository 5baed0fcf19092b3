"""Checks that run before any SQL is built: identifiers, counts, durations, filters."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

from ._exceptions import InvalidArgument, InvalidArgumentType

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: PostgreSQL truncates identifiers longer than NAMEDATALEN - 1 bytes.
MAX_IDENTIFIER_LENGTH = 63
MAX_BATCH = 10_000


def identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a plain SQL identifier PostgreSQL keeps as written."""
    if not isinstance(value, str):
        raise InvalidArgumentType(f"{what} must be a str, got {type(value).__name__}")
    if not _IDENTIFIER.match(value) or len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidArgument(
            f"{what} {value!r} is not a valid identifier: use letters, digits and underscores, "
            f"starting with a letter or underscore, at most {MAX_IDENTIFIER_LENGTH} characters"
        )
    return value


def optional_identifier(value: object, what: str) -> str | None:
    return None if value is None else identifier(value, what)


def count(value: object, what: str, *, minimum: int = 1, maximum: int = MAX_BATCH) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"{what} must be an int, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be between {minimum} and {maximum}, got {value}")
    return value


def duration(value: object, what: str, *, allow_zero: bool = False) -> dt.timedelta:
    """A positive (or, with ``allow_zero``, non-negative) timedelta; numbers are seconds."""
    if isinstance(value, bool) or not isinstance(value, dt.timedelta | int | float):
        raise InvalidArgumentType(
            f"{what} must be a timedelta or a number of seconds, got {type(value).__name__}"
        )
    delta = value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=value)
    if delta < dt.timedelta(0) or (delta == dt.timedelta(0) and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise InvalidArgument(f"{what} must be {bound}, got {delta}")
    return delta


def text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentType(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    return value


def optional_text(value: object, what: str) -> str | None:
    return None if value is None else text(value, what)


def name_filter(value: object, what: str) -> tuple[str, ...] | None:
    """``None`` (no filter), a str, or a non-empty sequence of non-empty str."""
    if value is None:
        return None
    if isinstance(value, str):
        return (text(value, what),)
    if not isinstance(value, Sequence | set | frozenset):
        raise InvalidArgumentType(
            f"{what} must be a str or a sequence of str, got {type(value).__name__}"
        )
    names = tuple(text(item, f"each of {what}") for item in value)
    if not names:
        raise InvalidArgument(f"{what} must name at least one value, or be None for all")
    return names


def aware_datetime(value: object, what: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise InvalidArgumentType(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise InvalidArgument(f"{what} must be timezone-aware, got naive {value}")
    return value
