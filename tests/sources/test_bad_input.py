"""Bad input: corrupt, empty and mislabelled files, duplicate keys, missing or empty sources,
and outputs that already hold something. Errors must name the culprit and leave no export
behind; ``on_error="skip"`` must finish and account for every skipped file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner, Result

import shardex
from helpers import files_of, image_bytes, make_tree, write_image
from shardex.cli import main
from shardex.errors import (
    BadSampleError,
    DuplicateKeyError,
    EmptySourceError,
    NotAnExportError,
    OutputExistsError,
    SourceError,
    SourceNotFoundError,
    StorageError,
)

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


def _error_line(result: Result) -> str:
    """The CLI's error output, which must be exactly one ``error: ...`` line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {result.stderr!r}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def _assert_no_export(out: Path) -> None:
    assert not (out / "config.yaml").exists()
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(out)


# ---------------------------------------------------------------- corrupt files


def test_default_export_refuses_bad_files_and_writes_no_export(tmp_path: Path) -> None:
    _bad_folder(tmp_path / "src")
    with pytest.raises(BadSampleError) as info:
        shardex.export(tmp_path / "src", tmp_path / "out", workers=1)
    message = str(info.value)
    assert any(name in message for name in BAD_FILES), message
    assert "--on-error skip" in message  # and the way out is named
    _assert_no_export(tmp_path / "out")
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
    _assert_no_export(tmp_path / "out")


def test_cli_refuses_bad_files_with_one_error_line(tmp_path: Path) -> None:
    _bad_folder(tmp_path / "src")
    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    line = _error_line(result)
    assert any(name in line for name in BAD_FILES), line
    assert "Traceback" not in result.output
    _assert_no_export(tmp_path / "out")


def _assert_skipped_export(out: Path, good: dict[str, bytes]) -> None:
    raw = yaml.safe_load((out / "config.yaml").read_text())
    assert raw["num_skipped"] == 3
    assert raw["errors_file"] == "errors.parquet"
    assert raw["num_samples"] == len(good) == 5
    errors = pq.read_table(out / "errors.parquet").to_pylist()
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
    _assert_no_export(tmp_path / "out")


@pytest.mark.parametrize("images", [[b""], [b"", b"\xff\xd8"], [b"\xff"]])
def test_in_memory_images_of_a_few_bytes_are_skipped_or_refused(
    tmp_path: Path, images: list[bytes]
) -> None:
    """Images shorter than any JPEG, held in memory (all a shard's bytes under 5): the
    shard check did index past them (IndexError); now each is a bad sample."""
    data = {"key": [f"k{i}" for i in range(len(images))], "jpg": images}
    with pytest.raises(EmptySourceError, match="skipped"):
        shardex.export(data, tmp_path / "skip", on_error="skip", workers=1)
    _assert_no_export(tmp_path / "skip")
    with pytest.raises(BadSampleError, match=r"arrays\[0\]"):
        shardex.export(data, tmp_path / "refuse", workers=1)
    _assert_no_export(tmp_path / "refuse")


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
    _assert_no_export(tmp_path / "decode")

    # and with skip, decode drops it and keeps the rest
    config = shardex.export(
        tmp_path / "src", tmp_path / "skip", validate="decode", on_error="skip", workers=1
    )
    assert config.num_skipped == 1
    errors = pq.read_table(tmp_path / "skip" / "errors.parquet").to_pylist()
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
    _assert_no_export(tmp_path / "out")
    result = _cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    assert second in _error_line(result)


@_DUPLICATES
def test_duplicate_keys_are_skipped_with_a_reason(
    tmp_path: Path, first: str, second: str, key: str
) -> None:
    src = tmp_path / "src"
    written = make_tree(src, [first, second, "b.jpg"])
    config = shardex.export(src, tmp_path / "out", on_error="skip", workers=1)
    assert config.num_skipped == 1
    errors = pq.read_table(tmp_path / "out" / "errors.parquet").to_pylist()
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


def test_table_row_pointing_at_a_missing_image(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 0)
    pq.write_table(pa.table({"image_path": ["a.jpg", "gone/b.jpg"]}), tmp_path / "t.parquet")
    with pytest.raises(SourceNotFoundError, match=r"gone/b\.jpg") as info:
        shardex.export(tmp_path / "t.parquet", tmp_path / "out", workers=1)
    assert "row 1" in str(info.value)
    _assert_no_export(tmp_path / "out")


# ---------------------------------------------------------------- missing / empty sources


def test_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        shardex.export(missing, tmp_path / "out", workers=1)
    result = _cli("export-dataset", str(missing), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code != 0
    line = _error_line(result)
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
    assert "no image files" in _error_line(result)
    _assert_no_export(tmp_path / "out")


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
    assert "--overwrite" in _error_line(result)
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
    assert "thesis.docx" in _error_line(result)
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
