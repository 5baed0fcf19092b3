"""JSON as the library writes it: `compact_json`, and `fast_compact_json` for many payloads.

`compact_json` is JSON without spaces that refuses NaN and Infinity (jsonb rejects them
too). `fast_compact_json` gives its output at a quarter of its cost, for serialising many
small payloads.

`may_be_unstorable` and `unstorable_at` tell whether a serialised payload holds what jsonb
cannot: a NUL character (``\\u0000``), a lone surrogate, or more than `MAX_DEPTH` levels of
nesting. The first is a few substring tests on the text, cheap enough for every enqueue;
the second, which finds the path of the bad value, runs only when the first says "maybe".

``json.dumps`` with options (and ``JSONEncoder.encode``) sets up a new C encoder at every
call; for the small payloads of a job that setup is most of the time (about 1.2 µs of
1.5 µs for ``{}``). `fast_compact_json` sets it up once, with the same options.

Examples:
    >>> fast_compact_json({"to": "ana@example.com", "n": [1, 2.5, None]})
    '{"to":"ana@example.com","n":[1,2.5,null]}'
"""

from __future__ import annotations

import json
import json.encoder
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ._validation import is_utf8, unstorable

__all__ = [
    "MAX_DEPTH",
    "Unstorable",
    "compact_json",
    "fast_compact_json",
    "may_be_unstorable",
    "may_be_unstorable_utf8",
    "nests_deeper",
    "prebuilt_encoder",
    "unstorable_at",
]

#: Most levels of nesting of a payload (``{}`` and ``[]`` are one level, ``[[]]`` two).
#: Real documents stay under ten; the limit is far below the depth at which Python's json
#: module (the encoder here, and the decoder psycopg uses to read jsonb back in a worker
#: or relay) runs out of recursion, about 1,000 levels less the caller's own stack.
MAX_DEPTH = 100
#: A text of at most this many characters cannot nest deeper than `MAX_DEPTH` (each level
#: takes two: ``[`` and ``]``).
DEEP_TEXT = 2 * MAX_DEPTH + 1


