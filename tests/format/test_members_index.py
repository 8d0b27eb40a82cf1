"""index-members.npy (format 3): where each sample's members lie, so reads slice fields
instead of parsing tar headers. Its rows equal what parsing the tar gives, a damaged row is
refused, damaged shard bytes are still caught, and exports without it read as before."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from helpers import copy_of
from shardex.errors import ChecksumError, FormatError
from shardex.format.index import ABSENT, MAX_MEMBER_COLUMNS, MemberSpans, member_row
from shardex.format.tar import iter_members, member_bytes, parse_sample, split_name
from shardex.storage import ObjectStorage
from shardex.verification import verify
from tests.support.s3data import S3Location

# Keys of every layout a member name can take: short ustar names, a name over 100 bytes
# with a "/" (split over ustar's prefix and name fields: the row says "parse"), a GNU
# long-name record (no "/" to split at), non-ASCII.
KEYS = ["a", "b" * 98, "d/" * 40 + "e" * 30, "f" * 140, "grün/ü", "h9"]


def _source() -> dict[str, list[Any]]:
    n = len(KEYS)
    return {
        "key": KEYS,
        "txt": [f"text {i}".encode() * (i * 50 + 1) for i in range(n)],
        "seg.bin": [bytes([i]) * (700 * i) for i in range(n)],
        "label": list(range(n)),
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("members") / "out"
    shardex.export(_source(), out, workers=1, samples_per_shard=4)
    return out


@pytest.fixture
def export(clean: Path, tmp_path: Path) -> Path:
    return copy_of(clean, tmp_path)


def _parsed(root: Path) -> list[tuple[str, dict[str, bytes], list[tuple[str, int, int]]]]:
    """Every sample as parsing its shard's tar headers gives it."""
    ds = shardex.open_dataset(root)
    out = []
    for i in range(len(ds)):
        offset, _, shard, length = ds.index.record(i)  # type: ignore[attr-defined]
        data = (root / ds._paths[shard]).read_bytes()[offset : offset + length]  # type: ignore[attr-defined]
        key, fields = parse_sample(data)
        spans = [(split_name(m.name)[1], m.data_offset, m.size) for m in iter_members(data)]
        out.append((key, fields, spans))
    return out


def test_rows_hold_what_the_tar_headers_say(clean: Path) -> None:
    rows = np.load(clean / "train" / "index-members.npy")
    names = rows.dtype["members"].names
    assert set(names) == {"txt", "seg.bin", "cls"}
    parsed = _parsed(clean)
    assert len(rows) == len(parsed) == len(KEYS)
    for row, (key, _, spans) in zip(rows, parsed, strict=True):
        present = {ext: (at, size) for ext, at, size in spans}
        for name in names:
            assert tuple(row["members"][name]) == present.get(name, (ABSENT, ABSENT))
        if key == KEYS[2]:  # split over prefix and name: readers parse it
            assert row["key"][1] == ABSENT
        else:
            assert row["key"][1] == len(key.encode())


def test_reads_equal_parsing_the_tar(clean: Path) -> None:
    want = [{**fields, "__key__": key} for key, fields, _ in _parsed(clean)]
    assert [s["__key__"] for s in want] == KEYS
    for verify_reads in (True, False):
        ds = shardex.open_dataset(clean, verify=verify_reads)
        n = len(ds)
        assert [ds[i] for i in range(n)] == want
        assert list(ds) == want
        assert ds.get_many(list(range(n))[::-1]) == want[::-1]
        assert ds.get_many([5, 0, 3], coalesce_gap=1 << 20) == [want[5], want[0], want[3]]
        assert ds.get(KEYS[3]) == want[3]
    decoding = shardex.open_dataset(clean, decode=True)
    decoded = decoding[0]
    assert decoded["txt"] == "text 0"
    assert decoded["__key__"] == "a"
    every = [decoding[i] for i in range(len(decoding))]
    assert list(decoding) == every == decoding.get_many(range(len(decoding)))
    assert [s["cls"] for s in every] == list(range(len(KEYS)))


def _members_file(root: Path) -> Path:
    return root / "train" / "index-members.npy"


