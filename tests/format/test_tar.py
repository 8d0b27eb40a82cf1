"""Our tar members against Python's tarfile, and the sample parser."""

from __future__ import annotations

import contextlib
import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.errors import FormatError
from shardex.format.tar import (
    END_OF_ARCHIVE,
    iter_members,
    member_bytes,
    parse_sample,
    split_name,
)

_name_part = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/."),
    min_size=1,
    max_size=60,
)
_keys = st.lists(_name_part, min_size=1, max_size=6).map("/".join)


@settings(max_examples=150, deadline=None)
@given(key=_keys, payloads=st.lists(st.binary(max_size=1500), min_size=1, max_size=3))
def test_tarfile_reads_our_members(key: str, payloads: list[bytes]) -> None:
    exts = ["jpg", "cls", "json"][: len(payloads)]
    blob = b"".join(member_bytes(f"{key}.{e}", p) for e, p in zip(exts, payloads, strict=True))
    with tarfile.open(fileobj=io.BytesIO(blob + END_OF_ARCHIVE)) as tf:
        members = tf.getmembers()
        assert [m.name for m in members] == [f"{key}.{e}" for e in exts]
        assert all((m.mtime, m.uid, m.gid, m.mode) == (0, 0, 0, 0o644) for m in members)
        got = [tf.extractfile(m).read() for m in members]  # type: ignore[union-attr]
    assert got == payloads
    assert parse_sample(blob) == (key, dict(zip(exts, payloads, strict=True)))
    assert [m.name for m in iter_members(blob + END_OF_ARCHIVE)] == [f"{key}.{e}" for e in exts]


def test_members_are_deterministic_and_block_aligned() -> None:
    a = member_bytes("x/y.jpg", b"abc")
    assert a == member_bytes("x/y.jpg", b"abc")
    assert len(a) == 1024
    long = member_bytes("d/" * 200 + "k.jpg", b"z")  # needs a GNU long-name record
    assert len(long) % 512 == 0
    assert parse_sample(long) == ("d/" * 200 + "k", {"jpg": b"z"})


def test_iter_members_reads_pax_and_gnu_tars_from_elsewhere() -> None:
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            names = (f"{'n' * 150}/k.jpg", "ü/long" + "x" * 120 + ".txt")
            for name, data in zip(names, (b"1", b"22"), strict=True):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            folder = tarfile.TarInfo("dir")
            folder.type = tarfile.DIRTYPE
            tf.addfile(folder)  # not a sample member: skipped
        found = list(iter_members(buf.getvalue()))
        assert [m.name for m in found] == [f"{'n' * 150}/k.jpg", "ü/long" + "x" * 120 + ".txt"]
        assert [buf.getvalue()[m.data_offset : m.data_offset + m.size] for m in found] == [
            b"1",
            b"22",
        ]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000))
def test_parsers_raise_only_format_errors_on_garbage(data: bytes) -> None:
    for parse in (parse_sample, lambda b: list(iter_members(b))):
        with contextlib.suppress(FormatError):
            parse(data)


def test_truncated_member_is_a_format_error() -> None:
    blob = member_bytes("k.jpg", b"x" * 1000)
    with pytest.raises(FormatError, match="runs past"):
        parse_sample(blob[:700])
    with pytest.raises(FormatError):
        parse_sample(member_bytes("a.jpg", b"1") + member_bytes("b.jpg", b"2"))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a/b.c/x.seg.png", ("a/b.c/x", "seg.png")),
        ("k.jpg", ("k", "jpg")),
        ("noext", ("noext", "")),
    ],
)
def test_split_name_follows_webdataset(name: str, expected: tuple[str, str]) -> None:
    import webdataset.tariterators as wt

    assert split_name(name) == expected
    if expected[1]:
        assert wt.base_plus_ext(name) == expected
