"""docs/operations.md's commands, run as printed, against a queue in a known state: every
``console`` block's ``$ sa-outbox …`` lines run in order (``sa-outbox`` is this interpreter's
``python -m sa_outbox``) and print what the page shows, ids, times and ages aside.

``myapp/models.py`` is the page's ``<!-- snippet: operations-models -->``, verbatim.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.schema import CreateSchema, DropSchema

from sa_outbox import JobQueue, Outbox

from .test_docs import blocks

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "operations.md"
SCHEMA = f"docs_operations_{os.getpid()}"
#: The ids the page shows: the failed job and the parked event.
FAILED_ID = uuid.UUID("0b0e6c1e-3f4a-4c9e-9d1e-2f8a3b4c5d6e")
PARKED_ID = uuid.UUID("7d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d")

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?(\+00:00)?")
_AGE = re.compile(r"\b\d+(s|m\d\ds|h\d\dm|d\d\dh)\b")


def normalised(output: str) -> list[str]:
    """Ids, times and ages replaced, runs of spaces made one: what must match the page."""
    lines = []
    for line in output.strip("\n").splitlines():
        line = _AGE.sub("AGE", _TIME.sub("TIME", _UUID.sub("ID", line)))
        lines.append(" ".join(line.split()))
    return lines


def console_commands(path: Path) -> list[tuple[int, str, str]]:
    """``(line, command, expected output)`` of every ``$ `` line of the page's console blocks."""
    found = []
    for block in blocks(path):
        if block.language != "console":
            continue
        command: str | None = None
        shown: list[str] = []
        start = block.line
        for offset, line in enumerate(block.code.splitlines()):
            if line.startswith("$ "):
                if command is not None:
                    found.append((start, command, "\n".join(shown)))
                command, shown, start = line[2:], [], block.line + offset
            else:
                shown.append(line)
        if command is not None:
            found.append((start, command, "\n".join(shown)))
    return found


def models_snippet() -> str:
    [models] = [b.code for b in blocks(PAGE) if b.snippet == "operations-models"]
    return models


@pytest.fixture
def shop(database_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(SCHEMA))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    shown = url.render_as_string(hide_password=False)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "models.py").write_text(models_snippet())
    namespace: dict[str, object] = {}
    exec(compile(models_snippet(), str(PAGE), "exec"), namespace)
    engine = create_engine(shown)
    try:
        namespace["Base"].metadata.create_all(engine)  # type: ignore[attr-defined]
        set_the_scene(engine, namespace["Job"], namespace["OutboxEvent"])
    finally:
        engine.dispose()
    yield shown, tmp_path
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
    admin.dispose()


def set_the_scene(engine: Engine, job: object, event: object) -> None:
    """The state the page describes: 3 emails waiting, one that failed for good, 2 images
    resized; one event the broker kept refusing, parked, and one waiting for the relay."""
    queue, outbox = JobQueue(job), Outbox(event)
    with engine.begin() as conn:
        for n in range(3):
            queue.enqueue(conn, "send-email", {"to": f"user{n}@example.com"}, queue="emails")
        failing = queue.enqueue(
            conn, "send-email", {"to": "ana@example"}, queue="emails", max_attempts=3, priority=5
        )
        for n in range(2):
            queue.enqueue(conn, "resize-image", {"image": n})
        conn.execute(
            text("UPDATE jobs SET id = :fixed WHERE id = :id"),
            {"fixed": FAILED_ID, "id": failing.id},
        )
        for aggregate in ("41", "42"):
            outbox.append(
                conn,
                event_type="OrderPlaced",
                aggregate_type="order",
                aggregate_id=aggregate,
                payload={"order": int(aggregate)},
            )
    with engine.begin() as conn:
        for claimed in queue.claim(conn, worker_id="docs", kinds=["resize-image"], batch=2):
            queue.complete(conn, claimed.id, claimed.lease_token)
    error = (
        "SMTPRecipientsRefused: {'ana@example': (550, b'5.1.1 no such user')}\n"
        "Traceback (most recent call last):\n"
        '  File "myapp/tasks.py", line 12, in send_email\n'
        "    smtp.send_message(message)"
    )
    for _ in range(3):  # three attempts, each refused: failed for good at the third
        with engine.begin() as conn:
            [held] = queue.claim(conn, worker_id="docs", kinds=["send-email"], batch=1)
            assert held.id == FAILED_ID
            queue.retry(conn, held.id, held.lease_token, error=error, delay=0)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE outbox SET id = :fixed, parked_at = now(), attempts = 10,"
                " last_error = 'NACK from RabbitMQ: message refused (x-max-length reached)'"
                " WHERE aggregate_id = '41'"
            ),
            {"fixed": PARKED_ID},
        )


def test_the_page_has_commands_and_the_models_snippet() -> None:
    commands = console_commands(PAGE)
    assert len(commands) >= 8
    assert all(command.startswith("sa-outbox ") for _, command, _ in commands)
    assert "class Job(JobMixin, Base)" in models_snippet()


def run_sa_outbox(argv: list[str], shop: tuple[str, Path]) -> subprocess.CompletedProcess[str]:
    """``sa-outbox argv`` in a process of its own, in the shop's folder, on its database (by
    ``$DATABASE_URL``, as the page's application has it)."""
    url, cwd = shop
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": f"{cwd}{os.pathsep}{ROOT}"}
    env.pop("SA_OUTBOX_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "sa_outbox", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_command_prints_what_the_page_shows(shop: tuple[str, Path]) -> None:
    for line, command, expected in console_commands(PAGE):
        done = run_sa_outbox(shlex.split(command)[1:], shop)
        printed = done.stdout + done.stderr
        where = f"docs/operations.md:{line}: {command}"
        assert (done.returncode != 0) == ("error:" in done.stderr), f"{where}\n{printed}"
        assert normalised(printed) == normalised(expected), f"{where}\n{printed}"


def readme_commands() -> list[str]:
    """The ``sh`` lines of docs/tour.md's "See and steer the queue" section."""
    readme = ROOT / "docs" / "tour.md"
    text_ = readme.read_text(encoding="utf-8")
    start = text_.index("## See and steer the queue")
    end = text_.find("\n## ", start + 1) % (len(text_) + 1)
    lines = text_[start:end].splitlines()
    section_start = text_[:start].count("\n") + 1
    commands = []
    for block in blocks(readme):
        if block.language == "sh" and section_start <= block.line < section_start + len(lines):
            commands += [line for line in block.code.splitlines() if line.strip()]
    return commands


def test_the_readme_commands_run(shop: tuple[str, Path]) -> None:
    commands = readme_commands()
    assert len(commands) == 8
    for command in commands:
        argv = shlex.split(command.replace("JOB_ID", str(FAILED_ID)), comments=True)
        if "--watch" in argv:
            argv += ["--count", "1"]  # one frame, then exit
        done = run_sa_outbox(argv[1:], shop)
        assert done.returncode == 0, f"README: {command}\n{done.stdout}{done.stderr}"
        assert done.stdout.strip(), command