def _flip_row(root: Path, row: int, byte: int) -> None:
    path = _members_file(root)
    rows = np.load(path)
    data = bytearray(path.read_bytes())
    data[len(data) - rows.nbytes + row * rows.dtype.itemsize + byte] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_damaged_row_is_refused_and_verify_reports_it(export: Path) -> None:
    before = list(shardex.open_dataset(export))
    _flip_row(export, 3, 8 + 8 + 4)  # the size of row 3's first member
    ds = shardex.open_dataset(export)
    with pytest.raises(FormatError, match=r"row 3 of .*index-members\.npy fails its check") as e:
        ds[3]
    assert "\n" not in str(e.value)
    with pytest.raises(FormatError, match="row 3 "):
        list(ds)
    with pytest.raises(FormatError, match="row 3 "):
        ds.get_many([2, 3])
    assert ds[2] == before[2]
    assert ds[4] == before[4]
    skipping = shardex.open_dataset(export, on_error="skip")
    assert list(skipping) == before[:3] + before[4:]
    report = verify(export)
    assert [p.file for p in report.problems] == ["train/index-members.npy"]
    assert "1 rows differ" in report.problems[0].message


def test_a_row_moved_to_another_sample_fails_its_check(export: Path) -> None:
    path = _members_file(export)
    rows = np.load(path)
    rows[[0, 1]] = rows[[1, 0]]
    np.save(path, rows)
    ds = shardex.open_dataset(export)
    with pytest.raises(FormatError, match="row 0 "):
        ds[0]
    assert not verify(export).ok


def test_a_flipped_byte_in_a_member_is_still_caught(export: Path) -> None:
    ds = shardex.open_dataset(export)
    offset, _, shard, _ = ds.index.record(5)  # type: ignore[attr-defined]
    tar = export / ds._paths[shard]  # type: ignore[attr-defined]
    data = bytearray(tar.read_bytes())
    at = offset + int(np.load(_members_file(export))[5]["members"]["seg.bin"][0]) + 10
    data[at] ^= 0x01
    tar.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="sample 5 "):
        shardex.open_dataset(export)[5]
    with pytest.raises(ChecksumError, match="sample 5 "):
        list(shardex.open_dataset(export))
    assert not verify(export).ok


def test_a_members_file_of_the_wrong_shape_is_refused(export: Path) -> None:
    np.save(_members_file(export), np.zeros(3, np.uint64))
    with pytest.raises(FormatError, match=r"index-members\.npy: expected a 1-d array"):
        shardex.open_dataset(export)[0]
    assert any("index-members" in p.file for p in verify(export).problems)


