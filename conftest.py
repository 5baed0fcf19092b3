"""Shared by the tests and the package's doctests (pytest collects both from here).

`linecache.checkcache` lists the cache's keys, then reads each entry: an entry another
thread drops in between (SQLAlchemy's generated ``__init__`` sources, which have no file,
are dropped by any traceback formatted in a worker thread) raises ``KeyError`` in the
thread that checks. doctest checks the cache before every example (through pdb), so a
doctest failed now and then when a background thread of an earlier test logged a
traceback at that moment. The check is made tolerant of that, for the test process only.
"""

from __future__ import annotations

import contextlib
import linecache

_checkcache = linecache.checkcache


def _tolerant_checkcache(filename: str | None = None) -> None:
    with contextlib.suppress(KeyError):  # dropped by another thread meanwhile
        _checkcache(filename)


linecache.checkcache = _tolerant_checkcache
