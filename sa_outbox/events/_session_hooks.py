"""The unit of work: ``session.add(event)`` becomes an outbox row at flush; ``enqueue(session, …)``.

`install` attaches three listeners to a session factory (or class, or instance):

- ``transient_to_pending`` notes the order in which events joined the session, gives each a
  time-ordered id (its message id) and the time it was recorded;
- ``before_flush`` takes the pending events out of the session, so the ORM never inserts
  them itself, and writes the rows of those whose entities already exist;
- ``after_flush`` — when every INSERT of the flush has run, so an aggregate created by the
  same flush has its primary key — writes the rest, kept meanwhile in the flush's own context
  (nothing outlives a failed flush).

Rows are written with one statement per flush step, in the order the events were added, on
the flush's connection: they commit or roll back with the rest of the unit of work,
savepoints included.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import Connection, Engine, Executable, event, inspect
from sqlalchemy.orm import Session, UOWTransaction, scoped_session, sessionmaker

from .._exceptions import InvalidArgument, InvalidArgumentType, SaOutboxError
from .._ids import uuid7
from .._tracing import current_trace_headers
from ..queue import AsyncJobQueue, EnqueueResult, JobQueue
from ..schema import JobMixin, OutboxMixin, resolve_table
from ..schema._event_types import (
    added_order,
    event_record,
    field_values,
    is_domain_event,
    mark_added,
)
from ..statements import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    NewEvent,
    NewJob,
    Unique,
    append_events,
    check_event,
)

if TYPE_CHECKING:
    import datetime as dt

    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..ops import AsyncConn

__all__ = ["JOB_MODEL_INFO_KEY", "enqueue", "install"]

#: Key of ``Session.info`` naming the job model `enqueue` uses when none is given.
JOB_MODEL_INFO_KEY = "sa_outbox.job_model"
_FLUSH_KEY = "sa_outbox.events"


def _on_pending(session: Session, instance: object) -> None:
    if is_domain_event(instance):
        mark_added(instance)
        if getattr(instance, "id", None) is None:
            instance.id = uuid7()  # type: ignore[attr-defined]


def _before_flush(session: Session, flush_context: UOWTransaction, instances: object) -> None:
    events = sorted((obj for obj in session.new if is_domain_event(obj)), key=added_order)
    if not events:
        return
    # An event whose aggregate this flush creates must wait for its INSERT (after_flush).
    # The others are written now: a flush left with nothing else to do returns before
    # after_flush. From the first event that waits, all wait, to keep the order they were
    # added in; a waiting event's pending aggregate keeps the flush going to after_flush.
    first_waiting = next((i for i, obj in enumerate(events) if _waits_for_flush(obj)), None)
    now = events if first_waiting is None else events[:first_waiting]
    later = [] if first_waiting is None else events[first_waiting:]
    # Every event is checked before the session changes and before the flush sends any SQL
    # (before_flush runs ahead of the flush's transaction): a bad one raises here, stays in
    # the session, and the caller's transaction is untouched. The waiting ones are checked
    # with their aggregate's future key standing as 0 (`_event_row(provisional=True)`).
    statements = _statements(now)
    for obj in later:
        check_event(_event_row(obj, provisional=True))
    for obj in events:
        session.expunge(obj)
    _execute(session, statements)
    if later:
        flush_context.attributes.setdefault(_FLUSH_KEY, []).extend(later)


def _after_flush(session: Session, flush_context: UOWTransaction) -> None:
    events: list[Any] | None = flush_context.attributes.pop(_FLUSH_KEY, None)
    if events:
        _execute(session, _statements(events))


def _waits_for_flush(event_obj: object) -> bool:
    """Whether the event refers to an entity this flush is about to INSERT."""
    for value in field_values(event_obj):
        for item in value if isinstance(value, list | tuple) else (value,):
            state = inspect(item, raiseerr=False)
            if getattr(state, "pending", False):
                return True
    return False


def _event_row(event: object, *, provisional: bool = False) -> NewEvent:
    """The outbox row `append_events` writes for a domain event (`event_record`'s values)."""
    record = event_record(event, provisional=provisional)
    return NewEvent(
        event_type=record.event_type,
        aggregate_type=record.aggregate_type,
        aggregate_id=record.aggregate_id,
        payload=record.payload,
        headers=record.headers,
        id=record.id,
    )


def _statements(events: list[Any]) -> list[tuple[type, Executable]]:
    """One `append_events` per outbox table, built (so checked) before anything runs."""
    return [
        (model, append_events(model, [_event_row(obj) for obj in group])[0])
        for model, group in _by_table(events)
    ]


def _execute(session: Session, statements: list[tuple[type, Executable]]) -> None:
    for model, stmt in statements:
        session.connection(bind_arguments={"mapper": inspect(model)}).execute(stmt)


def _by_table(events: list[Any]) -> Iterator[tuple[type, list[Any]]]:
    groups: dict[Any, tuple[type, list[Any]]] = {}
    for obj in events:
        table = type(obj).__table__
        groups.setdefault(table, (type(obj), []))[1].append(obj)
    yield from groups.values()


@event.listens_for(OutboxMixin, "before_insert", propagate=True)
def _before_insert(mapper: Any, connection: Connection, target: Any) -> None:
    # A plain outbox row the ORM inserts (session.add(OutboxEvent(...))): the current trace
    # context joins its headers, under those set on it.
    if not is_domain_event(target):
        trace = current_trace_headers()
        own = target.headers
        if trace is not None and (own is None or isinstance(own, Mapping)):
            target.headers = {**trace, **(own or {})}
        return
    # With the hooks installed, events never reach the ORM's INSERT: they are taken out in
    # before_flush. Reaching here means this session has no hooks.
    if is_domain_event(target):
        raise SaOutboxError(
            f"{type(target).__name__} was flushed by a session without sa-outbox's hooks, so "
            "it would not become an outbox row: call sa_outbox.install(<your sessionmaker, "
            "Session class or db.session>) once at startup"
        )


_LISTENERS = (
    ("transient_to_pending", _on_pending),
    ("before_flush", _before_flush),
    ("after_flush", _after_flush),
)


# event.contains() is unreliable for session targets (it answers True for a new
# sessionmaker that reuses the id of a collected one), so installed targets are kept here.
_installed: weakref.WeakSet[Any] = weakref.WeakSet()


def _listen(target: Any) -> None:
    try:
        if target in _installed:
            return
        _installed.add(target)
    except TypeError:  # not weak-referenceable: the listeners are idempotent anyway
        pass
    for name, listener in _LISTENERS:
        event.listen(target, name, listener)


def install(target: Any, *, job_model: type | None = None) -> None:
    """Make ``session.add(event)`` write outbox rows, on the sessions ``target`` makes.

    ``target`` is a `sessionmaker`, a `scoped_session` (Flask-SQLAlchemy's ``db.session``,
    or the ``db`` object itself), a `Session` subclass or instance, an
    ``async_sessionmaker``, or an ``AsyncSession`` instance or subclass. Installing twice
    is harmless. ``job_model`` names the job model `enqueue` uses on these sessions
    (needed only when the application maps more than one).

    Examples:
        from sqlalchemy.orm import sessionmaker
        import sa_outbox

        SessionLocal = sessionmaker(engine)
        sa_outbox.install(SessionLocal)
    """
    factory_kw: dict[str, Any] | None = None
    if isinstance(target, scoped_session):
        _listen(target)
        factory_kw = target.session_factory.kw
    elif isinstance(target, sessionmaker):
        _listen(target)
        factory_kw = target.kw
    elif isinstance(target, Session) or (isinstance(target, type) and issubclass(target, Session)):
        _listen(target)
        if isinstance(target, Session):
            factory_kw = {"info": target.info}
    elif isinstance(getattr(target, "session", None), scoped_session):  # Flask-SQLAlchemy
        install(target.session, job_model=job_model)
        return
    else:
        factory_kw = _install_async(target)
    if job_model is not None and factory_kw is not None:
        resolve_table(job_model)
        factory_kw.setdefault("info", {})[JOB_MODEL_INFO_KEY] = job_model


def _install_async(target: Any) -> dict[str, Any] | None:
    sync_session = getattr(target, "sync_session", None)
    if isinstance(sync_session, Session):  # an AsyncSession instance
        _listen(sync_session)
        return {"info": sync_session.info}
    kw = getattr(target, "kw", None)
    if isinstance(kw, dict) and type(target).__name__ == "async_sessionmaker":
        kw["sync_session_class"] = _own_session_class(kw.get("sync_session_class") or Session)
        return kw
    if isinstance(target, type) and hasattr(target, "sync_session_class"):
        if target.__module__ == "sqlalchemy.ext.asyncio.session":
            raise InvalidArgument(
                "install() on SQLAlchemy's own AsyncSession class would reach every session of "
                "the process: install on your async_sessionmaker, or an AsyncSession subclass"
            )
        target.sync_session_class = _own_session_class(target.sync_session_class)
        return None
    raise InvalidArgumentType(
        "install() takes a sessionmaker, scoped_session, Session (class or instance), "
        "async_sessionmaker, AsyncSession (subclass or instance) or Flask-SQLAlchemy, "
        f"got {target!r}"
    )


def _own_session_class(base: type[Session]) -> type[Session]:
    """A subclass of ``base`` carrying the listeners, so ``base``'s other users are untouched."""
    if getattr(base, "_sa_outbox_hooks", False):
        return base
    own = type(f"SaOutbox{base.__name__}", (base,), {"_sa_outbox_hooks": True})
    _listen(own)
    return own


_queues: weakref.WeakKeyDictionary[type, tuple[JobQueue, AsyncJobQueue]] = (
    weakref.WeakKeyDictionary()
)


def _queues_for(model: type) -> tuple[JobQueue, AsyncJobQueue]:
    queues = _queues.get(model)
    if queues is None:
        queues = _queues[model] = (JobQueue(model), AsyncJobQueue(model))
    return queues


def _job_model(session: Any, model: type | None) -> type:
    if model is not None:
        return model
    info = getattr(session, "info", None)
    if isinstance(info, dict) and info.get(JOB_MODEL_INFO_KEY) is not None:
        return info[JOB_MODEL_INFO_KEY]  # type: ignore[no-any-return]
    found = [cls for cls in _subclasses(JobMixin) if "__table__" in cls.__dict__]
    if len(found) == 1:
        return found[0]
    names = ", ".join(sorted(f"{c.__module__}.{c.__qualname__}" for c in found)) or "none"
    raise InvalidArgument(
        f"enqueue() cannot tell which job model to use (mapped: {names}): pass model=, or "
        "install(session_factory, job_model=...)"
    )


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@overload
def enqueue(
    session: Session | Connection | Engine,
    kind: str,
    payload: Any,
    *,
    model: type | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    deduplication_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    lock_key: str | None = None,
    unique: Unique | None = None,
) -> EnqueueResult: ...


@overload
def enqueue(
    session: AsyncConn | AsyncEngine,
    kind: str,
    payload: Any,
    *,
    model: type | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    deduplication_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    lock_key: str | None = None,
    unique: Unique | None = None,
) -> Awaitable[EnqueueResult]: ...


def enqueue(
    session: Any,
    kind: str,
    payload: Any,
    *,
    model: type | None = None,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    deduplication_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    lock_key: str | None = None,
    unique: Unique | None = None,
) -> EnqueueResult | Awaitable[EnqueueResult]:
    """Add a job in the session's transaction; ``await`` it on an ``AsyncSession``.

    A taken deduplication key is not an error (``ON CONFLICT DO NOTHING``): the user's
    transaction goes on, and the result says ``inserted=False``. The job model is ``model``,
    else the one given to `install`, else the only `JobMixin` model the application maps.
    Given an `Engine` (``AsyncEngine``) instead, the job is one autocommit ``INSERT`` of its
    own, committed when this returns (`JobQueue.enqueue`). ``headers`` and the current
    trace context travel with the job as `JobQueue.enqueue` says (docs/tracing.md);
    ``lock_key`` makes it a serial job (docs/concurrency.md). A ``unique`` job
    (`Unique`) is skipped, ``inserted=False``, while a job with its unique key holds it
    (docs/unique.md).

    Examples:
        with Session(engine) as session, session.begin():
            session.add(order)
            session.flush()
            result = enqueue(session, "send-email", {"order_id": order.id},
                             deduplication_key=f"confirmation:{order.id}")
    """
    sync_queue, async_queue = _queues_for(_job_model(session, model))
    job = NewJob(
        kind,
        payload,
        queue,
        priority,
        run_at,
        delay,
        max_attempts,
        deduplication_key,
        headers,
        lock_key,
        unique,
    )
    # AsyncSession has a sync_session; AsyncConnection and AsyncEngine have a sync_engine.
    if hasattr(session, "sync_session") or hasattr(session, "sync_engine"):
        return async_queue.enqueue_one(session, job)
    return sync_queue.enqueue_one(session, job)
