"""Deterministic ustar tar members, and parsing of member headers: every header field but
name and size is fixed, so the same members give the same bytes; names past 100 + 155
bytes get a GNU ``L`` record (no PAX). Stock tarfile, WebDataset and DALI read the shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shardex.errors import FormatError

if TYPE_CHECKING:  # numpy: the writer's header_blocks only, reading needs none
    import numpy as np
    import numpy.typing as npt

BLOCK: Final = 512
END_OF_ARCHIVE: Final = bytes(2 * BLOCK)
MAX_MEMBER_SIZE: Final = 8**11 - 1  # 11 octal digits

_SIZE, _CHKSUM, _TYPE = slice(124, 136), slice(148, 156), 156
_GNU_LONGNAME: Final = ord("L")
_REGULAR: Final = (ord("0"), 0)


def _template() -> bytearray:
    h = bytearray(BLOCK)
    h[100:108] = b"0000644\0"  # mode
    h[108:116] = b"0000000\0"  # uid
    h[116:124] = b"0000000\0"  # gid
    h[136:148] = b"00000000000\0"  # mtime
    h[156] = ord("0")
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[329:337] = b"0000000\0"  # devmajor
    h[337:345] = b"0000000\0"  # devminor
    return h


_TEMPLATE: Final = bytes(_template())
# The checksum is the byte sum of the header with the checksum field read as 8 spaces.
_TEMPLATE_SUM: Final = sum(_TEMPLATE) + 8 * ord(" ")


def padding(size: int) -> int:
    """Zero bytes that follow ``size`` data bytes to reach a block boundary."""
    return -size % BLOCK


# The header is built by concatenation around the two variable fields (name, size) and
# the checksum; every other byte is the template's.
_MODE_TO_SIZE: Final = _TEMPLATE[100:124]
_MTIME: Final = _TEMPLATE[136:148]
_TYPE_TO_PREFIX: Final = _TEMPLATE[157:345]
_TAIL: Final = _TEMPLATE[500:]


def _header(name: bytes, size: int, *, typeflag: int = ord("0")) -> bytes:
    if size > MAX_MEMBER_SIZE:
        raise FormatError(f"tar member {name!r} is {size} bytes; the limit is {MAX_MEMBER_SIZE}")
    prefix = b""
    if len(name) > 100:
        cut = name.rfind(b"/", 0, 156)
        prefix, name = name[:cut], name[cut + 1 :]
    size_field = b"%011o\0" % size
    total = _TEMPLATE_SUM + sum(name) + sum(prefix) + sum(size_field) + typeflag - ord("0")
    return b"".join(
        (
            name.ljust(100, b"\0"),
            _MODE_TO_SIZE,
            size_field,
            _MTIME,
            b"%06o\0 " % total,
            bytes((typeflag,)),
            _TYPE_TO_PREFIX,
            prefix.ljust(155, b"\0"),
            _TAIL,
        )
    )


def fits_ustar(name: bytes) -> bool:
    """Whether a member name fits ustar's name/prefix fields without a long-name record."""
    if len(name) <= 100:
        return True
    cut = name.rfind(b"/", 0, 156)
    return cut > 0 and len(name) - cut - 1 <= 100


def member_header(name: str) -> tuple[bytes, int]:
    """Encode a member name; returns (name bytes, header bytes needed before the data)."""
    raw = name.encode("utf-8")
    if b"\0" in raw:
        raise FormatError(f"tar member name {name!r} contains a NUL byte")
    if fits_ustar(raw):
        return raw, BLOCK
    return raw, 2 * BLOCK + len(raw) + 1 + padding(len(raw) + 1)


def encode_member(name: bytes, size: int) -> bytes:
    """Header bytes (long-name record included when needed) for a member of ``size`` bytes."""
    if fits_ustar(name):
        return _header(name, size)
    long = name + b"\0"
    return (
        _header(b"././@LongLink", len(long), typeflag=_GNU_LONGNAME)
        + long
        + bytes(padding(len(long)))
        + _header(name[:100], size)
    )


