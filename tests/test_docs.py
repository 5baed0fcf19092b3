"""The code in README.md and docs/*.md runs, against the test database.

Fence convention (for every Markdown file of the project):

- A block fenced ```` ```python ```` (that word alone) is **executed**. The blocks of one file
  run in order in one namespace, as one test: a later block sees the names an earlier one
  defined, as a reader following the page would.
- A ```` ```python ```` block directly preceded by the line ``<!-- snippet: NAME -->`` is a
  **named snippet**: another test extracts it by name and runs it in the context it needs
  (``tests/test_alembic.py`` runs docs/alembic.md's inside a real Alembic environment).
  Here it must parse, and is not run.
- A block fenced ```` ```py ```` is **shown, not run**: a fragment that cannot run here (an
  Alembic ``env.py`` excerpt, code that needs a broker or a web app). It must still parse.
- ```` ```python ```` followed by anything (``title="env.py"``…) is refused, so that whether a
  block runs never depends on a detail of its info string. Use ```` ```py ```` instead.
- Any other fence (``sh``, ``console``, ``text``, ``sql``, ``toml``, ``pycon``…) is ignored.

How the executed code meets the database: ``os.environ["DATABASE_URL"]`` holds the test
database's URL with ``search_path`` set to a schema of this test's own, created empty before
each file and dropped after it. So the docs declare plain tables (``"jobs"``, ``"outbox"``)
as a reader's application would, and never collide with other tests. Engines a file leaves
in its namespace are disposed; asynchronous engines must be disposed by the code itself
(``await engine.dispose()``), as the docs should teach anyway.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.schema import CreateSchema, DropSchema

from sa_outbox import JobMixin, OutboxMixin

from .helpers import unset_tracer_provider

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
#: Pages whose code must not silently stop running (a typo in a fence would do that).
MUST_RUN = {
    "README.md",
    "docs/tour.md",
    "docs/getting-started.md",
    "docs/retention.md",
    "docs/inbox.md",
    "docs/vacuum.md",
    "docs/flask.md",
    "docs/concurrency.md",
}
SCHEMA = f"docs_demo_{os.getpid()}"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_SNIPPET = re.compile(r"^\s*<!--\s*snippet:\s*(?P<name>\S+)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    path: str
    line: int  # 1-based line of the first line of code
    info: str
    code: str
    snippet: str | None = None

    @property
    def language(self) -> str:
        return self.info.split(maxsplit=1)[0] if self.info else ""

    def compiled(self) -> object:
        # Pad with blank lines so tracebacks point at the Markdown file's own line numbers.
        return compile("\n" * (self.line - 1) + self.code, self.path, "exec")


def _dedent(line: str, indent: int) -> str:
    return line[indent:] if not line[:indent].strip() else line.lstrip()


def blocks(path: Path, root: Path = ROOT) -> Iterator[Block]:
    """Every fenced block of a Markdown file, with its info string and dedented code."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = path.relative_to(root).as_posix()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        i += 1
        if not opening:
            continue
        marker = _SNIPPET.match(lines[i - 2]) if i >= 2 else None
        indent, fence = len(opening["indent"]), opening["fence"]
        start, body = i, []
        while i < len(lines):
            closing = _FENCE.match(lines[i])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            body.append(_dedent(lines[i], indent))
            i += 1
        i += 1
        snippet = marker["name"] if marker else None
        yield Block(name, start + 1, opening["info"].strip(), "\n".join(body) + "\n", snippet)


def test_the_fence_parser_keeps_order_lines_and_languages(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# title\n```python\nx = 1\n```\ntext\n1. step\n   ```py\n   y = x\n   ```\n"
        "````sh\n```\nnot a fence end\n````\n<!-- snippet: env -->\n```python\nz = 3\n```\n",
        encoding="utf-8",
    )
    assert list(blocks(page, root=tmp_path)) == [
        Block("page.md", 3, "python", "x = 1\n"),
        Block("page.md", 8, "py", "y = x\n"),
        Block("page.md", 11, "sh", "```\nnot a fence end\n"),
        Block("page.md", 16, "python", "z = 3\n", snippet="env"),
    ]


@pytest.fixture
def docs_database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
        conn.execute(CreateSchema(SCHEMA))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    monkeypatch.setenv("DATABASE_URL", url.render_as_string(hide_password=False))
    yield SCHEMA
    with admin.begin() as conn:
        conn.execute(DropSchema(SCHEMA, cascade=True, if_exists=True))
    admin.dispose()


