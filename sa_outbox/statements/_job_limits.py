"""Concurrency and rate limits that every claim obeys, whichever worker runs it.

A `Limit` caps the jobs of one kind (or queue) that run at once across all workers —
optionally per value of a payload field (per customer, per tenant) — or that may start in
any window of a period. `ClaimLimits` holds a table's limits; `claim_jobs(...,
limits=...)` takes them into the claim's own SQL, and `lock_claim_limits` serialises the
claims that share a limited scope so that each one counts what the others committed.

Why a lock and a second statement: a statement sees the rows committed before it began.
Two claims running side by side would each count the running jobs without the other's,
and together exceed the limit. The claims of a limited scope therefore take a
transaction-level advisory lock first (one statement, in the scope's sorted order, so two
claims never wait for each other in a cycle), then claim: the claim's statement begins
after the lock is granted, so it counts every job the previous holder claimed. Claims of
scopes without limits take no lock and run as before.

Examples:
    >>> limits = ClaimLimits((Limit(kind="call-api", running=10),
    ...                       Limit(kind="sync-account", running=1, by="account_id")))
    >>> limits.applying(queues=None, kinds=("send-email",)) is None
    True
    >>> [lim.scope for lim in limits.applying(queues=None, kinds=("call-api",)).limits]
    ['kind:call-api']
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import Delete, Insert

from .._exceptions import InvalidArgument, InvalidArgumentType
from .._validation import count, duration, name
from ..schema import JobStatus
from ._common import interval, table_of

__all__ = [
    "DEFAULT_LOOKAHEAD",
    "MAX_LIMIT",
    "ClaimLimits",
    "Limit",
    "lock_claim_limits",
]

#: How many ready jobs of a kind limited per key one claim looks at (see `ClaimLimits`).
DEFAULT_LOOKAHEAD = 100
#: The largest ``running`` or ``rate`` a `Limit` takes.
MAX_LIMIT = 1_000_000
#: A payload field a limit may group by: letters, digits, ``_``, ``-`` and ``.``.
_FIELD = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """A limit on one kind's (or queue's) claims, across every worker of the job table.

    - ``running=N``: at most N jobs of the kind (or queue) are ``running`` at once; with
      ``by="field"``, at most N per value of ``payload["field"]`` (jobs without the field
      share one value).
    - ``rate=R, per=P``: at most R jobs of the kind start in any window of P (a timedelta
      or seconds). Every claim counts, retries too. Needs a `RateLimitLogMixin` table.

    A running job counts until it ends or is reclaimed: the jobs of a worker that died
    hold their places until their leases expire and the reclaimer returns them.

    Examples:
        >>> Limit(kind="call-api", rate=100, per=60).per
        datetime.timedelta(seconds=60)
        >>> Limit(queue="imports", running=2).scope
        'queue:imports'
        >>> Limit(kind="x")
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: the limit of kind 'x' sets neither running= nor rate=
    """

    kind: str | None = None
    queue: str | None = None
    running: int | None = None
    by: str | None = None
    rate: int | None = None
    per: dt.timedelta | None = None

    def __post_init__(self) -> None:
        if (self.kind is None) == (self.queue is None):
            raise InvalidArgument("a limit names exactly one of kind= or queue=")
        what = (
            f"the limit of kind {self.kind!r}"
            if self.kind is not None
            else f"the limit of queue {self.queue!r}"
        )
        if self.kind is not None:
            name(self.kind, "the limited kind")
        if self.queue is not None:
            name(self.queue, "the limited queue")
        if self.running is None and self.rate is None:
            raise InvalidArgument(f"{what} sets neither running= nor rate=")
        if self.running is not None:
            count(self.running, f"running of {what}", maximum=MAX_LIMIT)
        if self.by is not None:
            if not isinstance(self.by, str):
                raise InvalidArgumentType(f"by of {what} must be a str, got {self.by!r}")
            if self.kind is None or self.running is None:
                raise InvalidArgument(f"{what}: by= groups a kind's running= limit only")
            if not _FIELD.match(self.by):
                raise InvalidArgument(
                    f"by of {what} must be a payload field name (letters, digits, _ - .), "
                    f"got {self.by!r}"
                )
        if self.rate is not None or self.per is not None:
            if self.kind is None:
                raise InvalidArgument(f"{what}: rate limits are per kind")
            if self.rate is None or self.per is None:
                raise InvalidArgument(f"{what} needs both rate= and per=")
            count(self.rate, f"rate of {what}", maximum=MAX_LIMIT)
            object.__setattr__(self, "per", duration(self.per, f"per of {what}"))

    @property
    def scope(self) -> str:
        """``kind:<kind>`` or ``queue:<queue>``: what the limit counts, and locks."""
        return f"kind:{self.kind}" if self.kind is not None else f"queue:{self.queue}"


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimLimits:
    """The limits of one job table, for `claim_jobs` and `lock_claim_limits`.

    ``log`` is the `RateLimitLogMixin` table that rate limits count in (required when a
    limit has ``rate=``). ``lookahead`` bounds the ready jobs of a kind limited per key that
    one claim looks at: when the first ``lookahead`` all belong to keys at their limit, the
    claim takes none of that kind this time, even if a free key's job waits further back.

    Examples:
        >>> ClaimLimits((Limit(kind="a", running=1), Limit(kind="a", running=2)))
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: two limits for kind:a: one Limit per kind or queue
    """

    limits: tuple[Limit, ...]
    log: Any = None
    lookahead: int = DEFAULT_LOOKAHEAD

    def __post_init__(self) -> None:
        if not isinstance(self.limits, tuple) or not all(
            isinstance(lim, Limit) for lim in self.limits
        ):
            raise InvalidArgumentType("limits must be a tuple of Limit")
        seen: set[str] = set()
        for lim in self.limits:
            if lim.scope in seen:
                raise InvalidArgument(f"two limits for {lim.scope}: one Limit per kind or queue")
            seen.add(lim.scope)
        count(self.lookahead, "lookahead", maximum=10_000)
        rated = [lim.scope for lim in self.limits if lim.rate is not None]
        if rated and self.log is None:
            raise InvalidArgument(
                f"{rated[0]} has a rate limit: give a RateLimitLogMixin table (log=) to count it in"
            )
        if self.log is not None:
            object.__setattr__(self, "log", table_of(self.log))

    def applying(
        self, queues: tuple[str, ...] | None, kinds: tuple[str, ...] | None
    ) -> ClaimLimits | None:
        """The limits a claim of ``queues`` and ``kinds`` (``None``: all) must obey, or
        ``None`` when it touches no limited kind or queue."""
        kept = tuple(
            lim
            for lim in self.limits
            if (lim.kind is not None and (kinds is None or lim.kind in kinds))
            or (lim.queue is not None and (queues is None or lim.queue in queues))
        )
        return dataclasses.replace(self, limits=kept) if kept else None

    @property
    def kinds(self) -> dict[str, Limit]:
        """The kinds' limits, by kind."""
        return {lim.kind: lim for lim in self.limits if lim.kind is not None}

    @property
    def queues(self) -> dict[str, Limit]:
        """The queues' limits, by queue."""
        return {lim.queue: lim for lim in self.limits if lim.queue is not None}

    @property
    def rated(self) -> tuple[Limit, ...]:
        """The limits with a rate."""
        return tuple(lim for lim in self.limits if lim.rate is not None)


