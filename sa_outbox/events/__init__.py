"""Layer 4, the unit of work: domain events and jobs written in the user's own session.

May import: ``sa_outbox.queue``, ``sa_outbox.statements``, ``sa_outbox.schema`` and the
foundation modules. The runtimes and integrations sit above it.

- ``_rows``: a domain event as an outbox row at flush (`event_row`) and back
  (`decode_event`); the event classes themselves are declared in the schema layer
  (``sa_outbox.schema._event_types``), since declaring one is part of declaring the model;
- ``_session_hooks``: `install` (the flush hook for every session flavour) and `enqueue`.

Examples:
    >>> import sa_outbox
    >>> sa_outbox.install is install
    True
"""

from ..schema._event_types import UnknownEventType, event_types
from ._rows import decode_event
from ._session_hooks import enqueue, install

__all__ = ["UnknownEventType", "decode_event", "enqueue", "event_types", "install"]
