"""Domain events in the unit of work: ``session.add(Event(...))`` becomes an outbox row at flush."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    MappedAsDataclass,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import sa_outbox
from sa_outbox import (
    InvalidArgument,
    Outbox,
    OutboxDataclassMixin,
    PayloadNotSerializable,
    SaOutboxError,
    UnknownEventType,
    decode_event,
    enqueue,
    event_types,
)

from .conftest import Job, Order, OutboxEvent
from .helpers import event_rows, jobs_by_status


class Currency(enum.Enum):
    EUR = "EUR"
    BRL = "BRL"


class OrderPlaced(OutboxEvent):
    order: Order
    total_cents: int
    currency: Currency = Currency.EUR
    placed_at: dt.datetime | None = None
    discount: decimal.Decimal | None = None


class OrderShipped(OutboxEvent):
    __event_type__ = "order.shipped"
    order: Order
    carrier: str


class CustomerNotified(OutboxEvent):
    __aggregate__ = "customer_id"
    __aggregate_type__ = "customer"
    customer_id: uuid.UUID
    lines: list[str]


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    made = sessionmaker(engine)
    sa_outbox.install(made, job_model=Job)
    return made


def orders(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(Order.__table__).order_by(Order.id)).all())


def test_an_event_and_its_new_aggregate_commit_together(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    with factory() as session, session.begin():
        order = Order(customer="ana")
        session.add(order)
        event = OrderPlaced(order=order, total_cents=1200, discount=decimal.Decimal("1.50"))
        session.add(event)  # the order has no id yet: the same flush creates it
        message_id = event.id
    [order_row] = orders(engine)
    [row] = event_rows(engine)
    assert row.id == message_id and isinstance(message_id, uuid.UUID)
    assert (row.event_type, row.aggregate_type, row.aggregate_id) == (
        "OrderPlaced",
        "Order",
        str(order_row.id),
    )
    assert row.payload == {
        "order": order_row.id,
        "total_cents": 1200,
        "currency": "EUR",
        "placed_at": None,
        "discount": "1.50",
    }
    assert row.headers["message_id"] == str(message_id)
    recorded = dt.datetime.fromisoformat(row.headers["recorded_at"])
    assert abs(recorded - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=5)
    assert row.published_at is None and row.attempts == 0


def test_events_keep_the_order_they_were_added_in_across_flushes(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    with factory() as session, session.begin():
        order = Order(customer="bia")
        late = OrderShipped(order=order, carrier="late-made, added first")
        early = OrderPlaced(order=order, total_cents=1)
        session.add(order)
        session.add(late)
        session.add(early)
        session.flush()
        session.add(OrderShipped(order=order, carrier="second flush"))
        session.execute(select(Order)).all()  # autoflush: the event is written once
        session.add(OrderShipped(order=order, carrier="at commit"))
    rows = event_rows(engine)
    assert [r.payload.get("carrier", "placed") for r in rows] == [
        "late-made, added first",
        "placed",
        "second flush",
        "at commit",
    ]
    assert [r.event_type for r in rows] == [
        "order.shipped",
        "OrderPlaced",
        "order.shipped",
        "order.shipped",
    ]


def test_explicit_rollback_leaves_nothing(engine: Engine, factory: sessionmaker[Session]) -> None:
    with factory() as session:
        order = Order(customer="cid")
        session.add_all([order, OrderPlaced(order=order, total_cents=5)])
        session.flush()  # the row exists inside the transaction...
        assert session.execute(text(f"SELECT count(*) FROM {OutboxEvent.__table__.fullname}"))
        session.rollback()  # ...and goes with it
    assert event_rows(engine) == []
    assert orders(engine) == []


def test_an_exception_in_the_block_leaves_nothing(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    with pytest.raises(RuntimeError), factory() as session, session.begin():
        order = Order(customer="dan")
        session.add_all([order, OrderPlaced(order=order, total_cents=5)])
        session.flush()
        raise RuntimeError("payment declined")
    assert event_rows(engine) == [] and orders(engine) == []


def test_a_failed_flush_leaves_nothing(engine: Engine, factory: sessionmaker[Session]) -> None:
    with factory() as session, session.begin():
        session.add(Order(customer="eva"))
    with pytest.raises(IntegrityError), factory() as session, session.begin():
        duplicate = Order(customer="eva")  # violates the unique constraint at flush
        session.add_all([duplicate, OrderPlaced(order=duplicate, total_cents=5)])
    assert event_rows(engine) == []
    assert [o.customer for o in orders(engine)] == ["eva"]


def test_a_savepoint_rollback_removes_only_its_events(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    with factory() as session, session.begin():
        order = Order(customer="fia")
        session.add_all([order, OrderPlaced(order=order, total_cents=1)])
        with session.begin_nested() as savepoint:
            session.add(OrderShipped(order=order, carrier="flushed in the savepoint"))
            session.flush()
            session.add(OrderShipped(order=order, carrier="pending in the savepoint"))
            savepoint.rollback()
        with session.begin_nested():
            session.add(OrderShipped(order=order, carrier="kept savepoint"))
        session.add(OrderShipped(order=order, carrier="after"))
    rows = event_rows(engine)
    assert [r.payload.get("carrier") for r in rows] == [None, "kept savepoint", "after"]


def test_an_unserialisable_field_fails_the_flush_naming_class_and_field(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    invalid = PayloadNotSerializable
    with pytest.raises(invalid, match=r"CustomerNotified\.lines\[1\]"), factory() as session:
        session.add(Order(customer="gil"))
        session.add(CustomerNotified(customer_id=uuid.uuid4(), lines=["ok", {1, 2}]))
        session.commit()
    assert event_rows(engine) == [] and orders(engine) == []


def test_an_event_without_an_aggregate_fails_the_flush(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    with (
        pytest.raises(
            InvalidArgument,
            match=r"OrderPlaced\.order refers to a Order that has no primary key yet",
        ),
        factory() as session,
        session.begin(),
    ):
        stray = Order(customer="never added")  # not in the session: never flushed
        session.add(OrderPlaced(order=stray, total_cents=1))
    assert event_rows(engine) == []


def test_events_come_back_typed(engine: Engine, factory: sessionmaker[Session]) -> None:
    customer = uuid.uuid4()
    when = dt.datetime(2030, 5, 1, 12, tzinfo=dt.UTC)
    with factory() as session, session.begin():
        order = Order(customer="hal")
        session.add(order)
        session.add(
            OrderPlaced(
                order=order,
                total_cents=990,
                currency=Currency.BRL,
                placed_at=when,
                discount=decimal.Decimal("0.10"),
            )
        )
        session.add(CustomerNotified(customer_id=customer, lines=["a", "b"]))
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        placed, notified = outbox.claim(conn)
    event = decode_event(OutboxEvent, placed)
    assert isinstance(event, OrderPlaced)
    assert (event.total_cents, event.currency, event.placed_at) == (990, Currency.BRL, when)
    assert event.discount == decimal.Decimal("0.10") and event.id == placed.id
    assert isinstance(event.order, int)  # no session: the aggregate's primary key
    with Session(engine) as session:
        loaded = decode_event(OutboxEvent, placed, session=session)
        assert isinstance(loaded.order, Order) and loaded.order.customer == "hal"
    again = decode_event(OutboxEvent, notified)
    assert again.customer_id == customer and again.lines == ["a", "b"]
    assert set(event_types(OutboxEvent)) >= {"OrderPlaced", "order.shipped", "CustomerNotified"}


def test_an_unknown_event_type_is_a_clear_error(engine: Engine) -> None:
    outbox = Outbox(OutboxEvent)
    with engine.begin() as conn:
        outbox.append(conn, event_type="Retired", aggregate_type="x", aggregate_id=1, payload={})
        [row] = outbox.claim(conn)
    with pytest.raises(UnknownEventType, match=r"'Retired'.*registered: .*OrderPlaced"):
        decode_event(OutboxEvent, row)


def test_event_classes_are_checked_when_declared() -> None:
    with pytest.raises(InvalidArgument, match="clashes with the outbox model"):

        class Clash(OutboxEvent):
            headers: dict[str, str]

    with pytest.raises(InvalidArgument, match="already registered"):

        class Impostor(OutboxEvent):
            __event_type__ = "OrderPlaced"
            order: Order

    with pytest.raises(InvalidArgument, match="__aggregate__"):

        class WrongAggregate(OutboxEvent):
            __aggregate__ = "nope"
            order: Order

    with pytest.raises(TypeError, match="missing field"):
        OrderPlaced(total_cents=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected field 'totl'"):
        OrderPlaced(order=None, totl=1)  # type: ignore[call-arg]


def test_enqueue_in_the_unit_of_work(engine: Engine, factory: sessionmaker[Session]) -> None:
    with factory() as session, session.begin():
        order = Order(customer="ian")
        session.add(order)
        session.flush()
        first = enqueue(session, "send-confirmation", {"order": order.id}, deduplication_key="c1")
        again = enqueue(session, "send-confirmation", {"order": order.id}, deduplication_key="c1")
        session.add(OrderPlaced(order=order, total_cents=3))  # the transaction goes on
    assert first.inserted and not again.inserted and again.id is None
    assert jobs_by_status(engine) == {"pending": 1} and len(event_rows(engine)) == 1


def test_enqueue_rolls_back_with_the_unit_of_work(
    engine: Engine, factory: sessionmaker[Session]
) -> None:
    with factory() as session:
        enqueue(session, "send-confirmation", {})
        session.rollback()
    assert jobs_by_status(engine) == {}


def test_enqueue_needs_to_know_the_job_model_when_several_are_mapped(engine: Engine) -> None:
    from sa_outbox import JobMixin

    class OtherBase(DeclarativeBase):
        pass

    class OtherJob(JobMixin, OtherBase):  # a second job model in the process
        __tablename__ = "other_jobs"

    with Session(engine) as session:
        with pytest.raises(InvalidArgument, match="cannot tell which job model"):
            enqueue(session, "k", {})
        assert enqueue(session, "k", {}, model=Job).inserted
        session.rollback()
    assert OtherJob.__table__.name == "other_jobs"


@pytest.fixture
def flask_db(engine: Engine, database_url: str) -> Iterator[Any]:
    flask = pytest.importorskip("flask", reason="Flask is an optional test dependency")
    flask_sqlalchemy = pytest.importorskip("flask_sqlalchemy")
    app = flask.Flask("events-test")
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    db = flask_sqlalchemy.SQLAlchemy(app)
    with app.app_context():
        yield db
        db.session.remove()
        db.engine.dispose()


def test_install_on_each_kind_of_target(engine: Engine, flask_db: Any) -> None:
    class AppSession(Session):
        pass

    made = sessionmaker(engine)
    scoped = scoped_session(sessionmaker(engine))
    instance = Session(engine)
    for target in (made, scoped, AppSession, instance, flask_db):
        sa_outbox.install(target)
        sa_outbox.install(target)  # twice is harmless
    sessions: list[Any] = [made(), scoped(), AppSession(engine), instance, flask_db.session]
    for i, session in enumerate(sessions):
        order = Order(customer=f"target-{i}")
        session.add_all([order, OrderPlaced(order=order, total_cents=i)])
        session.commit()
        session.close()
    scoped.remove()
    assert [r.payload["total_cents"] for r in event_rows(engine)] == [0, 1, 2, 3, 4]


def test_install_refuses_what_it_cannot_hook() -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    with pytest.raises(TypeError, match="install\\(\\) takes"):
        sa_outbox.install(object())
    with pytest.raises(InvalidArgument, match="every session of the process"):
        sa_outbox.install(AsyncSession)


def test_a_session_without_hooks_refuses_events_clearly(engine: Engine) -> None:
    refused = pytest.raises(SaOutboxError, match="without sa-outbox's hooks")
    with refused, Session(engine) as session, session.begin():
        order = Order(customer="jon")
        session.add_all([order, OrderPlaced(order=order, total_cents=1)])
    assert event_rows(engine) == [] and orders(engine) == []


def test_every_new_session_factory_gets_the_hooks(engine: Engine) -> None:
    """A new sessionmaker may reuse the id() of a collected one: it still gets its hooks."""
    import gc

    for i in range(30):
        made = sessionmaker(engine)
        sa_outbox.install(made)
        with made() as session, session.begin():
            order = Order(customer=f"factory-{i}")
            session.add_all([order, OrderPlaced(order=order, total_cents=i)])
        del made
        gc.collect()
    assert [r.payload["total_cents"] for r in event_rows(engine)] == list(range(30))


def test_events_on_a_dataclass_base(engine: Engine) -> None:
    schema = f"events_dc_{uuid.uuid4().hex[:8]}"

    class Base(MappedAsDataclass, DeclarativeBase):
        pass

    class Invoice(Base):
        __tablename__ = "invoices"
        __table_args__ = {"schema": schema}  # noqa: RUF012
        id: Mapped[int] = mapped_column(primary_key=True, init=False)
        number: Mapped[str]

    class DcOutbox(OutboxDataclassMixin, Base):
        __tablename__ = "outbox"
        __table_schema__ = schema

    class InvoiceIssued(DcOutbox):
        invoice: Invoice
        amount_cents: int
        note: str = ""

    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        Base.metadata.create_all(engine)
        made = sessionmaker(engine)
        sa_outbox.install(made)
        with made() as session, session.begin():
            invoice = Invoice(number="2030-001")
            session.add_all([invoice, InvoiceIssued(invoice=invoice, amount_cents=5000)])
        with engine.connect() as conn:
            row = conn.execute(text(f"SELECT * FROM {schema}.outbox")).one()
        assert (row.event_type, row.aggregate_type) == ("InvoiceIssued", "Invoice")
        assert row.payload == {"invoice": 1, "amount_cents": 5000, "note": ""}
        assert repr(decode_event(DcOutbox, row)) == (
            "InvoiceIssued(invoice=1, amount_cents=5000, note='')"
        )
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
