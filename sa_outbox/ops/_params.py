"""Typed, frozen parameter objects: what an operation is asked to do, checked once.

A frozen dataclass rather than a dict of options: the type checker catches a misspelt or
mistyped option where it is written, and the object is its own key in the statement cache
(a worker claims with the same parameters again and again: the claim is built once).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from .. import statements as st
from .._exceptions import InvalidArgumentType
from .._validation import count, duration, name_filter, text

__all__ = ["ClaimParams"]


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimParams:
    """What a claim asks for (`sa_outbox.statements.claim_jobs`' options), checked once.

    ``lease`` is kept as a `timedelta` (a number is seconds); ``queues`` and ``kinds`` as a
    tuple of names (a single name is one); ``paused`` is the table of the paused queues
    (`QueuePauseMixin`), ``limits`` a `sa_outbox.statements.ClaimLimits`. Bad input raises
    the error the statement would.

    Examples:
        >>> params = ClaimParams(worker_id="w1", batch=20, lease=30, queues="emails")
        >>> params.lease, params.queues
        (datetime.timedelta(seconds=30), ('emails',))
        >>> params.with_batch(5).batch, params == ClaimParams("w1", 20, 30.0, ("emails",))
        (5, True)
    """

    worker_id: str
    batch: int = 1
    lease: dt.timedelta | float = st.DEFAULT_LEASE
    queues: str | Sequence[str] | None = None
    kinds: str | Sequence[str] | None = None
    paused: Any = None
    limits: st.ClaimLimits | None = None

    def __post_init__(self) -> None:
        # The order of `st.claim_jobs`' own checks: the first bad option is the one named.
        set_ = object.__setattr__
        set_(self, "worker_id", text(self.worker_id, "worker_id"))
        count(self.batch, "batch")
        set_(self, "lease", duration(self.lease, "lease"))
        set_(self, "queues", name_filter(self.queues, "queues"))
        set_(self, "kinds", name_filter(self.kinds, "kinds"))
        if self.limits is not None and not isinstance(self.limits, st.ClaimLimits):
            raise InvalidArgumentType(
                f"limits must be a ClaimLimits, got {type(self.limits).__name__}"
            )

    def with_batch(self, batch: int) -> ClaimParams:
        """The same parameters for a claim of up to ``batch`` jobs.

        Examples:
            >>> ClaimParams(worker_id="w1").with_batch(10).batch
            10
        """
        return dataclasses.replace(self, batch=batch)
