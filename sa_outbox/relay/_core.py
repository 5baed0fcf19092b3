"""What `Relay` and `AsyncRelay` share: turning a publish's outcome into the plan, and the
database writes that end a cycle (one transaction: mark, reject, release).

Examples:
    >>> describe(TimeoutError("no answer"))
    'TimeoutError: no answer'
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import tenacity
from sqlalchemy.exc import InterfaceError, OperationalError

from .._exceptions import InvalidArgumentType
from .._pooler import note_prepared_statement_error
from .._validation import storable_text
from ..ops import Op, OutboxOps
from ..queue import ClaimedEvent
from ._config import RelaySettings
from ._plan import BatchPlan, RelayReport
from ._publisher import EventsRejected, Publisher, PublisherUnavailable, reset_publisher

__all__ = [
    "LOGGER",
    "RESET_TIMEOUT",
    "RETRYABLE",
    "GuardedPublisher",
    "describe",
    "finish",
    "log_report",
    "log_retry",
    "require_publisher",
    "retry_wait",
    "retryable",
    "settle",
]

LOGGER = logging.getLogger("sa_outbox.relay")
#: What the relay's loop backs off from and retries: a broker it cannot reach, and a
#: database it cannot reach (restarted, connection killed) or a deadlock.
RETRYABLE: tuple[type[BaseException], ...] = (
    PublisherUnavailable,
    OperationalError,
    InterfaceError,
)


def retryable(engine: Any) -> Callable[[BaseException], bool]:
    """What the relay's loop retries on ``engine``: `RETRYABLE`, and a prepared statement
    error through a pooler (after which the engine's connections prepare nothing).

    Examples:
        >>> from sqlalchemy import create_engine
        >>> retry = retryable(create_engine("postgresql+psycopg://"))
        >>> retry(PublisherUnavailable("down")), retry(ValueError("bug"))
        (True, False)
    """

    def retry(error: BaseException) -> bool:
        return isinstance(error, RETRYABLE) or note_prepared_statement_error(engine, error)

    return retry


#: ``last_error`` keeps at most this many characters of an error.
MAX_ERROR_LENGTH = 2000


def describe(error: BaseException) -> str:
    """An error as ``last_error`` keeps it: its type and message, capped.

    Examples:
        >>> describe(PublisherUnavailable("connection refused"))
        'connection refused'
    """
    if isinstance(error, EventsRejected | PublisherUnavailable):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    # A broker's message may hold a NUL or a lone surrogate: written as it is, last_error
    # would fail the cycle's whole transaction (and the relay with it).
    return storable_text((text or type(error).__name__)[:MAX_ERROR_LENGTH])


#: The longest the relay waits for a publisher's ``reset()`` (at most the publish timeout):
#: the connection it drops is dead, nothing is worth waiting for on it.
RESET_TIMEOUT = 5.0


class GuardedPublisher:
    """One publish within ``timeout``; after one that timed out or was cancelled, the
    publisher's ``reset()`` (`sa_outbox.relay.reset_publisher`), so that the next publish
    does not reuse a connection the network left half-open.

    The first reset of a run of failed publishes is logged as a warning, the next ones at
    debug level, and the first publish that succeeds after them at info level.

    Examples:
        >>> import asyncio
        >>> class Silent:
        ...     async def publish(self, events):
        ...         await asyncio.sleep(60)  # a broker behind a network that went silent
        ...     async def aclose(self): ...
        ...     async def reset(self):
        ...         print("reset")
        >>> guarded = GuardedPublisher("relay-1", 0.01)
        >>> try:
        ...     asyncio.run(guarded.publish(Silent(), []))
        ... except PublisherUnavailable as exc:
        ...     print(exc)
        reset
        the publisher did not finish within 0.01 s (its connection was reset)
        >>> guarded.resets
        1
    """

    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        #: Publishes cut short (timed out or cancelled) since the last one that succeeded.
        self.resets = 0

    async def publish(self, publisher: Publisher, events: Sequence[ClaimedEvent]) -> None:
        """``publisher.publish(events)`` within the timeout, resetting it after a timeout
        (then raises `PublisherUnavailable`) or a cancellation (then re-raises it)."""
        try:
            async with asyncio.timeout(self.timeout) as within:
                await publisher.publish(events)
        except TimeoutError:
            if not within.expired():
                raise  # the publisher's own TimeoutError, not the relay's timeout
            what = f"the publisher did not finish within {self.timeout} s"
            if await self.reset(publisher, what):
                what += " (its connection was reset)"
            raise PublisherUnavailable(what) from None
        except asyncio.CancelledError:
            await self.reset(publisher, "the publish was cancelled")
            raise
        if self.resets:
            LOGGER.info(
                "relay %s: publishing again (after %d publish%s cut short)",
                self.name,
                self.resets,
                "es" if self.resets != 1 else "",
            )
            self.resets = 0

    async def reset(self, publisher: Publisher, what: str) -> bool:
        """Reset the publisher (bounded by `RESET_TIMEOUT`), logging ``what`` happened;
        returns whether it was reset."""
        self.resets += 1
        level = logging.WARNING if self.resets == 1 else logging.DEBUG
        try:
            async with asyncio.timeout(min(RESET_TIMEOUT, self.timeout)):
                had_reset = await reset_publisher(publisher)
        except Exception as exc:  # a timeout too: the next publish still tries afresh
            LOGGER.warning(
                "relay %s: %s; resetting the publisher failed: %s", self.name, what, describe(exc)
            )
            return False
        if had_reset:
            LOGGER.log(
                level,
                "relay %s: %s: its connection was reset (a network gone silent leaves it "
                "half-open); the next publish reconnects",
                self.name,
                what,
            )
        else:
            LOGGER.log(
                level, "relay %s: %s (the publisher has no reset() to drop it)", self.name, what
            )
        return had_reset


def settle(
    plan: BatchPlan, wave: Sequence[ClaimedEvent], error: BaseException | None
) -> list[ClaimedEvent]:
    """Record how publishing ``wave`` ended; returns events to publish one by one, if any.

    No error: all published. `EventsRejected`: those rejected, the others published.
    `PublisherUnavailable`: the whole batch stops. Anything else on one event: rejected
    with that error; on several: they are tried again one by one, to find the culprit.

    Examples:
        >>> plan = BatchPlan([])
        >>> settle(plan, [], None)
        []
    """
    if error is None:
        plan.published(wave)
    elif isinstance(error, EventsRejected):
        plan.published([e for e in wave if e.id not in error.rejected])
        for event in wave:
            if event.id in error.rejected:
                reason = storable_text(error.rejected[event.id][:MAX_ERROR_LENGTH])
                plan.reject(event, reason or "rejected")
    elif isinstance(error, PublisherUnavailable):
        plan.unreachable(wave, describe(error))
    elif len(wave) == 1:
        plan.reject(wave[0], describe(error))
    else:
        return list(wave)
    return []


def finish(ops: OutboxOps, plan: BatchPlan, relay: str, max_attempts: int) -> Op[RelayReport]:
    """The writes that end a cycle, in one transaction; returns the cycle's report.

    Only a rejection counts against ``max_attempts``: the events tried while the broker was
    unreachable are given back with their claim's attempt taken back (and ``last_error``
    set), so however long an outage lasts, an event is parked only after ``max_attempts``
    answers of the broker that refused it.
    """
    lost = parked = 0
    parked_ids: tuple[uuid.UUID, ...] = ()
    published = plan.published_pairs()
    if published:
        lost += len((yield from ops.mark_published_many(published)).lost)
    rejected = plan.rejected_triples()
    if rejected:
        results = yield from ops.reject_many(rejected, max_attempts)
        parked_ids = tuple(r.id for r in results if r.parked)
        parked = len(parked_ids)
        lost += len(rejected) - len(results)
    unreachable = plan.unreachable_pairs()
    if unreachable:
        lost += len((yield from ops.release_many(unreachable, plan.unavailable, False)).lost)
    untried = plan.untried_pairs()
    if untried:
        lost += len((yield from ops.release_many(untried, None, False)).lost)
    return plan.report(relay, parked=parked, lost=lost, parked_ids=parked_ids)


def retry_wait(settings: RelaySettings) -> tenacity.wait.wait_base:
    """The loop's backoff: ``retry_initial · 2^(n-1)`` capped at ``retry_max``, plus up to
    ``retry_initial`` of jitter, so relays that lost the same broker do not retry in step.

    Examples:
        >>> wait = retry_wait(RelaySettings.build(retry_initial=1, retry_max=4))
        >>> isinstance(wait, tenacity.wait.wait_base)
        True
    """
    initial = settings.retry_initial.total_seconds()
    return tenacity.wait_exponential(
        multiplier=initial, max=settings.retry_max.total_seconds()
    ) + tenacity.wait_random(0, initial)


def require_publisher(publisher: object) -> None:
    """A relay's publisher: a `Publisher`, else `InvalidArgumentType`.

    Examples:
        >>> try:
        ...     require_publisher(print)
        ... except InvalidArgumentType as exc:
        ...     print(str(exc).split(",")[0])
        publisher must have async publish(events) and aclose()
    """
    if not isinstance(publisher, Publisher):
        raise InvalidArgumentType(
            f"publisher must have async publish(events) and aclose(), got {publisher!r}"
        )


def log_report(report: RelayReport) -> None:
    """Log a cycle's report: a warning when anything went wrong, else at debug level.

    Examples:
        >>> log_report(RelayReport("relay-1"))  # nothing to say
    """
    if report.rejected or report.lost or report.unavailable:
        LOGGER.warning(
            "relay %s: %d published, %d rejected (%d parked), %d released, %d lost%s",
            report.relay,
            report.published,
            report.rejected,
            report.parked,
            report.released,
            report.lost,
            f"; broker unavailable: {report.unavailable}" if report.unavailable else "",
        )
    elif report.published:
        LOGGER.debug("relay %s: %d published", report.relay, report.published)


def log_retry(name: str) -> Callable[[tenacity.RetryCallState], None]:
    """The relay loop's ``before_sleep``: logs why it backs off, and for how long.

    Examples:
        >>> callable(log_retry("relay-1"))
        True
    """

    def log(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        LOGGER.warning(
            "relay %s: %s; trying again in %.1f s",
            name,
            describe(error) if error else "failed",
            delay,
        )

    return log
