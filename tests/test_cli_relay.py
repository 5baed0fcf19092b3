"""``sa-outbox relay``: its TARGET forms and ``--database-url``, against the test database.

A function of an engine gets one made on the command's URL (an ``AsyncEngine`` when its
parameter says so); a relay object keeps its own engine, and ``--database-url`` with it is
refused before anything runs.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from sa_outbox import Outbox
from sa_outbox.cli import (
    ENV_APP_DATABASE_URL,
    ENV_DATABASE_URL,
    CommandError,
    load_relay_target,
    main,
)

from .conftest import OutboxEvent

MODULE = textwrap.dedent(
    """
    from __future__ import annotations

    import os
    from typing import TYPE_CHECKING

    from sqlalchemy import Engine, create_engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from sa_outbox import AsyncRelay, Relay
    from sa_outbox.publishers.callable import CallablePublisher
    from tests.conftest import OutboxEvent

    if TYPE_CHECKING:  # only a type checker resolves this name: the command reads the text
        import sqlalchemy.ext.asyncio as sa_asyncio

    published = []
    OPTIONS = dict(listen=False, vacuum=None)


    def publisher():
        return CallablePublisher(lambda event: published.append(event.payload["n"]))


    def make_relay(engine: Engine) -> Relay:
        return Relay(engine, OutboxEvent, publisher(), **OPTIONS)


    def make_async_relay(engine: AsyncEngine) -> AsyncRelay:
        return AsyncRelay(engine, OutboxEvent, publisher(), **OPTIONS)


    def make_late_async_relay(engine: sa_asyncio.AsyncEngine) -> AsyncRelay:
        return AsyncRelay(engine, OutboxEvent, publisher(), **OPTIONS)


    def make_relay_untyped(engine, name="untyped"):
        return Relay(engine, OutboxEvent, publisher(), name=name, **OPTIONS)


    def create_relay():  # no arguments: it makes its own engine
        return Relay(create_engine(os.environ["RELAY_TEST_URL"]), OutboxEvent, publisher(),
                     **OPTIONS)


    def two_engines(a, b):
        raise AssertionError("never called")


    def not_a_relay(engine):
        return 42


    def not_of_an_engine(obj):
        raise AssertionError("never called")
    """
)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str) -> str:
    name = f"relays_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RELAY_TEST_URL", database_url)
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv(ENV_APP_DATABASE_URL, raising=False)
    return name


def append(engine: Engine, *numbers: int) -> None:
    with engine.begin() as conn:
        for n in numbers:
            Outbox(OutboxEvent).append(
                conn,
                event_type="Counted",
                aggregate_type="counter",
                aggregate_id=1,
                payload={"n": n},
            )


def unpublished(engine: Engine) -> int:
    t = OutboxEvent.__table__
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).where(t.c.published_at.is_(None))) or 0


@pytest.mark.parametrize(
    "factory", ["make_relay", "make_async_relay", "make_late_async_relay", "make_relay_untyped"]
)
def test_a_function_of_an_engine_gets_one_on_the_database_url(
    engine: Engine,
    database_url: str,
    module: str,
    factory: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    append(engine, 1, 2, 3)
    argv = ["relay", f"{module}:{factory}", "--once", "--database-url", database_url]
    assert main([*argv, "--log-level", "ERROR"]) == 0
    assert "3 claimed, 3 published" in capsys.readouterr().out
    assert sys.modules[module].published == [1, 2, 3]
    assert unpublished(engine) == 0


def test_the_engine_matches_the_annotation(engine: Engine, database_url: str, module: str) -> None:
    relay, made = load_relay_target(f"{module}:make_late_async_relay", database_url)
    assert isinstance(made, AsyncEngine) and relay.engine is made
    asyncio.run(made.dispose())
    relay, made = load_relay_target(f"{module}:make_relay", database_url)
    assert isinstance(made, Engine) and relay.engine is made
    made.dispose()


def test_a_function_of_no_arguments_keeps_working(
    engine: Engine, module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    append(engine, 7)
    assert main(["relay", f"{module}:create_relay", "--once", "--log-level", "ERROR"]) == 0
    assert "1 claimed, 1 published" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["create_relay", "relay_object"])
def test_database_url_with_a_relay_of_its_own_is_refused_before_anything_runs(
    engine: Engine,
    database_url: str,
    module: str,
    target: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    append(engine, 1)
    if target == "relay_object":
        loaded = importlib.import_module(module)
        loaded.relay_object = loaded.create_relay()
    argv = ["relay", f"{module}:{target}", "--once", "--database-url", database_url]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sa-outbox relay: error: --database-url cannot apply to {module}:")
    assert "name a function of the engine instead" in err and err.count("\n") == 1
    assert unpublished(engine) == 1


def test_the_environment_is_not_read_for_a_relay_of_its_own(
    engine: Engine, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(engine, 1)
    monkeypatch.setenv(ENV_APP_DATABASE_URL, "sqlite://")  # would be refused, were it read
    assert main(["relay", f"{module}:create_relay", "--once", "--log-level", "ERROR"]) == 0
    assert unpublished(engine) == 0


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("two_engines", "is not a Relay or an AsyncRelay, nor a function of an engine"),
        ("not_a_relay", "is not a Relay or an AsyncRelay, nor a function of an engine"),
        ("OPTIONS", "is not a Relay or an AsyncRelay, nor a function of an engine"),
        ("not_of_an_engine", "is not a Relay or an AsyncRelay, nor a function of an engine"),
        ("missing", "has no attribute 'missing'"),
    ],
)
def test_a_target_that_is_no_relay_says_so(
    database_url: str, module: str, target: str, message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        load_relay_target(f"{module}:{target}", database_url)


def test_an_unreachable_database_is_one_line_without_the_password(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "postgresql://relay:hunter2@127.0.0.1:1/nowhere"
    argv = ["relay", f"{module}:make_relay", "--once", "--database-url", url]
    assert main([*argv, "--log-level", "ERROR"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "sa-outbox relay: error: cannot connect to "
        "postgresql+psycopg://relay:***@127.0.0.1:1/nowhere: "
    )
    assert "hunter2" not in err and err.count("\n") == 1
