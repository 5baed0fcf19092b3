"""What `Outbox` and `AsyncOutbox` share: the operations on one outbox table.

`AsyncOutbox` (``_outbox_async.py``) is written by hand; `Outbox` (``_outbox_sync.py``) is
generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table

from .. import statements as st
from .._backoff import Backoff
from .._clock import Clock
from ..ops import OutboxOps
from ..statements._common import Dumps

Pairs = Sequence[tuple[uuid.UUID, uuid.UUID]]


def event_options(
    event_type: str,
    aggregate_type: str,
    aggregate_id: object,
    payload: Any,
    headers: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "event_type": event_type,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "payload": payload,
        "headers": headers,
    }


class OutboxBase:
    """The outbox table and its operations (`OutboxOps`), for `Outbox` and `AsyncOutbox`."""

    def __init__(
        self,
        model: object,
        *,
        clock: Clock | None = None,
        dumps: Dumps | None = None,
        max_payload_bytes: int = st.DEFAULT_MAX_PAYLOAD_BYTES,
        backoff: Backoff | None = None,
    ) -> None:
        self._ops = OutboxOps(
            model, clock=clock, dumps=dumps, max_payload_bytes=max_payload_bytes, backoff=backoff
        )

    @property
    def table(self) -> Table:
        """The outbox table."""
        return self._ops.table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.fullname!r})"
