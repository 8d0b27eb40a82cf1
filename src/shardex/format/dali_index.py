"""DALI's index files for tar shards (``.idx``, the format of DALI's ``wds2idx`` tool).

``nvidia.dali.fn.readers.webdataset(paths=..., index_paths=...)`` reads one index file per
tar instead of scanning the tar. The format, as DALI's reader parses it (``ParseIndexFile``
in ``dali/operators/reader/loader/webdataset_loader.cc``) and ``tools/wds2idx.py`` writes
it::

    v1.2 N                                        version, then the number of sample lines
    EXT OFFSET SIZE NAME [EXT OFFSET SIZE NAME]   one line per sample, one group per member

``OFFSET`` is where the member's *data* starts (just past its header, and past a GNU
long-name record before it), always a multiple of 512; ``SIZE`` is the data size without
padding; ``NAME`` is the member name. DALI reads the fields with C++ ``>>``, so they must hold
no whitespace. ``v1.1`` is the same without ``NAME``; DALI reads both.

shardex writes ``v1.2``; a shard where a member name holds a space (keys may) gets ``v1.1``,
whose offsets and sizes are the same. A member extension that is empty or holds whitespace
cannot be written at all, nor can a sample without members or a shard without samples (DALI
requires a positive count): such a shard gets no index file, and DALI scans its tar.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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
        self._names_ok = True
        self._representable = True

    def add(self, start: int, components: list[Component]) -> None:
        """Add the next sample: its first byte in the tar, and its members with data offsets
        counted from that byte."""
        if not components:  # DALI refuses a sample line without members
            self._representable = False
        for ext, _, _, name in components:
            if not ext or WHITESPACE.search(ext):
                self._representable = False
            elif self._names_ok and WHITESPACE.search(name):
                self._names_ok = False
        self._samples.append((start, components))

    def to_bytes(self) -> bytes | None:
        """The file's bytes; None when a member cannot be described in the format."""
        if not self._representable or not self._samples:
            return None
        if self._names_ok:
            lines = [
                " ".join(f"{ext} {start + at} {size} {name}" for ext, at, size, name in parts)
                for start, parts in self._samples
            ]
            version = VERSION
        else:
            lines = [
                " ".join(f"{ext} {start + at} {size}" for ext, at, size, _ in parts)
                for start, parts in self._samples
            ]
            version = VERSION_WITHOUT_NAMES
        head = f"{version} {len(lines)}"
        return "\n".join([head, *lines, ""]).encode("utf-8")


def dali_index_bytes(
    counts: Sequence[int],
    exts: Sequence[str],
    offsets: Sequence[int],
    sizes: Sequence[int],
    names: Sequence[str],
) -> bytes | None:
    """What :meth:`DaliIndex.to_bytes` gives for samples of ``counts[i]`` members each,
    their members' (extension, data offset in the tar, size, name) given flat, sample
    after sample: one string per member, no Python loop per sample line."""
    if not counts or min(counts) == 0:
        return None
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