def long_headers(
    values: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> dict[int, bytes]:
    """The whole headers (:func:`encode_member`), by member number, of the few members whose
    name (``values[offsets[j]:offsets[j + 1]]``) is past ustar's 100 bytes.
    """
    import numpy as np

    long = np.flatnonzero(np.diff(offsets) > 100).tolist()
    return {
        j: encode_member(values[offsets[j] : offsets[j + 1]].tobytes(), int(sizes[j])) for j in long
    }


def header_blocks(
    values: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    into: npt.NDArray[np.uint8],
    rows: npt.NDArray[np.int64],
) -> None:
    """The headers of many members at once, built with numpy into the 512-byte rows
    ``into[rows[j]]`` (one Python call a header costs more than writing its member).

    Member ``j``'s name is ``values[offsets[j]:offsets[j + 1]]``; names past 100 bytes are
    left to :func:`long_headers`. The same bytes as :func:`encode_member`.
    """
    import numpy as np

    if len(sizes) and int(sizes.max()) > MAX_MEMBER_SIZE:
        big = int(np.argmax(sizes))
        name = values[offsets[big] : offsets[big + 1]].tobytes()
        _header(name, int(sizes[big]))  # raises the one-line error
    lengths = np.diff(offsets)
    fixed = lengths <= 100
    short = np.where(fixed, lengths, 0)
    rows, sizes = rows[fixed], sizes[fixed]
    # the name bytes, scattered into their rows (a ragged arange; the template's are 0)
    within = np.arange(int(short.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(short) - short, short
    )
    name_bytes = values[np.repeat(offsets[:-1], short) + within]
    into[rows] = np.frombuffer(_TEMPLATE, np.uint8)
    into.reshape(-1)[np.repeat(rows * BLOCK, short[fixed]) + within] = name_bytes
    digits = ((sizes[:, None] >> (3 * np.arange(10, -1, -1, dtype=np.int64))) & 7) + ord("0")
    into[rows, 124:135] = digits
    into[rows, 135] = 0
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), short[fixed])
    names = np.bincount(owner, weights=name_bytes, minlength=len(rows)).astype(np.int64)
    checksum = _TEMPLATE_SUM + names + digits.sum(axis=1) - sum(_TEMPLATE[124:135])
    into[rows, 148:154] = ((checksum[:, None] >> (3 * np.arange(5, -1, -1))) & 7) + ord("0")
    into[rows, 154] = 0
    into[rows, 155] = ord(" ")


def member_bytes(name: str, data: bytes) -> bytes:
    """A whole member: header, data and padding."""
    raw, _ = member_header(name)
    return encode_member(raw, len(data)) + data + bytes(padding(len(data)))


@dataclass(frozen=True, slots=True)
class Member:
    """One regular member found in tar bytes: its name and where its data lies."""

    name: str
    header_offset: int
    data_offset: int
    size: int


def _octal(field: bytes, where: str) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    if field[:1] == b"\x80":  # GNU base-256 for sizes past 8 GiB
        return int.from_bytes(field[1:], "big")
    try:
        return int(text, 8) if text else 0
    except ValueError as exc:
        raise FormatError(f"{where}: bad octal field {field!r}") from exc


def _checksum_ok(header: bytes) -> bool:
    stored = header[_CHKSUM].rstrip(b"\0 ").lstrip(b" ")
    try:
        want = int(stored, 8)
    except ValueError:
        return False
    return sum(header[:148]) + 8 * 32 + sum(header[156:]) == want


def iter_members(
    buf: bytes | memoryview, *, start: int = 0, where: str = "tar", strict: bool = True
) -> Iterator[Member]:
    """Yield the regular-file members of tar bytes, in order.

    Other entries are skipped; GNU long names and PAX ``path``/``size`` are honoured.

    Raises:
        FormatError: a header is malformed or a member runs past the end of ``buf``.
    """
    view = memoryview(buf)
    pos, end = start, len(view)
    long_name: str | None = None
    pax: dict[str, str] = {}
    while pos + BLOCK <= end:
        header = bytes(view[pos : pos + BLOCK])
        if header == bytes(BLOCK):
            return
        if strict and not _checksum_ok(header):
            raise FormatError(f"{where}: bad tar header checksum at byte {pos}")
        size = int(pax["size"]) if "size" in pax else _octal(header[_SIZE], where)
        data = pos + BLOCK
        nxt = data + size + padding(size)
        if data + size > end:
            raise FormatError(f"{where}: member at byte {pos} runs past the end ({end} bytes)")
        kind = header[_TYPE]
        if kind == _GNU_LONGNAME:
            long_name = bytes(view[data : data + size]).rstrip(b"\0").decode("utf-8", "replace")
        elif kind in (ord("x"), ord("g")):
            if kind == ord("x"):
                pax = _parse_pax(bytes(view[data : data + size]), where)
        else:
            if kind in _REGULAR:
                name = (
                    long_name
                    or pax.get("path")
                    or _ustar_raw_name(header, 0).decode("utf-8", "replace")
                )
                yield Member(name, pos, data, size)
            long_name, pax = None, {}
        pos = nxt
    if pos < end and strict:
        raise FormatError(f"{where}: {end - pos} trailing bytes are not a tar header")


