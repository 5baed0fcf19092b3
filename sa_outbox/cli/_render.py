"""How the inspection commands print: aligned tables, ages, times, JSON, rows, retries."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._human import moment
from ..queue import as_plain


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: int = 0) -> str:
    """Columns aligned with two spaces between; the last ``right`` columns right-aligned.

    Examples:
        >>> print(table(["queue", "jobs"], [["default", 3], ["emails", 12]], right=1))
        queue    jobs
        default     3
        emails     12
    """
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    first_right = len(headers) - right
    lines = []
    for row in cells:
        parts = [
            cell.rjust(w) if i >= first_right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def as_json(value: Any) -> str:
    """A result as one line of JSON (times ISO 8601, ages in seconds, ids as text).

    Examples:
        >>> as_json({"age": dt.timedelta(seconds=1.5), "at": None})
        '{"age": 1.5, "at": null}'
    """
    return json.dumps(as_plain(value), default=str)


def format_record(found: dict[str, Any], *, long: tuple[str, ...]) -> str:
    """A row as ``name: value`` lines, the ``long`` columns last and whole.

    Examples:
        >>> print(format_record({"id": 1, "payload": {"a": 1}, "kind": "ping"}, long=("payload",)))
        id:      1
        kind:    ping
        payload:
          {
            "a": 1
          }
    """
    width = max(len(name) for name in found) + 2
    lines = []
    for name, value in found.items():
        if name in long:
            continue
        shown = moment(value) + " UTC" if isinstance(value, dt.datetime) else value
        if isinstance(value, list):  # a unique job's states
            shown = ", ".join(str(item) for item in value)
        lines.append(f"{name + ':':<{width}}{'-' if shown is None else shown}")
    for name in long:
        if name not in found:
            continue
        value = found[name]
        if value is None:
            lines.append(f"{name + ':':<{width}}-")
            continue
        text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
        lines.append(f"{name}:")
        lines += [f"  {line}" for line in text.splitlines()]
    return "\n".join(lines)


#: How many ids a retry prints before it says how many more there were.
SHOWN_IDS = 20


def listed_ids(ids: list[Any]) -> str:
    """The ids a retry changed, one a line, the first `SHOWN_IDS` only.

    Examples:
        >>> print(listed_ids(list(range(22))))  # doctest: +ELLIPSIS
          0
          1
        ...
          19
          … and 2 more
    """
    lines = [f"  {i}" for i in ids[:SHOWN_IDS]]
    if len(ids) > SHOWN_IDS:
        lines.append(f"  … and {len(ids) - SHOWN_IDS} more")
    return "\n".join(lines)


def format_retried(
    retried: list[Any],
    *,
    in_json: bool,
    nothing: str,
    done: str,
    skipped: Mapping[Any, Any] | None = None,
) -> str:
    """What a retry prints: ``{"retried": [...]}`` with ``in_json``, else ``nothing`` when
    none changed, else ``done`` and the ids (`listed_ids`). ``skipped`` (a unique job left
    failed: the job holding its key) adds ``"skipped": {id: held_by}``, or a line for each.

    Examples:
        >>> print(format_retried([1], in_json=False, nothing="none", done="retried 1:"))
        retried 1:
          1
        >>> print(format_retried([], in_json=False, nothing="none", done="", skipped={2: 1}))
        none
        skipped 1 unique job(s) whose key another job holds:
          2 (key held by 1)
    """
    if in_json:
        shown: dict[str, Any] = {"retried": retried}
        if skipped:
            shown["skipped"] = {str(k): str(v) for k, v in skipped.items()}
        return as_json(shown)
    text = f"{done}\n{listed_ids(retried)}" if retried else nothing
    if skipped:
        held = [f"{job} (key held by {holder})" for job, holder in skipped.items()]
        text += (
            f"\nskipped {len(skipped)} unique job(s) whose key another job holds:\n"
            f"{listed_ids(held)}"
        )
    return text