def lock_claim_limits(target: object, limits: ClaimLimits) -> Select[Any]:
    """Wait for, and hold until the transaction ends, the lock of each limited scope.

    Run it in the claim's transaction, right before `claim_jobs(..., limits=limits)`: the
    claim then counts every job that the claims before it took. The scopes are locked one
    at a time in sorted order, so claims locking overlapping sets never deadlock. The keys
    are ``hashtextextended`` of the table's name and the scope (the one-bigint form of
    ``pg_advisory_xact_lock``, apart from the outbox's two-int locks).

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import JobMixin
        >>> class Base(DeclarativeBase): pass
        >>> class Job(JobMixin, Base): __tablename__ = "jobs"
        >>> stmt = lock_claim_limits(Job, ClaimLimits((Limit(kind="a", running=1),)))
        >>> "pg_advisory_xact_lock" in str(stmt), stmt.compile().params["limit_locks"]
        (True, ['sa_outbox limit jobs kind:a'])
    """
    t = table_of(target)
    keys = sorted(f"sa_outbox limit {t.fullname} {lim.scope}" for lim in limits.limits)
    each = (
        func.unnest(bindparam("limit_locks", keys, type_=ARRAY(Text())))
        .table_valued("key")
        .render_derived(name="limit_locks")
    )
    key = func.hashtextextended(each.c.key, literal(0, BigInteger()))
    return select(func.count(func.pg_advisory_xact_lock(key))).select_from(each)


