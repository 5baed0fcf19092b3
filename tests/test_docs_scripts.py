"""docs/scripts.md, followed as a reader would: plain scripts, no web framework.

In an empty folder of its own: the page's snippets are written to the files their first
line names (``myjobs.py``, ``enqueue.py``, ``worker.py``, ``drain.py``); its ``sh`` lines
run in order, each a process of this interpreter, against a schema of the test's own; the
long-running ``python worker.py`` is stopped by SIGTERM once its jobs have succeeded. Each
``text`` block that follows an ``sh`` block is what that block's commands print, together.
Every block of the page is used, so none can rot.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.schema import CreateSchema, DropSchema

from .helpers import wait_until
from .test_docs import Block, blocks

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "scripts.md"
SCHEMA = f"docs_scripts_{os.getpid()}"
FILES = ("scripts-myjobs", "scripts-enqueue", "scripts-worker", "scripts-drain")


@pytest.fixture
def folder(database_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(SCHEMA))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    for block in blocks(PAGE):
        if block.snippet in FILES:
            name = block.code.splitlines()[0].removeprefix("# ")
            (tmp_path / name).write_text(block.code)
    try:
        yield url.render_as_string(hide_password=False), tmp_path
    finally:
        with admin.begin() as conn:
            conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
        admin.dispose()


def environment(url: str) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    env.pop("SA_OUTBOX_DATABASE_URL", None)
    return env


def jobs(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT status, count(*) FROM jobs GROUP BY status"))
            return {str(status): n for status, n in found}
    finally:
        engine.dispose()


def run_worker_until(url: str, cwd: Path, argv: list[str], succeeded: int) -> str:
    """Start the long-running script, wait for ``succeeded`` jobs, stop it with SIGTERM."""
    log = cwd / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, *argv],
            cwd=cwd,
            env=environment(url),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: jobs(url).get("succeeded", 0) == succeeded, "the jobs to succeed")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    output = log.read_text()
    assert worker.returncode == 0, output
    return output


def test_the_scripts_run_as_written(folder: tuple[str, Path]) -> None:
    url, cwd = folder
    found = list(blocks(PAGE))
    assert {b.snippet for b in found if b.snippet} == set(FILES), "a snippet this test skips"
    assert not [b for b in found if b.info == "python" and not b.snippet]

    printed: list[str] = []  # what the last sh block's commands printed
    shown: list[tuple[Block, list[str]]] = []  # each text block, and what it must match
    worker_log = ""
    for block in found:
        if block.language == "sh":
            printed = []
            for line in filter(None, block.code.splitlines()):
                argv = shlex.split(line)
                assert argv[0] == "python", f"docs/scripts.md:{block.line}: cannot run {line}"
                if argv[1] == "worker.py":
                    worker_log = run_worker_until(url, cwd, argv[1:], succeeded=3)
                    continue
                done = subprocess.run(
                    [sys.executable, *argv[1:]],
                    cwd=cwd,
                    env=environment(url),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
                printed += done.stdout.splitlines()
        elif block.language == "text":
            shown.append((block, printed))

    assert len(shown) == 2
    for block, output in shown:
        assert output == block.code.splitlines(), f"docs/scripts.md:{block.line}\n{output}"
    for name in ("a", "b", "c"):
        assert f"resized photos/{name}.jpg to 800 px" in worker_log
    assert "Worker" in worker_log and "stopping" in worker_log  # logging.basicConfig works
    assert jobs(url) == {"succeeded": 4}