def _parse_pax(data: bytes, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        if space < 0:
            raise FormatError(f"{where}: malformed PAX header")
        try:
            length = int(data[pos:space])
        except ValueError as exc:
            raise FormatError(f"{where}: malformed PAX record length") from exc
        if length <= 0:
            raise FormatError(f"{where}: malformed PAX record length")
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def split_name(name: str) -> tuple[str, str]:
    """Split a member name into (key, extension) the way WebDataset does: at the first dot of
    the last path component, ``a/b.c/x.seg.png`` -> ``("a/b.c/x", "seg.png")``.
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


_EXTENSIONS: dict[bytes, str] = {}


def parse_sample(
    buf: bytes, *, where: str = "sample", start: int = 0, stop: int | None = None
) -> tuple[str, dict[str, bytes]]:
    """Split one sample's bytes (members of one key) into ``(key, {ext: data})``.

    ``buf[start:stop]`` is the sample; error offsets count from ``start``. The hot path of
    reads before format 3, tuned for CPython (literals: 512 block, 76 "L", 47 "/"; no header
    checksums: the sample's covers them).

    Raises:
        FormatError: the bytes are not whole members, or hold more than one key.
    """
    pos, end = start, len(buf) if stop is None else stop
    key, klen, keydot, extensions = b"", 0, b"", _EXTENSIONS
    fields: dict[str, bytes] = {}
    long_name: bytes | None = None
    try:
        while pos < end:
            try:  # shardex writes 11 octal digits and a NUL; other writers pad otherwise
                size = int(buf[pos + 124 : pos + 135], 8)
            except ValueError:
                size = int(buf[pos + 124 : pos + 136].rstrip(b"\0 ") or b"0", 8)
            data, stop_at = pos + 512, pos + 512 + size
            if stop_at > end:
                raise FormatError(
                    f"{where}: member at byte {pos - start} runs past the sample's end"
                )
            if buf[pos + 156] == 76:
                long_name = buf[data:stop_at].rstrip(b"\0")
                pos = stop_at + (-size % 512)
                continue
            if long_name is None and 0 < klen < 99 and not buf[pos + 345]:
                # the common case: a short ustar name "key.ext", compared in place
                if not buf.startswith(keydot, pos):
                    _other_key(buf, pos, key, where)
                nul = buf.find(b"\0", pos, pos + 100) % (pos + 101)
                ext = buf[pos + klen + 1 : nul]
                if 47 in ext:
                    _other_key(buf, pos, key, where)
            else:
                key, ext = _key_and_ext(buf, pos, long_name, key, where)
                klen, keydot, long_name = len(key), key + b".", None
            text = extensions.get(ext)
            if text is None:
                text = ext.decode("utf-8", "replace")
                if len(extensions) < 1024:  # a bounded memo of the few extensions in use
                    extensions[ext] = text
            fields[text] = buf[data:stop_at]
            pos = stop_at + (-size % 512)
    except (ValueError, IndexError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: malformed tar header at byte {pos - start} ({exc})") from exc
    if not klen:
        raise FormatError(f"{where}: holds no members")
    return key.decode("utf-8", "replace"), fields


def _key_and_ext(
    buf: bytes, pos: int, long_name: bytes | None, key: bytes, where: str
) -> tuple[bytes, bytes]:
    """The key and extension of the member at ``pos`` where :func:`parse_sample` cannot match
    in place: a first member, a long name, a ustar prefix (``key``: b"" before the first).
    """
    if long_name is not None:
        name = long_name
    elif buf[pos + 345]:
        name = _ustar_raw_name(buf, pos)
    else:
        # find() gives -1 for a name of exactly 100 bytes; % maps it to pos + 100
        name = buf[pos : buf.find(b"\0", pos, pos + 100) % (pos + 101)]
    if not key:
        dot = name.find(b".", name.rfind(b"/") + 1)
        return (name, b"") if dot < 0 else (name[:dot], name[dot + 1 :])
    klen = len(key)  # the same key, then ".", then an extension without "/"
    if name[:klen] != key or name[klen] != 46 or 47 in name[klen + 1 :]:
        other = name.decode("utf-8", "replace")
        raise FormatError(f"{where}: holds members of two keys ({key!r}, {other!r})")
    return key, name[klen + 1 :]


def _other_key(buf: bytes, pos: int, key: bytes, where: str) -> None:
    name = _ustar_raw_name(buf, pos).decode("utf-8", "replace")
    raise FormatError(f"{where}: holds members of two keys ({key!r}, {name!r})")


def _ustar_raw_name(buf: bytes, pos: int) -> bytes:
    name = buf[pos : pos + 100].split(b"\0", 1)[0]
    if buf[pos + 257 : pos + 263] == b"ustar\0" and buf[pos + 345] != 0:
        name = buf[pos + 345 : pos + 500].split(b"\0", 1)[0] + b"/" + name
    return name
