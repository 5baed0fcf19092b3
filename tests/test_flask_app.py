"""The example shop (examples/flask_app), driven with Flask's test client on real PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

flask = pytest.importorskip("flask", reason="the example needs Flask (the test extra has it)")
pytest.importorskip("flask_sqlalchemy", reason="the example needs Flask-SQLAlchemy")

from examples.flask_app import create_app  # noqa: E402
from examples.flask_app.models import db  # noqa: E402

SCHEMA = f"shop_{os.getpid()}"


@pytest.fixture
def shop_url(database_url: str) -> Iterator[str]:
    """The test database, with ``search_path`` on an empty schema of this test's own."""
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    yield url.render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    admin.dispose()


@pytest.fixture
def app(shop_url: str) -> Iterator[Any]:
    application = create_app(shop_url)  # runs the example's Alembic migrations
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def rows(app: Any, sql: str) -> list[Any]:
    with app.app_context():
        return list(db.session.execute(text(sql)).all())


def test_the_migrations_create_everything(app: Any) -> None:
    tables = {
        r[0] for r in rows(app, f"SELECT tablename FROM pg_tables WHERE schemaname = '{SCHEMA}'")
    }
    assert tables >= {"orders", "jobs", "outbox", "sent_emails", "alembic_version"}
    [[version]] = rows(app, "SELECT version_num FROM alembic_version")
    assert version == "0001"


def test_an_order_its_event_and_its_job_commit_together(app: Any) -> None:
    client = app.test_client()
    response = client.post(
        "/orders", json={"reference": "A-1", "email": "ana@example.com", "total_cents": 1200}
    )
    assert response.status_code == 201, response.json
    order_id = response.json["order_id"]
    [order] = rows(app, "SELECT id, reference FROM orders")
    [event] = rows(app, "SELECT event_type, aggregate_type, aggregate_id, payload FROM outbox")
    [job] = rows(app, "SELECT kind, queue, status, payload, deduplication_key FROM jobs")
    assert order == (order_id, "A-1")
    assert event == (
        "OrderPlaced",
        "Order",
        str(order_id),
        {"order": order_id, "email": "ana@example.com", "total_cents": 1200},
    )
    assert job == (
        "send-confirmation",
        "emails",
        "pending",
        {"order_id": order_id},
        f"confirmation:{order_id}",
    )
    assert str(job) and response.json["job_id"]


def test_placing_the_same_order_twice_writes_nothing_the_second_time(app: Any) -> None:
    client = app.test_client()
    order = {"reference": "B-7", "email": "bia@example.com", "total_cents": 500}
    assert client.post("/orders", json=order).status_code == 201
    again = client.post("/orders", json=order)
    assert again.status_code == 409 and "already placed" in again.json["errors"][0]
    counts = client.get("/status.json").json
    assert counts["orders"] == 1
    assert counts["jobs"]["pending"] == 1
    assert counts["outbox"] == {"published": 0, "unpublished": 1}


def test_bad_input_is_refused_before_anything_is_written(app: Any) -> None:
    client = app.test_client()
    response = client.post("/orders", json={"reference": "", "email": "nope", "total_cents": -1})
    assert response.status_code == 400
    assert len(response.json["errors"]) == 3
    assert client.get("/status.json").json["orders"] == 0
    assert rows(app, "SELECT count(*) FROM outbox") == [(0,)]


def test_the_form_and_the_status_page(app: Any) -> None:
    client = app.test_client()
    form = {"reference": "C-3", "email": "cid@example.com", "total_cents": "990"}
    response = client.post("/orders", data=form)
    assert response.status_code == 302
    page = client.get("/").get_data(as_text=True)
    assert "1 orders" in page
    assert "pending: 1" in page and "unpublished: 1" in page
    assert "send-confirmation" in page and "OrderPlaced" in page