def _as_format_2(root: Path) -> None:
    """The export as format 2 wrote it: no index-members.npy."""
    raw = yaml.safe_load((root / "config.yaml").read_text())
    raw["format_version"] = 2
    del raw["splits"]["train"]["index"]["members"]
    (root / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    _members_file(root).unlink()


def test_format_2_exports_read_verify_and_append_as_before(export: Path) -> None:
    want = list(shardex.open_dataset(export))
    _as_format_2(export)
    ds = shardex.open_dataset(export)
    assert ds.config.format_version == 2
    assert ds.members is None
    assert [ds[i] for i in range(len(ds))] == want
    assert list(ds) == want
    assert ds.get_many([4, 1]) == [want[4], want[1]]
    assert verify(export).ok, verify(export).problems
    more = {k: v[:2] for k, v in _source().items()}
    more["key"] = ["new1", "new2"]
    shardex.export(more, export, workers=1, samples_per_shard=4, mode="append")
    raw = yaml.safe_load((export / "config.yaml").read_text())
    assert raw["format_version"] == 2
    assert "members" not in raw["splits"]["train"]["index"]
    assert not _members_file(export).exists()
    ds = shardex.open_dataset(export)
    assert list(ds)[: len(want)] == want
    assert len(ds) == len(want) + 2
    assert verify(export).ok, verify(export).problems


def test_an_append_extends_the_members_index(export: Path) -> None:
    want = list(shardex.open_dataset(export))
    more = {"key": ["x1", "x2", "x3"], "txt": [b"1", b"2", b"3"], "seg.bin": [b"s"] * 3}
    more["label"] = [0, 1, 2]
    shardex.export(more, export, workers=1, samples_per_shard=4, mode="append")
    raw = yaml.safe_load((export / "config.yaml").read_text())
    assert raw["format_version"] == 3
    rows = np.load(export / raw["splits"]["train"]["index"]["members"])
    assert len(rows) == len(want) + 3
    ds = shardex.open_dataset(export)
    assert list(ds)[: len(want)] == want
    assert [ds[len(want) + k]["txt"] for k in range(3)] == [b"1", b"2", b"3"]
    assert verify(export).ok, verify(export).problems


def test_object_storage_reads_slice_by_the_members_index(
    s3: S3Location, clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = list(shardex.open_dataset(clean))
    shardex.export(_source(), s3.url, storage_options=s3.direct, workers=1, samples_per_shard=4)
    # index copies are cached by the shards' checksums: another test's would be found
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(tmp_path / "cache"))
    s3.proxy.reset()
    ds = shardex.open_dataset(s3.url, storage_options=s3.counted)
    s3.proxy.wait_idle()
    assert all("index-members" not in r.path for r in s3.proxy.requests)  # not at open
    ds.stream_chunk_size = 3000  # type: ignore[attr-defined]  # samples span chunks
    assert list(ds) == want
    assert [ds[i] for i in range(len(ds))] == want
    assert ds.get_many([5, 0, 3]) == [want[5], want[0], want[3]]
    s3.proxy.wait_idle()
    assert sum("index-members" in r.path for r in s3.proxy.requests) == 1
    # a damaged row on the server is refused there too
    storage = ObjectStorage(s3.url, s3.direct)
    raw = bytearray(storage.get("train/index-members.npy"))
    rows = np.load(io.BytesIO(bytes(raw)))
    raw[len(raw) - rows.nbytes + 2 * rows.dtype.itemsize + 20] ^= 0x04
    storage.put("train/index-members.npy", bytes(raw))
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(tmp_path / "cache2"))
    damaged = shardex.open_dataset(s3.url, storage_options=s3.direct)
    with pytest.raises(FormatError, match="row 2 "):
        list(damaged)
    assert damaged[1] == want[1]


_NAME_CHARS = st.characters(blacklist_characters="\x00./", blacklist_categories=("Cs",))


@settings(max_examples=60, deadline=None)
@given(
    key=st.lists(st.text(_NAME_CHARS, min_size=1, max_size=70), min_size=1, max_size=4).map(
        "/".join
    ),
    members=st.lists(
        st.tuples(st.text(_NAME_CHARS, min_size=0, max_size=8), st.binary(max_size=1500)),
        min_size=1,
        max_size=4,
    ),
)
def test_a_row_slices_what_parsing_gives(key: str, members: list[tuple[str, bytes]]) -> None:
    """For any key and members (long names, prefix-split names, empty or repeated
    extensions), slicing by the row gives what parse_sample gives, or the row says parse."""
    sample = b"".join(member_bytes(f"{key}.{ext}" if ext else key, data) for ext, data in members)
    found = [(m.name, m.data_offset, m.size) for m in iter_members(sample)]
    row = MemberSpans.of([member_row(found)])  # as the writer and verify build rows
    assert row is not None
    key_at, key_len = (int(v) for v in row.spans[0, :2])
    spans = [
        (ext, int(row.spans[0, 2 + 2 * c]), int(row.spans[0, 3 + 2 * c]))
        for c, ext in enumerate(row.exts)
    ]
    try:
        parsed_key, fields = parse_sample(sample)
    except FormatError:  # readers raise it, through the parse the row sends them to
        assert key_len == ABSENT
        return
    if key_len == ABSENT:  # readers parse this one
        assert (  # a name beyond ustar's 100-byte field puts part of the key elsewhere
            any(len((f"{key}.{e}" if e else key).encode()) > 100 for e, _ in members)
            or any(not e for e, _ in members)
            or len({e for e, _ in members}) < len(members)
        )
        return
    assert sample[key_at : key_at + key_len].decode() == parsed_key == key
    assert {ext: sample[at : at + size] for ext, at, size in spans} == fields


