"""The synchronous runtimes are generated from the asyncio ones (tools/async_to_sync.py): the
files in the clone are what a fresh generation gives, a hand edit fails the check, and the
transform's rules (names, markers, prose) hold."""

from __future__ import annotations

import doctest
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "async_to_sync.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = load_tool()
#: The default names, and what a conversion adds: its own classes, a module.
RENAMES = tool.Names({**tool.NAMES, "AsyncRelay": "Relay"}, {**tool.DOTTED, "asyncio": "threading"})


def run_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "async_to_sync.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_generated_file_is_what_its_source_generates() -> None:
    done = run_check(ROOT)
    assert done.returncode == 0, (
        f"{done.stdout}{done.stderr}\n(regenerate: python tools/async_to_sync.py)"
    )


def test_a_generated_file_edited_by_hand_fails_the_check(tmp_path: Path) -> None:
    for conversion in tool.CONVERSIONS:
        for path in (conversion.source, conversion.target):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, tmp_path / path)
    for path in ("tools/async_to_sync.py", "pyproject.toml"):  # the tool and ruff's settings
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    assert run_check(tmp_path).returncode == 0

    target = tmp_path / tool.CONVERSIONS[0].target
    edited = target.read_text().replace("return report\n", "return report  # hand edit\n", 1)
    assert edited != target.read_text()
    target.write_text(edited)
    done = run_check(tmp_path)
    assert done.returncode == 1
    assert "-        return report  # hand edit" in done.stdout  # the diff says what differs
    assert "python tools/async_to_sync.py" in done.stderr


def test_async_syntax_and_names_become_synchronous() -> None:
    source = '''\
# the source's note, replaced by the header
"""`AsyncRelay` on an ``AsyncEngine``.

Examples:
    await relay.aclose()
"""

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine


async def run(engine: AsyncEngine, event: asyncio.Event) -> None:
    async with engine.begin() as conn:  # `await conn.run()` inside
        async for row in await conn.stream():
            await row.aclose()
    print(f"AsyncRelay({engine!r})")
'''
    expected = '''\
# generated from _async.py by tools/async_to_sync.py — do not edit
# (edit _async.py and run `python tools/async_to_sync.py`)
"""`Relay` on an ``Engine``.

Examples:
    relay.close()
"""

import threading

from sqlalchemy import Engine


def run(engine: Engine, event: threading.Event) -> None:
    with engine.begin() as conn:  # `conn.run()` inside
        for row in conn.stream():
            row.close()
    print(f"Relay({engine!r})")
'''
    assert tool.convert(source, "_async.py", renames=RENAMES) == expected


def test_markers_drop_an_async_statement_and_add_a_sync_line() -> None:
    source = """\
def f() -> None:
    if loop is not None:  # async-only
        loop.stop()
    # sync-only: thread.join()
    done()
"""
    assert tool.convert(source, "m.py").splitlines()[2:] == [
        "def f() -> None:",
        "    thread.join()",
        "    done()",
    ]


def test_prose_of_the_text_table_is_replaced_as_is_and_must_match() -> None:
    source = '"""Use `Relay` from synchronous code; `AsyncRelay` is this one."""\n'
    text = {"Use `Relay` from synchronous code": "Use `AsyncRelay` from asyncio code"}
    assert tool.convert(source, "m.py", text, RENAMES).splitlines()[2] == (
        '"""Use `AsyncRelay` from asyncio code; `Relay` is this one."""'
    )
    with pytest.raises(tool.ConversionError, match="match nothing"):
        tool.convert(source, "m.py", {"no such words": "x"})


def test_the_tool_s_own_examples() -> None:
    assert doctest.testmod(tool).failed == 0
