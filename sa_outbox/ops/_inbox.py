"""`InboxOps`: a consumer's inbox, one operation (`accept`)."""

from __future__ import annotations

from .. import statements as st
from .._clock import Clock
from ..statements._inbox import inbox_table
from ._drive import Op

__all__ = ["InboxOps"]


class InboxOps:
    """The inbox's operation, written once as a generator over statements.

    What `sa_outbox.queue.Inbox` runs: `accept` inserts ``(source, message_id)`` and is
    ``True`` if the message is new (run it in the transaction that applies the message).

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox import InboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class InboxEntry(InboxMixin, Base): __tablename__ = "inbox"
        >>> op = InboxOps(InboxEntry).accept("orders", "m-1")
        >>> next(op).is_insert
        True
    """

    def __init__(self, model: object, *, clock: Clock | None = None) -> None:
        self.table = inbox_table(model)
        self.clock = clock

    def accept(self, source: str, message_id: str) -> Op[bool]:
        """Record the message; returns whether it was new (``False``: handled before)."""
        stmt = st.accept_message(self.table, message_id, source=source, clock=self.clock)
        return (yield stmt).first() is not None
