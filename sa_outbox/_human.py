"""Durations, times and sizes as an operator reads them, for the CLI and the dashboard."""

from __future__ import annotations

import datetime as dt

__all__ = ["age", "ago", "moment", "size", "span"]


def age(value: dt.timedelta | None) -> str:
    """A duration as an operator reads it: ``45s``, ``2m05s``, ``3h07m``, ``2d04h``.

    Examples:
        >>> age(dt.timedelta(seconds=125)), age(dt.timedelta(days=2, hours=4)), age(None)
        ('2m05s', '2d04h', '-')
        >>> age(dt.timedelta(milliseconds=250))
        '0s'
    """
    if value is None:
        return "-"
    seconds = max(0, int(value.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def span(value: dt.timedelta) -> str:
    """A window as ``1h``, ``5m``, ``1m30s``: `age` without its zero tail.

    Examples:
        >>> span(dt.timedelta(hours=1)), span(dt.timedelta(seconds=90))
        ('1h', '1m30s')
    """
    text = age(value)
    for tail in ("00s", "00m", "00h"):
        if text.endswith(tail) and len(text) > len(tail):
            return text[: -len(tail)]
    return text


def moment(value: dt.datetime | None) -> str:
    """A time in UTC to the second: ``2030-01-01 09:00:00``.

    Examples:
        >>> moment(dt.datetime(2030, 1, 1, 9, 0, 0, 5, tzinfo=dt.UTC)), moment(None)
        ('2030-01-01 09:00:00', '-')
    """
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(value: dt.datetime | None, now: dt.datetime) -> str:
    """How long before ``now`` a time was (``3m10s ago``), or after it (``in 45s``).

    Examples:
        >>> now = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.UTC)
        >>> ago(now - dt.timedelta(minutes=3), now), ago(now + dt.timedelta(seconds=45), now)
        ('3m00s ago', 'in 45s')
        >>> ago(None, now)
        '-'
    """
    if value is None:
        return "-"
    if value > now:
        return f"in {age(value - now)}"
    return f"{age(now - value)} ago"


def size(value: int | None) -> str:
    """A number of bytes in binary units to three significant figures: ``144 kB``, ``1.2 MB``.

    Examples:
        >>> size(512), size(147456), size(1_258_291), size(None)
        ('512 B', '144 kB', '1.2 MB', '-')
    """
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(amount) < 1024 or unit == "TB":
            break
        amount /= 1024
    if unit == "B":
        return f"{int(amount)} B"
    digits = 0 if abs(amount) >= 100 else 1
    text = f"{amount:.{digits}f}".removesuffix(".0")
    return f"{text} {unit}"
