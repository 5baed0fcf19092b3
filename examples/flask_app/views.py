"""Pages and endpoints: place an order (form or JSON), see jobs and outbox rows by status."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, redirect, render_template_string, request, url_for
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from werkzeug.exceptions import BadRequest

import sa_outbox

from .models import Job, Order, OrderPlaced, OutboxEvent, SentEmail, db

bp = Blueprint("shop", __name__)


#: The largest total an order may have: ``orders.total_cents`` is a PostgreSQL integer.
MAX_TOTAL_CENTS = 2**31 - 1


def _order_form(data: Any) -> tuple[dict[str, Any], list[str]]:
    errors = []
    reference = str(data.get("reference") or "").strip()
    email = str(data.get("email") or "").strip()
    raw_total = data.get("total_cents")
    try:
        if isinstance(raw_total, bool) or (
            isinstance(raw_total, float) and not raw_total.is_integer()
        ):
            raise ValueError(raw_total)
        total_cents = int(raw_total)
    except (TypeError, ValueError, OverflowError):
        total_cents = 0
    if not reference:
        errors.append("reference is required")
    if "@" not in email:
        errors.append("email must be an email address")
    if "\x00" in reference + email:
        errors.append("reference and email must not contain NUL characters")
    if not 0 < total_cents <= MAX_TOTAL_CENTS:
        errors.append(f"total_cents must be a whole number from 1 to {MAX_TOTAL_CENTS}")
    return {"reference": reference, "email": email, "total_cents": total_cents}, errors


_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number"}
_JSON_TYPES |= {bool: "true or false", type(None): "null"}


def _json_object() -> tuple[Any, str | None]:
    """The request's JSON body, or why it is refused: not JSON, or not an object."""
    try:
        body = request.get_json()
    except BadRequest:  # malformed JSON, or not UTF-8
        return None, "the body is not valid JSON"
    if not isinstance(body, dict):
        return None, f"the body must be a JSON object, got {_JSON_TYPES[type(body)]}"
    return body, None


@bp.post("/orders")
def place_order() -> Any:
    """Write the order, its ``OrderPlaced`` event and its confirmation job, together."""
    wants_json = request.is_json
    if wants_json:
        body, refused = _json_object()
        if refused is not None:
            return {"errors": [refused]}, 400
    fields, errors = _order_form(body if wants_json else request.form)
    if errors:
        return {"errors": errors}, 400
    try:
        order = Order(**fields)
        db.session.add(order)
        db.session.add(OrderPlaced(order=order, email=order.email, total_cents=order.total_cents))
        db.session.flush()  # the order's id, for the job's payload and key
        job = sa_outbox.enqueue(
            db.session,
            "send-confirmation",
            {"order_id": order.id},
            queue="emails",
            deduplication_key=f"confirmation:{order.id}",
        )
        db.session.commit()
    except IntegrityError:
        db.session.rollback()  # the order, its event and its job: none of them
        return {"errors": [f"order {fields['reference']!r} was already placed"]}, 409
    body = {"order_id": order.id, "job_id": str(job.id)}
    return (body, 201) if wants_json else redirect(url_for("shop.index"))


def _counts() -> dict[str, Any]:
    jobs = dict(db.session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    published = OutboxEvent.published_at.is_not(None)
    events = dict(db.session.execute(select(published, func.count()).group_by(published)).all())
    return {
        "orders": db.session.scalar(select(func.count()).select_from(Order)),
        "jobs": {str(status): jobs.get(status, 0) for status in sa_outbox.JobStatus},
        "outbox": {"published": events.get(True, 0), "unpublished": events.get(False, 0)},
        "emails_sent": db.session.scalar(select(func.count()).select_from(SentEmail)),
    }


@bp.get("/status.json")
def status() -> Any:
    """Counts of orders, jobs by status, outbox rows by published or not."""
    return _counts()


PAGE = """<!doctype html>
<title>sa-outbox shop</title>
<h1>Place an order</h1>
<form method=post action="{{ url_for('shop.place_order') }}">
  <input name=reference placeholder="reference" required>
  <input name=email placeholder="email" required>
  <input name=total_cents placeholder="total in cents" required>
  <button>Place</button>
</form>
<h2>Counts</h2>
<p>{{ counts.orders }} orders, {{ counts.emails_sent }} confirmations sent.</p>
<table border=1>
  <tr><th>jobs</th>
    {% for s, n in counts.jobs.items() %}<td>{{ s }}: {{ n }}</td>{% endfor %}</tr>
  <tr><th>outbox</th>
    {% for s, n in counts.outbox.items() %}<td>{{ s }}: {{ n }}</td>{% endfor %}</tr>
</table>
<h2>Latest jobs</h2>
<table border=1>
  <tr><th>kind</th><th>status</th><th>attempts</th><th>payload</th><th>last error</th></tr>
  {% for job in jobs %}<tr><td>{{ job.kind }}</td><td>{{ job.status.value }}</td>
  <td>{{ job.attempts }}</td><td>{{ job.payload }}</td><td>{{ job.last_error or "" }}</td></tr>
  {% endfor %}
</table>
<h2>Latest outbox rows</h2>
<table border=1>
  <tr><th>seq</th><th>event</th><th>aggregate</th><th>payload</th><th>published</th></tr>
  {% for e in events %}<tr><td>{{ e.seq }}</td><td>{{ e.event_type }}</td>
  <td>{{ e.aggregate_type }} {{ e.aggregate_id }}</td><td>{{ e.payload }}</td>
  <td>{{ e.published_at or "not yet" }}</td></tr>{% endfor %}
</table>
"""


@bp.get("/")
def index() -> Any:
    """The order form, the counts, and the latest jobs and outbox rows."""
    jobs = db.session.scalars(select(Job).order_by(Job.created_at.desc()).limit(20)).all()
    events = db.session.scalars(
        select(OutboxEvent).order_by(OutboxEvent.seq.desc()).limit(20)
    ).all()
    return render_template_string(PAGE, counts=_counts(), jobs=jobs, events=events)
