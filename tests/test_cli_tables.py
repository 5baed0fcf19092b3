"""Every command that reads the tables names them one way: ``--model`` / ``--jobs-table``,
``--outbox-model`` / ``--outbox-table``, ``--pause-model`` / ``--pause-table``,
``--inbox-model`` / ``--inbox-table``; and an option a command does not know is reported by
that command, with its own usage. Real PostgreSQL; each pruning test counts what is left."""

from __future__ import annotations

import datetime as dt
import re
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select

from sa_outbox.cli import build_parser

from .conftest import TEST_SCHEMA
from .helpers import cli_exit
from .helpers import run_cli as run
from .inbox_bed import (
    INBOX,
    SOURCE,
    create_consumer_tables,
    drop_consumer_tables,
    truncate_consumer_tables,
)
from .test_retention import (
    EVENTS,
    JOBS,
    KEPT_JOBS,
    SEEDED_EVENTS,
    event_counts,
    job_counts,
    seed,
)

ROOT = Path(__file__).resolve().parents[1]
JOBS_TABLE = ["--jobs-table", f"{TEST_SCHEMA}.jobs"]
OUTBOX_TABLE = ["--outbox-table", f"{TEST_SCHEMA}.outbox"]
JOB = "--model TARGET | --jobs-table [SCHEMA.]TABLE"
OUTBOX = "--outbox-model TARGET | --outbox-table [SCHEMA.]TABLE"
PAUSE = "--pause-model TARGET | --pause-table [SCHEMA.]TABLE"
INBOX_OPTIONS = "--inbox-model TARGET | --inbox-table [SCHEMA.]TABLE"
NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


@pytest.fixture
def consumer_tables(engine: Engine) -> Iterator[None]:
    create_consumer_tables(engine)
    truncate_consumer_tables(engine)
    yield
    drop_consumer_tables(engine)


