"""What waiting for job results shares between asyncio and threads: the checks, and what a
finished job's `JobResult` makes of the wait.

`AsyncJobResults` (``_results_async.py``) and `JobResults` (generated from it) wait.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .._exceptions import InvalidArgumentType
from ..queue import JobResult
from ..schema import JobStatus
from ._settings import check_engine, seconds
from .errors import JobFailed

__all__ = ["check_async_engine", "check_engine", "check_wait", "outcome"]


def check_async_engine(engine: object, what: str) -> None:
    """`check_engine` for asyncio: an ``AsyncEngine``, or a one-line error.

    Examples:
        >>> try:
        ...     check_async_engine("postgresql://", "AsyncJobResults")
        ... except InvalidArgumentType as exc:
        ...     print(exc)
        AsyncJobResults needs an AsyncEngine (create_async_engine), got str
    """
    if not hasattr(engine, "sync_engine"):
        raise InvalidArgumentType(
            f"{what} needs an AsyncEngine (create_async_engine), got {type(engine).__name__}"
        )


def check_wait(value: dt.timedelta | float, what: str) -> float:
    """A wait's length in seconds (a positive number or timedelta), or a one-line error.

    Examples:
        >>> check_wait(dt.timedelta(minutes=1), "timeout")
        60.0
    """
    return seconds(value, what)


def outcome(found: JobResult) -> Any:
    """A finished job's return value, or `JobFailed` when it did not succeed.

    Examples:
        >>> import uuid
        >>> outcome(JobResult(uuid.UUID(int=1), JobStatus.SUCCEEDED, [1, 2], None))
        [1, 2]
    """
    if found.status is JobStatus.SUCCEEDED:
        return found.value
    raise JobFailed(found.id, found.status, found.error)