def test_an_append_refuses_a_damaged_members_file_instead_of_sealing_it(export: Path) -> None:
    # The append writes the rows again with new checks: a damaged row carried over would
    # pass its new check, and ds[3] would slice wrong fields out of good bytes silently.
    before = list(shardex.open_dataset(export))
    config = (export / "config.yaml").read_bytes()
    _flip_row(export, 3, 8 + 8 + 4)
    more = {"key": ["x1"], "txt": [b"1"], "seg.bin": [b"s"], "label": [0]}
    with pytest.raises(FormatError, match=r"row 3 of .*index-members\.npy fails its check") as e:
        shardex.export(more, export, workers=1, samples_per_shard=4, mode="append")
    assert "\n" not in str(e.value)
    assert (export / "config.yaml").read_bytes() == config
    ds = shardex.open_dataset(export)
    with pytest.raises(FormatError, match="row 3 "):
        ds[3]
    assert [ds[i] for i in range(len(ds)) if i != 3] == before[:3] + before[4:]
    shardex.export(_source(), export, workers=1, samples_per_shard=4, mode="overwrite")
    shardex.export(more, export, workers=1, samples_per_shard=4, mode="append")
    assert list(shardex.open_dataset(export))[: len(before)] == before
    assert verify(export).ok, verify(export).problems


def test_an_append_refuses_a_members_file_claiming_a_huge_shape(export: Path) -> None:
    path = _members_file(export)
    data = path.read_bytes()
    n = len(KEYS)
    path.write_bytes(data.replace(f"'shape': ({n},)".encode(), b"'shape': (999999999999,)"))
    more = {"key": ["x1"], "txt": [b"1"], "seg.bin": [b"s"], "label": [0]}
    with pytest.raises(FormatError, match=r"index-members\.npy: not a valid member index") as e:
        shardex.export(more, export, workers=1, samples_per_shard=4, mode="append")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("damage", ["out of range", "repeated", "short"])
def test_an_append_refuses_a_damaged_key_table_in_one_line(export: Path, damage: str) -> None:
    # the append carries the committed key table into the new one: sample numbers past
    # the end, or one sample twice, must stop it before anything is written
    path = export / "train" / "index-keys.npy"
    table = np.load(path)
    if damage == "out of range":
        table[1, 2] = 10**6
    elif damage == "repeated":
        table[1, 2] = table[1, 3]
    else:
        table = table[:, :-1]
    np.save(path, table)
    config = (export / "config.yaml").read_bytes()
    more = {"key": ["x1"], "txt": [b"1"], "seg.bin": [b"s"], "label": [0]}
    with pytest.raises(FormatError, match=r"index-keys\.npy: ") as e:
        shardex.export(more, export, workers=1, samples_per_shard=4, mode="append")
    assert "\n" not in str(e.value)
    assert "overwrite" in str(e.value)
    assert (export / "config.yaml").read_bytes() == config


