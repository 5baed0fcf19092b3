"""Domain events, all the library knows of them in one module.

A domain event class is a subclass of an outbox model without a table of its own. Declaring
one gives it its fields, constructor and registry entry (`prepare_event_class`, called by
`OutboxMixin.__init_subclass__`); `mark_added` records when an instance joined a session;
`event_record` gives the values of its outbox row (payload, aggregate, headers) and
`decode_event` turns a row back into the event. Writing the rows at flush is the events
layer's job (`sa_outbox.events`), through the names here, none of them private.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import inspect as pyinspect
import itertools
import json
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from sqlalchemy import inspect
from sqlalchemy.orm import MappedAsDataclass, Mapper

from .._exceptions import InvalidArgument, InvalidArgumentType, PayloadNotSerializable
from .._json import MAX_DEPTH
from .._tracing import current_trace_headers
from .._validation import text as checked_text

_SPEC = "__sa_outbox_event__"


_REGISTRY = "__sa_outbox_event_types__"


_ADDED = "_sa_outbox_added"


_RECORDED = "_sa_outbox_recorded_at"


_TRACE = "_sa_outbox_trace"


_MISSING = object()


#: Orders events by the moment they were added to a session (ties between sessions are
#: harmless: order only matters inside one transaction).
_add_order = itertools.count()


class UnknownEventType(InvalidArgument, LookupError):
    """An outbox row whose ``event_type`` names no registered domain event class.

    Examples:
        >>> raise UnknownEventType("no domain event class is registered for 'Gone'")
        Traceback (most recent call last):
        ...
        sa_outbox.UnknownEventType: no domain event class is registered for 'Gone'
    """

    __module__ = "sa_outbox"  # its public home, as tracebacks show it


@dataclasses.dataclass(frozen=True, slots=True)
class EventSpec:
    """What the library knows of one domain event class.

    Examples:
        >>> EventSpec("OrderPlaced", ("order", "total_cents"), {}, None, None).fields
        ('order', 'total_cents')
    """

    event_type: str
    fields: tuple[str, ...]
    defaults: Mapping[str, Any]
    aggregate: str | None
    aggregate_type: str | None
    #: The fields' annotations as declared (strings under ``from __future__ import
    #: annotations``), resolved when a row is decoded.
    annotations: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    module: str = __name__


@dataclasses.dataclass(frozen=True, slots=True)
class EventRecord:
    """A domain event as the values of its outbox row (`event_record`).

    The statements layer's `sa_outbox.statements.NewEvent` takes the same fields.

    Examples:
        >>> EventRecord("OrderPlaced", "order", "42", {"total_cents": 1200}, {}, None).aggregate_id
        '42'
    """

    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    headers: dict[str, Any]
    #: The message id (the row's id) when the event has one.
    id: uuid.UUID | None


def _table_owner(cls: type) -> type | None:
    """The mapped class in ``cls``'s bases that owns the outbox table, if any."""
    for base in cls.__mro__[1:]:
        if "__table__" in base.__dict__ and "__tablename__" in base.__dict__:
            return base
    return None


