"""The read side of a split's index without numpy: its ``.npy`` files mapped and read
through ``struct`` (numpy costs 120-170 ms to import). A header of exactly shardex's form
is parsed here; any other goes to ``numpy.load``, with its usual errors. numpy loads on
first use of the whole arrays (:attr:`SplitIndex.samples`, :attr:`MemberIndex.rows`).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import xxhash

from shardex.errors import FormatError, ObjectNotFoundError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

RECORD: Final = struct.Struct("<QQII")
SAMPLE_FIELDS: Final = [("offset", "<u8"), ("checksum", "<u8"), ("shard", "<u4"), ("length", "<u4")]


def sample_dtype() -> np.dtype[np.void]:
    """The numpy dtype of a record (numpy imported on first use)."""
    import numpy as np

    return np.dtype(SAMPLE_FIELDS)


SAMPLES_FILE: Final = "index-samples.npy"
KEYS_FILE: Final = "index-keys.npy"
MEMBERS_FILE: Final = "index-members.npy"
MEMBERS_VERSION: Final = 3  # the first format with index-members.npy
#: The size of a member a sample lacks; as a key length: parse the sample.
ABSENT: Final = 0xFFFFFFFF
#: Past this many extensions a split gets no index-members.npy (reads parse headers):
#: samples bringing their own extensions would grow it by samples x extensions.
MAX_MEMBER_COLUMNS: Final = 64
SEEDED_VERSION: Final = 2  # the first format seeding checksums with the sample number

_SAMPLES_DESCR: Final = str(SAMPLE_FIELDS)  # as numpy.save writes it in the header
_HEADER: Final = re.compile(
    r"\{'descr': (.*), 'fortran_order': False, 'shape': \((\d+,|\d+, \d+)\), \}"
)
_MEMBERS_DESCR: Final = re.compile(
    r"\[\('check', '<u8'\), \('key', '<u4', \(2,\)\), \('members', \[(.*)\]\)\]"
)
_MEMBER: Final = re.compile(r"\('([A-Za-z0-9_.+-]+)', '<u4', \(2,\)\)")


def key_hash(key: str) -> int:
    """The 64-bit hash under which a key is filed in the key table."""
    return int(xxhash.xxh3_64_intdigest(key.encode("utf-8")))


def checksum_seeds(format_version: int) -> bool:
    """Whether an export of this format version seeds its sample checksums."""
    return format_version >= SEEDED_VERSION


class _Npy:
    """A ``.npy`` file of shardex's own form, mapped: ``descr``, shape and read-only data;
    :meth:`open` gives None for any other form (left to numpy).
    """

    def __init__(self, descr: str, shape: tuple[int, ...], data: memoryview) -> None:
        self.descr, self.shape, self.data = descr, shape, data

    @classmethod
    def open(cls, path: Path, itemsize: Callable[[str], int | None]) -> _Npy | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # numpy.load raises the error that fits
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, 10, 0)
            if len(head) < 10 or head[:8] != b"\x93NUMPY\x01\x00":
                return None
            start = 10 + int.from_bytes(head[8:10], "little")
            found = _HEADER.fullmatch(os.pread(fd, start - 10, 10).decode("latin-1").rstrip())
            if found is None:
                return None
            descr, dims = found.group(1), found.group(2)
            shape = tuple(int(d) for d in dims.split(",") if d)
            width = itemsize(descr)
            count = 1
            for d in shape:
                count *= d
            if width is None or start + count * width != size:
                return None
            if count == 0:
                return cls(descr, shape, memoryview(b""))
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            return cls(descr, shape, memoryview(mapped)[start:size])
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)


def _load(path: Path, what: str) -> npt.NDArray[np.generic]:
    """``numpy.load`` of an index file, mapped; its errors as shardex's."""
    import numpy as np

    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(f"{path}: the {what} index file is missing") from exc
    except Exception as exc:
        # numpy's header parser raises what it meets on a hostile header: ValueError,
        # SyntaxError, tokenize.TokenError (an unclosed bracket), OSError, EOFError ...
        raise FormatError(f"{path}: not a valid {what} index file ({exc})") from exc
    return arr  # type: ignore[no-any-return]


def _bytes_of(arr: Any) -> memoryview:
    import numpy as np

    return memoryview(arr.view(np.uint8)) if arr.size else memoryview(b"")


