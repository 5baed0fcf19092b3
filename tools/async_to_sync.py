#!/usr/bin/env python
"""Generate the synchronous runtimes from their asyncio sources.

The asyncio side is written by hand; its synchronous twin is generated from it, so the two
cannot drift apart. ``CONVERSIONS`` lists the pairs (the relay, the worker, the job queue,
the outbox, partition maintenance, durable steps). Run from anywhere in the clone:

    python tools/async_to_sync.py            # rewrite every generated file
    python tools/async_to_sync.py --check    # exit 1 and print a diff if one is stale

``nox -s generated`` runs the check (so does ``tests/test_generated.py``). It needs ruff,
which formats what it generates, importable by the Python that runs it.

The transform reads tokens, not an AST, so comments and layout survive:

- ``async def``/``async with``/``async for`` lose their ``async``; ``await x`` becomes ``x``.
- Names are mapped by ``NAMES`` (``AsyncEngine`` → ``Engine``, ``aclose`` → ``close``…) and
  the conversion's own (``AsyncRelay`` → ``Relay``), dotted names by ``DOTTED`` first
  (``sqlalchemy.ext.asyncio`` → ``sqlalchemy``), wherever they stand: code, strings,
  docstrings, comments, so examples follow the code.
- What must differ lives in hand-written helpers whose asyncio and synchronous versions have
  the same methods (``sa_outbox/relay/_runtime.py``); the names pick the synchronous one.
  Prose that differs goes in the conversion's ``text`` table (async text → sync text).
- Two markers, for what a helper cannot hold (keep them rare): a statement whose first line
  ends with the comment ``# async-only`` is left out, with its body; a comment line
  ``# sync-only: CODE`` becomes ``CODE``.
- The comments above the source's docstring are replaced by ``HEADER``; then ruff sorts the
  imports and formats the file, so it passes ``ruff check`` and ``ruff format --check``.

An entry of a ``text`` table that matches nothing is an error, so it cannot go stale.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEADER = """\
# generated from {source} by tools/async_to_sync.py — do not edit
# (edit {source} and run `python tools/async_to_sync.py`)
"""

#: Identifiers: the asyncio name → the synchronous one (a conversion adds its own).
NAMES: Mapping[str, str] = {
    # SQLAlchemy
    "AsyncEngine": "Engine",
    "AsyncConnection": "Connection",
    "AsyncSession": "Session",
    "async_engine": "engine",
    # the standard library and tenacity
    "AsyncRetrying": "Retrying",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aclose": "close",
    # sa_outbox
    "arun": "run",
    "AsyncVacuumer": "Vacuumer",
}

#: Dotted names, matched before the names: the longest match wins.
DOTTED: Mapping[str, str] = {
    "sqlalchemy.ext.asyncio": "sqlalchemy",
    "asyncio.Event": "threading.Event",
}

ASYNC_ONLY = "# async-only"
SYNC_ONLY = "# sync-only:"


@dataclass(frozen=True)
class Names:
    """What a conversion renames: ``names`` (identifiers) and ``dotted`` (dotted names)."""

    names: Mapping[str, str] = field(default_factory=lambda: NAMES)
    dotted: Mapping[str, str] = field(default_factory=lambda: DOTTED)

    def map(self, parts: Sequence[str]) -> list[str]:
        """``parts`` of a dotted name, mapped: the longest ``dotted`` prefix, then each
        part by ``names``."""
        for n in range(len(parts), 0, -1):
            mapped = self.dotted.get(".".join(parts[:n]))
            if mapped is not None:
                return [*mapped.split("."), *(self.names.get(p, p) for p in parts[n:])]
        return [self.names.get(p, p) for p in parts]


@dataclass(frozen=True)
class Conversion:
    """One generated file: ``target`` from ``source`` (paths from the repository root).

    ``names`` and ``dotted`` are added to `NAMES` and `DOTTED` for this file; ``text`` maps
    prose of the source (exact, line breaks and indentation included) to the generated
    file's.
    """

    source: str
    target: str
    names: Mapping[str, str] = field(default_factory=dict)
    dotted: Mapping[str, str] = field(default_factory=dict)
    text: Mapping[str, str] = field(default_factory=dict)

    @property
    def renames(self) -> Names:
        return Names({**NAMES, **self.names}, {**DOTTED, **self.dotted})


CONVERSIONS = [
    Conversion(
        "sa_outbox/relay/_async.py",
        "sa_outbox/relay/_sync.py",
        names={
            "AsyncRelay": "Relay",
            "AsyncListener": "SyncListener",
            # the twins of sa_outbox/relay/_runtime.py
            "AsyncPortal": "Portal",
            "AsyncStopSignal": "StopSignal",
            "require_async_engine": "require_engine",
        },
        # An Event is all of asyncio the relay uses: any other name of it would become
        # threading's, which mypy --strict rejects on the generated file.
        dotted={"asyncio": "threading"},
        text={
            "The publisher runs on the event loop that runs the relay; ``stop`` may be called "
            "from\n    the loop, another thread or a signal handler. Use `Relay` from "
            "synchronous code.": "The publisher (async, as every publisher is) runs on an "
            "event loop in a thread of the\n    relay's own. Use `AsyncRelay` from asyncio "
            "code.",
            "asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, relay.stop)": (
                "signal.signal(signal.SIGTERM, lambda *_: relay.stop())"
            ),
        },
    ),
    Conversion(
        "sa_outbox/worker/aio.py",
        "sa_outbox/worker/sync.py",
        names={
            "AsyncWorker": "Worker",
            "AsyncHeldConnection": "HeldConnection",
            "AsyncListener": "Listener",
            "AsyncPruner": "Pruner",
            "AsyncReclaimer": "Reclaimer",
            "AsyncSteps": "Steps",
            "_steps_async": "_steps_sync",
            "async_call_retrying": "call_retrying",
            # the twins of sa_outbox/worker/_runtime.py
            "AsyncGate": "Gate",
            "AsyncGrace": "Grace",
            "AsyncHandlers": "Handlers",
            "AsyncKeeper": "Keeper",
            "AsyncRunner": "Runner",
            "async_open_listener": "open_listener",
            "async_pool_connection": "pool_connection",
            "async_wait_event": "wait_event",
            "require_async_engine": "require_engine",
        },
        # Events are all of asyncio the worker uses itself (the rest is in _runtime.py).
        dotted={"asyncio": "threading", "self.engine.sync_engine": "self.engine"},
        text={
            "`AsyncWorker`: the job queue's runtime on asyncio, over an `AsyncEngine` "
            "(psycopg).\n\nThe same logic as `Worker` (`sa_outbox.worker._core`), driven by one "
            "event loop: ``async\ndef`` handlers run as tasks (``concurrency`` at a time), "
            "plain functions in a pool of\n``concurrency`` daemon threads.": "`Worker`: the "
            "job queue's runtime on threads, over a sync SQLAlchemy `Engine`.\n\nOne loop "
            "thread claims and writes; ``concurrency`` handler threads run the jobs outside "
            "any\ntransaction; a keeper thread sends the heartbeats and runs the reclaimer; a "
            "listener thread\nholds a ``LISTEN`` connection. The loop writes the results of "
            "finished jobs (completions as\none batched statement, retries, failures, "
            "follow-up jobs) and claims the next batch in one\ntransaction: one commit per "
            "batch, not per job.",
            "Run the jobs of a `JobApp` on asyncio": "Run the jobs of a `JobApp` with threads",
            "``async def`` handlers run as tasks of the worker's loop; a timeout cancels the "
            "task\n    (``asyncio.CancelledError`` inside the handler), so does the end of the "
            "grace period.\n    Plain (sync) handlers run in threads, where, as in `Worker`, a "
            "timeout cancels the job's\n    token. Signals (SIGTERM, SIGINT) are handled when "
            "`run` runs in the main thread.\n\n    ": "",
            "(``now=True``: skip the grace period).\n\n        Call it from the worker's event "
            "loop (``loop.call_soon_threadsafe(worker.stop)``\n        from another thread)."
            "\n\n        Examples:\n            asyncio.get_running_loop().call_later(60, "
            "worker.stop)\n            await worker.run()": "(``now=True``: skip the grace "
            "period). Thread-safe.\n\n        Examples:\n            threading.Timer(60, "
            "worker.stop).start()\n            worker.run()  # returns after a minute, and the "
            "grace period",
            "(a second signal, or the end of the grace period); ": "(a second signal); ",
        },
    ),
    Conversion(
        "sa_outbox/queue/_outbox_async.py",
        "sa_outbox/queue/_outbox_sync.py",
        names={"AsyncOutbox": "Outbox", "AsyncConn": "SyncConn"},
        text={
            "on asyncio. `Outbox` (``_outbox_sync.py``) is generated from this file.": (
                "generated from `AsyncOutbox` (``_outbox_async.py``)."
            ),
        },
    ),
    Conversion(
        "sa_outbox/queue/_job_queue_async.py",
        "sa_outbox/queue/_job_queue_sync.py",
        names={
            "AsyncJobQueue": "JobQueue",
            "AsyncConn": "SyncConn",
            "aenqueue_on": "enqueue_on",
            "ain_transaction": "in_transaction",
            "copy_jobs_async": "copy_jobs_sync",
        },
        text={
            "on asyncio.\n`JobQueue` (``_job_queue_sync.py``) is generated from this file.": (
                "generated\nfrom `AsyncJobQueue` (``_job_queue_async.py``)."
            ),
        },
    ),
    Conversion(
        "sa_outbox/maintenance/_partitions_async.py",
        "sa_outbox/maintenance/_partitions.py",
        names={"amaintain_partitions": "maintain_partitions"},
        text={
            "(on an `AsyncEngine`; `maintain_partitions` is generated from it)\nworks": (
                "(and `amaintain_partitions`, its source, on an `AsyncEngine`)\nworks"
            ),
        },
    ),
    Conversion(
        "sa_outbox/worker/_steps_async.py",
        "sa_outbox/worker/_steps_sync.py",
        names={"AsyncSteps": "Steps", "async_step_session": "step_session"},
        text={
            "Durable steps on an `AsyncEngine`: `AsyncSteps`, what `JobContext.astep` runs on.": (
                "Durable steps on an `Engine`: `Steps`, what `JobContext.step` runs on."
            ),
            "handlers call `JobContext.astep`.": "handlers call `JobContext.step`.",
            "sqlalchemy.ext.asyncio needs greenlet, which a plain install may lack": (
                "only for the annotations"
            ),
        },
    ),
    Conversion(
        "sa_outbox/worker/_results_async.py",
        "sa_outbox/worker/_results_sync.py",
        names={
            "AsyncJobResults": "JobResults",
            "AsyncListener": "Listener",
            "async_listen_on": "listen_on",
            "check_async_engine": "check_engine",
            "async_wait_event": "wait_event",
        },
        text={
            "on asyncio.\n`JobResults` (``_results_sync.py``) is generated from this file.": (
                "generated\nfrom `AsyncJobResults` (``_results_async.py``)."
            ),
            "sqlalchemy.ext.asyncio needs greenlet, which a plain install may lack": (
                "only for the annotations"
            ),
        },
    ),
]


class ConversionError(Exception):
    """The source cannot be converted (a stale ``text`` entry, a misplaced marker)."""


# -- names ----------------------------------------------------------------------------


_WORDS = re.compile(r"\b(?:await|async)\s+(?=[\w(\[])|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def map_prose(text: str, renames: Names) -> str:
    """Strings and comments: ``await``/``async`` dropped, names mapped as in code."""

    def one(match: re.Match[str]) -> str:
        word = match.group()
        if word.rstrip() in ("await", "async"):
            return ""  # before an expression, or `def`, `with`, `for`
        return ".".join(renames.map(word.split(".")))

    return _WORDS.sub(one, text)


def map_text(text: str, renames: Names, table: Mapping[str, str], used: set[str]) -> str:
    """``map_prose``, except where an entry of ``table`` matches: that is replaced as is."""
    for old, new in table.items():
        before, found, after = text.partition(old)
        if found:
            used.add(old)
            return (
                map_text(before, renames, table, used) + new + map_text(after, renames, table, used)
            )
    return map_prose(text, renames)


# -- the transform --------------------------------------------------------------------


@dataclass
class _Edits:
    source: str
    starts: list[int] = field(init=False)
    edits: list[tuple[int, int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.starts = [0]
        for line in self.source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, position: tuple[int, int]) -> int:
        row, col = position
        return self.starts[row - 1] + col

    def replace(self, start: tuple[int, int], end: tuple[int, int], text: str) -> None:
        self.edits.append((self.offset(start), self.offset(end), text))

    def drop_lines(self, first: int, last: int) -> None:
        self.edits.append((self.starts[first - 1], self.starts[last], ""))

    def apply(self) -> str:
        out, at = [], 0
        for start, end, text in sorted(self.edits, key=lambda e: (e[0], -e[1])):
            if start < at:  # inside a span already replaced (a dropped statement)
                continue
            out.append(self.source[at:start])
            out.append(text)
            at = end
        out.append(self.source[at:])
        return "".join(out)


def _async_only_statements(source: str, comments: Mapping[int, str]) -> Iterator[ast.stmt]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and comments.get(node.lineno) == ASYNC_ONLY:
            yield node


def convert(
    source: str,
    name: str,
    text: Mapping[str, str] | None = None,
    renames: Names | None = None,
) -> str:
    """The synchronous module generated from ``source`` (``name``: its file name, for the
    header), before formatting; ``text`` and ``renames`` as in `Conversion`.

    Examples:
        >>> print(convert("async def f(e: AsyncEngine) -> None:\\n    await g(e)\\n", "m.py"))
        # generated from m.py by tools/async_to_sync.py — do not edit
        # (edit m.py and run `python tools/async_to_sync.py`)
        def f(e: Engine) -> None:
            g(e)
        <BLANKLINE>
    """
    table = dict(text or {})
    renames = renames or Names()
    used: set[str] = set()
    edits = _Edits(source)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    comments = {t.start[0]: t.string.strip() for t in tokens if t.type == tokenize.COMMENT}
    # Python 3.12 splits an f-string into parts (3.14 a t-string): the text parts are prose.
    fstring_parts = {getattr(tokenize, kind, -1) for kind in ("FSTRING_MIDDLE", "TSTRING_MIDDLE")}
    prose_types = {tokenize.STRING, tokenize.COMMENT, *fstring_parts}

    # The comments above the docstring: the source's own note, replaced by the header.
    lead = 0
    for token in tokens:
        if token.type in (tokenize.COMMENT, tokenize.NL):
            lead = token.end[0]
            continue
        break
    if lead:
        edits.drop_lines(1, lead)
    header = HEADER.format(source=name)

    for node in _async_only_statements(source, comments):
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        assert node.end_lineno is not None
        edits.drop_lines(first, node.end_lineno)

    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else token
        if token.start[0] <= lead:
            i += 1
            continue
        if token.type == tokenize.NAME and token.string in ("async", "await"):
            if token.string == "async" and following.string not in ("def", "with", "for"):
                raise ConversionError(f"{name}:{token.start[0]}: `async` before {following!r}")
            edits.replace(token.start, following.start, "")
            i += 1
            continue
        if token.type == tokenize.NAME:
            after_dot = i > 0 and tokens[i - 1].string == "."
            j = i
            parts = [token.string]
            while (
                not after_dot
                and j + 2 < len(tokens)
                and tokens[j + 1].string == "."
                and tokens[j + 2].type == tokenize.NAME
            ):
                j += 2
                parts.append(tokens[j].string)
            mapped = ".".join(renames.map(parts))
            if mapped != ".".join(parts):
                edits.replace(token.start, tokens[j].end, mapped)
            i = j + 1
            continue
        if token.type == tokenize.COMMENT and token.string.startswith(SYNC_ONLY):
            if token.line[: token.start[1]].strip():
                raise ConversionError(f"{name}:{token.start[0]}: {SYNC_ONLY} after code")
            edits.replace(token.start, token.end, token.string[len(SYNC_ONLY) :].strip())
        elif token.type == tokenize.COMMENT and token.string.strip() == ASYNC_ONLY:
            pass  # its statement is dropped above
        elif token.type in prose_types:
            mapped = map_text(token.string, renames, table, used)
            if mapped != token.string:
                if token.type in fstring_parts and ("{" in mapped or "}" in mapped):
                    # its string holds `{{` as `{`: rewriting it would change the f-string
                    raise ConversionError(f"{name}:{token.start[0]}: a name by braces")
                edits.replace(token.start, token.end, mapped)
        i += 1

    unused = [old for old in table if old not in used]
    if unused:
        raise ConversionError(f"{name}: text entries that match nothing: {unused!r}")
    return header + edits.apply()


# -- formatting, writing, checking ----------------------------------------------------


def _ruff(*args: str, source: str, path: str) -> str:
    command = [sys.executable, "-m", "ruff", *args, "--stdin-filename", path, "-"]
    done = subprocess.run(command, input=source, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise ConversionError(f"{' '.join(command)} failed on {path}:\n{done.stderr}")
    return done.stdout


def generate(conversion: Conversion) -> str:
    """The text ``conversion.target`` should have: converted, imports sorted, formatted."""
    source = (ROOT / conversion.source).read_text()
    code = convert(source, Path(conversion.source).name, conversion.text, conversion.renames)
    code = _ruff("check", "--fix", "--select", "I", "--quiet", source=code, path=conversion.target)
    return _ruff("format", "--quiet", source=code, path=conversion.target)


def check(conversions: Sequence[Conversion], write: Callable[[str], object]) -> bool:
    """Whether every target is what a fresh generation gives; ``write`` gets the diffs."""
    fresh = True
    for conversion in conversions:
        target = ROOT / conversion.target
        expected = generate(conversion)
        actual = target.read_text() if target.exists() else ""
        if actual != expected:
            fresh = False
            write(
                "".join(
                    difflib.unified_diff(
                        actual.splitlines(keepends=True),
                        expected.splitlines(keepends=True),
                        f"{conversion.target} (as it is)",
                        f"{conversion.target} (generated from {conversion.source})",
                    )
                )
            )
    return fresh


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and print a diff when a generated file is stale",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            if check(CONVERSIONS, sys.stdout.write):
                return 0
            print(
                "\nA generated file differs from a fresh generation: edit its source "
                "and run `python tools/async_to_sync.py`.",
                file=sys.stderr,
            )
            return 1
        for conversion in CONVERSIONS:
            target = ROOT / conversion.target
            code = generate(conversion)
            if not target.exists() or target.read_text() != code:
                target.write_text(code)
                print(f"wrote {conversion.target}")
    except ConversionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