def prepare_event_class(cls: type) -> None:
    """Turn a subclass of an outbox model into a domain event class (no-op for others).

    Called by `OutboxMixin.__init_subclass__` before SQLAlchemy maps the class.

    Examples:
        >>> class NotAnEvent:
        ...     pass
        >>> prepare_event_class(NotAnEvent)  # no outbox table among its bases: left alone
    """
    owner = _table_owner(cls)
    if owner is None or "__tablename__" in cls.__dict__:
        return
    if cls.__dict__.get("__abstract__", False):
        return
    columns = set(owner.__table__.columns.keys()) | set(dir(owner))  # type: ignore[attr-defined]
    fields: list[str] = []
    defaults: dict[str, Any] = {}
    declared: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is owner or not issubclass(klass, owner):
            continue
        for name, annotation in annotations_of(klass).items():
            if name.startswith("_") or _is_classvar(annotation):
                continue
            if _is_mapped(annotation):
                raise InvalidArgument(
                    f"domain event {cls.__name__} declares a mapped column {name!r}: events "
                    "live in the outbox table's payload, declare plain fields instead"
                )
            if name in columns and name not in fields:
                raise InvalidArgument(
                    f"field {name!r} of domain event {cls.__name__} clashes with the outbox "
                    f"model {owner.__name__}'s attribute of that name: rename the field"
                )
            if name not in fields:
                fields.append(name)
            declared[name] = annotation
            value = klass.__dict__.get(name, _MISSING)
            if value is not _MISSING:
                defaults[name] = value
            elif name in defaults and klass is cls:
                del defaults[name]
    event_type = checked_text(cls.__dict__.get("__event_type__", cls.__name__), "__event_type__")
    aggregate = getattr(cls, "__aggregate__", None)
    if aggregate is not None and aggregate not in fields:
        raise InvalidArgument(
            f"__aggregate__ of domain event {cls.__name__} names {aggregate!r}, which is not "
            f"one of its fields {fields}"
        )
    aggregate_type = getattr(cls, "__aggregate_type__", None)
    if aggregate_type is not None:
        checked_text(aggregate_type, "__aggregate_type__")
    spec = EventSpec(
        event_type,
        tuple(fields),
        dict(defaults),
        aggregate,
        aggregate_type,
        declared,
        cls.__module__,
    )
    setattr(cls, _SPEC, spec)
    if issubclass(cls, MappedAsDataclass):
        # SQLAlchemy would make the fields dataclass fields after the model's defaulted ones
        # (an error); they are plain attributes our own __init__ sets, so hide them from it.
        own = cls.__annotations__  # its own dict (per class since Python 3.10), mutated here
        for name in fields:
            own.pop(name, None)
    cls.__init__ = _make_init(cls.__name__, spec)  # type: ignore[misc]
    cls.__repr__ = _event_repr  # type: ignore[method-assign, assignment]
    _register(owner, event_type, cls)


def annotations_of(klass: type) -> dict[str, Any]:
    """The annotations ``klass`` itself declares (not its bases'), unevaluated."""
    return pyinspect.get_annotations(klass)


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return typing.get_origin(annotation) is ClassVar


def _is_mapped(annotation: object) -> bool:
    from sqlalchemy.orm import Mapped

    if isinstance(annotation, str):
        return annotation.startswith(("Mapped[", "orm.Mapped[", "sqlalchemy.orm.Mapped["))
    return typing.get_origin(annotation) is Mapped


def _make_init(class_name: str, spec: EventSpec) -> Any:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(spec.fields):
            raise TypeError(
                f"{class_name}() takes {len(spec.fields)} positional arguments "
                f"({', '.join(spec.fields)}), got {len(args)}"
            )
        values = dict(zip(spec.fields, args, strict=False))
        for name, value in kwargs.items():
            if name not in spec.fields:
                raise TypeError(f"{class_name}() got an unexpected field {name!r}")
            if name in values:
                raise TypeError(f"{class_name}() got field {name!r} twice")
            values[name] = value
        missing = [n for n in spec.fields if n not in values and n not in spec.defaults]
        if missing:
            raise TypeError(f"{class_name}() is missing field(s): {', '.join(missing)}")
        for name in spec.fields:
            value = values.get(name, _MISSING)
            if value is _MISSING:
                value = spec.defaults[name]
                if isinstance(value, list | dict | set):
                    value = type(value)(value)  # a fresh copy, never a shared default
            object.__setattr__(self, name, value)

    init.__name__ = "__init__"
    init.__qualname__ = f"{class_name}.__init__"
    return init


def _event_repr(self: Any) -> str:
    spec: EventSpec = getattr(type(self), _SPEC)
    fields = ", ".join(f"{name}={getattr(self, name, None)!r}" for name in spec.fields)
    return f"{type(self).__name__}({fields})"


