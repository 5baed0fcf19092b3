"""Domain event classes: a subclass of an outbox model without a table of its own.

Declaring one gives it its fields, constructor and registry entry (`prepare_event_class`,
called by `OutboxMixin.__init_subclass__`); turning one into an outbox row is the events
layer's job (`sa_outbox.events`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect as pyinspect
import itertools
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from sqlalchemy.orm import MappedAsDataclass

from .._exceptions import InvalidArgument
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
