"""What durable steps share between asyncio and threads: checks, the result's JSON, sessions.

`AsyncSteps` (``_steps_async.py``) and `Steps` (generated from it) run the steps; the
functions here are the parts whose asyncio and synchronous versions differ or that both use.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from .._exceptions import InvalidArgument, InvalidArgumentType, LeaseLost
from .._json import compact_json
from ..statements import DEFAULT_MAX_PAYLOAD_BYTES, serialise

if TYPE_CHECKING:  # sqlalchemy.ext.asyncio needs greenlet, which a plain install may lack
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

#: The largest result a step may record, as JSON (1 MiB).
MAX_STEP_RESULT_BYTES = DEFAULT_MAX_PAYLOAD_BYTES
#: The longest step name.
MAX_STEP_NAME = 200

#: ``False``: the step runs outside any transaction; ``True``: it gets a Session whose
#: transaction commits its rows and its record together; a session factory (a
#: ``sessionmaker``, with your ``sa_outbox.install`` hooks): the same, from that factory.
SessionChoice = bool | Callable[..., Any]


def check_name(name: object) -> str:
    """A step's (or a sleep's, or a signal's) name, checked (one line naming what is wrong)."""
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise InvalidArgument(
            f"a step's name must be a non-empty str of at most {MAX_STEP_NAME} characters, "
            f"got {name!r}"
        )
    if name.startswith("@"):
        raise InvalidArgument(f"step names starting with '@' are the library's, got {name!r}")
    return name


def check_step(name: object, fn: object, session: object) -> str:
    """The step's name, once the arguments are checked (one line naming what is wrong)."""
    name = check_name(name)
    if not callable(fn):
        raise InvalidArgumentType(f"step {name!r}: fn must be callable, got {fn!r}")
    if not isinstance(session, bool) and not callable(session):
        raise InvalidArgumentType(
            f"step {name!r}: session must be a bool or a session factory, got {session!r}"
        )
    return name


def result_json(value: Any, name: str, job_id: uuid.UUID) -> str:
    """``value`` as the JSON text recorded for step ``name`` (size-limited)."""
    text: str = serialise(
        value, f"step {name!r} of job {job_id}", compact_json, MAX_STEP_RESULT_BYTES
    )
    return text


def returned_json(value: Any, job_id: uuid.UUID, kind: str) -> str:
    """A handler's return value as the JSON recorded as its job's result (size-limited)."""
    what = f"the value returned by job {job_id} (kind {kind!r})"
    text: str = serialise(value, what, compact_json, MAX_STEP_RESULT_BYTES)
    return text


def recorded_value(text: str) -> Any:
    """What a step returns: its result as recorded, the same on every attempt."""
    return json.loads(text)


def lease_lost(job_id: uuid.UUID, token: uuid.UUID, name: str) -> LeaseLost:
    return LeaseLost("job", job_id, token, action=f"record step {name!r} of")


def step_session(engine: Engine, session: SessionChoice) -> Session:
    """The Session a step runs in: a plain one on ``engine``, or the user's factory's."""
    made = Session(bind=engine) if session is True else session(bind=engine)  # type: ignore[operator]
    if not isinstance(made, Session):
        raise InvalidArgumentType(f"the session factory returned {made!r}, not a Session")
    return made


def async_step_session(engine: AsyncEngine, session: SessionChoice) -> AsyncSession:
    """`step_session` for asyncio: an `AsyncSession` (the factory: an async_sessionmaker)."""
    from sqlalchemy.ext.asyncio import AsyncSession

    made = AsyncSession(bind=engine) if session is True else session(bind=engine)  # type: ignore[operator]
    if not isinstance(made, AsyncSession):
        raise InvalidArgumentType(f"the session factory returned {made!r}, not an AsyncSession")
    return made
