"""Checks that run before any SQL is built: identifiers, counts, durations, names, filters.

Text bound for a ``text`` column must be text PostgreSQL can store: no NUL character (it
refuses ``\\u0000`` in ``text`` and ``jsonb``) and valid UTF-8 (no lone surrogate such as
``"\\ud800"``, which UTF-8 cannot encode). Names (job kind, queue, event type, aggregate
type) and keys (deduplication key, aggregate id) have maximum lengths, so that the btree
indexes they are in can always hold them (docs/limits.md).

Examples:
    >>> name("send-email", "kind")
    'send-email'
    >>> name("   ", "queue")
    Traceback (most recent call last):
    ...
    sa_outbox._exceptions.InvalidArgument: queue must not be blank (only whitespace), got '   '
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Sequence

from ._exceptions import InvalidArgument, InvalidArgumentType

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: PostgreSQL truncates identifiers longer than NAMEDATALEN - 1 bytes.
MAX_IDENTIFIER_LENGTH = 63
MAX_BATCH = 10_000
#: Most characters of a job kind, queue, event type or aggregate type.
MAX_NAME_LENGTH = 128
#: Most characters of a deduplication key.
MAX_DEDUPLICATION_KEY_LENGTH = 512
#: Most characters of an aggregate id (as stored: ``str(aggregate_id)``).
MAX_AGGREGATE_ID_LENGTH = 512
#: Most characters of a message id an inbox records (its source is a name: 128 at most).
MAX_MESSAGE_ID_LENGTH = 512
# A btree index entry must fit in about 2,704 bytes (a third of an 8 kB page). A character is
# at most 4 bytes of UTF-8, so the widest entries, (kind, deduplication_key),
# (aggregate_type, aggregate_id, seq) and an inbox's (source, message_id), take at most
# 4 * (128 + 512) = 2,560 bytes, plus a few bytes of headers: they always fit, whatever the
# characters.


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


def shown(value: str, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages.

    ``repr`` writes a NUL, a lone surrogate or a control character as an escape, so the
    message itself is always text PostgreSQL can store (a worker keeps it in ``last_error``).

    Examples:
        >>> shown("a\\x00b"), shown("x" * 100, limit=5)
        ("'a\\\\x00b'", "'xxxxx…'")
    """
    return repr(value) if len(value) <= limit else repr(value[:limit])[:-1] + "…'"


def is_utf8(value: str) -> bool:
    """Whether UTF-8 can encode ``value`` (it holds no lone surrogate).

    Examples:
        >>> is_utf8("é 😀"), is_utf8("\\ud800")
        (True, False)
    """
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def unstorable(value: str) -> str | None:
    """What makes ``value`` text PostgreSQL cannot store, or ``None`` when it can.

    Examples:
        >>> unstorable("fine"), unstorable("a\\x00b")
        (None, 'contains a NUL character (\\\\u0000) at index 1, which PostgreSQL cannot store')
        >>> unstorable("\\ud800")
        'is not valid UTF-8 text: a lone surrogate (\\\\ud800) at index 0'
    """
    if "\x00" in value:
        return (
            f"contains a NUL character (\\u0000) at index {value.index(chr(0))}, which "
            "PostgreSQL cannot store"
        )
    if value.isascii() or is_utf8(value):
        return None
    at = next(i for i, c in enumerate(value) if 0xD800 <= ord(c) <= 0xDFFF)
    return f"is not valid UTF-8 text: a lone surrogate (\\u{ord(value[at]):04x}) at index {at}"


def storable(value: str, what: str) -> str:
    """``value`` if PostgreSQL can store it as text (`unstorable`), else `InvalidArgument`.

    Examples:
        >>> storable("a\\x00", "deduplication_key")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: deduplication_key 'a\\x00' contains a NUL \
character (\\u0000) at index 1, which PostgreSQL cannot store
    """
    if "\x00" not in value and (value.isascii() or is_utf8(value)):
        return value
    raise InvalidArgument(f"{what} {shown(value)} {unstorable(value)}")


def storable_text(value: str) -> str:
    """``value`` with what PostgreSQL cannot store written as escapes: a NUL as ``\\x00``, a
    lone surrogate as ``\\udc80``. For free text such as an error message kept in
    ``last_error``, where an escaped byte beats a write that fails.

    Examples:
        >>> print(storable_text("bad \\x00 byte \\udc80"), storable_text("fine é"))
        bad \\x00 byte \\udc80 fine é
    """
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    if not (value.isascii() or is_utf8(value)):
        value = value.encode("utf-8", "backslashreplace").decode()
    return value


def text(value: object, what: str) -> str:
    """A non-empty str PostgreSQL can store (`storable`).

    Examples:
        >>> text("worker-1", "worker_id")
        'worker-1'
    """
    if not isinstance(value, str):
        raise InvalidArgumentType(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    return storable(value, what)


def _too_long(value: str, what: str, maximum: int) -> InvalidArgument:
    return InvalidArgument(
        f"{what} {shown(value)} is {len(value)} characters long, over the limit of {maximum}"
    )


def name(value: object, what: str) -> str:
    """A job kind, queue, event type or aggregate type: `text`, not blank, at most
    `MAX_NAME_LENGTH` characters.

    Examples:
        >>> name("x" * 129, "kind")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: kind 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' \
is 129 characters long, over the limit of 128
    """
    checked = text(value, what)
    if len(checked) > MAX_NAME_LENGTH:
        raise _too_long(checked, what, MAX_NAME_LENGTH)
    if checked.isspace():
        raise InvalidArgument(f"{what} must not be blank (only whitespace), got {shown(checked)}")
    return checked


def is_name(value: object) -> bool:
    """Whether `name` accepts ``value`` as it is: the cheap test of the bulk paths.

    Examples:
        >>> is_name("send-email"), is_name(" "), is_name("a\\x00")
        (True, False, False)
    """
    return (
        type(value) is str
        and 0 < len(value) <= MAX_NAME_LENGTH
        and "\x00" not in value
        and not value.isspace()
        and (value.isascii() or is_utf8(value))
    )


def key(value: object, what: str, maximum: int) -> str:
    """A deduplication key or an aggregate id: `text` of at most ``maximum`` characters.

    Examples:
        >>> key("welcome:ana", "deduplication_key", MAX_DEDUPLICATION_KEY_LENGTH)
        'welcome:ana'
    """
    checked = text(value, what)
    if len(checked) > maximum:
        raise _too_long(checked, what, maximum)
    return checked


def optional_text(value: object, what: str) -> str | None:
    return None if value is None else text(value, what)


def optional_key(value: object, what: str, maximum: int) -> str | None:
    return None if value is None else key(value, what, maximum)


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


def as_uuid(value: object, what: str) -> uuid.UUID:
    """``value`` as a UUID (a UUID, or its text), or a one-line error naming ``what``.

    Examples:
        >>> as_uuid("00000000-0000-0000-0000-000000000001", "job id")
        UUID('00000000-0000-0000-0000-000000000001')
    """
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            raise InvalidArgument(f"{what} is not a UUID: {value!r}") from None
    raise InvalidArgumentType(f"{what} must be a UUID, got {type(value).__name__}")