class SplitIndex:
    """Memory-mapped index of one split."""

    def __init__(
        self, samples_path: Path, keys_path: Path | Callable[[], Path], *, num_samples: int
    ) -> None:
        self._samples: Any = None
        npy = _Npy.open(samples_path, lambda d: 24 if d == _SAMPLES_DESCR else None)
        if npy is not None and npy.shape == (num_samples,):
            self._raw = npy.data
        else:
            self._raw = self._checked(samples_path, num_samples)
        self._keys_path = keys_path
        self._keys: memoryview | None = None
        self._sorted: bool | None = None
        self.num_samples = num_samples

    def _checked(self, samples_path: Path, num_samples: int) -> memoryview:
        """The records through numpy.load, for what the fast path did not take."""
        dtype = sample_dtype()
        samples = _load(samples_path, "sample")
        if samples.dtype != dtype or samples.ndim != 1:
            raise FormatError(
                f"{samples_path}: expected a 1-d array of {dtype}, found "
                f"{samples.dtype} with shape {samples.shape}"
            )
        if len(samples) != num_samples:
            raise FormatError(
                f"{samples_path}: holds {len(samples)} samples, config.yaml says {num_samples}"
            )
        self._samples = samples
        return _bytes_of(samples)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def raw(self) -> memoryview:
        """The record array's bytes: record ``i`` is :data:`RECORD` at ``24 * i``."""
        return self._raw

    def record(self, i: int) -> tuple[int, int, int, int]:
        """``(offset, checksum, shard, length)`` of sample ``i``."""
        return RECORD.unpack_from(self._raw, i * 24)

    def records(self, lo: int, hi: int) -> Iterator[tuple[int, int, int, int]]:
        """``(offset, checksum, shard, length)`` of samples ``lo`` to ``hi`` (excluded).

        From a copy: an ``iter_unpack`` over a slice of the mapping, left in a reference cycle
        (a traceback), lets the collector clear the slice under it and crash the process later.
        """
        return RECORD.iter_unpack(self._raw[lo * 24 : hi * 24].tobytes())

    @property
    def samples(self) -> npt.NDArray[np.void]:
        """The whole record array (numpy, over the same mapping)."""
        if self._samples is None:
            import numpy as np

            self._samples = np.frombuffer(self._raw, sample_dtype())
        return self._samples  # type: ignore[no-any-return]

    def _key_table(self) -> memoryview:
        """The key table as a (2 x N) uint64 memoryview (hashes, then sample numbers)."""
        if self._keys is None:
            path = self._keys_path if isinstance(self._keys_path, Path) else self._keys_path()
            n = self.num_samples
            npy = _Npy.open(path, lambda d: 8 if d == "'<u8'" else None)
            if npy is not None and npy.shape == (2, n):
                data = npy.data
            else:
                keys = _load(path, "key")
                if keys.dtype != "<u8" or keys.shape != (2, n):
                    raise FormatError(
                        f"{path}: expected uint64 of shape (2, {n}), "
                        f"found {keys.dtype} {keys.shape}"
                    )
                if not keys.flags.c_contiguous:  # a Fortran-ordered file: rows apart
                    import numpy as np

                    keys = np.ascontiguousarray(keys)
                data = _bytes_of(keys)
            self._keys = data.cast("Q") if n else memoryview(b"").cast("Q")
        return self._keys

    def keys_sorted(self) -> bool:
        """Whether the key hashes are sorted (checked once): a damaged table can hide a key."""
        if self._sorted is None:
            import numpy as np

            n = self.num_samples
            hashes = np.frombuffer(self._key_table(), np.uint64, n) if n else np.zeros(0)
            self._sorted = not bool(np.any(hashes[1:] < hashes[:-1]))
        return self._sorted

    def candidates(self, key: str) -> Iterator[int]:
        """Sample numbers whose key hash equals ``key``'s (usually exactly one)."""
        table, n = self._key_table(), self.num_samples
        h = key_hash(key)
        pos = bisect_left(table, h, 0, n)
        while pos < n and table[pos] == h:
            yield table[n + pos]
            pos += 1


def _members_width(descr: str, names: list[str]) -> int | None:
    """The row size of an ``index-members.npy`` header of shardex's form, or None."""
    found = _MEMBERS_DESCR.fullmatch(descr)
    if found is None:
        return None
    inner = found.group(1)
    got = _MEMBER.findall(inner)
    if not got or ", ".join(f"('{e}', '<u4', (2,))" for e in got) != inner:
        return None
    if len(set(got)) != len(got):
        return None  # numpy refuses a repeated name: it says so
    names.extend(got)
    return 16 + 8 * len(got)


class MemberIndex:
    """Memory-mapped ``index-members.npy`` of a split."""

    def __init__(self, path: Path, *, num_samples: int) -> None:
        self.path = path
        self._rows: Any = None
        names: list[str] = []
        npy = _Npy.open(path, lambda d: _members_width(d, names))
        if npy is not None and npy.shape == (num_samples,):
            self.raw = npy.data
        else:
            rows: Any = _load(path, "member")
            names = list(check_member_rows(rows, str(path), num_samples))
            self._rows = rows
            self.raw = _bytes_of(rows)
        self.names: tuple[str, ...] = tuple(names)
        self.row_size = 16 + 8 * len(names)
        # check, key offset, key length, then offset and size per member
        self.row = struct.Struct("<Q" + "I" * (2 + 2 * len(names)))
        self.unpack: Callable[[memoryview, int], tuple[int, ...]] = self.row.unpack_from

    def unpacked(self, lo: int, hi: int) -> Iterator[tuple[int, ...]]:
        """The rows of samples ``lo`` to ``hi``, unpacked from a copy (see ``records``)."""
        size = self.row_size
        return self.row.iter_unpack(self.raw[lo * size : hi * size].tobytes())

    @property
    def rows(self) -> npt.NDArray[np.void]:
        """The rows as a numpy structured array (over the same mapping)."""
        if self._rows is None:
            import numpy as np

            self._rows = np.frombuffer(self.raw, members_dtype(self.names))
        return self._rows  # type: ignore[no-any-return]


def members_dtype(exts: Sequence[str]) -> np.dtype[np.void]:
    """The row type of ``index-members.npy`` for these member extensions."""
    import numpy as np

    return np.dtype(
        [("check", "<u8"), ("key", "<u4", (2,)), ("members", [(e, "<u4", (2,)) for e in exts])]
    )


def check_member_rows(rows: Any, where: str, num_samples: int) -> tuple[str, ...]:
    """The member extensions of the ``index-members.npy`` rows found at ``where``.

    Raises:
        FormatError: it is not a 1-d array of index-members rows, or not one per sample.
    """
    names = rows.dtype.names == ("check", "key", "members") and rows.dtype["members"].names
    if rows.ndim != 1 or names is False or names is None or rows.dtype != members_dtype(names):
        raise FormatError(
            f"{where}: expected a 1-d array of index-members rows, found {rows.dtype} "
            f"with shape {rows.shape}"
        )
    if len(rows) != num_samples:
        raise FormatError(
            f"{where}: holds {len(rows)} rows, config.yaml says {num_samples} samples"
        )
    return tuple(names)
