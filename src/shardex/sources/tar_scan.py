"""The scan of one WebDataset tar: members grouped into samples by key, as references to
their bytes (only ``.cls`` and ``.json`` are read). Damage never loses samples silently:
what cannot be used marks its sample ``_invalid`` with the reason (for a damaged tar, the
last sample read).
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, cast

from shardex.errors import ObjectNotFoundError, SourceError, StorageError
from shardex.format.tar import BLOCK, split_name
from shardex.quoting import one_line, printable
from shardex.sources import tarheaders
from shardex.sources.jsonmeta import json_member
from shardex.storage import Storage
from shardex.storage.fetch.held import Part, TarHold
from shardex.storage.fetch.tars import RangedTar, TarCopies, TarCopy, open_object_tar

_ZERO_BLOCK: Final = bytes(BLOCK)
_SCAN_CHUNK: Final = 1 << 20
_IGNORED_TYPES: Final = (tarfile.DIRTYPE,)
_TYPE_NAMES: Final = {
    tarfile.LNKTYPE: "a hard link",
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a fifo",
}


@dataclass(slots=True)
class TarSample:
    """The sample being read: consecutive members with one key."""

    key: str
    #: (ext, data offset, size, path of the local copy holding it or None)
    members: list[tuple[str, int, int, str | None]] = field(default_factory=list)
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    seen: set[str] = field(default_factory=set)

    def refuse(self, reason: str) -> None:
        """Mark the sample unusable (the first reason wins)."""
        self.problem = self.problem or reason

    def done(self) -> TarSample:
        """The sample read whole (``seen`` dropped: it may be pickled)."""
        self.seen = set()
        return self


@dataclass(frozen=True, slots=True)
class TarRef:
    """One tar: a local file (``storage`` None) or an object below ``storage``; pickles to its
    scanning process. ``copies``/``hold``: where a local or Ray scan keeps what it reads.
    """

    path: str
    rel: str
    size: int
    storage: Storage | None = None
    copies: TarCopies | None = None
    hold: bool = False

    @property
    def where(self) -> str:
        """The local path or object URL."""
        return self.path if self.storage is None else self.storage.join(self.path)


def tar_samples(tar: TarRef, hold: TarHold | None = None) -> Generator[TarSample, None, None]:
    """The samples of one tar, in order; a tar that cannot be opened is one unusable sample.

    Raises:
        SourceError: the local tar cannot be opened as a file.
    """
    where = tar.where
    raw: IO[bytes]
    if tar.storage is None:
        try:
            raw = open(where, "rb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise SourceError(f"cannot read tar {where!r}: {exc.strerror}") from exc
    else:
        opened = open_object_tar(tar.storage, tar.path, tar.size, tar.copies, hold)
        raw = cast("IO[bytes]", opened)
    try:
        # tarfile seeks to each header itself, so the member reads may share the file
        try:
            tf = tarfile.open(fileobj=raw, mode="r:")  # noqa: SIM115 (closed in scan_members)
        except (tarfile.TarError, OSError) as exc:
            if _store_failed(exc):
                raise
            unreadable = TarSample(tar.rel)
            unreadable.refuse(f"not a readable tar at byte 0: {one_line(str(exc))}")
            yield unreadable
            return
        size = os.fstat(raw.fileno()).st_size if tar.storage is None else tar.size
        copy = raw.copy if isinstance(raw, RangedTar) else None
        for sample in scan_members(tf, raw, rel=tar.rel, size=size):
            if isinstance(copy, TarHold):
                copy.take(sample.members)
            yield _in_copy(sample, copy) if isinstance(copy, TarCopy) else sample
    finally:
        raw.close()


def _in_copy(sample: TarSample, copy: TarCopy) -> TarSample:
    """The sample with the members the scan read named in the tar's copy."""
    members = sample.members
    for i, (ext, offset, size, _) in enumerate(members):
        if copy.holds(offset, size):
            members[i] = (ext, offset, size, str(copy.path))
            copy.used = True
    if members:
        copy.forget(members[-1][1] + members[-1][2])
    return sample


def tar_sample_list(tar: TarRef) -> tuple[TarRef, list[TarSample]]:
    """Every sample of one tar (what a runner's task hands back)."""
    return tar, list(tar_samples(tar))


HeldScan = tuple[TarRef, list[TarSample], list[tuple[int, int]]]


def tar_scan_held(tar: TarRef) -> Iterator[Part | HeldScan]:
    """A Ray task's scan of one tar: its held parts as they fill, then its :data:`HeldScan`."""
    # no ``yield from``: Ray's generator tasks send values in
    hold = TarHold() if tar.hold else None
    samples: list[TarSample] = []
    with contextlib.closing(tar_samples(tar, hold)) as scan:
        for sample in scan:
            samples.append(sample)
            for part in hold.ready() if hold is not None else ():
                yield part
    for part in hold.finish() if hold is not None else ():
        yield part
    yield tar, samples, hold.spans if hold is not None else []


