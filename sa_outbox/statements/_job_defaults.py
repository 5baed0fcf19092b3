"""Defaults shared by the job statements (queue, lease, attempts, backoff)."""

from __future__ import annotations

import datetime as dt

from .._backoff import Backoff
from ..schema import JobStatus

DEFAULT_QUEUE = "default"


DEFAULT_LEASE = dt.timedelta(seconds=30)


DEFAULT_MAX_ATTEMPTS = 8


#: The backoff used when none is given: 1 s doubling up to 5 min, plus up to 1 s of jitter.
DEFAULT_BACKOFF = Backoff()


_MAX_INT = 2**31 - 1


#: The states a job never leaves: what retention prunes, what `cancel_jobs` leaves alone.
_FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