def usage(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The usage block of ``sa-outbox argv --help``, on one line."""
    out, _ = cli_exit(capsys, [*argv, "--help"], 0)
    return " ".join(out.split("\n\n")[0].split())


@pytest.mark.parametrize(
    ("argv", "groups"),
    [
        (["status"], [JOB, OUTBOX, PAUSE]),
        (["queues"], [JOB, PAUSE]),
        (["queues", "pause"], [JOB, PAUSE]),
        (["queues", "resume"], [JOB, PAUSE]),
        (["jobs", "enqueue"], [JOB]),
        (["jobs", "list"], [JOB]),
        (["jobs", "show"], [JOB]),
        (["jobs", "retry"], [JOB]),
        (["jobs", "cancel"], [JOB]),
        (["outbox", "list"], [OUTBOX]),
        (["outbox", "show"], [OUTBOX]),
        (["outbox", "retry"], [OUTBOX]),
        (["dashboard"], [JOB, OUTBOX]),
        (["health"], [JOB, OUTBOX]),
        (["prune"], [JOB, OUTBOX, INBOX_OPTIONS]),
    ],
    ids=" ".join,
)
def test_every_command_names_the_tables_the_same_way(
    argv: list[str], groups: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    shown = usage(capsys, argv)
    for group in groups:
        assert f"[{group}]" in shown, shown
    assert "--outbox TARGET" not in shown and "--inbox TARGET" not in shown


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["health", "tests.conftest:Job"], "unrecognized arguments: tests.conftest:Job"),
        (["prune", "tests.conftest:Job", "--older-than", "1d"], "unrecognized arguments"),
        (["prune", "--outbox", "m:E", "--older-than", "1d"], "ambiguous option: --outbox"),
        (["prune", "--inbox", "m:I", "--inbox-older-than", "1d"], "ambiguous option: --inbox"),
        (["partitions", "maintain", "--table", "m:J"], "one of the arguments --model --outbox"),
    ],
)
def test_the_old_forms_are_gone(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = cli_exit(capsys, argv, 2)
    assert message in err.splitlines()[-1]


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("health", ["--model", "m:J"]),
        ("status", []),
        ("queues", []),
        ("queues pause", ["emails"]),
        ("jobs list", []),
        ("jobs enqueue", ["k", "--payload", "{}"]),
        ("outbox retry", ["--all-parked"]),
        ("prune", ["--model", "m:J", "--older-than", "1d"]),
        ("partitions maintain", ["--model", "m:J"]),
        ("worker", ["m:app"]),
        ("relay", ["m:make_relay"]),
        ("demo", []),
        ("dashboard", []),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_an_unknown_option_shows_the_usage_of_its_command(
    name: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = cli_exit(capsys, [*name.split(), *argv, "--bogus"], 2)
    lines = err.splitlines()
    assert lines[0].startswith(f"usage: sa-outbox {name} "), err
    assert lines[-1] == f"sa-outbox {name}: error: unrecognized arguments: --bogus"


def test_prune_reflects_the_tables_by_name(
    engine: Engine, database_url: str, consumer_tables: None, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(engine, now=NOW)
    rows = [
        {"source": SOURCE, "message_id": f"m{i}", "received_at": NOW - age}
        for i, age in enumerate([20 * DAY] * 3 + [DAY] * 2)
    ]
    with engine.begin() as conn:
        conn.execute(insert(INBOX), rows)
    argv = ["prune", *JOBS_TABLE, "--older-than", "1d", "--failed-older-than", "30d"]
    argv += [*OUTBOX_TABLE, "--outbox-older-than", "7d"]
    argv += ["--inbox-table", INBOX.fullname, "--inbox-older-than", "14d"]
    code, out, err = run(capsys, *argv, "--database-url", database_url)
    assert code == 0, err
    assert out.startswith(
        "pruned 25 succeeded, 7 failed and 0 cancelled jobs, 12 published events, "
        "3 inbox entries in "
    )
    assert job_counts(engine, NOW) == KEPT_JOBS
    assert event_counts(engine, NOW) == {**SEEDED_EVENTS, "old published": 0}
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(INBOX)).scalar_one() == 2


def test_prune_refuses_a_table_of_another_kind(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(engine, now=NOW)
    jobs = job_counts(engine, NOW)
    argv = ["prune", "--jobs-table", EVENTS.fullname, "--older-than", "1d"]
    code, _, err = run(capsys, *argv, "--database-url", database_url)
    assert code == 1
    assert f"{EVENTS.fullname} is not a job table (no column" in err
    argv = ["prune", "--outbox-model", "tests.conftest:Job", "--older-than", "1d"]
    code, _, err = run(capsys, *argv, "--database-url", database_url)
    assert code == 1
    assert "tests.conftest:Job is a job model; --outbox-model needs the outbox model" in err
    assert event_counts(engine, NOW) == SEEDED_EVENTS
    assert job_counts(engine, NOW) == jobs  # nothing pruned


def test_health_reflects_the_tables_by_name(
    engine: Engine, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(engine, now=NOW)
    code, out, err = run(
        capsys, "health", *JOBS_TABLE, *OUTBOX_TABLE, "--database-url", database_url
    )
    assert code == 0, err
    assert f"{JOBS.fullname}: pending 4, running 3, succeeded 28, failed 9" in out
    assert f"{EVENTS.fullname}: published 14, unpublished 3, parked 2" in out
    code, out, err = run(capsys, "health", *OUTBOX_TABLE, "--database-url", database_url)
    assert code == 0, err
    assert f"{EVENTS.fullname}: " in out and f"{JOBS.fullname}: " not in out
    code, out, err = run(capsys, "health", "--database-url", database_url)
    assert code == 1 and "give the job table (--model" in err


def documented_command_lines() -> list[tuple[str, str]]:
    """Every ``sa-outbox …`` line of a sh or console block in the README and docs/, with
    its continuation lines joined and its comment cut: (where, line)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fence = None
        lines = page.read_text().splitlines()
        number = 0
        while number < len(lines):
            line = lines[number]
            number += 1
            if line.startswith("```"):
                fence = None if fence is not None else line[3:].strip()
                continue
            if fence not in ("sh", "console", "bash", "shell"):
                continue
            text = line.removeprefix("$ ") if fence == "console" else line
            if not text.startswith("sa-outbox ") or (fence == "console" and text == line):
                continue  # in a console block, a line without its prompt is output
            where = f"{page.name}:{number}"
            while text.endswith("\\") and number < len(lines):
                text = text[:-1] + " " + lines[number].strip()
                number += 1
            found.append((where, text.split(" #")[0].strip()))
    return found


@pytest.mark.parametrize(("where", "line"), documented_command_lines(), ids=lambda v: v)
def test_every_documented_command_line_parses(where: str, line: str) -> None:
    argv = [re.sub(r"^[A-Z]+_ID$", str(uuid.UUID(int=1)), arg) for arg in shlex.split(line)]
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exit_:
        raise AssertionError(f"{where}: {line!r} is refused by the parser") from exit_
