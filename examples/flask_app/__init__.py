"""An order shop on Flask, Flask-SQLAlchemy and Alembic, using sa-outbox.

Placing an order writes, in one transaction, the order, an ``OrderPlaced`` domain event (an
outbox row) and a ``send-confirmation`` job. ``flask --app examples.flask_app run`` serves
it; the ``worker`` and ``relay`` commands work the job and publish the event.
"""

from .app import create_app

__all__ = ["create_app"]
