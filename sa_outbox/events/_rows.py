"""A domain event as an outbox row and back: `event_row` (at flush) and `decode_event`."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.orm import Mapper

from .._exceptions import InvalidArgument, InvalidArgumentType, PayloadNotSerializable
from .._json import MAX_DEPTH
from ..schema._event_types import (
    _RECORDED,
    EventSpec,
    UnknownEventType,
    added_trace,
    event_types,
    is_domain_event,
    mark_added,
    spec_of,
    spec_of_class,
)
from ..statements import NewEvent


def event_row(event: Any, *, provisional: bool = False) -> NewEvent:
    """The outbox row of a domain event, once its aggregate has a primary key.

    ``provisional=True`` builds it before that: an entity without a primary key yet stands
    as ``0``, so the row can be checked (`sa_outbox.statements.check_event`) before the
    flush writes anything; the real row is built once the key exists.

    The aggregate is the field named by ``__aggregate__``, else the first field that holds an
    ORM entity. An entity field is stored as its primary key; datetimes, dates, UUIDs,
    Decimals and enums as their JSON-friendly forms. A value JSON cannot hold raises
    `PayloadNotSerializable` naming the event class and the field.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import OutboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> class UserSignedUp(OutboxEvent):
        ...     __aggregate__ = "user_id"
        ...     __aggregate_type__ = "user"
        ...     user_id: int
        >>> row = event_row(UserSignedUp(user_id=7))
        >>> row.aggregate_type, row.aggregate_id, row.payload
        ('user', '7', {'user_id': 7})
    """
    spec = spec_of(event)
    name = type(event).__name__
    # The payload is an object (one level): its fields start at depth 1.
    payload = {
        field: _jsonable(getattr(event, field), f"{name}.{field}", 1, provisional)
        for field in spec.fields
    }
    aggregate_type, aggregate_id = _aggregate(event, spec, name, provisional)
    mark_added(event)
    recorded: dt.datetime = getattr(event, _RECORDED)
    event_id = event.id if isinstance(getattr(event, "id", None), uuid.UUID) else None
    # The trace context current when the event was added (docs/tracing.md), if any.
    headers: dict[str, Any] = dict(added_trace(event) or {})
    headers["recorded_at"] = recorded.isoformat()
    if event_id is not None:
        headers["message_id"] = str(event_id)
    return NewEvent(
        event_type=spec.event_type,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        payload=payload,
        headers=headers,
        id=event_id,
    )


def _aggregate(event: Any, spec: EventSpec, name: str, provisional: bool) -> tuple[str, str]:
    field = spec.aggregate
    if field is None:
        field = next((f for f in spec.fields if _mapper_of(getattr(event, f)) is not None), None)
    if field is None:
        raise InvalidArgument(
            f"domain event {name} has no aggregate: give it a field holding an ORM entity, or "
            "set __aggregate__ = '<field>' and __aggregate_type__ = '<type>'"
        )
    value = getattr(event, field)
    mapper = _mapper_of(value)
    if mapper is not None:
        key = _primary_key(value, mapper, f"{name}.{field}", provisional)
        return spec.aggregate_type or mapper.class_.__name__, key
    if spec.aggregate_type is None:
        raise InvalidArgument(
            f"domain event {name}: __aggregate__ field {field!r} holds "
            f"{type(value).__name__}, not an ORM entity, so set __aggregate_type__ as well"
        )
    if value is None or isinstance(value, bool) or not isinstance(value, str | int | uuid.UUID):
        raise InvalidArgumentType(
            f"domain event {name}: aggregate field {field!r} must hold an ORM entity, a str, "
            f"an int or a UUID, got {type(value).__name__}"
        )
    return spec.aggregate_type, str(value)


def _mapper_of(value: object) -> Mapper[Any] | None:
    if value is None or isinstance(value, type) or is_domain_event(value):
        return None
    state = inspect(value, raiseerr=False)
    mapper = getattr(state, "mapper", None)
    return mapper if isinstance(mapper, Mapper) else None


def _key_of(value: object, mapper: Mapper[Any], where: str, provisional: bool) -> list[Any]:
    key = mapper.primary_key_from_instance(value)
    if any(part is None for part in key):
        if provisional:  # the flush gives it a key before the real row is built
            return [0 if part is None else part for part in key]
        raise InvalidArgument(
            f"{where} refers to a {mapper.class_.__name__} that has no primary key yet: add it "
            "to the session (it is flushed before the event's row is written)"
        )
    return list(key)


def _primary_key(value: object, mapper: Mapper[Any], where: str, provisional: bool) -> str:
    key = _key_of(value, mapper, where, provisional)
    if len(key) == 1:
        return str(key[0])
    return json.dumps([_jsonable(k, where, 1, provisional) for k in key])


def _jsonable(value: Any, where: str, depth: int = 0, provisional: bool = False) -> Any:
    """``value`` in a form JSON holds, or `PayloadNotSerializable` naming ``where``.

    ``depth`` counts the containers around ``value`` (the payload object itself is one):
    past `MAX_DEPTH`, `InvalidArgument`, long before Python runs out of recursion.
    """
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise PayloadNotSerializable(f"{where} is {value}, which JSON cannot hold")
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, where, depth, provisional)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, Mapping | list | tuple) and depth >= MAX_DEPTH:
        raise InvalidArgument(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadNotSerializable(
                    f"{where} has a key {key!r} of type {type(key).__name__}: JSON keys are str"
                )
            out[key] = _jsonable(item, f"{where}[{key!r}]", depth + 1, provisional)
        return out
    if isinstance(value, list | tuple):
        return [
            _jsonable(item, f"{where}[{i}]", depth + 1, provisional) for i, item in enumerate(value)
        ]
    mapper = _mapper_of(value)
    if mapper is not None:
        key = _key_of(value, mapper, where, provisional)
        return _jsonable(key[0] if len(key) == 1 else key, where, depth, provisional)
    raise PayloadNotSerializable(
        f"{where} holds a {type(value).__name__}, which is not JSON-serialisable (use str, "
        "int, float, bool, None, lists, dicts, datetimes, UUIDs, Decimals, enums or ORM entities)"
    )


def decode_event(model: type, row: Any, *, session: Any = None) -> Any:
    """Turn an outbox row (a `ClaimedEvent`, a row or a model instance) back into its event.

    The class comes from the registry of ``model`` (the outbox model) by ``event_type``;
    fields are converted back by their annotations (datetime, date, UUID, Decimal, enums).
    An entity field comes back as the entity when a ``session`` is given (loaded with
    ``session.get``), else as its primary key.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import OutboxMixin
        >>> from sa_outbox.queue import ClaimedEvent
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> class UserSignedUp(OutboxEvent):
        ...     __aggregate__ = "user_id"
        ...     __aggregate_type__ = "user"
        ...     user_id: int
        >>> row = ClaimedEvent(uuid.UUID(int=1), 1, "UserSignedUp", "user", "7", {"user_id": 7},
        ...                    {}, 1, None, uuid.UUID(int=2), None)
        >>> decode_event(OutboxEvent, row)
        UserSignedUp(user_id=7)
    """
    registry = event_types(model)
    cls = registry.get(row.event_type)
    if cls is None:
        known = ", ".join(sorted(registry)) or "none"
        raise UnknownEventType(
            f"no domain event class is registered for {row.event_type!r} on "
            f"{model.__name__} (registered: {known})"
        )
    spec = spec_of_class(cls)
    hints = _resolved(spec)
    payload = row.payload if isinstance(row.payload, Mapping) else {}
    values = {
        name: _from_json(payload[name], hints.get(name), session)
        for name in spec.fields
        if name in payload
    }
    event = cls(**values)
    event.id = row.id  # the message id travels with the event
    return event


def _resolved(spec: EventSpec) -> dict[str, Any]:
    holder = type(
        "_Fields", (), {"__annotations__": dict(spec.annotations), "__module__": spec.module}
    )
    try:
        return typing.get_type_hints(holder)
    except Exception:  # a name the module cannot resolve (a class local to a function)
        return {}


def _from_json(value: Any, hint: Any, session: Any) -> Any:
    if value is None or hint is None:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _from_json(value, options[0], session) if len(options) == 1 else value
    if not isinstance(hint, type):
        return value
    mapper: Any = inspect(hint, raiseerr=False)
    if isinstance(mapper, Mapper):
        if session is None:
            return value
        return session.get(hint, tuple(value) if isinstance(value, list) else value)
    converters: list[tuple[type, Any]] = [
        (dt.datetime, dt.datetime.fromisoformat),
        (dt.date, dt.date.fromisoformat),
        (dt.time, dt.time.fromisoformat),
        (uuid.UUID, uuid.UUID),
        (decimal.Decimal, decimal.Decimal),
        (enum.Enum, hint),
    ]
    for kind, convert in converters:
        if issubclass(hint, kind):
            return convert(value)
    return value
