"""DALI's ``.idx`` files for tar shards (``wds2idx``'s format: ``v1.2 N`` then per sample
``EXT OFFSET SIZE NAME ...``, data offsets; see docs/format.md). Fields may hold no
whitespace: spaced names give ``v1.1`` (no names); an empty or spaced extension, an empty
sample or shard gives no file (DALI then scans the tar).
"""

from __future__ import annotations

import re
from typing import Final

VERSION: Final = "v1.2"
VERSION_WITHOUT_NAMES: Final = "v1.1"

# The bytes C++ isspace() treats as separators in the "C" locale; UTF-8 sequences of other
# characters never contain them.
WHITESPACE: Final = re.compile(r"[ \t\n\v\f\r]")

#: (extension, data offset, data size, member name) of one tar member.
Component = tuple[str, int, int, str]


class DaliIndex:
    """The ``.idx`` lines of one shard, collected while its samples are written."""

    def __init__(self) -> None:
        self._samples: list[tuple[int, list[Component]]] = []

    def add(self, start: int, components: list[Component]) -> None:
        """Add the next sample: its first byte in the tar, and its members with data offsets
        counted from that byte."""
        self._samples.append((start, components))

    def to_bytes(self) -> bytes | None:
        """The file's bytes, one string per member and no loop per line; None when a
        member cannot be described in the format."""
        counts = [len(parts) for _, parts in self._samples]
        if not counts or min(counts) == 0:
            return None
        flat = [
            (e, start + at, n, name) for start, parts in self._samples for e, at, n, name in parts
        ]
        exts, offsets, sizes, names = zip(*flat, strict=True)
        if any(not e or WHITESPACE.search(e) for e in set(exts)):
            return None
        ends = [" "] * len(exts)
        at = -1
        for count in counts:  # the last member of each sample ends its line
            at += count
            ends[at] = "\n"
        if WHITESPACE.search("".join(names)) is None:
            body = map("{} {} {} {}{}".format, exts, offsets, sizes, names, ends)
            version = VERSION
        else:
            body = map("{} {} {}{}".format, exts, offsets, sizes, ends)
            version = VERSION_WITHOUT_NAMES
        return f"{version} {len(counts)}\n{''.join(body)}".encode()
