"""The dashboard's times, durations and sizes as an operator reads them: Jinja filters over
`sa_outbox._human` (the CLI's units), registered by `register` on the dashboard's blueprint.

Times are in UTC to the second (``2030-01-01 09:00:00``), durations short (``4m16s``),
relative times against the database's ``now()`` (``3m10s ago``), sizes in binary units
(``144 kB``). The filters are app-wide in Flask, so each name starts with ``sa_outbox_``
and cannot clash with a filter of the host app.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

from flask import Blueprint

from .._human import age, ago, moment, size, span

__all__ = ["FILTERS", "cell", "iso", "lease_left", "register"]


def iso(value: dt.datetime | None) -> str:
    """A time for a ``<time datetime=…>`` attribute: ISO 8601 in UTC, to the second.

    Examples:
        >>> iso(dt.datetime(2030, 1, 1, 9, 0, 0, 346906, tzinfo=dt.UTC)), iso(None)
        ('2030-01-01T09:00:00+00:00', '')
    """
    if value is None:
        return ""
    return value.astimezone(dt.UTC).replace(microsecond=0).isoformat()


def lease_left(left: dt.timedelta | None) -> str:
    """A lease's time left (``4m59s``), or how long ago it expired (``expired 1m01s ago``).

    Examples:
        >>> lease_left(dt.timedelta(seconds=299.6)), lease_left(dt.timedelta(hours=2))
        ('4m59s', '2h00m')
        >>> lease_left(dt.timedelta(seconds=-61)), lease_left(None)
        ('expired 1m01s ago', '')
    """
    if left is None:
        return ""
    if left < dt.timedelta(0):
        return f"expired {age(-left)} ago"
    return age(left)


def cell(value: object, now: dt.datetime | None = None) -> str:
    """Any column's value on a job's or an event's page: a time to the second and how long
    before ``now`` it was, a duration as `age`, a list joined, JSON as JSON, none as empty.

    Examples:
        >>> now = dt.datetime(2030, 1, 1, 9, 3, 10, 5, tzinfo=dt.UTC)
        >>> cell(dt.datetime(2030, 1, 1, 9, 0, 0, 346906, tzinfo=dt.UTC), now)
        '2030-01-01 09:00:00 (3m09s ago)'
        >>> cell(dt.timedelta(seconds=264.9)), cell(["pending", "running"]), cell(None)
        ('4m24s', 'pending, running', '')
        >>> cell({"to": "ana@example.com"}), cell(7)
        ('{"to": "ana@example.com"}', '7')
    """
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return moment(value) if now is None else f"{moment(value)} ({ago(value, now)})"
    if isinstance(value, dt.timedelta):
        return age(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


#: Every filter, by the name templates use.
FILTERS: dict[str, Callable[..., str]] = {
    "sa_outbox_age": age,
    "sa_outbox_span": span,
    "sa_outbox_moment": moment,
    "sa_outbox_ago": ago,
    "sa_outbox_size": size,
    "sa_outbox_iso": iso,
    "sa_outbox_lease_left": lease_left,
    "sa_outbox_cell": cell,
}


def register(bp: Blueprint) -> None:
    """Register `FILTERS` with the app that mounts ``bp``.

    Examples:
        >>> from flask import Flask, render_template_string
        >>> bp = Blueprint("b", __name__)
        >>> register(bp)
        >>> app = Flask("t")
        >>> app.register_blueprint(bp)
        >>> with app.app_context():
        ...     render_template_string("{{ d | sa_outbox_age }}", d=dt.timedelta(seconds=256))
        '4m16s'
    """
    for name, function in FILTERS.items():
        bp.add_app_template_filter(function, name)
