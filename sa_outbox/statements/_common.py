"""Pieces the job and outbox statements share: payloads, clocks, fences, arrays."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import ARRAY, Interval, Table, Text, Uuid, bindparam, cast, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

from .._clock import DATABASE_CLOCK, Clock
from .._exceptions import (
    InvalidArgument,
    InvalidArgumentType,
    PayloadNotSerializable,
    PayloadTooLarge,
)
from .._json import may_be_unstorable_utf8, unstorable_at
from .._validation import as_uuid as as_uuid
from ..schema import resolve_table

#: Default limit of a serialised payload (1 MiB); PostgreSQL's own limit for jsonb is 255 MiB.
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20

Dumps = Callable[[Any], str]


def table_of(target: object) -> Table:
    return resolve_table(target)


def now_of(clock: Clock | None) -> ColumnElement[dt.datetime]:
    if clock is None:
        return DATABASE_CLOCK.sql_now()
    if not isinstance(clock, Clock):
        raise InvalidArgumentType(
            f"clock must have a sql_now() method (DatabaseClock, FakeClock), got {clock!r}"
        )
    return clock.sql_now()


def serialise(payload: Any, what: str, dumps: Dumps, limit: int) -> str:
    """Serialise ``payload`` for a jsonb column, or raise naming ``what`` it belongs to.

    Refused, before any SQL: what JSON cannot encode (`PayloadNotSerializable`), a lone
    surrogate (`PayloadNotSerializable`: not valid UTF-8), a NUL character or more than
    `MAX_DEPTH` levels of nesting (`InvalidArgument`, naming the path of the bad value), and
    more than ``limit`` bytes (`PayloadTooLarge`).

    Examples:
        >>> from sa_outbox.statements import compact_json
        >>> serialise({"to": ["a", "b\\x00"]}, "job kind 'send-email'", compact_json, 1024)
        Traceback (most recent call last):
        ...
        sa_outbox._exceptions.InvalidArgument: payload of job kind 'send-email' at $.to[1]: \
contains a NUL character (\\u0000) at index 1, which PostgreSQL cannot store
    """
    try:
        text = dumps(payload)
    except RecursionError:  # nested too deep for the encoder: say where it goes too deep
        refuse_unstorable(None, payload, what)
        raise  # pragma: no cover - refuse_unstorable always raises without a text
    except (TypeError, ValueError) as exc:
        raise PayloadNotSerializable(f"payload of {what} is not JSON-serialisable: {exc}") from exc
    if not isinstance(text, str):
        raise InvalidArgumentType(f"the dumps function must return str, got {type(text).__name__}")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError:  # a lone surrogate
            size = 0
            refuse_unstorable(text, payload, what)
    if size > limit:
        raise PayloadTooLarge(f"payload of {what} is {size} bytes, over the limit of {limit}")
    if may_be_unstorable_utf8(text):  # it encoded: only NUL and nesting are left to doubt
        refuse_unstorable(text, payload, what)
    return text


def refuse_unstorable(text: str | None, payload: Any, what: str) -> None:
    """Raise if the serialised ``text`` of ``payload`` holds what jsonb cannot store.

    ``text=None`` when serialising ran out of recursion: then it always raises.

    Examples:
        >>> refuse_unstorable('{"a":"fine"}', {"a": "fine"}, "job kind 'k'")
    """
    found = unstorable_at(text, payload)
    if found is None:
        return
    message = f"payload of {what} at {found.path}: {found.problem}"
    if found.not_utf8:
        raise PayloadNotSerializable(message)
    raise InvalidArgument(message)


def jsonb(text: str) -> ColumnElement[Any]:
    """A pre-serialised JSON text as jsonb (serialised once, by `serialise`)."""
    return cast(bindparam(None, text, type_=Text), JSONB)


def interval(delta: dt.timedelta) -> ColumnElement[dt.timedelta]:
    return bindparam(None, delta, type_=Interval)


def id_token_pairs(
    pairs: Iterable[tuple[object, object]], what: str
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Split (id, token) pairs into two UUID lists, checking each."""
    ids: list[uuid.UUID] = []
    tokens: list[uuid.UUID] = []
    for pair in pairs:
        if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2:
            raise InvalidArgumentType(f"each of {what} must be an (id, token) pair, got {pair!r}")
        ids.append(as_uuid(pair[0], f"{what} id"))
        tokens.append(as_uuid(pair[1], f"{what} token"))
    if not ids:
        raise InvalidArgument(f"{what} must hold at least one (id, token) pair")
    return ids, tokens


def uuid_array(values: list[uuid.UUID]) -> ColumnElement[Any]:
    return bindparam(None, values, type_=ARRAY(Uuid()))


def unnest_pairs(ids: list[uuid.UUID], tokens: list[uuid.UUID], name: str) -> Any:
    """``unnest(:ids, :tokens) AS name(id, token)``: one statement shape for any batch size."""
    pairs = func.unnest(uuid_array(ids), uuid_array(tokens)).table_valued("id", "token")
    return pairs.render_derived(name=name)


def locked_in_id_order(t: Table, pairs: Any, name: str, *conditions: ColumnElement[bool]) -> Any:
    """``WITH name AS (SELECT id, token … ORDER BY id FOR UPDATE)``: the held rows of ``t``
    that ``pairs`` names (and ``conditions`` keep), locked in ``id`` order.

    Every batched write to held rows takes its locks through this, so two of them on
    overlapping rows (a worker's heartbeat and its completion, on two connections) wait for
    each other at most; each locking in its own order (the pairs' order, or whatever the
    plan meets first), they deadlock.

    Examples:
        >>> from sqlalchemy import Column, MetaData, Table, Uuid
        >>> t = Table("jobs", MetaData(), Column("id", Uuid), Column("lease_token", Uuid))
        >>> from sqlalchemy.dialects import postgresql
        >>> held = locked_in_id_order(t, unnest_pairs([], [], "p"), "held")
        >>> sql = str(select(held).compile(dialect=postgresql.dialect()))
        >>> "ORDER BY jobs.id FOR UPDATE OF jobs" in sql
        True
    """
    return (
        select(t.c.id, pairs.c.token)
        .where(t.c.id == pairs.c.id, t.c.lease_token == pairs.c.token, *conditions)
        .order_by(t.c.id)
        .with_for_update(of=t)
        .cte(name)
    )


def in_names(column: ColumnElement[str], names: tuple[str, ...]) -> ColumnElement[bool]:
    # One name compares with "=" so the planner walks the index in order for that value.
    return column == names[0] if len(names) == 1 else column.in_(names)