def scan_members(
    tf: tarfile.TarFile, raw: IO[bytes], *, rel: str, size: int
) -> Iterator[TarSample]:
    """The samples of an open tar of ``size`` bytes (see :func:`tar_samples`)."""
    headers = tarheaders.Headers(tf, raw, fast=tarheaders.FAST)
    with tf:
        sample: TarSample | None = None
        damage: str | None = None
        while True:
            try:
                info = headers.next()
            except (tarfile.TarError, OSError, ValueError) as exc:  # e.g. a long name alone,
                # or a GNU sparse map that is not numbers (tarfile lets int() raise)
                if _store_failed(exc):
                    raise
                damage = f"bad tar header at byte {tf.offset} ({one_line(str(exc))})"
                break
            if info is None:
                damage = _end_problem(raw, tf.offset, size)
                break
            if info.type in _IGNORED_TYPES:
                continue
            name = printable(info.name)  # tarfile keeps bad UTF-8 as surrogates
            key, ext = split_name(name)
            if sample is None or key != sample.key:
                if sample is not None:
                    yield sample.done()
                sample = TarSample(key)
            if info.isreg() and info.offset_data + info.size > size:
                damage = (
                    f"member {name!r} at byte {info.offset} runs past the end of the tar "
                    f"({info.offset_data + info.size} > {size} bytes)"
                )
                break
            _read_member(raw, info, name, ext, sample)
        if damage is not None:
            if sample is None:
                raise SourceError(
                    f"tar {rel!r}: {damage} before any sample; re-create or remove the tar"
                )
            sample.refuse(
                f"tar {rel!r} is damaged: {damage}; this sample may be incomplete and any "
                "later samples of the tar are lost"
            )
        if sample is not None:
            yield sample.done()


def _store_failed(exc: BaseException) -> bool:
    """Whether the store itself failed (not a tar gone since listed): that stops the export."""
    return isinstance(exc, StorageError) and not isinstance(exc, ObjectNotFoundError)


def _end_problem(raw: IO[bytes], offset: int, size: int) -> str | None:
    """Why the tar does not end properly at ``offset``, or None (tarfile stops quietly at
    a cut, so a cut tar would read as a shorter one).
    """
    raw.seek(offset)
    block = raw.read(BLOCK)
    if block == _ZERO_BLOCK:
        return _data_after_end(raw, offset)
    if len(block) < BLOCK:
        return (
            f"it ends at byte {size} without its end-of-archive blocks (cut short?)"
            if not block
            else f"it ends inside the header at byte {offset} ({size} bytes)"
        )
    return f"bad tar header at byte {offset}"


def _data_after_end(raw: IO[bytes], offset: int) -> str | None:
    """Where non-zero bytes follow the end-of-archive block (tars joined with ``cat``), or None."""
    raw.seek(offset)
    while chunk := raw.read(_SCAN_CHUNK):
        if chunk.count(0) != len(chunk):
            at = offset + next(i for i, b in enumerate(chunk) if b)
            return f"data follows its end-of-archive blocks at byte {at} (tars joined with cat?)"
        offset += len(chunk)
    return None


def _read_member(raw: IO[bytes], info: tarfile.TarInfo, name: str, ext: str, s: TarSample) -> None:
    """Add one member to its sample, or say why the sample cannot be used."""
    problem = _member_problem(info, name, ext, s.seen)
    s.seen.add(ext)
    if problem is not None:
        s.refuse(problem)
    elif ext == "cls":
        text = _read(raw, info).strip()
        try:
            s.label = int(text)
        except ValueError:
            s.refuse(f"member {name!r} is not an integer class ({text[:40]!r})")
    elif ext == "json":
        s.meta, problem = json_member(_read(raw, info), name)
        if problem is not None:
            s.refuse(problem)
    else:
        s.members.append((ext, info.offset_data, info.size, None))


def _member_problem(info: tarfile.TarInfo, name: str, ext: str, seen: set[str]) -> str | None:
    if not info.isreg() or info.sparse is not None:
        kind = "a sparse file" if info.isreg() else _TYPE_NAMES.get(info.type)
        kind = kind or f"an entry of tar type {info.type!r}"
        target = f" to {info.linkname!r}" if info.islnk() or info.issym() else ""
        return f"member {name!r} is {kind}{target}; only regular files are exported"
    if name != info.name:
        return f"member name {name!r} is not UTF-8"
    if not ext:
        return f"member {name!r} has no extension"
    if ext in seen:  # a reader would keep one of the two: the other would vanish
        return f"member {name!r} appears twice in its sample"
    return None


def _read(raw: IO[bytes], info: tarfile.TarInfo) -> bytes:
    raw.seek(info.offset_data)
    return raw.read(info.size)
