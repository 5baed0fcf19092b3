"""`Inbox` / `AsyncInbox`: a consumer records each message in its own transaction, once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine, Table

from .._asyncio_ext import is_async_engine
from .._clock import Clock
from .._exceptions import InvalidArgumentType
from ..ops import InboxOps, SyncConn, arun, run
from ..statements._inbox import checked_message

if TYPE_CHECKING:
    from ..ops import AsyncConn


def _in_a_transaction(conn: object) -> None:
    """Refuse what cannot hold the consumer's transaction: an engine, or no connection."""
    if isinstance(conn, Engine) or is_async_engine(conn):
        raise InvalidArgumentType(
            "accept records the message in the consumer's own transaction: pass the "
            "Session or Connection that applies the message, not an Engine"
        )
    if not callable(getattr(conn, "execute", None)):
        raise InvalidArgumentType(
            f"accept needs a Session or a Connection, got {type(conn).__name__}"
        )


class _Base:
    def __init__(self, model: object, *, clock: Clock | None = None) -> None:
        self._ops = InboxOps(model, clock=clock)

    @property
    def table(self) -> Table:
        """The inbox table (an `InboxMixin` model's)."""
        return self._ops.table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.fullname!r})"


class Inbox(_Base):
    """A consumer's record of the messages it handled: `accept` says whether one is new.

    ``model`` is the user's `InboxMixin` model. `accept` inserts ``(source, message_id)``
    in the caller's transaction: apply the message in that same transaction, and only when
    `accept` returned True. If the transaction rolls back, the inbox forgets the message
    too, so a redelivery applies it then. See docs/inbox.md.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import InboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class InboxEntry(InboxMixin, Base): __tablename__ = "inbox"
        >>> Inbox(InboxEntry)
        Inbox('inbox')
    """

    def accept(self, conn: SyncConn, message_id: str, *, source: str) -> bool:
        """Record the message: True the first time, False if ``source`` sent it before.

        ``conn`` is the `Session` or `Connection` whose transaction applies the message
        (not an `Engine`: the record must commit or roll back with the work). A
        ``message_id`` that is not a str, is empty or is longer than 512 characters, and a
        ``source`` that is not a name, are refused before any SQL.

        Examples:
            with Session(engine) as session, session.begin():
                if inbox.accept(session, message.message_id, source="orders"):
                    apply(session, message)
        """
        _in_a_transaction(conn)
        source, message_id = checked_message(message_id, source)
        return run(conn, self._ops.accept(source, message_id))


class AsyncInbox(_Base):
    """`Inbox` on an `AsyncSession` or `AsyncConnection`.

    Examples:
        >>> from sqlalchemy.orm import DeclarativeBase
        >>> from sa_outbox.schema import InboxMixin
        >>> class Base(DeclarativeBase): pass
        >>> class InboxEntry(InboxMixin, Base): __tablename__ = "inbox"
        >>> AsyncInbox(InboxEntry).table.name
        'inbox'
    """

    async def accept(self, conn: AsyncConn, message_id: str, *, source: str) -> bool:
        """See `Inbox.accept`.

        Examples:
            async with AsyncSession(engine) as session, session.begin():
                if await inbox.accept(session, message.message_id, source="orders"):
                    await apply(session, message)
        """
        _in_a_transaction(conn)
        source, message_id = checked_message(message_id, source)
        return await arun(conn, self._ops.accept(source, message_id))
