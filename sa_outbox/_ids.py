"""Time-ordered ids (UUID version 7, RFC 9562) for rows the library inserts.

Jobs that share ``priority`` and ``run_at`` (all jobs enqueued by one transaction share
``now()``) are claimed in ``id`` order: v7 ids make that the order they were enqueued in,
within a process, and keep the primary key index appending at its right edge instead of
splitting pages at random as v4 ids do.
"""

from __future__ import annotations

import array
import os
import sys
import threading
import time
import uuid

__all__ = ["uuid7", "uuid7_hex", "uuid7_ints"]

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_COUNTER_BITS = 12


def uuid7() -> uuid.UUID:
    """A new UUIDv7: 48 bits of Unix milliseconds, a 12-bit counter, 62 random bits.

    Ids made by one process are strictly increasing (the counter orders ids of the same
    millisecond; on overflow or a clock step back, the millisecond is carried forward).

    Examples:
        >>> a, b = uuid7(), uuid7()
        >>> a.version, a < b
        (7, True)
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(1)) & 0x0F
        else:
            _counter += 1
            if _counter >> _COUNTER_BITS:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    rand = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    return uuid.UUID(int=value)


def _reserve(count: int) -> int:
    """Take ``count`` consecutive (millisecond, counter) slots; returns the first.

    A slot is ``millisecond << 12 | counter``: the slot after (ms, 4095) is (ms + 1, 0), so
    the slots of a block are consecutive numbers, and they follow those of earlier calls.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            first = ms << _COUNTER_BITS | (int.from_bytes(os.urandom(1)) & 0x0F)
        else:
            first = (_last_ms << _COUNTER_BITS | _counter) + 1
        last = first + count - 1
        _last_ms, _counter = last >> _COUNTER_BITS, last & ((1 << _COUNTER_BITS) - 1)
    return first


def uuid7_ints(count: int) -> list[int]:
    """``count`` new UUIDv7 values as 128-bit ints, in increasing order, for bulk inserts.

    The same sequence as ``count`` calls of `uuid7` (one lock, one clock read and one
    ``os.urandom`` call for the lot), without building ``uuid.UUID`` objects, which cost more
    than the value itself when a statement only needs the value.

    Examples:
        >>> a, b = uuid7_ints(2)
        >>> uuid.UUID(int=a).version, a < b < uuid7().int
        (7, True)
    """
    if count <= 0:
        return []
    first = _reserve(count)
    randoms = array.array("Q", os.urandom(8 * count)).tolist()
    mask48, mask62, fixed = (1 << 48) - 1, (1 << 62) - 1, 0x7 << 76 | 0b10 << 62
    return [
        ((slot >> _COUNTER_BITS) & mask48) << 80 | (slot & 0xFFF) << 64 | fixed | (rand & mask62)
        for slot, rand in zip(range(first, first + count), randoms, strict=True)
    ]


# Maps a random byte to the first byte of a UUID's second half: variant bits 10, 6 random bits.
_VARIANT_BYTE = bytes(0x80 | (b & 0x3F) for b in range(256))


def uuid7_hex(count: int) -> list[str]:
    """`uuid7_ints`' ids as 32 lowercase hex digits each, the form COPY's text format takes.

    Built a block at a time in C (arrays, ``bytes.translate``, ``bytes.hex``) rather than by
    formatting ``count`` 128-bit ints: about a quarter of the cost, for `enqueue_copy`.

    Examples:
        >>> a, b = uuid7_hex(2)
        >>> len(a), uuid.UUID(a).version, a < b < uuid7().hex
        (32, 7, True)
    """
    if count <= 0:
        return []
    slot = _reserve(count)
    last = slot + count - 1
    # The first 64 bits: 48 of milliseconds, the version (7), the 12-bit counter. Within one
    # millisecond consecutive slots are consecutive numbers: one range() per millisecond.
    high = array.array("Q")
    while slot <= last:
        end = min(last, slot | 0xFFF)  # the last slot of this millisecond
        top = ((slot >> _COUNTER_BITS) & ((1 << 48) - 1)) << 16 | 0x7 << 12 | (slot & 0xFFF)
        high.extend(range(top, top + end - slot + 1))
        slot = end + 1
    if sys.byteorder == "little":
        high.byteswap()  # to big-endian, the order of the hex digits
    # The last 64 bits: the variant (0b10) and 62 random bits.
    low = bytearray(os.urandom(8 * count))
    low[0::8] = low[0::8].translate(_VARIANT_BYTE)
    ids = array.array("Q", bytes(16 * count))
    ids[0::2] = high
    ids[1::2] = array.array("Q", low)
    return ids.tobytes().hex("\n", 16).split("\n")
