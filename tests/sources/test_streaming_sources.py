"""Every built-in source streams: batches of bounded size, label names known before the
first batch, the same rows as scan(), and memory that does not grow with the dataset."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import shardex
from helpers import image_bytes, make_tree, write_tar
from shardex.errors import ConfigError, SourceError
from shardex.refs.scan import MEMBERS, batch_table, members_array
from shardex.sources import (
    ArraySource,
    DemoSource,
    ExportSource,
    FolderSource,
    Source,
    TableSource,
    TarSource,
)
from shardex.sources.arrays import npy_bytes
from shardex.sources.base import DEFAULT_BATCH_SIZE
from shardex.sources.demo import CLASSES


def _json_tar(path: Path, metas: list[object]) -> Path:
    """A tar of samples ``s0``, ``s1``...: each a JPEG and a .json member of its meta."""
    members = []
    for i, meta in enumerate(metas):
        members += [(f"s{i}.jpg", image_bytes(i)), (f"s{i}.json", json.dumps(meta).encode())]
    return write_tar(path, members)


def _folder(root: Path) -> Source:
    # names that sort differently as paths and as folder names ("cat-2" < "cat/...")
    rels = [f"{c}/{i:02d}.jpg" for c in ("dog", "cat", "cat-2", "cat.x") for i in range(5)]
    make_tree(root / "imgs", [*rels, "cat/sub/deep.jpg"])
    (root / "imgs" / "cat" / "x.heic").write_bytes(b"heic")  # left out
    return FolderSource(root / "imgs")


def _table(root: Path) -> Source:
    _folder(root)
    rows = sorted(str(p.relative_to(root)) for p in (root / "imgs").rglob("*.jpg"))
    rows.append("imgs/missing.jpg")  # left out
    labels = [r.split("/")[1] if r.count("/") > 1 else "dog" for r in rows]
    pq.write_table(
        pa.table({"image_path": rows, "label": labels, "score": range(len(rows))}),
        root / "t.parquet",
        row_group_size=4,
    )
    return TableSource(root / "t.parquet")


def _csv(root: Path) -> Source:
    _table(root)
    pcsv.write_csv(pq.read_table(root / "t.parquet"), root / "t.csv")
    return TableSource(root / "t.csv")


def _tars(root: Path) -> Source:
    (root / "tars").mkdir()
    for t in range(3):
        members = []
        for i in range(9):
            members.append((f"s{t}{i}.jpg", image_bytes(i)))
            members.append((f"s{t}{i}.cls", str(i % 3).encode()))
            members.append((f"s{t}{i}.json", json.dumps({"n": i, "w": i / 2}).encode()))
        write_tar(root / "tars" / f"{t}.tar", members)
    return TarSource(root / "tars")


def _export(root: Path) -> Source:
    shardex.export(_folder(root), root / "out", samples_per_shard=4, workers=1, on_error="skip")
    return ExportSource(root / "out")


def _arrays(root: Path) -> Source:
    n = 23
    return ArraySource(
        {
            "jpg": [image_bytes(i) for i in range(n)],
            "x": np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3),
            "txt": [f"caption {i}" for i in range(n)],
            "label": np.arange(n) % 4,
        },
        label_names=("a", "b", "c", "d"),
    )


def _demo(root: Path) -> Source:
    return DemoSource(30, size_range=(16, 24))


SOURCES: dict[str, Callable[[Path], Source]] = {
    "folder": _folder,
    "parquet": _table,
    "csv": _csv,
    "tars": _tars,
    "export": _export,
    "arrays": _arrays,
    "demo": _demo,
}
LABELS: dict[str, tuple[str, ...] | None] = {
    "folder": ("cat", "cat-2", "cat.x", "dog"),
    "parquet": ("cat", "cat-2", "cat.x", "dog"),
    "csv": ("cat", "cat-2", "cat.x", "dog"),
    "tars": None,
    "export": ("cat", "cat-2", "cat.x", "dog"),
    "arrays": ("a", "b", "c", "d"),
    "demo": CLASSES,
}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_stream_comes_in_bounded_batches_with_the_rows_of_scan(kind: str, tmp_path: Path) -> None:
    source = SOURCES[kind](tmp_path)
    whole = source.scan()
    assert whole.table.num_rows > 10

    source.batch_size = 4
    stream = source.stream()
    assert stream.label_names == LABELS[kind]  # known before any batch is read
    batches = list(stream.batches)

    assert len(batches) >= whole.table.num_rows // 4
    assert all(0 < b.table.num_rows <= 4 for b in batches[:-1])
    assert batches[-1].table.num_rows <= 4
    joined = pa.concat_tables([b.table for b in batches], promote_options="default")
    assert joined.select(whole.table.column_names).to_pylist() == whole.table.to_pylist()
    assert sorted(x for b in batches for x in b.left_out) == sorted(whole.left_out)
    # every batch has the same fixed columns, and each column one type
    fixed = {"key", "original_path", "split", "label", MEMBERS}
    assert len({tuple(c for c in b.table.column_names if c in fixed) for b in batches}) == 1
    for name in whole.table.column_names:
        types = {b.table.schema.field(name).type for b in batches if name in b.table.column_names}
        assert len(types - {pa.null()}) == 1, (name, types)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_default_batches_hold_at_most_8192_samples(kind: str, tmp_path: Path) -> None:
    source = SOURCES[kind](tmp_path)
    assert source.batch_size == DEFAULT_BATCH_SIZE == 8192
    assert all(b.table.num_rows <= 8192 for b in source.stream().batches)


def test_a_bad_batch_size_is_refused_in_one_line(tmp_path: Path) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="batch_size must be a positive int"):
            FolderSource(tmp_path, batch_size=bad)  # type: ignore[arg-type]


def test_folder_class_names_are_known_before_the_walk_reaches_them(tmp_path: Path) -> None:
    # the last class is found only at the end of the walk, and folders holding no image
    # are no class, as when the whole walk came first
    rels = [f"a{i:03d}/x.jpg" for i in range(30)] + ["zebra/deep/er/z.jpg"]
    make_tree(tmp_path / "src", rels)
    (tmp_path / "src" / "empty").mkdir()
    (tmp_path / "src" / "notes").mkdir()
    (tmp_path / "src" / "notes" / "readme.txt").write_text("no image")

    stream = FolderSource(tmp_path / "src", batch_size=7).stream()

    assert stream.label_names == (*(f"a{i:03d}" for i in range(30)), "zebra")
    first = next(stream.batches)
    assert first.table.column("label").to_pylist() == list(range(7))


def test_folder_split_layout_is_checked_before_the_first_batch(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", ["train/cat/a.jpg", "val/dog/b.jpg", "zoo/c.jpg"])
    with pytest.raises(SourceError, match="mixes split folders") as err:
        FolderSource(tmp_path / "src").stream()
    assert "\n" not in str(err.value)


def _refused_in_batches_of_two(tar: Path) -> str:
    """The one-line message of the SourceError a scan of ``tar`` in batches of 2 raises."""
    with pytest.raises(SourceError) as err:
        TarSource(tar, batch_size=2).scan()
    message = str(err.value)
    assert "\n" not in message
    return message


def test_tar_json_field_changing_type_across_batches_is_one_line_naming_it(
    tmp_path: Path,
) -> None:
    _json_tar(tmp_path / "a.tar", [{"ok": i, "field": "text" if i < 4 else i} for i in range(6)])
    message = _refused_in_batches_of_two(tmp_path / "a.tar")
    assert "json field 'field' holds int64 in sample 's4'" in message
    assert "but string in earlier samples" in message


def test_tar_json_ints_after_floats_are_kept_as_floats(tmp_path: Path) -> None:
    _json_tar(tmp_path / "a.tar", [{"v": i + 0.5 if i < 3 else i} for i in range(6)])

    table = TarSource(tmp_path / "a.tar", batch_size=3).scan().table

    assert table.schema.field("v").type == pa.float64()
    assert table.column("v").to_pylist() == [0.5, 1.5, 2.5, 3.0, 4.0, 5.0]


def test_tar_labels_first_seen_after_the_first_batch_are_refused(tmp_path: Path) -> None:
    members = [(f"s{i}.jpg", image_bytes(i)) for i in range(4)]
    members += [("s9.jpg", image_bytes(9)), ("s9.cls", b"1")]
    write_tar(tmp_path / "a.tar", members)

    with pytest.raises(SourceError, match=r"sample 's9' .* has a \.cls label but the first 2"):
        TarSource(tmp_path / "a.tar", batch_size=2).scan()
    # one batch sees them all: labelled where present, as before
    table = TarSource(tmp_path / "a.tar").scan().table
    assert table.column("label").to_pylist() == [None, None, None, None, 1]


def _tracemalloc_peak(source: Source) -> int:
    tracemalloc.start()
    try:
        for batch in source.stream().batches:
            del batch
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streaming_a_tar_holds_memory_flat_whatever_its_size(tmp_path: Path) -> None:
    tiny = image_bytes(0, size=(4, 4))
    sizes = {"small": 2_000, "large": 8_000}
    peaks = {}
    for name, n in sizes.items():
        members = [m for i in range(n) for m in ((f"{i:06d}.jpg", tiny), (f"{i:06d}.cls", b"3"))]
        write_tar(tmp_path / f"{name}.tar", members)
        peaks[name] = _tracemalloc_peak(TarSource(tmp_path / f"{name}.tar", batch_size=500))
    # four times the samples, about the same peak (the whole table would be ~4x)
    assert peaks["large"] < 1.5 * peaks["small"], peaks


def test_streaming_a_folder_holds_memory_flat_whatever_its_size(tmp_path: Path) -> None:
    tiny = image_bytes(0, size=(4, 4))
    peaks = {}
    for name, n in {"small": 1_000, "large": 4_000}.items():
        for i in range(n):
            folder = tmp_path / name / f"c{i % 10}" / f"part{i // 100:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:05d}.jpg").write_bytes(tiny)
        peaks[name] = _tracemalloc_peak(FolderSource(tmp_path / name, batch_size=200))
    # four times the files in four times the folders: the walk holds one listing per
    # folder level and one batch, not every file
    assert peaks["large"] < 1.5 * peaks["small"], peaks


@settings(max_examples=40, deadline=None)
@given(
    array=hnp.arrays(
        dtype=st.sampled_from(["<f4", ">i8", "u1", "<c8", "?", "<m8[s]", "S3", "<U2"]),
        shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4),
    ),
    batch_size=st.integers(1, 5),
)
def test_array_rows_are_the_npy_bytes_of_each_row(array: np.ndarray, batch_size: int) -> None:
    if len(array) == 0:
        return
    source = ArraySource({"x": array}, batch_size=batch_size)
    members = [m for b in source.stream().batches for m in b.table.column(MEMBERS).to_pylist()]
    assert [m[0]["data"] for m in members] == [npy_bytes(row) for row in array]
    assert [m[0]["size"] for m in members] == [len(npy_bytes(row)) for row in array]


def test_array_bytes_fields_interleave_in_field_order(tmp_path: Path) -> None:
    source = ArraySource(
        {"jpg": [b"j0", b"j1", b"j2"], "txt": ["a", "b", "c"], "png": [b"p0", b"p1", b"p2"]},
        batch_size=2,
    )
    rows = source.scan().table.column(MEMBERS).to_pylist()
    assert [[(m["ext"], m["data"]) for m in row] for row in rows] == [
        [("jpg", b"j0"), ("txt.txt", b"a"), ("png", b"p0")],
        [("jpg", b"j1"), ("txt.txt", b"b"), ("png", b"p1")],
        [("jpg", b"j2"), ("txt.txt", b"c"), ("png", b"p2")],
    ]


def test_array_metadata_of_another_length_is_one_line(tmp_path: Path) -> None:
    source = ArraySource({"jpg": [b"a", b"b"]}, metadata=pa.table({"m": [1, 2, 3]}))
    with pytest.raises(SourceError, match="metadata has 3 rows for 2 samples"):
        source.stream()


def _scan_outcome(path: Path) -> object:
    try:
        scan = TarSource(path).scan()
    except SourceError as exc:
        return type(exc).__name__, str(exc)
    return scan.table.to_pylist(), scan.table.schema


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["plain", "long", "pax", "link", "dir", "gnu"]), max_size=5),
    flips=st.lists(st.tuples(st.integers(0, 10**5), st.integers(1, 255)), max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10**5)),
    mode=st.sampled_from(
        [b"0000644\x00", b" 644   \x00", b"644\x00junk", b"0o644\x00\x00\x00", b"\x80" * 8]
    ),
)
def test_tar_headers_read_without_tarfile_are_what_tarfile_reads(
    kinds: list[str], flips: list[tuple[int, int]], cut: int | None, mode: bytes
) -> None:
    import tempfile

    from shardex.sources import tarheaders

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.tar"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for i, kind in enumerate(["plain", *kinds, "plain"]):
                name = f"{'d' * 120 if kind == 'long' else 'k'}/s{i}"
                for ext, data in (("jpg", b"x" * (i * 300)), ("cls", b"%d" % i)):
                    info = tarfile.TarInfo(f"{name}.{ext}")
                    info.size = len(data)
                    if kind == "pax":
                        info.pax_headers = {"comment": "é"}
                    if kind == "link" and ext == "cls":
                        info.type, info.linkname, info.size, data = tarfile.SYMTYPE, "x", 0, b""
                    if kind == "dir" and ext == "cls":
                        info.type, info.size, data = tarfile.DIRTYPE, 0, b""
                    if kind == "gnu":
                        info.mtime = 8**12  # a number only base-256 can hold
                    tf.addfile(info, io.BytesIO(data))
        data = bytearray(buf.getvalue())
        # the second header (the first read without tarfile): numbers written otherwise
        data[512 + 100 : 512 + 108] = mode
        data[512 + 148 : 512 + 156] = b"        "
        data[512 + 148 : 512 + 156] = b"%06o\x00 " % sum(data[512:1024])
        for where, xor in flips:
            data[where % len(data)] ^= xor
        path.write_bytes(bytes(data if cut is None else data[: cut % (len(data) + 1)]))

        fast = _scan_outcome(path)
        tarheaders.FAST = False
        try:
            slow = _scan_outcome(path)
        finally:
            tarheaders.FAST = True
        assert fast == slow


def test_a_batch_of_more_than_2_gib_of_inline_bytes_keeps_every_sample() -> None:
    # Arrow's binary offsets are 32-bit: a re-export's batch of 8192 samples read through
    # their dataset (bytes held, e.g. 300 KB images from S3) passes 2 GiB
    blob = bytes(range(256)) * 4096  # 1 MiB, shared by every row (little Python memory)
    n = 2049
    members = members_array(
        list(range(n + 1)), ["jpg"] * n, [None] * n, [-1] * n, [len(blob)] * n, [blob] * n
    )
    table = batch_table([f"k{i}" for i in range(n)], [f"p{i}" for i in range(n)], members)
    assert table.num_rows == n
    column = table.column(MEMBERS)
    for row in (0, n // 2, n - 1):
        (member,) = column[row].as_py()
        assert (member["ext"], member["size"], member["data"]) == ("jpg", len(blob), blob)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.lists(st.integers(0, 9), max_size=3), min_size=1, max_size=12),
    limit=st.integers(1, 30),
)
def test_inline_bytes_past_the_limit_are_cut_between_samples(
    sizes: list[list[int]], limit: int
) -> None:
    from shardex.refs import scan as base

    offsets = np.cumsum([0, *map(len, sizes)]).tolist()
    data = [bytes([i]) * n for i, n in enumerate(n for sample in sizes for n in sample)]
    ext = [f"e{i}" for i in range(len(data))]
    whole = members_array(offsets, ext, None, [0] * len(data), list(map(len, data)), data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base, "MAX_INLINE_BYTES", limit)
        cut = members_array(offsets, ext, None, [0] * len(data), list(map(len, data)), data)
    assert cut.to_pylist() == whole.to_pylist()
    chunks = cut.chunks if isinstance(cut, pa.ChunkedArray) else [cut]
    for chunk in chunks:  # each piece within the limit, unless one sample alone passes it
        inline = sum(len(m["data"]) for row in chunk.to_pylist() for m in row)
        assert inline <= limit or len(chunk) == 1


@pytest.mark.parametrize(
    ("first", "later"),
    [
        ([], ["cat"]),  # only empty lists in the first batch
        ({"x": 1}, {"x": 1, "y": 2}),  # an object gaining a key
    ],
)
def test_tar_json_field_narrower_in_the_first_batch_says_so(
    tmp_path: Path, first: object, later: object
) -> None:
    # one type in every .json member as JSON sees it: the refusal must not tell the user
    # to fix their data, but say that the first batch fixed the column's type
    _json_tar(tmp_path / "a.tar", [{"f": first if i < 2 else later} for i in range(4)])
    assert TarSource(tmp_path / "a.tar").scan().table.num_rows == 4  # one batch: fine
    message = _refused_in_batches_of_two(tmp_path / "a.tar")
    assert "json field 'f'" in message
    assert "in sample 's2'" in message
    assert "batch of 2 samples" in message  # the batch that set the type
    assert "give the field one type" not in message


def test_tar_json_floats_after_a_batch_of_ints_make_the_field_float(tmp_path: Path) -> None:
    # JSON writers that print 2.0 as 2 give a score field ints first, floats later: the
    # export keeps every value, as one float column, whatever the batch size
    _json_tar(tmp_path / "a.tar", [{"score": i if i < 4 else i + 0.5} for i in range(6)])
    whole = TarSource(tmp_path / "a.tar").scan().table
    batched = TarSource(tmp_path / "a.tar", batch_size=2).scan().table
    assert batched.column("score").type == pa.float64()
    assert batched.column("score").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.5, 5.5]
    assert batched.select(["key", "score"]).equals(whole.select(["key", "score"]))
    out = tmp_path / "out"
    shardex.export(TarSource(tmp_path / "a.tar", batch_size=2), out, workers=1)
    ds = shardex.open_dataset(out)
    assert [json.loads(ds[i]["json"])["score"] for i in range(6)] == [0, 1, 2, 3, 4.5, 5.5]
    assert ds.metadata.column("score").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.5, 5.5]


def test_an_array_source_pickles_after_an_export_pinned_its_bytes(tmp_path: Path) -> None:
    """Its pinned bytes stay in this process; the source itself still travels (a pipeline
    stage's, say) and streams its bytes inline there."""
    import pickle

    source = ArraySource({"bin": [b"ab", b"cd"]})
    shardex.export(source, tmp_path / "out")
    again = pickle.loads(pickle.dumps(source))
    members = [m for b in again.stream().batches for m in b.table.column(MEMBERS).to_pylist()]
    assert [m[0]["data"] for m in members] == [b"ab", b"cd"]