def compact_json(value: Any) -> str:
    """JSON without spaces, refusing NaN and Infinity (jsonb rejects them too).

    Examples:
        >>> compact_json({"a": [1, "é"]})
        '{"a":[1,"é"]}'
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _prebuilt() -> Callable[[Any, int], Any] | None:
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (PyPy): nothing to gain
        return None
    try:
        # No circular check (markers=None), so one encoder serves every call; a circular
        # payload then ends in RecursionError, and compact_json says what is wrong instead.
        encoder: Callable[[Any, int], Any] = make(
            None,
            json.JSONEncoder().default,
            json.encoder.encode_basestring,
            None,
            ":",
            ",",
            False,
            False,
            False,
        )
        sample: Any = {"a": [1, 2.5, None, True, "é\n"], "b": {}}
        if "".join(encoder(sample, 0)) != compact_json(sample):
            return None
    except Exception:  # a C encoder of another signature: keep compact_json
        return None
    return encoder


_ENCODER = _prebuilt()


def prebuilt_encoder(dumps: Any) -> Callable[[Any, int], Any] | None:
    """The C encoder behind `fast_compact_json`, if ``dumps`` is it or `compact_json`.

    For loops over thousands of payloads that cannot afford a Python call each: the
    encoder returns the text in chunks (``"".join`` them) and raises ``TypeError``,
    ``ValueError`` or ``RecursionError`` (a circular payload) where `compact_json` raises.
    ``None`` when there is no C encoder or ``dumps`` is another function.

    Examples:
        >>> encode = prebuilt_encoder(fast_compact_json)
        >>> encode is None or "".join(encode({"a": [1, None]}, 0)) == '{"a":[1,null]}'
        True
        >>> prebuilt_encoder(lambda value: "{}") is None
        True
    """
    return _ENCODER if dumps is fast_compact_json or dumps is compact_json else None


def fast_compact_json(value: Any) -> str:
    """The same text as `compact_json` (``separators=(",", ":")``, UTF-8, no NaN).

    Examples:
        >>> fast_compact_json({})
        '{}'
    """
    if _ENCODER is None:
        return compact_json(value)
    try:
        return "".join(_ENCODER(value, 0))
    except (TypeError, ValueError, RecursionError):
        return compact_json(value)  # raises compact_json's own error (a circular payload too)


def may_be_unstorable(text: str) -> bool:
    """Whether the JSON ``text`` may hold what jsonb refuses; ``False`` is certain.

    The test behind every enqueue: a NUL or a surrogate can reach JSON text only as a
    ``\\u`` escape (or raw, from a ``dumps`` of the user's own), and ``MAX_DEPTH`` levels of
    nesting need more than ``MAX_DEPTH`` brackets. ``True`` means "ask `unstorable_at`".

    Examples:
        >>> may_be_unstorable('{"to":"ana@example.com"}')
        False
        >>> may_be_unstorable('{"to":"ana\\\\u0000"}')
        True
    """
    return may_be_unstorable_utf8(text) or (not text.isascii() and not is_utf8(text))


def may_be_unstorable_utf8(text: str) -> bool:
    """`may_be_unstorable` for a ``text`` known to encode to UTF-8 (it was encoded already,
    or the whole stream will be, and a failure there is checked on its own).

    Examples:
        >>> may_be_unstorable_utf8("[" * 101 + "]" * 101), may_be_unstorable_utf8("[1, 2]")
        (True, False)
    """
    return (
        "\\u" in text
        or "\x00" in text
        or (len(text) > DEEP_TEXT and text.count("[") + text.count("{") > MAX_DEPTH)
    )


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A path longer than this is shown by its two ends.
_MAX_PATH_SHOWN = 200


def _path(parts: tuple[object, ...]) -> str:
    """``$``, ``$.to[2]``, ``$["a b"]``: where a value is in a document (JSONPath)."""
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENTIFIER.fullmatch(part := str(part)):
            out.append(f".{part}")
        else:  # json.dumps escapes NUL and surrogates: the message stays storable text
            out.append(f"[{json.dumps(part)}]")
    path = "".join(out)
    if len(path) > _MAX_PATH_SHOWN:
        half = _MAX_PATH_SHOWN // 2
        path = f"{path[:half]}…{path[-half:]}"
    return path


def _children(value: object) -> Iterator[tuple[object, object]] | None:
    if isinstance(value, dict):
        return iter(value.items())
    if isinstance(value, list | tuple):
        return enumerate(value)
    return None


class Unstorable(NamedTuple):
    """What `unstorable_at` found: where, what is wrong, and whether it is an encoding
    problem (a lone surrogate, which UTF-8 cannot encode) rather than a value jsonb refuses.

    Examples:
        >>> Unstorable("$.to", "is nested more than 100 levels deep", False).path
        '$.to'
    """

    path: str
    problem: str
    not_utf8: bool


def _bad(parts: tuple[object, ...], text: str, problem: str, *, key: bool = False) -> Unstorable:
    if key:
        problem = f"the key {json.dumps(text)} {problem}"
    return Unstorable(_path(parts), problem, "\x00" not in text)


def _walk(document: object) -> Unstorable | None:
    """The first bad value of ``document``, in document order."""
    problem = unstorable(document) if isinstance(document, str) else None
    if problem is not None:
        assert isinstance(document, str)
        return _bad((), document, problem)
    children = _children(document)
    if children is None:
        return None
    # Depth-first without recursion (a document may be deeper than the interpreter's stack).
    stack: list[tuple[Iterator[tuple[object, object]], tuple[object, ...]]] = [(children, ())]
    while stack:
        items, parts = stack[-1]
        step = next(items, None)
        if step is None:
            stack.pop()
            continue
        key, value = step
        here = (*parts, key)
        if isinstance(key, str) and (problem := unstorable(key)) is not None:
            return _bad(here, key, problem, key=True)
        if isinstance(value, str):
            if (problem := unstorable(value)) is not None:
                return _bad(here, value, problem)
            continue
        inner = _children(value)
        if inner is None:
            continue
        if len(stack) >= MAX_DEPTH:
            return Unstorable(_path(here), _TOO_DEEP, False)
        stack.append((inner, here))
    return None


_TOO_DEEP = f"is nested more than {MAX_DEPTH} levels deep"

# Bytes of JSON text a nesting count needs: quotes (to skip strings) and brackets, with
# "{}" counted as "[]".
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")


def nests_deeper(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON ``text`` nests more than ``limit`` levels deep, without parsing it.

    Strings go first (their escaped backslashes and quotes, then everything between two
    quotes), then all but the brackets; each pass of ``replace("[]", "")`` then removes one
    level, the innermost pairs. All of it runs in C: a wide payload (thousands of small
    objects side by side) is measured in a few passes over its brackets.

    Examples:
        >>> nests_deeper('[{"a":"[[[["}]', limit=2), nests_deeper("[[[1]]]", limit=2)
        (False, True)
    """
    if "\\" in text:  # escapes: an escaped quote must not end its string
        text = text.replace("\\\\", "").replace('\\"', "")
    coded = text.encode("utf-8", "surrogatepass").translate(_AS_BRACKETS, _NOT_STRUCTURE)
    # Two quotes side by side enclose a string without brackets, or nothing outside one:
    # dropping them changes no bracket outside the strings.
    brackets = coded.replace(b'""', b"")
    if b'"' in brackets:  # some string holds brackets: keep what lies between the strings
        brackets = b"".join(brackets.split(b'"')[::2])
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _doubtful(text: str) -> bool:
    """The exact screen behind `may_be_unstorable`'s quick one: ``False`` when ``text``
    holds no NUL (escaped or not), no surrogate escape, encodes to UTF-8, and nests no more
    than `MAX_DEPTH` levels (a control character's escape, or many brackets side by side,
    made the quick screen doubt)."""
    return (
        ("\\u" in text and ("\\u0000" in text or "\\ud" in text or "\\uD" in text))
        or "\x00" in text
        or not (text.isascii() or is_utf8(text))
        or (len(text) > DEEP_TEXT and nests_deeper(text))
    )


def unstorable_at(text: str | None, value: Any = None) -> Unstorable | None:
    """Where the payload holds what jsonb refuses, and what (`Unstorable`), or ``None``.

    ``text`` is the payload as serialised: it is parsed back, so the answer is about what
    would be stored, whatever ``dumps`` wrote. ``value`` (the payload itself) is walked
    instead when there is no text (serialising it ran out of recursion, ``text=None``) or
    when the text is too deep to parse back; either way, a payload that deep is refused.
    Slow: call it when `may_be_unstorable` says so.

    Examples:
        >>> unstorable_at('{"to":["a","b","c\\\\u0000"]}').path
        '$.to[2]'
        >>> unstorable_at('{"a":"\\\\ud800"}').problem
        'is not valid UTF-8 text: a lone surrogate (\\\\ud800) at index 0'
        >>> unstorable_at('{"ok":[1,2]}') is None
        True
    """
    too_deep = Unstorable("$", _TOO_DEEP, False)
    if text is None:
        return _walk(value) or too_deep  # serialising it ran out of recursion
    if not _doubtful(text):
        return None
    try:
        document = json.loads(text)
    except RecursionError:
        return (None if value is None else _walk(value)) or too_deep
    except ValueError:  # a dumps of the user's own wrote raw control characters
        problem = unstorable(text)
        return None if problem is None else _bad((), text, f"the JSON text {problem}")
    return _walk(document)
