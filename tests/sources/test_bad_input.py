"""Bad input: corrupt, empty and mislabelled files, duplicate keys, missing or empty sources,
and outputs that already hold something or cannot be made. Errors must name the culprit
and leave no export behind; ``on_error="skip"`` must finish and account for every skipped
file.

Nothing a source holds vanishes without a word: folder entries and table rows that
shardex cannot export (symlink loops, broken symlinks, symlinks out of the source,
``.heic`` files, unreadable folders, non-UTF-8 names, table rows naming missing files or
folders, bytes that are no image) are refused with one ``error: ...`` line by default, and
recorded in errors.parquet (and named in the CLI's summary) under ``--on-error skip``.

Permission cases run the CLI in a subprocess that the permission bits really stop: as an
ordinary user they apply anyway; as root, the subprocess runs without the capabilities
that let root ignore them (``setpriv``), since faking the error would prove nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardex
from helpers import (
    assert_no_export,
    error_line,
    files_of,
    image_bytes,
    make_tree,
    skipped_rows,
    write_image,
)
from shardex.cli import main
from shardex.errors import (
    BadSampleError,
    DuplicateKeyError,
    EmptySourceError,
    OutputExistsError,
    SourceError,
    SourceNotFoundError,
    StorageError,
)
from shardex.pipeline import ImageWriterStage, Pipeline, ReaderStage
from shardex.quoting import printable

BAD_FILES = ("broken.jpg", "empty.jpg", "notes.png")


def _bad_folder(root: Path) -> dict[str, bytes]:
    """Five good JPEGs plus a truncated JPEG, a zero-byte .jpg and a text file named .png.

    Returns the good files' bytes by file name.
    """
    good = make_tree(root, [f"good{i}.jpg" for i in range(5)])
    whole = image_bytes(99, size=(24, 24))
    (root / "broken.jpg").write_bytes(whole[: len(whole) // 2])
    (root / "empty.jpg").write_bytes(b"")
    (root / "notes.png").write_text("these are my notes, not a picture\n")
    return good


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


# ---------------------------------------------------------------- corrupt files


def test_default_export_refuses_bad_files_and_writes_no_export(tmp_path: Path) -> None:
    _bad_folder(tmp_path / "src")
    with pytest.raises(BadSampleError) as info:
        shardex.export(tmp_path / "src", tmp_path / "out", workers=1)
    message = str(info.value)
    assert any(name in message for name in BAD_FILES), message
    assert "--on-error skip" in message  # and the way out is named
    assert_no_export(tmp_path / "out")
    # found while writing (one pass over the bytes): what was written is removed
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("broken.jpg", image_bytes(5, size=(24, 24))[:300], "truncated"),
        ("empty.jpg", b"", "empty"),
        ("notes.png", b"not an image at all", "not a recognised image"),
    ],
    ids=["truncated-jpeg", "zero-bytes", "text-as-png"],
)
def test_each_kind_of_bad_file_is_named_with_its_reason(
    tmp_path: Path, name: str, content: bytes, reason: str
) -> None:
    make_tree(tmp_path / "src", ["ok0.jpg", "ok1.jpg"])
    (tmp_path / "src" / name).write_bytes(content)
    with pytest.raises(BadSampleError) as info:
        shardex.export(tmp_path / "src", tmp_path / "out", workers=1)
    assert name in str(info.value)
    assert reason in str(info.value)
    assert "more" not in str(info.value)
    assert_no_export(tmp_path / "out")


def test_cli_refuses_bad_files_with_one_error_line(tmp_path: Path) -> None:
    _bad_folder(tmp_path / "src")
    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    line = error_line(result.stderr)
    assert any(name in line for name in BAD_FILES), line
    assert "Traceback" not in result.output
    assert_no_export(tmp_path / "out")


def _assert_skipped_export(out: Path, good: dict[str, bytes]) -> None:
    raw = yaml.safe_load((out / "config.yaml").read_text())
    assert raw["num_skipped"] == 3
    assert raw["errors_file"] == "errors.parquet"
    assert raw["num_samples"] == len(good) == 5
    errors = skipped_rows(out)
    reasons = {row["original_path"]: row["reason"] for row in errors}
    assert set(reasons) == set(BAD_FILES)
    assert "truncated" in reasons["broken.jpg"]
    assert "empty" in reasons["empty.jpg"]
    assert "not a recognised image" in reasons["notes.png"]
    assert {row["key"] for row in errors} == {"broken", "empty", "notes"}
    ds = shardex.open_dataset(out)
    assert len(ds) == 5
    for name, data in good.items():
        assert ds.get(name.removesuffix(".jpg"))["jpg"] == data
    assert sorted(ds.metadata.column("original_path").to_pylist()) == sorted(good)


def test_skip_records_every_bad_file_and_keeps_the_good_ones(tmp_path: Path) -> None:
    good = _bad_folder(tmp_path / "src")
    config = shardex.export(tmp_path / "src", tmp_path / "out", on_error="skip", workers=1)
    assert config.num_skipped == 3
    _assert_skipped_export(tmp_path / "out", good)


def test_cli_skip_finishes_and_reports_the_skipped_files(tmp_path: Path) -> None:
    good = _bad_folder(tmp_path / "src")
    out = tmp_path / "out"
    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(out), "--on-error", "skip")
    assert result.exit_code == 0, result.output
    assert "skipped 3" in result.stdout
    assert "errors.parquet" in result.stdout
    _assert_skipped_export(out, good)


def test_skip_of_every_sample_is_an_empty_source(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "empty.jpg").write_bytes(b"")
    with pytest.raises(EmptySourceError, match="skipped"):
        shardex.export(tmp_path / "src", tmp_path / "out", on_error="skip", workers=1)
    assert_no_export(tmp_path / "out")


@pytest.mark.parametrize("images", [[b""], [b"", b"\xff\xd8"], [b"\xff"]])
def test_in_memory_images_of_a_few_bytes_are_skipped_or_refused(
    tmp_path: Path, images: list[bytes]
) -> None:
    """Images shorter than any JPEG, held in memory (all a shard's bytes under 5): the
    shard check did index past them (IndexError); now each is a bad sample."""
    data = {"key": [f"k{i}" for i in range(len(images))], "jpg": images}
    with pytest.raises(EmptySourceError, match="skipped"):
        shardex.export(data, tmp_path / "skip", on_error="skip", workers=1)
    assert_no_export(tmp_path / "skip")
    with pytest.raises(BadSampleError, match=r"arrays\[0\]"):
        shardex.export(data, tmp_path / "refuse", workers=1)
    assert_no_export(tmp_path / "refuse")


# ---------------------------------------------------------------- folder entries left out

GOOD = ("good0.jpg", "good1.jpg")


def _entry(make: Callable[[Path], None]) -> Callable[[Path], Path]:
    def build(root: Path) -> Path:
        src = root / "src"
        make_tree(src, list(GOOD))
        make(src)
        return src

    return build


def _mkfifo(src: Path) -> None:
    os.mkfifo(src / "pipe.jpg")


def _non_utf8(src: Path) -> None:
    name = os.fsencode(src) + b"/caf\xe9.jpg"
    with open(name, "wb") as f:
        f.write(image_bytes(7))


def _link_outside_folder(src: Path) -> None:
    make_tree(src.parent / "elsewhere", ["secret.jpg"])
    os.symlink(src.parent / "elsewhere", src / "photos")


def _link_loop_folder(src: Path) -> None:
    (src / "sub").mkdir()
    write_image(src / "sub" / "c.jpg", 3)
    os.symlink("..", src / "sub" / "up")


#: name: (how to make it, its name in messages and errors.parquet, the reason given)
FOLDER_CASES: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    "heic": (
        _entry(lambda s: (s / "x.heic").write_bytes(b"\0\0\0\x18ftypheic")),
        "x.heic",
        "'.heic' images are not supported",
    ),
    "avif": (
        _entry(lambda s: (s / "x.avif").write_bytes(b"\0\0\0\x18ftypavif")),
        "x.avif",
        "'.avif' images are not supported",
    ),
    "jfif": (
        _entry(lambda s: (s / "x.JFIF").write_bytes(image_bytes(5))),
        "x.JFIF",
        "rename the file .jpg",
    ),
    "broken symlink": (
        _entry(lambda s: os.symlink(s / "gone.jpg", s / "dangling.jpg")),
        "dangling.jpg",
        "broken symlink",
    ),
    "broken symlink to a folder": (
        _entry(lambda s: os.symlink(s / "gone", s / "images")),
        "images",
        "broken symlink",
    ),
    "symlink loop": (
        _entry(lambda s: os.symlink("loop.jpg", s / "loop.jpg")),
        "loop.jpg",
        "symlink loop",
    ),
    "folder symlink loop": (_entry(_link_loop_folder), "sub/up", "symlink loop"),
    "symlinked folder outside": (
        _entry(_link_outside_folder),
        "photos",
        "outside the source folder",
    ),
    "non-utf8 name": (_entry(_non_utf8), "caf\\xe9.jpg", "not valid UTF-8"),
    "fifo named .jpg": (_entry(_mkfifo), "pipe.jpg", "not a regular file"),
}


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_folder_entry_is_refused_with_one_line(tmp_path: Path, case: str) -> None:
    build, name, reason = FOLDER_CASES[case]
    src = build(tmp_path)
    with pytest.raises(BadSampleError) as info:
        shardex.export(src, tmp_path / "out", workers=1)
    assert name in str(info.value)
    assert reason in str(info.value)
    assert "--on-error skip" in str(info.value)
    result = _cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert name in line
    assert reason in line
    assert_no_export(tmp_path / "out")


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_folder_entry_is_skipped_recorded_and_summarised(tmp_path: Path, case: str) -> None:
    build, name, reason = FOLDER_CASES[case]
    src = build(tmp_path)
    out = tmp_path / "out"
    result = _cli("export-dataset", str(src), "-o", str(out), "-q", "--on-error", "skip")
    assert result.exit_code == 0, result.output
    errors = skipped_rows(out)
    assert [(e["original_path"], reason in e["reason"]) for e in errors] == [(name, True)]
    summary = result.stdout.splitlines()
    assert summary[1].startswith("skipped 1 samples or files")
    assert name in summary[2]
    assert reason in summary[2]
    config = shardex.read_config(out)
    assert config.num_skipped == 1
    ds = shardex.open_dataset(out)
    expected = {"good0", "good1", *(["sub/c"] if case == "folder symlink loop" else [])}
    assert set(ds.keys()) == expected  # type: ignore[attr-defined]
    assert shardex.verify(out).ok


def test_symlinks_inside_the_source_are_followed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    written = make_tree(src, ["real/a.jpg", "real/b.jpg", "c.jpg"])
    os.symlink("real", src / "alias")  # a folder inside the source
    os.symlink("c.jpg", src / "d.jpg")  # a file inside the source
    config = shardex.export(src, tmp_path / "out", workers=1)
    assert config.num_skipped == 0
    ds = shardex.open_dataset(tmp_path / "out")
    samples = {s["__key__"]: s["jpg"] for s in ds}
    assert samples == {
        "alias/a": written["real/a.jpg"],
        "alias/b": written["real/b.jpg"],
        "real/a": written["real/a.jpg"],
        "real/b": written["real/b.jpg"],
        "c": written["c.jpg"],
        "d": written["c.jpg"],
    }


def test_files_that_are_not_images_are_not_left_out(tmp_path: Path) -> None:
    """Notes and broken links that are no image's are not samples: no error, no record."""
    src = tmp_path / "src"
    make_tree(src, list(GOOD))
    (src / "README.txt").write_text("about these images")
    os.symlink(src / "gone.csv", src / "labels.csv")
    os.mkfifo(src / "control.fifo")
    config = shardex.export(src, tmp_path / "out", workers=1)
    assert (config.num_samples, config.num_skipped, config.errors_file) == (2, 0, None)


def test_a_folder_of_only_unexportable_files_is_refused_or_empty(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.heic").write_bytes(b"x")
    with pytest.raises(BadSampleError, match=r"a\.heic"):
        shardex.export(src, tmp_path / "out", workers=1)
    with pytest.raises(EmptySourceError, match="skipped"):
        shardex.export(src, tmp_path / "out", workers=1, on_error="skip")
    assert_no_export(tmp_path / "out")


def test_a_name_with_a_newline_gives_a_one_line_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, list(GOOD))
    (src / "two\nlines.jpg").write_bytes(image_bytes(4)[:100])  # truncated
    result = _cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code == 1
    assert "'two\\nlines.jpg'" in error_line(result.stderr)


def test_the_pipeline_never_reads_what_the_source_left_out(tmp_path: Path) -> None:
    src = _entry(_link_outside_folder)(tmp_path)
    os.symlink(tmp_path / "elsewhere" / "secret.jpg", src / "leak.jpg")
    out = tmp_path / "out"
    Pipeline("p", [ReaderStage(src), ImageWriterStage(out, on_error="skip")]).run()
    errors = {e["original_path"]: e["reason"] for e in skipped_rows(out)}
    assert set(errors) == {"leak.jpg", "photos"}
    assert all("outside the source folder" in r for r in errors.values())
    assert set(shardex.open_dataset(out).keys()) == {"good0", "good1"}  # type: ignore[attr-defined]
    with pytest.raises(BadSampleError, match="outside the source folder"):
        Pipeline("p", [ReaderStage(src), ImageWriterStage(tmp_path / "o2")]).run()


def test_a_source_folder_whose_path_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    src = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(src)
    write_image(Path(os.fsdecode(src)) / "a.jpg", 0)
    result = _cli("export-dataset", os.fsdecode(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code == 1
    assert "caf\\xe9' is not valid UTF-8" in error_line(result.stderr)
    assert_no_export(tmp_path / "out")


_NAME = st.binary(min_size=1, max_size=12).filter(
    lambda b: not any(c in b for c in b"/.\0") and os.name == "posix"
)
_SUFFIX = st.sampled_from([b".jpg", b".PNG", b".heic", b".jfif", b".txt", b""])


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(files=st.lists(st.tuples(_NAME, _SUFFIX), min_size=1, max_size=4))
def test_any_file_name_is_exported_or_recorded_never_lost(
    tmp_path_factory: pytest.TempPathFactory, files: list[tuple[bytes, bytes]]
) -> None:
    """Names of any bytes (newlines, non-UTF-8, spaces, case twins): every image-named
    file is a sample or an errors.parquet row; no traceback; other files are no samples."""
    root = tmp_path_factory.mktemp("names")
    src = root / "src"
    src.mkdir()
    wanted: set[str] = set()
    for i, (stem, suffix) in enumerate(dict.fromkeys(files)):
        name = stem + suffix
        fmt = "png" if suffix == b".PNG" else "jpg"
        with open(os.fsencode(src) + b"/" + name, "wb") as f:
            f.write(image_bytes(i, fmt))
        if suffix not in (b".txt", b""):
            wanted.add(printable(os.fsdecode(name)))
    out = root / "out"
    try:
        config = shardex.export(src, out, workers=1, on_error="skip")
    except EmptySourceError:  # nothing exportable: no export, and it says why
        assert not (out / "config.yaml").exists()
        return
    exported = set(shardex.open_dataset(out).metadata.column("original_path").to_pylist())
    recorded = {e["original_path"] for e in skipped_rows(out)} if config.errors_file else set()
    assert exported | recorded == wanted
    assert not exported & recorded
    assert config.num_skipped == len(recorded)


# ---------------------------------------------------------------- validate levels


def _garbled_jpeg() -> bytes:
    """A JPEG whose middle is zeroed: the magic bytes and the end marker are intact."""
    data = bytearray(image_bytes(42, size=(32, 32)))
    middle = len(data) // 2
    data[20:middle] = bytes(middle - 20)
    assert data[:3] == b"\xff\xd8\xff"
    assert data[-2:] == b"\xff\xd9"
    return bytes(data)


def test_validate_decode_catches_damage_that_header_lets_through(tmp_path: Path) -> None:
    good = make_tree(tmp_path / "src", ["a.jpg", "b.jpg"])
    garbled = _garbled_jpeg()
    (tmp_path / "src" / "garbled.jpg").write_bytes(garbled)

    # header (the default) only looks at the ends: the file is exported as it is
    config = shardex.export(tmp_path / "src", tmp_path / "header", validate="header", workers=1)
    assert config.num_samples == 3
    assert shardex.open_dataset(tmp_path / "header").get("garbled")["jpg"] == garbled

    # decode decodes every image and refuses it
    with pytest.raises(BadSampleError, match=r"garbled\.jpg") as info:
        shardex.export(tmp_path / "src", tmp_path / "decode", validate="decode", workers=1)
    assert "decode" in str(info.value)
    assert_no_export(tmp_path / "decode")

    # and with skip, decode drops it and keeps the rest
    config = shardex.export(
        tmp_path / "src", tmp_path / "skip", validate="decode", on_error="skip", workers=1
    )
    assert config.num_skipped == 1
    errors = skipped_rows(tmp_path / "skip")
    assert [row["original_path"] for row in errors] == ["garbled.jpg"]
    ds = shardex.open_dataset(tmp_path / "skip")
    assert {s["__key__"]: s["jpg"] for s in ds} == {"a": good["a.jpg"], "b": good["b.jpg"]}


# ---------------------------------------------------------------- duplicate keys


_DUPLICATES = pytest.mark.parametrize(
    ("first", "second", "key"),
    [("a.jpg", "a.png", "a"), ("img.v2.jpg", "img_v2.jpg", "img_v2")],
    ids=["same-stem", "dot-becomes-underscore"],
)


@_DUPLICATES
def test_duplicate_keys_are_refused_by_default(
    tmp_path: Path, first: str, second: str, key: str
) -> None:
    src = tmp_path / "src"
    make_tree(src, [first, second, "b.jpg"])
    with pytest.raises(DuplicateKeyError) as info:
        shardex.export(src, tmp_path / "out", workers=1)
    message = str(info.value)
    assert first in message
    assert second in message
    assert f"duplicate key {key!r}" in message
    assert_no_export(tmp_path / "out")
    result = _cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    assert second in error_line(result.stderr)


@_DUPLICATES
def test_duplicate_keys_are_skipped_with_a_reason(
    tmp_path: Path, first: str, second: str, key: str
) -> None:
    src = tmp_path / "src"
    written = make_tree(src, [first, second, "b.jpg"])
    config = shardex.export(src, tmp_path / "out", on_error="skip", workers=1)
    assert config.num_skipped == 1
    errors = skipped_rows(tmp_path / "out")
    assert len(errors) == 1
    assert errors[0]["key"] == key
    assert errors[0]["original_path"] == second
    assert "duplicate key" in errors[0]["reason"]
    assert first in errors[0]["reason"]  # says which sample already has the key
    ds = shardex.open_dataset(tmp_path / "out")
    assert len(ds) == 2
    kept = ds.get(key)
    assert kept[first.rpartition(".")[2]] == written[first]
    assert ds.metadata.column("original_path").to_pylist().count(second) == 0
    assert ds.get("b")["jpg"] == written["b.jpg"]


# ---------------------------------------------------------------- table rows left out


def test_table_row_pointing_at_a_missing_image(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 0)
    pq.write_table(pa.table({"image_path": ["a.jpg", "gone/b.jpg"]}), tmp_path / "t.parquet")
    with pytest.raises(SourceNotFoundError, match=r"gone/b\.jpg") as info:
        shardex.export(tmp_path / "t.parquet", tmp_path / "out", workers=1)
    assert "row 1" in str(info.value)
    assert_no_export(tmp_path / "out")


def _table(root: Path, **columns: list[object] | pa.Array) -> Path:
    path = root / "t.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def test_bytes_that_are_no_image_are_refused_or_skipped(tmp_path: Path) -> None:
    blobs = [image_bytes(0), b"GARBAGE, not a picture", image_bytes(1, "png")]
    table = _table(tmp_path, key=["a", "b", "c"], image_bytes=pa.array(blobs, pa.binary()))
    with pytest.raises(BadSampleError, match=r"row 1.*not a recognised image"):
        shardex.export(table, tmp_path / "o1", workers=1)
    config = shardex.export(table, tmp_path / "out", workers=1, on_error="skip")
    assert [(e["key"], e["original_path"]) for e in skipped_rows(tmp_path / "out")] == [("b", "b")]
    # no KEY.bin member beside the images: x_keys are the image alone
    assert config.x_keys == ("image",)
    ds = shardex.open_dataset(tmp_path / "out")
    assert {s["__key__"]: s.get("jpg", s.get("png")) for s in ds} == {
        "a": blobs[0],
        "c": blobs[2],
    }


def test_bytes_are_validated_like_files(tmp_path: Path) -> None:
    truncated = image_bytes(2, size=(24, 24))[:300]  # JPEG magic, no end
    table = _table(tmp_path, image_bytes=pa.array([image_bytes(0), truncated], pa.binary()))
    with pytest.raises(BadSampleError, match="truncated"):
        shardex.export(table, tmp_path / "o1", workers=1)
    shardex.export(table, tmp_path / "out", workers=1, on_error="skip")
    assert [e["key"] for e in skipped_rows(tmp_path / "out")] == ["1"]


def test_a_path_naming_a_folder_is_refused_or_skipped(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 0)
    (tmp_path / "folder.jpg").mkdir()
    table = _table(tmp_path, image_path=["a.jpg", "folder.jpg"])
    result = _cli("export-dataset", str(table), "-o", str(tmp_path / "o1"), "-q")
    assert result.exit_code == 1
    assert "is a folder" in error_line(result.stderr)
    for validate in ("header", "decode", "none"):
        out = tmp_path / validate
        result = _cli(
            "export-dataset", str(table), "-o", str(out), "-q", "--on-error", "skip",
            "--validate", validate,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert [e["original_path"] for e in skipped_rows(out)] == ["folder.jpg"]
        assert "is a folder" in skipped_rows(out)[0]["reason"]
        assert "folder.jpg" in result.stdout


def test_a_row_naming_a_missing_file_is_skipped_and_recorded(tmp_path: Path) -> None:
    written = write_image(tmp_path / "a.jpg", 0)
    table = _table(tmp_path, image_path=["a.jpg", "gone/b.jpg"], score=[1.0, 2.0])
    with pytest.raises(SourceNotFoundError, match=r"row 1.*gone/b\.jpg"):
        shardex.export(table, tmp_path / "o1", workers=1)
    config = shardex.export(table, tmp_path / "out", workers=1, on_error="skip")
    assert config.num_skipped == 1
    [error] = skipped_rows(tmp_path / "out")
    assert (error["key"], error["original_path"]) == ("gone/b", "gone/b.jpg")
    assert "does not exist" in error["reason"]
    ds = shardex.open_dataset(tmp_path / "out")
    assert ds.get("a")["jpg"] == written
    assert ds.metadata.column("score").to_pylist() == [1.0]  # the rows stay aligned


def test_table_rows_that_are_no_image_files(tmp_path: Path) -> None:
    jpeg = write_image(tmp_path / "a.jpg", 0)
    (tmp_path / "hashed").write_bytes(jpeg)  # a JPEG without an extension: sniffed
    (tmp_path / "notes.txt").write_text("not a picture")
    (tmp_path / "x.heic").write_bytes(b"\0\0\0\x18ftypheic")
    table = _table(tmp_path, image_path=["a.jpg", "hashed", "notes.txt", "x.heic", ""])
    shardex.export(table, tmp_path / "out", workers=1, on_error="skip")
    reasons = {e["original_path"]: e["reason"] for e in skipped_rows(tmp_path / "out")}
    assert set(reasons) == {"notes.txt", "x.heic", "row 4"}
    assert "not a recognised image" in reasons["notes.txt"]
    assert "'.heic' images are not supported" in reasons["x.heic"]
    ds = shardex.open_dataset(tmp_path / "out")
    assert {s["__key__"]: s["jpg"] for s in ds} == {"a": jpeg, "hashed": jpeg}


# ---------------------------------------------------------------- missing / empty sources


def test_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        shardex.export(missing, tmp_path / "out", workers=1)
    result = _cli("export-dataset", str(missing), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    line = error_line(result.stderr)
    assert str(missing) in line
    assert "does not exist" in line
    assert not (tmp_path / "out" / "config.yaml").exists()


@pytest.mark.parametrize(
    "content", [[], ["readme.txt", "data.csv.bak"]], ids=["empty", "no-images"]
)
def test_empty_source_folder(tmp_path: Path, content: list[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in content:
        (src / name).write_text("x")
    with pytest.raises(EmptySourceError, match="no image files"):
        shardex.export(src, tmp_path / "out", workers=1)
    result = _cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    assert "no image files" in error_line(result.stderr)
    assert_no_export(tmp_path / "out")


def test_unsupported_source_file_type(tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("a.jpg\n")
    with pytest.raises(SourceError, match="unsupported file type"):
        shardex.export(tmp_path / "list.txt", tmp_path / "out", workers=1)


# ---------------------------------------------------------------- existing outputs


def test_existing_export_is_left_untouched_without_overwrite(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", [f"c{i % 2}/x{i}.jpg" for i in range(6)])
    make_tree(tmp_path / "other", [f"y{i}.jpg" for i in range(3)], first_seed=50)
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, samples_per_shard=2, workers=1)
    before = files_of(out)

    with pytest.raises(OutputExistsError, match="overwrite"):
        shardex.export(tmp_path / "other", out, workers=1)
    assert files_of(out) == before

    result = _cli("export-dataset", str(tmp_path / "other"), "-o", str(out), "-q")
    assert result.exit_code != 0
    assert "--overwrite" in error_line(result.stderr)
    assert files_of(out) == before
    assert len(shardex.open_dataset(out)) == 6


def test_overwrite_replaces_the_export_and_removes_stale_files(tmp_path: Path) -> None:
    old_good = _bad_folder(tmp_path / "old")
    new = make_tree(tmp_path / "new", [f"n{i}.jpg" for i in range(4)], first_seed=200)
    out = tmp_path / "out"
    first = shardex.export(tmp_path / "old", out, samples_per_shard=2, on_error="skip", workers=1)
    assert len(first.splits["train"].shards) == 3
    assert (out / "errors.parquet").exists()
    old_files = set(files_of(out))

    config = shardex.export(tmp_path / "new", out, samples_per_shard=100, overwrite=True, workers=1)

    assert config.num_samples == 4
    assert config.num_skipped == 0
    shards = config.splits["train"].shards
    index = config.splits["train"].index
    assert index is not None
    expected = {
        "config.yaml",
        str(config.metadata_file),
        index.samples,
        index.keys,
        index.members,
        "train/shards.txt",  # the shard lists, rewritten for the new shards
        "train/shards.wids.json",
        *(s.path for s in shards),
        *(s.metadata for s in shards if s.metadata),
        *(s.dali_index for s in shards if s.dali_index),
    }
    assert set(files_of(out)) == expected  # no stale shards, no stale errors.parquet
    assert old_files - expected  # the old export's shards really were different files
    ds = shardex.open_dataset(out)
    assert {s["__key__"]: s["jpg"] for s in ds} == {
        name.removesuffix(".jpg"): data for name, data in new.items()
    }
    assert not set(ds.metadata.column("original_path").to_pylist()) & set(old_good)


@pytest.mark.parametrize("with_export", [False, True], ids=["only-user-file", "export-and-user"])
def test_output_with_a_user_file_is_refused_even_with_overwrite(
    tmp_path: Path, with_export: bool
) -> None:
    make_tree(tmp_path / "src", ["a.jpg", "b.jpg"])
    out = tmp_path / "out"
    if with_export:
        shardex.export(tmp_path / "src", out, workers=1)
    out.mkdir(exist_ok=True)
    (out / "thesis.docx").write_bytes(b"years of work")
    before = files_of(out)

    with pytest.raises(OutputExistsError, match=r"thesis\.docx"):
        shardex.export(tmp_path / "src", out, overwrite=True, workers=1)
    assert files_of(out) == before

    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(out), "--overwrite", "-q")
    assert result.exit_code != 0
    assert "thesis.docx" in error_line(result.stderr)
    assert files_of(out) == before


def test_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    write_image(tmp_path / "src" / "a.jpg", 0)
    target = tmp_path / "out"
    target.write_bytes(b"precious")
    # a shardex error (not a bare OSError from deep inside the writer) naming the output
    with pytest.raises((OutputExistsError, StorageError), match="out"):
        shardex.export(tmp_path / "src", target, overwrite=True, workers=1)
    assert target.read_bytes() == b"precious"


def test_failed_overwrite_leaves_the_old_export_intact(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", [f"x{i}.jpg" for i in range(4)])
    _bad_folder(tmp_path / "bad")
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, samples_per_shard=2, workers=1)
    before = files_of(out)

    with pytest.raises(BadSampleError):
        shardex.export(tmp_path / "bad", out, overwrite=True, workers=1)

    assert files_of(out) == before
    assert len(shardex.open_dataset(out)) == 4


# ---------------------------------------------------------------- outputs that cannot be made, folders that cannot be read


def test_an_output_under_a_file_is_one_line(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", list(GOOD))
    (tmp_path / "afile").write_bytes(b"precious")
    with pytest.raises(StorageError, match="is a file, not a folder"):
        shardex.export(tmp_path / "src", tmp_path / "afile" / "out", workers=1)
    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "afile/x/y"))
    assert result.exit_code == 1
    assert "afile" in error_line(result.stderr)
    assert (tmp_path / "afile").read_bytes() == b"precious"
    with pytest.raises(OutputExistsError, match="not a folder"):
        shardex.export(tmp_path / "src", tmp_path / "afile", workers=1)


def _unprivileged(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``shardex ARGS`` in a process the permission bits stop (see the module docstring)."""
    command = [sys.executable, "-m", "shardex.cli", *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permission bits do not apply")
        command = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_an_unreadable_sub_folder_is_one_line_or_a_recorded_skip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, [*GOOD, "locked/c.jpg"])
    write_image(src / "unreadable.jpg", 5)
    (src / "unreadable.jpg").chmod(0)
    (src / "locked").chmod(0)
    try:
        done = _unprivileged(["export-dataset", "src/locked", "-o", "out", "-q"], tmp_path)
        assert done.returncode == 1, done.stderr
        assert "cannot read source folder" in error_line(done.stderr)
        done = _unprivileged(["export-dataset", "src", "-o", "out", "-q"], tmp_path)
        assert done.returncode == 1, done.stderr
        line = error_line(done.stderr)
        assert "'locked': cannot read folder: Permission denied" in line
        assert_no_export(tmp_path / "out")
        for validate in ("header", "none"):
            args = ["export-dataset", "src", "-o", validate, "-q", "--on-error", "skip"]
            done = _unprivileged([*args, "--validate", validate], tmp_path)
            assert done.returncode == 0, done.stderr
            reasons = {e["original_path"]: e["reason"] for e in skipped_rows(tmp_path / validate)}
            assert set(reasons) == {"locked", "unreadable.jpg"}
            assert all("Permission denied" in r for r in reasons.values())
            assert "'locked': cannot read folder" in done.stdout
    finally:
        (src / "locked").chmod(0o755)


def test_an_unwritable_output_parent_is_one_line(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", list(GOOD))
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    try:
        done = _unprivileged(["export-dataset", "src", "-o", "ro/out/deeper", "-q"], tmp_path)
        assert done.returncode == 1, done.stderr
        line = error_line(done.stderr)
        assert "no permission to write" in line
        assert "ro" in line
        assert list((tmp_path / "ro").iterdir()) == []
    finally:
        (tmp_path / "ro").chmod(0o755)
