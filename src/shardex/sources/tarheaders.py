"""Tar member headers read fast, as tarfile would read them: tarfile costs ~25 us a header
and a tar of tiny samples is mostly headers. Plain regular-file headers are read here;
anything else goes to tarfile, which then reads the rest (its state and messages).
"""

from __future__ import annotations

import re
import tarfile
from typing import IO, Final

from shardex.format.tar import BLOCK

__all__ = ["FAST", "Headers"]

#: Header fields tarfile reads as numbers (mode, uid, gid, size, mtime, checksum,
#: devmajor, devminor): a header is read on the fast path only if each is plain octal.
_NUMBERS: Final = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156))
_DEVICE_NUMBERS: Final = ((329, 337), (337, 345))
_PLAIN_OCTAL: Final = re.compile(rb" *([0-7]*) *")
_CANONICAL: Final = re.compile(
    rb"([0-7]{7})\x00([0-7]{7})\x00([0-7]{7})\x00([0-7]{11})\x00([0-7]{11})\x00([0-7]{6})\x00 "
)
_CANONICAL_DEVICES: Final = re.compile(rb"(?:[0-7]{7}\x00|\x00{8}){2}")
#: Whether plain headers are read without tarfile (tests compare both ways).
FAST = True


class Headers:
    """A tar's member headers, in order: ``next()`` as ``TarFile.next()``, without keeping them."""

    def __init__(self, tf: tarfile.TarFile, raw: IO[bytes], *, fast: bool = True) -> None:
        self.tf, self.raw = tf, raw
        self.fast = False  # the first member was read by tarfile.open
        self.allowed = fast

    def next(self) -> tarfile.TarInfo | None:
        if self.fast:
            info = self._plain()
            if info is not None:
                return info
            self.fast = False  # for good: tarfile keeps state from here on
        first = self.tf.firstmember is not None  # type: ignore[attr-defined]
        info = self.tf.next()
        # tarfile keeps every header it read: a tar of millions of members would hold
        # them all (members are read once, in order, here)
        self.tf.members.clear()  # type: ignore[attr-defined]
        self.fast = self.allowed and first and info is not None and not self.tf.pax_headers
        return info

    def _plain(self) -> tarfile.TarInfo | None:
        """The header at the tarfile's offset if it is a plain one, else None."""
        tf, at = self.tf, self.tf.offset
        # where tarfile would find the file: it checks the previous member's data is
        # there only when the file is not at its offset already
        before = self.raw.tell()
        self.raw.seek(at)
        buf = self.raw.read(BLOCK)
        numbers = _numbers(buf)
        if (
            numbers is None
            or buf[156:157] != tarfile.REGTYPE
            or numbers[5] != 256 + sum(buf[:148]) + sum(buf[156:])
        ):
            self.raw.seek(before)
            return None
        name = _nts(buf[0:100], tf.encoding, tf.errors)
        prefix = _nts(buf[345:500], tf.encoding, tf.errors)
        info = tarfile.TarInfo(f"{prefix}/{name}" if prefix else name)
        info.type = tarfile.REGTYPE
        info.size = numbers[3]
        info.offset, info.offset_data = at, at + BLOCK
        tf.offset = at + BLOCK + -(-info.size // BLOCK) * BLOCK
        return info


def _numbers(buf: bytes) -> list[int] | None:
    """The numbers of a header (see _NUMBERS), or None unless each is plain octal."""
    if len(buf) != BLOCK:
        return None
    canonical = _CANONICAL.match(buf, 100)  # what tarfile and GNU tar write: one match
    if canonical is not None and _CANONICAL_DEVICES.match(buf, 329) is not None:
        return [int(n, 8) for n in canonical.groups()]
    numbers = [_octal(buf[start:end]) for start, end in _NUMBERS + _DEVICE_NUMBERS]
    return None if None in numbers else numbers  # type: ignore[return-value]


def _octal(field: bytes) -> int | None:
    end = field.find(0)
    match = _PLAIN_OCTAL.fullmatch(field if end < 0 else field[:end])
    return None if match is None else int(match.group(1) or b"0", 8)


def _nts(field: bytes, encoding: str, errors: str) -> str:
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode(encoding, errors)