def test_samples_with_extensions_of_their_own_get_no_members_file(tmp_path: Path) -> None:
    # every sample brings an extension: rows of one column per extension would make the
    # file (and the writer's memory) grow with samples x extensions
    n = MAX_MEMBER_COLUMNS + 16
    with tarfile.open(tmp_path / "src.tar", "w") as tar:
        for i in range(n):
            for ext, data in ((f"f{i}.bin", b"x" * i), ("txt", b"t%d" % i)):
                info = tarfile.TarInfo(f"k{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    shardex.export(tmp_path / "src.tar", out, workers=1, samples_per_shard=n // 2)
    raw = yaml.safe_load((out / "config.yaml").read_text())
    assert "members" not in raw["splits"]["train"]["index"]
    assert not list(out.rglob("index-members*.npy"))
    ds = shardex.open_dataset(out)
    assert ds.members is None
    want = [{"__key__": f"k{i:04d}", f"f{i}.bin": b"x" * i, "txt": b"t%d" % i} for i in range(n)]
    assert [ds[i] for i in range(n)] == list(ds) == ds.get_many(range(n)) == want
    assert verify(out).ok, verify(out).problems


def test_a_members_file_of_other_samples_fails_its_checks(export: Path, tmp_path: Path) -> None:
    # Rows of another export with as many samples (a file copied over, a stale cached
    # copy) pass a check seeded with the row number alone, and their slices of this
    # export's bytes would be wrong fields, returned with checksums on.
    other = _source()
    other["txt"] = [b"other " * (i + 3) for i in range(len(KEYS))]
    shardex.export(other, tmp_path / "other", workers=1, samples_per_shard=4)
    shutil.copyfile(_members_file(tmp_path / "other"), _members_file(export))
    ds = shardex.open_dataset(export)
    for i in range(len(ds)):
        if np.load(_members_file(export))[i]["key"][1] != ABSENT:  # rows that slice
            with pytest.raises(FormatError, match=rf"row {i} of .*index-members\.npy fails"):
                ds[i]
    with pytest.raises(FormatError, match=r"index-members\.npy fails its check"):
        list(ds)
    with pytest.raises(FormatError, match=r"index-members\.npy fails its check"):
        ds.get_many(range(len(ds)))
    assert not verify(export).ok


def test_mapped_reads_give_bytes_and_catch_damage_made_after_the_first_read(
    export: Path,
) -> None:
    ds = shardex.open_dataset(export)
    first = ds[5]
    assert {type(v) for k, v in first.items() if k != "__key__"} == {bytes}
    assert all(type(v) is bytes for s in ds for k, v in s.items() if k != "__key__")
    assert ds.get_many([-1, 5, 0]) == [ds[len(ds) - 1], first, ds[0]]
    with pytest.raises(IndexError, match="out of range"):
        ds.get_many([0, len(ds)])
    offset, _, shard, _ = ds.index.record(5)  # type: ignore[attr-defined]
    at = offset + int(np.load(_members_file(export))[5]["members"]["seg.bin"][0]) + 10
    with open(export / ds._paths[shard], "r+b") as f:  # type: ignore[attr-defined]
        f.seek(at)  # in place: the shard stays mapped by ds
        f.write(bytes([first["seg.bin"][10] ^ 0x01]))
    with pytest.raises(ChecksumError, match="sample 5 "):
        ds[5]
    with pytest.raises(ChecksumError, match="sample 5 "):
        list(ds)
    unchecked = shardex.open_dataset(export, verify=False)[5]
    assert unchecked["seg.bin"] != first["seg.bin"]  # the damage itself, not a stale copy


def test_a_shard_shorter_than_listed_is_an_error_not_a_crash(export: Path) -> None:
    before = list(shardex.open_dataset(export))
    ds = shardex.open_dataset(export)
    offset, _, shard, _ = ds.index.record(5)  # type: ignore[attr-defined]
    with open(export / ds._paths[shard], "r+b") as f:  # type: ignore[attr-defined]
        f.truncate(offset + 100)  # inside sample 5, the second of its shard
    with pytest.raises(FormatError, match="shorter than its index says"):
        ds[5]
    assert ds[4] == before[4]
    skipping = shardex.open_dataset(export, on_error="skip")
    assert list(skipping) == before[:5]
    assert [n for n, _ in skipping.skipped] == [5]


def test_an_unchecked_row_pointing_outside_its_sample_is_refused(export: Path) -> None:
    before = shardex.open_dataset(export)[3]
    _flip_row(export, 3, 8 + 8 + 3)  # the high byte of row 3's first member offset
    for verify_reads in (True, False):
        ds = shardex.open_dataset(export, verify=verify_reads)
        with pytest.raises(FormatError, match="row 3 "):
            ds[3]
        with pytest.raises(FormatError, match="row 3 "):
            list(ds)
    assert shardex.open_dataset(export, verify=False)[2]["__key__"] == KEYS[2]
    assert before["__key__"] == KEYS[3]


def test_an_unchecked_row_pointing_inside_its_sample_slices_only_that_sample(
    export: Path,
) -> None:
    """The documented limit of verify=False: a damaged row that still points inside its
    sample is not checked (checking it costs more than the rest of a read), so its fields
    are wrong bytes of that same sample, never another's; verify=True and `shardex
    verify` refuse it."""
    before = shardex.open_dataset(export)
    whole = before[3]
    offset, _, shard, length = before.index.record(3)  # type: ignore[attr-defined]
    raw = (export / before._paths[shard]).read_bytes()[offset : offset + length]  # type: ignore[attr-defined]
    _flip_row(export, 3, 8 + 8 + 0)  # the low byte of row 3's first member offset
    with pytest.raises(FormatError, match="row 3 "):
        shardex.open_dataset(export)[3]
    unchecked = shardex.open_dataset(export, verify=False)
    damaged = unchecked[3]
    assert damaged != whole  # wrong fields: the limit this test documents
    for name, value in damaged.items():
        if name != "__key__":
            assert value in raw, name  # bytes of sample 3 only
    assert unchecked[2] == before[2]
    assert unchecked[4] == before[4]
    assert not verify(export).ok


_KEY_PART = st.text(st.sampled_from("ab.Z ü"), min_size=1, max_size=6).filter(
    lambda p: p not in (".", "..")
)


@settings(max_examples=12, deadline=None)
@given(
    keys=st.lists(
        st.lists(_KEY_PART, min_size=1, max_size=3).map("/".join), min_size=1, max_size=6
    ).map(lambda ks: list(dict.fromkeys(k.casefold() for k in ks))),
    repeat=st.booleans(),
)
def test_the_writers_rows_equal_the_rows_parsing_gives(
    keys: list[str], repeat: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The writer builds its rows from its own layout, with numpy (keys without a dot in
    their last part) or one member_row per sample (the others): either way each row is the
    one MemberSpans.of(member_row(...)) gives for the sample's bytes as parsed."""
    n = len(keys)
    source: dict[str, list[Any]] = {"key": keys, "txt": [k.encode() for k in keys]}
    if repeat:  # a "cls" member beside the label's: a repeated extension
        source["cls"] = [b"x"] * n
    source["label"] = list(range(n))
    out = tmp_path_factory.mktemp("rows") / "out"
    shardex.export(source, out, workers=1, samples_per_shard=4)
    path = out / "train" / "index-members.npy"
    if not path.exists():  # more extensions than columns (dots in keys): nothing to compare
        return
    rows = np.load(path)
    ds = shardex.open_dataset(out)
    for i, row in enumerate(rows):
        offset, _, shard, length = ds.index.record(i)  # type: ignore[attr-defined]
        data = (out / ds._paths[shard]).read_bytes()[offset : offset + length]  # type: ignore[attr-defined]
        want = MemberSpans.of(
            [member_row([(m.name, m.data_offset, m.size) for m in iter_members(data)])]
        )
        assert want is not None
        assert tuple(row["key"]) == tuple(want.spans[0, :2])
        cells = {e: tuple(want.spans[0, 2 + 2 * c : 4 + 2 * c]) for c, e in enumerate(want.exts)}
        for name in rows.dtype["members"].names:
            assert tuple(row["members"][name]) == cells.get(name, (ABSENT, ABSENT))


def test_index_row_iterators_left_in_a_garbage_cycle_do_not_crash_the_process(
    export: Path,
) -> None:
    """Iteration walks a shard's index records and members rows with ``struct.iter_unpack``.
    Over a slice of the mapped index, such an iterator was the slice's only owner. When it
    ended up in a reference cycle (a suspended iteration held by a traceback, a frame, a
    user's container), CPython's collector cleared the slice while the iterator still held
    its buffer, and the process died with SIGSEGV once the iterator was freed. The rows are
    now iterated from a copy. A child process, so that the old crash fails only this test."""
    code = textwrap.dedent(
        """
        import gc, sys
        import shardex
        ds = shardex.open_dataset(sys.argv[1])
        n = len(ds)
        ds[0]  # opens the members index
        for _ in range(20):
            for rows in (ds.index.records, ds.members.unpacked):
                it = rows(0, n)
                next(it)
                cycle = [it]
                cycle.append(cycle)
                del it, cycle
                gc.collect()
        print("read", len(list(ds)), "samples")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(export)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == f"read {len(KEYS)} samples"
