"""The unit of work: domain events and jobs written in the user's own session.

`install` sets the flush hook (for every session flavour) that turns domain events into
outbox rows (`event_row`, and back: `decode_event`); `enqueue` adds a job in the session.

Examples:
    >>> import sa_outbox
    >>> sa_outbox.install is install
    True
"""

from ..schema._event_types import UnknownEventType, event_types
from ._rows import decode_event
from ._session_hooks import enqueue, install

__all__ = ["UnknownEventType", "decode_event", "enqueue", "event_types", "install"]
