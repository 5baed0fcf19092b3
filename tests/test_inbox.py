"""`Inbox` / `AsyncInbox` on a real PostgreSQL: a message is applied once, in the consumer's
own transaction; a rollback forgets it; two consumers of one message wait for each other;
bad input is refused before any SQL; retention prunes old entries, from Python and from
``sa-outbox prune``.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, MappedAsDataclass, Session

from sa_outbox import (
    AsyncInbox,
    AsyncPruner,
    FakeClock,
    Inbox,
    InboxDataclassMixin,
    InboxMixin,
    InvalidArgument,
    InvalidArgumentType,
    Pruner,
    Retention,
)
from sa_outbox.cli import main
from sa_outbox.statements import MAX_MESSAGE_ID_LENGTH, accept_message, prune_inbox, prune_lock

from .conftest import TEST_SCHEMA, Job
from .helpers import wait_until
from .inbox_bed import (
    APPLIED,
    INBOX,
    SOURCE,
    Applied,
    InboxEntry,
    applied_counts,
    create_consumer_tables,
    drop_consumer_tables,
    inbox_keys,
    truncate_consumer_tables,
)

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


@pytest.fixture(scope="module")
def consumer_tables(engine: Engine) -> Iterator[None]:
    create_consumer_tables(engine)
    yield
    drop_consumer_tables(engine)


@pytest.fixture(autouse=True)
def _empty(engine: Engine, consumer_tables: None) -> None:
    truncate_consumer_tables(engine)


def consume(engine: Engine, inbox: Inbox, message_id: str, amount: int = 1) -> bool:
    """One consumer transaction: accept, and apply only a new message."""
    with engine.begin() as conn:
        accepted = inbox.accept(conn, message_id, source=SOURCE)
        if accepted:
            conn.execute(insert(APPLIED).values(message_id=message_id, amount=amount))
    return accepted


def inbox_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(INBOX)).scalar_one())


# -- accept --------------------------------------------------------------------------------


def test_a_message_is_applied_once_however_often_it_comes(engine: Engine) -> None:
    inbox = Inbox(InboxEntry)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    first = [consume(engine, inbox, message_id) for message_id in ids]
    again = [consume(engine, inbox, message_id) for message_id in ids + ids]
    assert first == [True, True, True]
    assert again == [False] * 6
    assert applied_counts(engine) == {message_id: 1 for message_id in ids}
    assert inbox_keys(engine) == sorted((SOURCE, message_id) for message_id in ids)


def test_the_key_is_the_source_and_the_id(engine: Engine) -> None:
    inbox = Inbox(InboxEntry)
    with engine.begin() as conn:
        assert inbox.accept(conn, "m-1", source="shop") is True
        assert inbox.accept(conn, "m-1", source="billing") is True  # another producer's id
        assert inbox.accept(conn, "m-1", source="shop") is False
    assert inbox_keys(engine) == [("billing", "m-1"), ("shop", "m-1")]


def test_a_rollback_forgets_the_message_and_a_redelivery_applies_it(engine: Engine) -> None:
    inbox = Inbox(InboxEntry)
    message_id = str(uuid.uuid4())

    class HandlerFailed(Exception):
        pass

    with pytest.raises(HandlerFailed), Session(engine) as session, session.begin():
        assert inbox.accept(session, message_id, source=SOURCE) is True
        session.add(Applied(message_id=message_id, amount=5))
        session.flush()
        raise HandlerFailed  # the consumer's work fails after the message was recorded
    assert inbox_count(engine) == 0 and applied_counts(engine) == {}

    with Session(engine) as session, session.begin():  # the broker redelivers it
        assert inbox.accept(session, message_id, source=SOURCE) is True
        session.add(Applied(message_id=message_id, amount=5))
    assert consume(engine, inbox, message_id) is False  # and once more: a duplicate
    assert applied_counts(engine) == {message_id: 1}
    assert inbox_keys(engine) == [(SOURCE, message_id)]


def test_a_savepoint_rolled_back_forgets_only_its_own_messages(engine: Engine) -> None:
    inbox = Inbox(InboxEntry)
    with Session(engine) as session, session.begin():
        assert inbox.accept(session, "kept", source=SOURCE)
        with pytest.raises(RuntimeError), session.begin_nested():
            assert inbox.accept(session, "undone", source=SOURCE)
            raise RuntimeError
        assert inbox.accept(session, "undone", source=SOURCE) is True  # forgotten with it
    assert inbox_keys(engine) == [(SOURCE, "kept"), (SOURCE, "undone")]


def inserts_waiting(engine: Engine) -> int:
    """Inserts into the inbox waiting for a lock, from a new transaction each time
    (``pg_stat_activity`` is a snapshot taken once per transaction)."""
    blocked = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE :insert"
    )
    with engine.connect() as conn:
        return int(conn.execute(blocked, {"insert": f"INSERT INTO {INBOX.fullname} %"}).scalar())


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_second_consumer_of_the_same_message_waits_for_the_first(
    engine: Engine, outcome: str
) -> None:
    """Two consumers get one message at once (a redelivery while the first still works):
    the second's insert waits on the first's uncommitted row, then sees what it became."""
    inbox = Inbox(InboxEntry)
    message_id = str(uuid.uuid4())
    second: list[bool] = []
    with engine.connect() as first:
        assert inbox.accept(first, message_id, source=SOURCE) is True
        first.execute(insert(APPLIED).values(message_id=message_id, amount=1))
        thread = threading.Thread(
            target=lambda: second.append(consume(engine, inbox, message_id)), daemon=True
        )
        thread.start()
        wait_until(lambda: inserts_waiting(engine) == 1, "the second consumer to wait")
        assert second == []  # still waiting on the first consumer's row
        if outcome == "commit":
            first.commit()
        else:
            first.rollback()
        thread.join(60)
    assert not thread.is_alive()
    assert second == [outcome == "rollback"]
    assert applied_counts(engine) == {message_id: 1}
    assert inbox_keys(engine) == [(SOURCE, message_id)]


def test_received_at_comes_from_the_clock(engine: Engine) -> None:
    inbox = Inbox(InboxEntry, clock=FakeClock(T0))
    with engine.begin() as conn:
        inbox.accept(conn, "m", source=SOURCE)
    with engine.connect() as conn:
        assert conn.execute(select(INBOX.c.received_at)).scalar_one() == T0


def test_a_dataclass_model_works_the_same(engine: Engine) -> None:
    class Base(MappedAsDataclass, DeclarativeBase):
        pass

    class Entry(InboxDataclassMixin, Base):
        __tablename__ = "dataclass_inbox"
        __table_schema__ = TEST_SCHEMA

    Base.metadata.create_all(engine)
    try:
        inbox = Inbox(Entry)
        with Session(engine) as session, session.begin():
            assert inbox.accept(session, "m", source=SOURCE) is True
            assert inbox.accept(session, "m", source=SOURCE) is False
        with Session(engine) as session:
            entry = session.scalars(select(Entry)).one()
            assert (entry.source, entry.message_id) == (SOURCE, "m")
            assert entry.received_at is not None
        assert Entry(source="s", message_id="x").received_at is None  # set by the database
    finally:
        Base.metadata.drop_all(engine)


async def test_async_inbox_applies_once_and_forgets_on_rollback(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    inbox = AsyncInbox(InboxEntry)
    message_id = str(uuid.uuid4())
    with pytest.raises(ZeroDivisionError):
        async with AsyncSession(async_engine) as session, session.begin():
            assert await inbox.accept(session, message_id, source=SOURCE) is True
            session.add(Applied(message_id=message_id, amount=1))
            await session.flush()
            _ = 1 / 0
    assert inbox_count(engine) == 0
    for expected in (True, False, False):
        async with AsyncSession(async_engine) as session, session.begin():
            accepted = await inbox.accept(session, message_id, source=SOURCE)
            if accepted:
                session.add(Applied(message_id=message_id, amount=1))
        assert accepted is expected
    async with async_engine.begin() as conn:  # an AsyncConnection too
        assert await inbox.accept(conn, message_id, source="other") is True
    assert applied_counts(engine) == {message_id: 1}
    assert inbox_keys(engine) == [("other", message_id), (SOURCE, message_id)]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message_id", "source", "error", "message"),
    [
        ("", SOURCE, InvalidArgument, "message_id must not be empty"),
        (uuid.UUID(int=1), SOURCE, InvalidArgumentType, "message_id must be a str, got UUID"),
        (42, SOURCE, InvalidArgumentType, "message_id must be a str, got int"),
        (None, SOURCE, InvalidArgumentType, "message_id must be a str, got NoneType"),
        (b"m", SOURCE, InvalidArgumentType, "message_id must be a str, got bytes"),
        (
            "x" * (MAX_MESSAGE_ID_LENGTH + 1),
            SOURCE,
            InvalidArgument,
            "is 513 characters long, over the limit of 512",
        ),
        ("a\x00b", SOURCE, InvalidArgument, "contains a NUL character"),
        ("\ud800", SOURCE, InvalidArgument, "is not valid UTF-8 text"),
        ("m", "", InvalidArgument, "source must not be empty"),
        ("m", "   ", InvalidArgument, "source must not be blank"),
        ("m", "s" * 129, InvalidArgument, "over the limit of 128"),
        ("m", 7, InvalidArgumentType, "source must be a str, got int"),
    ],
)
def test_bad_input_is_refused_before_any_sql_and_the_transaction_goes_on(
    engine: Engine, message_id: object, source: object, error: type[Exception], message: str
) -> None:
    inbox = Inbox(InboxEntry)
    with engine.begin() as conn:
        with pytest.raises(error, match=message.replace("(", r"\(")):
            inbox.accept(conn, message_id, source=source)  # type: ignore[arg-type]
        assert inbox.accept(conn, "good", source=SOURCE) is True  # the transaction is intact
    with pytest.raises(error):
        accept_message(InboxEntry, message_id, source=source)  # type: ignore[arg-type]
    assert inbox_keys(engine) == [(SOURCE, "good")]


def test_the_longest_ids_fit_the_index(engine: Engine) -> None:
    inbox = Inbox(InboxEntry)
    widest = "\U0001f600" * MAX_MESSAGE_ID_LENGTH  # 4 bytes a character
    with engine.begin() as conn:
        assert inbox.accept(conn, widest, source="\U0001f600" * 128) is True
        assert inbox.accept(conn, widest, source="\U0001f600" * 128) is False
    assert inbox_count(engine) == 1


async def test_an_engine_is_refused_it_has_no_transaction_of_yours(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    with pytest.raises(InvalidArgumentType, match="not an Engine"):
        Inbox(InboxEntry).accept(engine, "m", source=SOURCE)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match="not an Engine"):
        await AsyncInbox(InboxEntry).accept(async_engine, "m", source=SOURCE)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentType, match="needs a Session or a Connection, got str"):
        Inbox(InboxEntry).accept("postgresql://", "m", source=SOURCE)  # type: ignore[arg-type]
    assert inbox_count(engine) == 0


def test_a_model_that_is_not_an_inbox_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidArgumentType, match=r"is not an inbox table .*declare it with"):
        Inbox(Job)
    with pytest.raises(InvalidArgumentType, match="is not an inbox table"):
        Pruner(engine, inbox=Job)
    with pytest.raises(InvalidArgumentType, match="expected a Table or a mapped class"):
        AsyncInbox(object())


# -- retention -----------------------------------------------------------------------------


def seed(engine: Engine, ages: dict[dt.timedelta, int]) -> None:
    """Inbox entries received ``age`` before T0, ``n`` of each age."""
    rows = [
        {"source": SOURCE, "message_id": f"{age.total_seconds():.0f}-{i}", "received_at": T0 - age}
        for age, n in ages.items()
        for i in range(n)
    ]
    with engine.begin() as conn:
        conn.execute(insert(INBOX), rows)


def ages_left(engine: Engine) -> dict[dt.timedelta, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(INBOX.c.received_at, func.count()).group_by(INBOX.c.received_at)
        ).all()
    return {T0 - received_at: n for received_at, n in rows}


def test_the_pruner_deletes_old_entries_in_batches(engine: Engine) -> None:
    seed(engine, {30 * DAY: 7, 15 * DAY: 4, 13 * DAY: 3, dt.timedelta(hours=1): 2})
    progress: list[tuple[str, str, int]] = []
    pruner = Pruner(
        engine,
        inbox=InboxEntry,
        retention=Retention(inbox=14 * DAY, batch=4),
        clock=FakeClock(T0),
        progress=lambda table, what, n, _report: progress.append((table, what, n)),
    )
    report = pruner.run_once()
    assert (report.inbox, report.batches, report.deleted) == (11, 3, 11)
    assert progress == [(INBOX.fullname, "inbox", n) for n in (4, 4, 3)]
    assert ages_left(engine) == {13 * DAY: 3, dt.timedelta(hours=1): 2}
    assert pruner.run_once().inbox == 0


def test_the_default_window_is_14_days_and_none_keeps_everything(engine: Engine) -> None:
    seed(engine, {15 * DAY: 2, 13 * DAY: 1})
    clock = FakeClock(T0)
    kept = Pruner(engine, inbox=InboxEntry, retention=Retention(inbox=None), clock=clock)
    assert kept.run_once().inbox == 0
    assert Retention().inbox == 14 * DAY
    assert Pruner(engine, inbox=InboxEntry, clock=clock).run_once().inbox == 2
    assert ages_left(engine) == {13 * DAY: 1}


def test_another_pruner_holding_the_table_is_left_alone(engine: Engine) -> None:
    seed(engine, {30 * DAY: 3})
    with engine.begin() as holder:
        assert holder.execute(prune_lock(InboxEntry)).scalar() is True
        report = Pruner(engine, inbox=InboxEntry, clock=FakeClock(T0)).run_once()
    assert (report.inbox, report.skipped) == (0, [INBOX.fullname])
    assert ages_left(engine) == {30 * DAY: 3}


async def test_the_async_pruner_too(engine: Engine, async_engine: AsyncEngine) -> None:
    seed(engine, {20 * DAY: 5, DAY: 1})
    pruner = AsyncPruner(
        async_engine, inbox=InboxEntry, retention=Retention(inbox=7 * DAY), clock=FakeClock(T0)
    )
    assert (await pruner.run_once()).inbox == 5
    assert ages_left(engine) == {DAY: 1}


def test_prune_inbox_refuses_bad_windows_before_any_sql() -> None:
    with pytest.raises(InvalidArgument, match="older_than must be zero or more"):
        prune_inbox(InboxEntry, older_than=-1)
    with pytest.raises(InvalidArgument, match="batch must be between 1 and 10000"):
        prune_inbox(InboxEntry, older_than=60, batch=0)
    with pytest.raises(InvalidArgument, match="inbox must be zero or more"):
        Retention(inbox=-5)


# -- sa-outbox prune --inbox-model------------------------------------------------------------

TARGET = "tests.inbox_bed:InboxEntry"


def test_cli_prunes_the_inbox_alone(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    now = dt.datetime.now(dt.UTC)
    rows = [
        {"source": SOURCE, "message_id": f"m{i}", "received_at": now - age}
        for i, age in enumerate([20 * DAY] * 5 + [DAY] * 2)
    ]
    with engine.begin() as conn:
        conn.execute(insert(INBOX), rows)
    argv = ["prune", "--inbox-model", TARGET, "--inbox-older-than", "14d", "--batch", "2"]
    assert main([*argv, "--database-url", database_url]) == 0
    assert capsys.readouterr().out == (
        "pruned 0 succeeded, 0 failed and 0 cancelled jobs, 0 published events, "
        "5 inbox entries in 3 batches\n"
    )
    assert inbox_count(engine) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--inbox-model", TARGET], "the inbox needs --inbox-older-than"),
        (["--inbox-table", "public.inbox"], "the inbox needs --inbox-older-than"),
        ([], "give what to prune: the job table (--model or --jobs-table), the outbox"),
        (["--model", "tests.conftest:Job"], "the job table needs --older-than"),
        (["--outbox-model", "tests.conftest:OutboxEvent"], "the outbox needs --outbox-older"),
        (["--inbox-model", TARGET, "--inbox-older-than", "0s"], "must be more than"),
    ],
)
def test_cli_usage_errors_before_any_sql(
    engine: Engine, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(engine, {30 * DAY: 2})
    with pytest.raises(SystemExit) as exit_:
        main(["prune", *argv])  # no database URL at all: refused before connecting
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert inbox_count(engine) == 2


def test_cli_refuses_a_model_that_is_not_an_inbox(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(engine, {30 * DAY: 2})
    argv = ["prune", "--inbox-model", "tests.conftest:Job", "--inbox-older-than", "1d"]
    assert main([*argv, "--database-url", database_url]) == 1
    assert "tests.conftest:Job is a job model; --inbox-model needs the inbox model" in (
        capsys.readouterr().err
    )
    argv = ["prune", "--inbox-table", f"{TEST_SCHEMA}.jobs", "--inbox-older-than", "1d"]
    assert main([*argv, "--database-url", database_url]) == 1
    assert "is not an inbox table (no column message_id, received_at, source)" in (
        capsys.readouterr().err
    )
    assert inbox_count(engine) == 2


def test_the_mixin_declares_the_key_and_the_retention_index() -> None:
    assert [c.name for c in INBOX.primary_key.columns] == ["source", "message_id"]
    assert [(i.name, [c.name for c in i.columns]) for i in INBOX.indexes] == [
        ("inbox_retention_idx", ["received_at"])
    ]
    assert issubclass(InboxEntry, InboxMixin)