def _register(owner: type, event_type: str, cls: type) -> None:
    registry: dict[str, type] = owner.__dict__.get(_REGISTRY) or {}
    if _REGISTRY not in owner.__dict__:
        setattr(owner, _REGISTRY, registry)
    known = registry.get(event_type)
    if known is not None and (known.__module__, known.__qualname__) != (
        cls.__module__,
        cls.__qualname__,
    ):
        raise InvalidArgument(
            f"event type {event_type!r} is already registered by "
            f"{known.__module__}.{known.__qualname__}: give {cls.__qualname__} another name "
            "(set __event_type__)"
        )
    registry[event_type] = cls  # a redefinition (same module and name) replaces the old one


def event_types(model: type) -> Mapping[str, type]:
    """The domain event classes of an outbox model, by event type name.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import OutboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> class UserSignedUp(OutboxEvent):
        ...     __aggregate__ = "user_id"
        ...     __aggregate_type__ = "user"
        ...     user_id: int
        >>> list(event_types(OutboxEvent))
        ['UserSignedUp']
    """
    owner = model if "__tablename__" in model.__dict__ else _table_owner(model)
    return types.MappingProxyType(dict(getattr(owner, _REGISTRY, {}) if owner else {}))


def is_domain_event(obj: object) -> bool:
    """Whether ``obj`` is an instance of a domain event class.

    Examples:
        >>> is_domain_event(object())
        False
    """
    return hasattr(type(obj), _SPEC)


def spec_of(obj: object) -> EventSpec:
    return spec_of_class(type(obj))


def field_values(event: object) -> list[Any]:
    """The values of an event's fields, in declaration order."""
    return [getattr(event, name, None) for name in spec_of(event).fields]


def mark_added(event: object) -> None:
    """Record when an event joined a session: its order in the outbox, its time, and the
    trace context current then (`added_trace`)."""
    if getattr(event, _ADDED, None) is None:
        object.__setattr__(event, _ADDED, next(_add_order))
        object.__setattr__(event, _RECORDED, dt.datetime.now(dt.UTC))
        object.__setattr__(event, _TRACE, current_trace_headers())


def added_trace(event: object) -> dict[str, str] | None:
    """The W3C trace fields current when the event joined a session (``None``: none)."""
    return getattr(event, _TRACE, None)


def added_order(event: object) -> int:
    order = getattr(event, _ADDED, None)
    if order is None:
        mark_added(event)
        order = getattr(event, _ADDED)
    return order  # type: ignore[no-any-return]


def spec_of_class(cls: type) -> EventSpec:
    return getattr(cls, _SPEC)  # type: ignore[no-any-return]


def event_record(event: Any, *, provisional: bool = False) -> EventRecord:
    """The values of a domain event's outbox row, once its aggregate has a primary key.

    ``provisional=True`` builds them before that: an entity without a primary key yet stands
    as ``0``, so the row can be checked (`sa_outbox.statements.check_event`) before the
    flush writes anything; the real row is built once the key exists.

    The aggregate is the field named by ``__aggregate__``, else the first field that holds an
    ORM entity. An entity field is stored as its primary key; datetimes, dates, UUIDs,
    Decimals and enums as their JSON-friendly forms. A value JSON cannot hold raises
    `PayloadNotSerializable` naming the event class and the field. The headers carry the
    time the event joined its session (``recorded_at``), its message id and the trace
    context current then.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import OutboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class OutboxEvent(OutboxMixin, Base): __tablename__ = "outbox"
        >>> class UserSignedUp(OutboxEvent):
        ...     __aggregate__ = "user_id"
        ...     __aggregate_type__ = "user"
        ...     user_id: int
        >>> row = event_record(UserSignedUp(user_id=7))
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
    return EventRecord(
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
