"""One outbox event's page and retrying a parked event."""

from __future__ import annotations

from flask import Blueprint, Response
from werkzeug.wrappers import Response as BaseResponse

from ..queue import get_event, retry_parked
from ._pages import Pages, now_of, page, parse_uuid

__all__ = ["register"]


def register(bp: Blueprint, pages: Pages) -> None:
    """Adds ``/outbox/<id>`` and its ``retry`` to ``bp``."""
    outbox = pages.outbox

    @bp.get("/outbox/<event_id>")
    def event_detail(event_id: str) -> str | Response:
        wanted = parse_uuid(event_id)
        found = None
        if wanted is not None and outbox is not None:
            with pages.get_engine().connect() as conn:
                now = now_of(conn)
                found = get_event(conn, outbox, wanted)
        if found is None:
            return page(f"no outbox event {event_id}", 404)
        return pages.render("event.html", event=found, now=now)

    @bp.post("/outbox/<event_id>/retry")
    def retry_event(event_id: str) -> BaseResponse:
        if outbox is None:
            return page(f"no outbox event {event_id}", 404)
        return pages.retry_one(
            event_id,
            "event",
            lambda conn, wanted: retry_parked(conn, outbox, ids=[wanted]),
            lambda _: pages.url("overview"),
        )