def run_page(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the page's executed blocks, in order, in one fresh module namespace."""
    runnable = [b for b in blocks(path) if b.info == "python" and not b.snippet]
    # A real module, so that SQLAlchemy and dataclasses can resolve the page's annotations.
    page = types.ModuleType("docs_" + re.sub(r"\W", "_", path.stem))
    monkeypatch.setitem(sys.modules, page.__name__, page)
    # A page may set OpenTelemetry's global tracer provider (once per process, otherwise).
    unset_tracer_provider()
    try:
        for block in runnable:
            exec(block.compiled(), page.__dict__)
    finally:
        for value in list(page.__dict__.values()):
            if isinstance(value, Engine):
                value.dispose()
        unset_tracer_provider()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_code_runs(path: Path, docs_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    found = list(blocks(path))
    refused = [
        f"{b.path}:{b.line}: {b.info}"
        for b in found
        if b.language == "python" and b.info != "python"
    ]
    assert not refused, f"use ```py for blocks that must not run, not: {refused}"
    for block in found:
        if block.language == "py" or (block.info == "python" and block.snippet):
            ast.parse(block.code, f"{block.path}:{block.line}")
    runnable = [b for b in found if b.info == "python" and not b.snippet]
    if path.relative_to(ROOT).as_posix() in MUST_RUN:
        assert runnable, f"{path.name} has no ```python block left to run"
    run_page(path, monkeypatch)


def test_the_readme_runs_again_on_the_same_database(
    docs_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader runs the README's code, then the tour's, twice: the tables, jobs and events
    of the first run are still there, and the second run must not trip over them."""
    for _ in range(2):
        run_page(ROOT / "README.md", monkeypatch)
        run_page(ROOT / "docs" / "tour.md", monkeypatch)


def test_alembic_md_lists_the_indexes_the_operations_create() -> None:
    """docs/alembic.md's two bullets name every index of each table, and no other."""
    text = (ROOT / "docs" / "alembic.md").read_text(encoding="utf-8")

    class Base(DeclarativeBase):
        pass

    class Job(JobMixin, Base):
        __tablename__ = "t"

    class OutboxEvent(OutboxMixin, Base):
        __tablename__ = "t"
        __table_schema__ = "other"

    for operation, model in (("create_job_queue", Job), ("create_outbox", OutboxEvent)):
        bullet = re.search(rf"^- `{operation}` (.*?)(?=^- |\Z)", text, re.M | re.S)
        assert bullet, f"docs/alembic.md has no bullet for {operation}"
        listed = set(re.findall(r"`\{table\}_(\w+)`", bullet.group(1)))
        created = {index.name.removeprefix("t_") for index in model.__table__.indexes}
        assert listed == created, f"{operation}: the page lists {listed}, the table has {created}"


def test_the_decision_guide_shows_the_readmes_benchmark_table() -> None:
    """docs/decision-guide.md repeats docs/benchmarks.md's measured table; they must not
    drift."""
    readme = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("| workload |"))
    end = next(i for i in range(start, len(readme)) if not readme[i].startswith("|"))
    guide = (ROOT / "docs" / "decision-guide.md").read_text(encoding="utf-8")
    shown = re.search(
        r"<!-- benchmark-table[^\n]*-->\n(.*?)\n<!-- /benchmark-table -->", guide, re.S
    )
    assert shown, "docs/decision-guide.md has no benchmark-table markers"
    assert shown.group(1).splitlines() == readme[start:end]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_footnote_is_defined_and_cited(path: Path) -> None:
    """A footnote cited but not defined renders as text; one defined but not cited is a
    source the page no longer uses (docs/comparison.md is made of them)."""
    text = path.read_text(encoding="utf-8")
    defined = set(re.findall(r"^\[\^([\w-]+)\]:", text, re.M))
    cited = {
        m[1] for m in re.finditer(r"\[\^([\w-]+)\]", text) if not _footnote_definition(text, m)
    }
    assert cited == defined, f"cited, not defined: {cited - defined}; unused: {defined - cited}"


def _footnote_definition(text: str, match: re.Match[str]) -> bool:
    at_line_start = match.start() == 0 or text[match.start() - 1] == "\n"
    return at_line_start and text[match.end() : match.end() + 1] == ":"