def running_literal(t: Any) -> ColumnElement[Any]:
    # Inline, as the claim's 'pending': a generic plan can then use the partial index on
    # running jobs (the reclaimer's) to count them.
    return literal_column(f"'{JobStatus.RUNNING.value}'", t.c.status.type)


def limit_key(t: Any, lim: Limit) -> ColumnElement[Any]:
    """The payload field a per-key limit groups by (text), or NULL."""
    if lim.by is None:
        return literal(None, Text())
    # The field inline (checked by Limit): grouped on, it must be the same text everywhere.
    field: ColumnElement[Any] = t.c.payload.op("->>")(literal_column(f"'{lim.by}'", Text()))
    return field


def running_count(t: Any, column: Any, value: str) -> ColumnElement[int]:
    """How many jobs whose ``column`` is ``value`` are running now."""
    return (
        select(func.count())
        .select_from(t)
        .where(t.c.status == running_literal(t), column == value)
        .scalar_subquery()
    )


def running_by_key(t: Any, lim: Limit, alias: str) -> Any:
    """The running jobs of a per-key limited kind, counted by key (``limit_key, running``)."""
    key = limit_key(t, lim).label("limit_key")
    return (
        select(key, func.count().label("running"))
        .where(t.c.status == running_literal(t), t.c.kind == lim.kind)
        .group_by(literal_column("limit_key"))
        .subquery(alias)
    )


def allowance(t: Any, lim: Limit, log: Any, now: Any) -> ColumnElement[int] | None:
    """How many more jobs of the kind (or queue) may start now, key aside (None: any)."""
    parts: list[ColumnElement[int]] = []
    if lim.running is not None and lim.by is None:
        column = t.c.kind if lim.kind is not None else t.c.queue
        name_ = lim.kind if lim.kind is not None else lim.queue
        assert name_ is not None
        parts.append(literal(lim.running, Integer()) - running_count(t, column, name_))
    if lim.rate is not None and lim.per is not None:
        started = (
            select(func.count())
            .select_from(log)
            .where(log.c.scope == lim.scope, log.c.claimed_at > now - interval(lim.per))
            .scalar_subquery()
        )
        parts.append(literal(lim.rate, Integer()) - started)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else func.least(*parts)


def log_claims(limits: ClaimLimits, claimed: Any, now: Any) -> Insert:
    """Add a row to the rate log for each claimed job of a rate-limited kind."""
    log = limits.log
    kinds = [lim.kind for lim in limits.rated]
    return insert(log).from_select(
        ["scope", "claimed_at"],
        select(literal("kind:", Text()) + claimed.c.kind, now).where(claimed.c.kind.in_(kinds)),
    )


def prune_log(limits: ClaimLimits, now: Any) -> Delete:
    """Delete the rate log's rows that no window of these limits counts any more."""
    log = limits.log
    return delete(log).where(
        or_(
            *(
                and_(log.c.scope == lim.scope, log.c.claimed_at <= now - interval(lim.per))
                for lim in limits.rated
                if lim.per is not None
            )
        )
    )
