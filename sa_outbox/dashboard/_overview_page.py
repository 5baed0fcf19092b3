"""The overview page: counts, the throughput chart, running jobs and parked events."""

from __future__ import annotations

from flask import Blueprint

from ..queue import list_events, list_running_jobs, queue_status, throughput_by_minute
from ._chart import throughput_chart
from ._pages import Pages

__all__ = ["CHART_MINUTES", "RUNNING_SHOWN", "register"]

#: Minutes the overview's throughput chart covers.
CHART_MINUTES = 30
#: Running jobs the overview lists (the soonest lease end first).
RUNNING_SHOWN = 50


def register(bp: Blueprint, pages: Pages) -> None:
    """Adds ``/`` (the overview) to ``bp``."""

    @bp.get("/")
    def overview() -> str:
        jobs, outbox = pages.jobs, pages.outbox
        with pages.get_engine().connect() as conn:  # one transaction: one now() for every part
            status = queue_status(conn, jobs=jobs, outbox=outbox, dependencies=pages.dependencies)
            minutes = throughput_by_minute(conn, jobs, minutes=CHART_MINUTES)
            running = list_running_jobs(conn, jobs, limit=RUNNING_SHOWN)
            parked = [] if outbox is None else list_events(conn, outbox, parked=True)
        return pages.render(
            "overview.html",
            status=status,
            chart=throughput_chart(minutes),
            running=running,
            parked=parked,
            now=status.taken_at,
        )
