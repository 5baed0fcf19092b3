"""The ``flask`` commands of the example (the worker and the relay are added here)."""

from __future__ import annotations

from flask import Flask


def register(app: Flask) -> None:
    """Add the example's commands to ``app.cli``."""
