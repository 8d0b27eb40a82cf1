"""Hostile and damaged WebDataset tars as a source.

A tar cut short, a member that is not a regular file, a bad ``.json`` member: the export
refuses it with one line naming the tar, or (``on_error="skip"``) leaves the sample out and
records it in errors.parquet. Never a traceback, never fewer samples without a record. The
``.json`` members shardex writes are strict JSON that a stock webdataset reader decodes.
"""

from __future__ import annotations

import io
import json
import math
import os
import string
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import shardex
from helpers import image_bytes
from shardex.cli import main
from shardex.errors import BadSampleError, ShardexError, SourceError
from shardex.sources.jsonmeta import MAX_JSON_DEPTH
from shardex.sources.tar_scan import TarRef, tar_samples
from shardex.storage import open_storage
from shardex.storage.fetch import tars as objecttars
from tests.support.interop import read_with_webdataset

OnError = Literal["error", "skip"]


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _special(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _export(src: Path, out: Path, on_error: OnError = "error") -> shardex.ExportConfig:
    return shardex.export(src, out, workers=1, on_error=on_error, progress=False)


def _exported(out: Path) -> dict[str, dict[str, Any]]:
    """Every exported sample by key, with its metadata row under ``"meta"``."""
    ds = shardex.open_dataset(out)
    rows = {r["key"]: r for r in ds.metadata.to_pylist()}
    return {s["__key__"]: {**dict(s), "meta": rows[s["__key__"]]} for s in ds}


def _errors(out: Path) -> list[dict[str, str]]:
    path = out / "errors.parquet"
    return pq.read_table(path).to_pylist() if path.exists() else []


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _error_line(result: Result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def _four_sample_tar(path: Path) -> tuple[dict[str, bytes], list[int]]:
    """Four samples (jpg + json); returns their images and where each sample's data ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    ends: list[int] = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(4):
            images[f"s{i}"] = image_bytes(i)
            _add(tf, f"s{i}.jpg", images[f"s{i}"])
            _add(tf, f"s{i}.json", json.dumps({"n": i}).encode())
            ends.append(tf.offset)
    return images, ends


# ---------------------------------------------------------------- tars that end early


def test_tar_cut_at_a_block_boundary_is_refused_naming_the_tar(tmp_path: Path) -> None:
    _, ends = _four_sample_tar(tmp_path / "src" / "a.tar")
    data = (tmp_path / "src" / "a.tar").read_bytes()
    (tmp_path / "src" / "a.tar").write_bytes(data[: ends[1]])  # two whole samples, no end

    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "out"))

    line = _error_line(result)
    assert "a.tar" in line
    assert f"ends at byte {ends[1]} without its end-of-archive blocks" in line
    assert not (tmp_path / "out" / "config.yaml").exists()


def test_tar_cut_short_under_skip_records_the_last_sample_read(tmp_path: Path) -> None:
    images, ends = _four_sample_tar(tmp_path / "src" / "a.tar")
    data = (tmp_path / "src" / "a.tar").read_bytes()
    (tmp_path / "src" / "a.tar").write_bytes(data[: ends[2]])

    result = _cli(
        "export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "out"), "--on-error", "skip"
    )

    assert result.exit_code == 0, result.output
    assert "skipped 1 samples or files" in result.output
    samples = _exported(tmp_path / "out")
    # s2 may have had more members after the cut: it is left out, with the reason recorded
    assert sorted(samples) == ["s0", "s1"]
    assert all(samples[k]["jpg"] == images[k] for k in samples)
    assert [samples[k]["json"] for k in ("s0", "s1")] == [b'{"n":0}', b'{"n":1}']  # no _invalid
    (error,) = _errors(tmp_path / "out")
    assert (error["key"], error["original_path"]) == ("s2", "a.tar:s2")
    assert "tar 'a.tar' is damaged: it ends at byte" in error["reason"]


def test_tar_cut_at_every_block_and_inside_headers_is_never_silently_shorter(
    tmp_path: Path,
) -> None:
    images, ends = _four_sample_tar(tmp_path / "whole.tar")
    data = (tmp_path / "whole.tar").read_bytes()
    cuts = [*range(512, ends[-1] + 512, 512), ends[0] + 100, ends[1] + 511, ends[2] + 1]
    for cut in cuts:
        src = tmp_path / f"cut{cut}" / "a.tar"
        src.parent.mkdir()
        src.write_bytes(data[:cut])
        with pytest.raises(BadSampleError, match=r"a\.tar") as info:
            _export(src, tmp_path / f"cut{cut}-error")
        assert "\n" not in str(info.value)
        out = tmp_path / f"cut{cut}-skip"
        if cut < ends[0] + 512:  # the only sample read may be incomplete: nothing is left
            with pytest.raises(SourceError, match="every sample"):
                _export(src, out, on_error="skip")
            continue
        _export(src, out, on_error="skip")
        samples = _exported(out)
        recorded = {e["key"] for e in _errors(out)}
        complete = {f"s{i}" for i, end in enumerate(ends) if end <= cut}
        assert complete <= set(samples) | recorded, f"cut at {cut}"
        assert recorded, f"cut at {cut}"
        assert not recorded & set(samples), f"cut at {cut}"
        assert all(samples[k]["jpg"] == images[k] for k in samples), f"cut at {cut}"


def test_pipeline_over_a_cut_tar_fails_naming_it(tmp_path: Path) -> None:
    from shardex.pipeline import ImageWriterStage, LocalExecutor, Pipeline, ReaderStage

    _, ends = _four_sample_tar(tmp_path / "src" / "a.tar")
    data = (tmp_path / "src" / "a.tar").read_bytes()
    (tmp_path / "src" / "a.tar").write_bytes(data[: ends[1]])
    pipeline = Pipeline("cut", [ReaderStage(tmp_path / "src"), ImageWriterStage(tmp_path / "out")])
    with pytest.raises(BadSampleError, match=r"'a\.tar:s1'.*end-of-archive") as info:
        pipeline.run(LocalExecutor(1))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "config.yaml").exists()


def test_tar_with_only_one_end_block_is_whole(tmp_path: Path) -> None:
    _, ends = _four_sample_tar(tmp_path / "src" / "a.tar")
    data = (tmp_path / "src" / "a.tar").read_bytes()
    (tmp_path / "src" / "a.tar").write_bytes(data[: ends[-1] + 512])
    assert _export(tmp_path / "src", tmp_path / "out").num_samples == 4


def test_garbage_after_the_members_is_a_bad_header(tmp_path: Path) -> None:
    _, ends = _four_sample_tar(tmp_path / "src" / "a.tar")
    data = (tmp_path / "src" / "a.tar").read_bytes()
    (tmp_path / "src" / "a.tar").write_bytes(data[: ends[1]] + b"\x01" * 1024)
    with pytest.raises(BadSampleError, match=f"bad tar header at byte {ends[1]}"):
        _export(tmp_path / "src", tmp_path / "out")


def test_tars_joined_with_cat_do_not_lose_the_second_silently(tmp_path: Path) -> None:
    _four_sample_tar(tmp_path / "one.tar")
    data = (tmp_path / "one.tar").read_bytes()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.tar").write_bytes(data + data)
    with pytest.raises(
        BadSampleError, match=f"data follows its end-of-archive blocks at byte {len(data)}"
    ):
        _export(tmp_path / "src", tmp_path / "out")


def test_tar_cut_inside_its_first_header_names_the_tar(tmp_path: Path) -> None:
    _four_sample_tar(tmp_path / "src" / "a.tar")
    data = (tmp_path / "src" / "a.tar").read_bytes()
    (tmp_path / "src" / "a.tar").write_bytes(data[:300])
    line = _error_line(_cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "o")))
    assert "'a.tar': not a readable tar at byte 0" in line


def test_a_folder_named_like_a_tar_is_not_read_as_one(tmp_path: Path) -> None:
    _four_sample_tar(tmp_path / "src" / "a.tar")
    (tmp_path / "src" / "b.tar").mkdir()
    assert _export(tmp_path / "src", tmp_path / "out").num_samples == 4


def test_unreadable_tar_is_one_line_naming_it(tmp_path: Path) -> None:
    _four_sample_tar(tmp_path / "src" / "a.tar")
    (tmp_path / "src" / "a.tar").chmod(0)
    try:
        if os.access(tmp_path / "src" / "a.tar", os.R_OK):
            pytest.skip("running as a user who reads every file")
        line = _error_line(_cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "o")))
        assert "cannot read tar" in line
        assert "a.tar" in line
    finally:
        (tmp_path / "src" / "a.tar").chmod(0o644)


# ---------------------------------------------------------------- members that are not files


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_special("s1.jpg", tarfile.LNKTYPE, "s0.jpg"), "hard link to 's0.jpg'"),
        (_special("s1.jpg", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link to '/etc/passwd'"),
        (_special("s1.jpg", tarfile.FIFOTYPE), "fifo"),
        (_special("s1.jpg", tarfile.CHRTYPE), "character device"),
        (_special("s1.jpg", tarfile.BLKTYPE), "block device"),
    ],
)
def test_non_regular_members_are_refused_or_recorded(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    (tmp_path / "src").mkdir()
    with tarfile.open(tmp_path / "src" / "a.tar", "w") as tf:
        _add(tf, "s0.jpg", image_bytes(0))
        tf.addfile(member)
        _add(tf, "s1.cls", b"1")
        _add(tf, "s2.jpg", image_bytes(2))

    with pytest.raises(BadSampleError, match=why):
        _export(tmp_path / "src", tmp_path / "out")

    config = _export(tmp_path / "src", tmp_path / "skip", on_error="skip")
    assert (config.num_samples, config.num_skipped) == (2, 1)
    assert sorted(_exported(tmp_path / "skip")) == ["s0", "s2"]
    (error,) = _errors(tmp_path / "skip")
    assert error["key"] == "s1"
    assert why in error["reason"]


@pytest.mark.parametrize(
    ("sparse_map", "why"),
    [("0,5", "member 's1.jpg' is a sparse file"), ("zero,five", "bad tar header at byte")],
)
def test_sparse_members_are_refused_or_recorded(tmp_path: Path, sparse_map: str, why: str) -> None:
    # a sparse member's data is not its bytes in the tar: copying them would corrupt it
    (tmp_path / "src").mkdir()
    with tarfile.open(tmp_path / "src" / "a.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        _add(tf, "s0.jpg", image_bytes(0))
        _add(tf, "sa.jpg", image_bytes(1))
        info = tarfile.TarInfo("s1.jpg")
        info.pax_headers = {"GNU.sparse.map": sparse_map, "GNU.sparse.size": "64"}
        info.size = 5
        tf.addfile(info, io.BytesIO(b"12345"))
        _add(tf, "s2.jpg", image_bytes(2))

    with pytest.raises(BadSampleError, match=why):
        _export(tmp_path / "src", tmp_path / "out")
    config = _export(tmp_path / "src", tmp_path / "skip", on_error="skip")
    assert config.num_skipped == 1
    # a bad map leaves the tar unreadable past it: the sample before is recorded as the last
    assert sorted(_exported(tmp_path / "skip")) == (
        ["s0", "s2", "sa"] if sparse_map == "0,5" else ["s0"]
    )


def test_directory_members_hold_no_data_and_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with tarfile.open(tmp_path / "src" / "a.tar", "w") as tf:
        tf.addfile(_special("imgs", tarfile.DIRTYPE))
        _add(tf, "imgs/s0.jpg", image_bytes(0))
    assert _export(tmp_path / "src", tmp_path / "out").num_samples == 1
    assert sorted(_exported(tmp_path / "out")) == ["imgs/s0"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (b"a\nb.jpg", "unsafe key 'a\\nb' (control character)"),
        (b"\xff\xfe.jpg", "member name '\\\\xff\\\\xfe.jpg' is not UTF-8"),
        (b"ok/../../evil.jpg", "unsafe key 'ok/../../evil'"),
        (b"README", "member 'README' has no extension"),
    ],
)
def test_hostile_member_names_are_refused_in_one_line_or_recorded(
    tmp_path: Path, name: bytes, why: str
) -> None:
    (tmp_path / "src").mkdir()
    with tarfile.open(tmp_path / "src" / "a.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        _add(tf, "good.jpg", image_bytes(0))
        _add(tf, name.decode("utf-8", "surrogateescape"), image_bytes(1))

    line = _error_line(_cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "o")))
    assert why in line

    config = _export(tmp_path / "src", tmp_path / "skip", on_error="skip")
    assert sorted(_exported(tmp_path / "skip")) == ["good"]
    assert config.num_skipped == 1
    assert why in _errors(tmp_path / "skip")[0]["reason"]
    assert {p.name for p in tmp_path.iterdir()} <= {"o", "skip", "src"}  # nothing outside


def test_a_member_named_twice_in_a_sample_is_refused_or_recorded(tmp_path: Path) -> None:
    # extracting the tar, or reading it with webdataset, would keep only one of the two
    src = _json_tar(
        tmp_path / "src",
        [("a.jpg", image_bytes(0)), ("a.jpg", image_bytes(1)), ("b.jpg", image_bytes(2))],
    )
    with pytest.raises(BadSampleError, match=r"member 'a\.jpg' appears twice in its sample"):
        _export(src, tmp_path / "out")
    assert _export(src, tmp_path / "skip", on_error="skip").num_skipped == 1
    assert sorted(_exported(tmp_path / "skip")) == ["b"]


def test_reexport_of_a_cut_shard_is_one_line_naming_it(tmp_path: Path) -> None:
    _four_sample_tar(tmp_path / "src" / "a.tar")
    _export(tmp_path / "src", tmp_path / "first")
    (shard,) = (tmp_path / "first").rglob("*.tar")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2 // 512 * 512])
    line = _error_line(_cli("export-dataset", str(tmp_path / "first"), "-o", str(tmp_path / "2")))
    assert shard.name in line
    assert "the shard is truncated" in line


# ---------------------------------------------------------------- .json members read


def _json_tar(folder: Path, members: list[tuple[str, bytes]]) -> Path:
    folder.mkdir(parents=True)
    with tarfile.open(folder / "a.tar", "w") as tf:
        for name, data in members:
            _add(tf, name, data)
    return folder


def _two_samples(tmp_path: Path, a_json: bytes | None, b_json: bytes) -> Path:
    """A tar (in ``tmp_path / "src"``) of samples ``a`` and ``b``: a JPEG each, and these
    .json members (``a`` without one when ``a_json`` is None)."""
    a = [("a.jpg", image_bytes(0))] + ([("a.json", a_json)] if a_json is not None else [])
    return _json_tar(tmp_path / "src", [*a, ("b.jpg", image_bytes(1)), ("b.json", b_json)])


def _refused_line(tmp_path: Path, src: Path) -> str:
    """The one error line of ``shardex export-dataset src`` (into ``tmp_path / "out"``)."""
    return _error_line(_cli("export-dataset", str(src), "-o", str(tmp_path / "out")))


def test_json_fields_first_seen_after_the_first_sample_are_kept(tmp_path: Path) -> None:
    src = _json_tar(
        tmp_path / "src",
        [
            ("a.jpg", image_bytes(0)),
            ("b.jpg", image_bytes(1)),
            ("b.json", b'{"score": 2, "src": "web"}'),
            ("c.jpg", image_bytes(2)),
            ("c.json", b'{"score": 0.5, "extra": [1, 2]}'),
        ],
    )
    _export(src, tmp_path / "out")
    rows = {k: s["meta"] for k, s in _exported(tmp_path / "out").items()}
    assert [(rows[k]["score"], rows[k]["src"], rows[k]["extra"]) for k in "abc"] == [
        (None, None, None),
        (2.0, "web", None),
        (0.5, None, [1, 2]),
    ]
    table = shardex.open_dataset(tmp_path / "out").metadata
    assert str(table.schema.field("score").type) == "double"  # ints and floats widen


def test_json_field_with_two_types_is_refused_naming_field_types_and_sample(
    tmp_path: Path,
) -> None:
    line = _refused_line(tmp_path, _two_samples(tmp_path, b'{"score": 1}', b'{"score": "high"}'))
    assert "json field 'score' holds string in sample 'b'" in line
    assert "but int64 in earlier samples" in line
    assert not (tmp_path / "out").exists() or not (tmp_path / "out" / "config.yaml").exists()


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (
            b'{"n": 18446744073709551616}',
            "json field 'n' of sample 'b' ('a.tar:b') cannot be stored",
        ),
        (b'{"n": [1, "x"]}', "json field 'n' of sample 'b' ('a.tar:b') cannot be stored"),
        (b'{"n": true}', "json field 'n' holds bool in sample 'b' ('a.tar:b') but int64"),
        (b'{"n": {"k\\n": 1}}', "holds struct<k\\n: int64> in sample 'b'"),
        (b'{"split": 3}', "json field 'split' holds int64, not split names"),
    ],
)
def test_json_fields_arrow_cannot_type_are_one_line(
    tmp_path: Path, second: bytes, why: str
) -> None:
    assert why in _refused_line(tmp_path, _two_samples(tmp_path, b'{"n": 1}', second))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested deeper"),
        (b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), "nested deeper"),
        (b'{"score": 1,', "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[1, 2]", "JSON list, not an object"),
        (b'{"box": {}}', "empty JSON object"),
    ],
)
def test_bad_json_member_is_one_line_naming_the_member(
    tmp_path: Path, text: bytes, why: str
) -> None:
    src = _two_samples(tmp_path, None, text)
    line = _refused_line(tmp_path, src)
    assert "'a.tar:b': member 'b.json' " in line
    assert why in line

    config = _export(src, tmp_path / "skip", on_error="skip")
    assert config.num_samples == 1
    assert [(e["key"], why in e["reason"]) for e in _errors(tmp_path / "skip")] == [("b", True)]


def test_json_key_field_never_becomes_a_path(tmp_path: Path) -> None:
    src = _json_tar(
        tmp_path / "src",
        [("a.jpg", image_bytes(0)), ("a.json", b'{"key": "../../x", "tar_file": "/etc/x"}')],
    )
    _export(src, tmp_path / "out")
    (sample,) = _exported(tmp_path / "out").values()
    assert sample["__key__"] == "a"
    assert (sample["meta"]["json_key"], sample["meta"]["json_tar_file"]) == ("../../x", "/etc/x")
    assert sample["meta"]["tar_file"].startswith("train/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


# ---------------------------------------------------------------- .json members written


def _decoded_by_webdataset(shards: list[str]) -> dict[str, Any]:
    """Each sample's ``.json`` member as webdataset's own decoder gives it."""
    import gc
    import warnings

    import webdataset as wds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its file to gc
        decoded = {
            s["__key__"]: s["json"] for s in wds.WebDataset(shards, shardshuffle=False).decode()
        }
        gc.collect()
    return decoded


def _reject_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_nan_and_infinity_are_written_as_null_json(tmp_path: Path) -> None:
    src = _two_samples(
        tmp_path,
        b'{"score": NaN, "hi": Infinity, "lo": -Infinity, "ok": 0.25}',
        b'{"score": 1.5, "hi": 2.0, "lo": -2.0, "ok": 1.0}',
    )
    _export(src, tmp_path / "out")

    shards = sorted(str(p) for p in (tmp_path / "out").rglob("*.tar"))
    decoded = {s["__key__"]: s["json"] for s in read_with_webdataset(shards)}
    texts = {k: json.loads(v, parse_constant=_reject_constant) for k, v in decoded.items()}
    assert texts == {
        "a": {"score": None, "hi": None, "lo": None, "ok": 0.25},
        "b": {"score": 1.5, "hi": 2.0, "lo": -2.0, "ok": 1.0},
    }
    assert _decoded_by_webdataset(shards)["a"] == texts["a"]
    # metadata.parquet keeps the floats as they were
    row = _exported(tmp_path / "out")["a"]["meta"]
    assert math.isnan(row["score"])
    assert (row["hi"], row["lo"]) == (math.inf, -math.inf)
    assert json.loads(row["metadata"], parse_constant=_reject_constant)["score"] is None


# ---------------------------------------------------------------- generated tars

_KEYS = st.text(string.ascii_lowercase + string.digits + "_", min_size=1, max_size=6)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
# one type per field, so that most generated tars have no type conflict across samples
_TYPED: dict[str, st.SearchStrategy[Any]] = {
    "score": st.integers(-5, 5) | st.floats() | st.none(),  # NaN and infinities too
    "caption": st.text(max_size=8),
    "key": st.text(max_size=8),
    "label": st.integers(0, 9),
    "tar_file": st.text(max_size=8),
    "json_key": st.text(max_size=8),
    "x": st.lists(st.integers(0, 3), max_size=3),
}
_KINDS = [tarfile.LNKTYPE, tarfile.SYMTYPE, tarfile.FIFOTYPE, tarfile.DIRTYPE, tarfile.CHRTYPE]


@dataclass
class _Planned:
    """One generated sample: its members in tar order and whether shardex may export it."""

    key: str
    image: bytes
    members: list[tarfile.TarInfo | tuple[str, bytes]] = field(default_factory=list)
    usable: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


@st.composite
def _samples(draw: st.DrawFn) -> list[_Planned]:
    keys = draw(st.lists(_KEYS, min_size=2, max_size=6, unique=True))
    untyped = draw(st.integers(0, 3)) == 0  # then fields may hold values of any type
    planned = []
    for i, key in enumerate(keys):
        ext = draw(st.sampled_from(["jpg", "png"]))
        s = _Planned(key, image_bytes(i, ext))
        parts: list[tarfile.TarInfo | tuple[str, bytes]] = [(f"{key}.{ext}", s.image)]
        if draw(st.booleans()):
            label = draw(st.sampled_from([b"3", b" 7\n", b"0", b"12", b"1", b"x"]))
            parts.append((f"{key}.cls", label))
            s.usable &= label != b"x"
        if draw(st.booleans()):
            kind = draw(st.sampled_from(["object"] * 6 + ["garbage", "list"]))
            if kind == "object":
                names = draw(st.lists(st.sampled_from(sorted(_TYPED)), max_size=3, unique=True))
                s.meta = {n: draw(_JSON if untyped else _TYPED[n]) for n in names}
                text = json.dumps(s.meta).encode()
                s.usable &= _shape(s.meta) != "empty" and not {"key", "json_key"} <= set(names)
            else:
                text = b'{"a": 1' if kind == "garbage" else b"[]"
                s.usable = False
            parts.append((f"{key}.json", text))
        if draw(st.integers(0, 9)) == 0:
            kind = draw(st.sampled_from(_KINDS))
            parts.insert(draw(st.integers(0, len(parts))), _special(f"{key}.lnk", kind, "x"))
            s.usable &= kind == tarfile.DIRTYPE
        s.members = draw(st.permutations(parts))
        planned.append(s)
    return planned


def _shape(value: Any) -> str:
    """'empty' when a JSON value holds an empty object below the top level (refused)."""
    stack = [(value, True)]
    while stack:
        item, top = stack.pop()
        if isinstance(item, dict):
            if not item and not top:
                return "empty"
            stack.extend((v, False) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, False) for v in item)
    return "ok"


def _write(path: Path, planned: list[_Planned], fmt: int) -> tuple[dict[str, int], int]:
    """Write the tar; returns where each sample's data ends and where the members end."""
    ends: dict[str, int] = {}
    with tarfile.open(path, "w", format=fmt) as tf:
        for s in planned:
            for m in s.members:
                if isinstance(m, tarfile.TarInfo):
                    tf.addfile(m)
                else:
                    _add(tf, *m)
            ends[s.key] = tf.offset
        end = tf.offset
    return ends, end


@settings(
    max_examples=50,
    deadline=None,  # an export takes ~0.2 s; a loaded CI machine must not fail it
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    planned=_samples(),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    cut=st.none() | st.integers(0, 999) | st.integers(300, 999),  # per mille of the tar
    on_block=st.booleans(),
    on_error=st.sampled_from(["error", "skip", "skip"]),
)
def test_generated_tars_export_whole_or_fail_in_one_line(
    planned: list[_Planned], fmt: int, cut: int | None, on_block: bool, on_error: OnError
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        src.mkdir()
        ends, members_end = _write(src / "a.tar", planned, fmt)
        data = (src / "a.tar").read_bytes()
        if cut is not None:
            cut = (members_end + 1024) * cut // 1000
            cut = cut - cut % 512 if on_block else cut
            (src / "a.tar").write_bytes(data[:cut])
        size = len(data) if cut is None else cut
        damaged = size < members_end + 512
        if not _exported_or_refused_in_one_line(src, out, on_error, f"damaged={damaged} "):
            return
        assert not damaged or on_error == "skip", "a damaged tar exported without a word"
        samples = _exported(out)
        recorded = {e["key"] for e in _errors(out)}
        by_key = {s.key: s for s in planned}
        assert not recorded & set(samples)
        assert not damaged or recorded, "a damaged tar left no record"
        for s in planned:
            if ends[s.key] <= size:
                assert s.key in samples or s.key in recorded, f"{s.key} vanished"
            if not s.usable:
                assert s.key not in samples
        for key, sample in samples.items():
            want = by_key[key]
            assert ends[key] <= size
            assert want.usable
            assert want.image in (sample.get("jpg"), sample.get("png"))
            if "json" in sample:  # strict JSON, whatever the source held
                json.loads(sample["json"], parse_constant=_reject_constant)
            for name, value in want.meta.items():
                column = f"json_{name}" if name in ("key", "label", "tar_file") else name
                if isinstance(value, float) and math.isnan(value):
                    assert math.isnan(sample["meta"][column]), (key, name)
                elif isinstance(value, (bool, int, float, str)) or value is None:
                    assert sample["meta"][column] == value, (key, name)


def _exported_or_refused_in_one_line(
    src: Path, out: Path, on_error: OnError, tag: str = ""
) -> bool:
    """Export ``src``; True when it exported, False when it failed as it must: one line,
    a ShardexError, and no committed export left behind."""
    failed: ShardexError | None = None
    try:
        _export(src, out, on_error=on_error)
    except ShardexError as exc:
        failed = exc
    event(f"{tag}on_error={on_error} -> {type(failed).__name__}")
    if failed is None:
        return True
    assert "\n" not in str(failed)
    assert not (out / "config.yaml").exists()
    return False


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
    on_error=st.sampled_from(["error", "skip"]),
)
def test_tars_with_flipped_header_bytes_fail_in_one_line_or_export(
    flips: list[tuple[int, int]], on_error: OnError
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        images, ends = _four_sample_tar(src / "a.tar")
        data = bytearray((src / "a.tar").read_bytes())
        headers = [0, *ends[:-1]]  # each sample's first header; flip bytes in headers only
        for where, xor in flips:
            at = headers[where % len(headers)] + where % 512
            data[at] ^= xor
        (src / "a.tar").write_bytes(bytes(data))
        if not _exported_or_refused_in_one_line(src, out, on_error):
            return
        # a flip the header checksum cannot see may rename a member, but what is exported
        # is always whole members as they were written
        written = {*images.values(), b'{"n":null}', *(b'{"n":%d}' % i for i in range(4))}
        for key, sample in _exported(out).items():
            assert all(v in written for k, v in sample.items() if k in ("jpg", "json")), key


def _scanned(tar: TarRef) -> list[tuple[Any, ...]] | str:
    """What a scan of one tar finds (its samples, or its one-line error)."""
    try:
        return [
            (s.key, s.members, s.label, s.meta, s.problem and s.problem.split("; ")[0])
            for s in tar_samples(tar)
        ]
    except ShardexError as exc:
        return f"{type(exc).__name__}: {str(exc).replace(tar.where, '<tar>')}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    planned=_samples(),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    cut=st.none() | st.integers(0, 999),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=2),
    read_through=st.sampled_from([0, 1024, objecttars.READ_THROUGH]),
)
def test_a_tar_read_by_ranged_requests_scans_as_the_file_does(
    planned: list[_Planned],
    fmt: int,
    cut: int | None,
    flips: list[tuple[int, int]],
    read_through: int,
) -> None:
    """The scan of a tar on a store (ranged GETs hopping from header to header, or
    reading through) finds what the scan of the local file finds, damaged or not."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.tar"
        _write(path, planned, fmt)
        data = bytearray(path.read_bytes())
        for where, xor in flips:
            data[where % len(data)] ^= xor
        if cut is not None:
            data = data[: len(data) * cut // 1000]
        path.write_bytes(bytes(data))
        store = open_storage(tmp)
        before = objecttars.READ_THROUGH
        objecttars.READ_THROUGH = read_through  # type: ignore[misc]
        try:
            ranged = _scanned(TarRef("a.tar", "a.tar", len(data), store))
        finally:
            objecttars.READ_THROUGH = before  # type: ignore[misc]
        assert ranged == _scanned(TarRef(str(path), "a.tar", len(data)))
