"""The unit of work: domain events and jobs written in the user's own session.

`install` sets the flush hook (for every session flavour) that turns domain events into
outbox rows (and back: `decode_event`); `enqueue` adds a job in the session. What a domain
event is, how it becomes a row's values and how a row becomes an event again, is the schema
layer's domain-event module; this package writes the rows in the unit of work.

Examples:
    >>> import sa_outbox
    >>> sa_outbox.install is install
    True
"""

from ..schema._event_types import UnknownEventType, decode_event, event_types
from ._session_hooks import enqueue, install

__all__ = ["UnknownEventType", "decode_event", "enqueue", "event_types", "install"]
