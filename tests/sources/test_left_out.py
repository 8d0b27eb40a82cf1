"""Nothing a source holds vanishes without a word, and nothing gives a traceback.

Folder entries and table rows that shardex cannot export (symlink loops, broken symlinks,
symlinks out of the source, ``.heic`` files, unreadable folders, non-UTF-8 names, table
rows naming missing files or folders, bytes that are no image) are refused with one
``error: ...`` line by default, and recorded in errors.parquet (and named in the CLI's
summary) under ``--on-error skip``. Outputs that cannot be created fail the same way.

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
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardex
from helpers import image_bytes, make_tree, write_image
from shardex.cli import main
from shardex.errors import (
    BadSampleError,
    EmptySourceError,
    NotAnExportError,
    OutputExistsError,
    SourceNotFoundError,
    StorageError,
)
from shardex.pipeline import ImageWriterStage, Pipeline, ReaderStage
from shardex.quoting import printable

GOOD = ("good0.jpg", "good1.jpg")


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _error_line(stderr: str) -> str:
    """The one ``error: ...`` line a failed command must print, and nothing else."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {stderr!r}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def _errors(out: Path) -> list[dict[str, str]]:
    return pq.read_table(out / "errors.parquet").to_pylist()


def _assert_no_export(out: Path) -> None:
    assert not (out / "config.yaml").exists()
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(out)


# ---------------------------------------------------------------- folder entries left out


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
    line = _error_line(result.stderr)
    assert name in line
    assert reason in line
    _assert_no_export(tmp_path / "out")


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_folder_entry_is_skipped_recorded_and_summarised(tmp_path: Path, case: str) -> None:
    build, name, reason = FOLDER_CASES[case]
    src = build(tmp_path)
    out = tmp_path / "out"
    result = _cli("export-dataset", str(src), "-o", str(out), "-q", "--on-error", "skip")
    assert result.exit_code == 0, result.output
    errors = _errors(out)
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
    _assert_no_export(tmp_path / "out")


def test_a_name_with_a_newline_gives_a_one_line_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src, list(GOOD))
    (src / "two\nlines.jpg").write_bytes(image_bytes(4)[:100])  # truncated
    result = _cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q")
    assert result.exit_code == 1
    assert "'two\\nlines.jpg'" in _error_line(result.stderr)


def test_the_pipeline_never_reads_what_the_source_left_out(tmp_path: Path) -> None:
    src = _entry(_link_outside_folder)(tmp_path)
    os.symlink(tmp_path / "elsewhere" / "secret.jpg", src / "leak.jpg")
    out = tmp_path / "out"
    Pipeline("p", [ReaderStage(src), ImageWriterStage(out, on_error="skip")]).run()
    errors = {e["original_path"]: e["reason"] for e in _errors(out)}
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
    assert "caf\\xe9' is not valid UTF-8" in _error_line(result.stderr)
    _assert_no_export(tmp_path / "out")


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
    recorded = {e["original_path"] for e in _errors(out)} if config.errors_file else set()
    assert exported | recorded == wanted
    assert not exported & recorded
    assert config.num_skipped == len(recorded)


# ---------------------------------------------------------------- table rows left out


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
    assert [(e["key"], e["original_path"]) for e in _errors(tmp_path / "out")] == [("b", "b")]
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
    assert [e["key"] for e in _errors(tmp_path / "out")] == ["1"]


def test_absolute_paths_without_a_key_column_get_keys_from_their_common_parent(
    tmp_path: Path,
) -> None:
    written = make_tree(tmp_path / "data", ["cats/a.jpg", "dogs/b.png", "dogs/c.v2.jpg"])
    paths = [str(tmp_path / "data" / rel) for rel in sorted(written)]
    table = _table(tmp_path, image_path=paths)
    shardex.export(table, tmp_path / "out", workers=1)
    keys = {"cats/a", "dogs/b", "dogs/c_v2"}  # as a folder source names them
    ds = shardex.open_dataset(tmp_path / "out")
    assert set(ds.keys()) == keys  # type: ignore[attr-defined]
    assert ds.get("dogs/b")["png"] == written["dogs/b.png"]
    # the same table gives the same keys; "../" paths are resolved the same way
    shardex.export(table, tmp_path / "again", workers=1)
    assert set(shardex.open_dataset(tmp_path / "again").keys()) == keys  # type: ignore[attr-defined]
    (tmp_path / "lists").mkdir()
    rels = [f"../data/{rel}" for rel in sorted(written)]
    shardex.export(_table(tmp_path / "lists", path=rels), tmp_path / "rel", workers=1)
    assert set(shardex.open_dataset(tmp_path / "rel").keys()) == keys  # type: ignore[attr-defined]


def test_a_path_naming_a_folder_is_refused_or_skipped(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 0)
    (tmp_path / "folder.jpg").mkdir()
    table = _table(tmp_path, image_path=["a.jpg", "folder.jpg"])
    result = _cli("export-dataset", str(table), "-o", str(tmp_path / "o1"), "-q")
    assert result.exit_code == 1
    assert "is a folder" in _error_line(result.stderr)
    for validate in ("header", "decode", "none"):
        out = tmp_path / validate
        result = _cli(
            "export-dataset", str(table), "-o", str(out), "-q", "--on-error", "skip",
            "--validate", validate,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert [e["original_path"] for e in _errors(out)] == ["folder.jpg"]
        assert "is a folder" in _errors(out)[0]["reason"]
        assert "folder.jpg" in result.stdout


def test_a_row_naming_a_missing_file_is_skipped_and_recorded(tmp_path: Path) -> None:
    written = write_image(tmp_path / "a.jpg", 0)
    table = _table(tmp_path, image_path=["a.jpg", "gone/b.jpg"], score=[1.0, 2.0])
    with pytest.raises(SourceNotFoundError, match=r"row 1.*gone/b\.jpg"):
        shardex.export(table, tmp_path / "o1", workers=1)
    config = shardex.export(table, tmp_path / "out", workers=1, on_error="skip")
    assert config.num_skipped == 1
    [error] = _errors(tmp_path / "out")
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
    reasons = {e["original_path"]: e["reason"] for e in _errors(tmp_path / "out")}
    assert set(reasons) == {"notes.txt", "x.heic", "row 4"}
    assert "not a recognised image" in reasons["notes.txt"]
    assert "'.heic' images are not supported" in reasons["x.heic"]
    ds = shardex.open_dataset(tmp_path / "out")
    assert {s["__key__"]: s["jpg"] for s in ds} == {"a": jpeg, "hashed": jpeg}


# ---------------------------------------------------------------- outputs that cannot be made


def test_an_output_under_a_file_is_one_line(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", list(GOOD))
    (tmp_path / "afile").write_bytes(b"precious")
    with pytest.raises(StorageError, match="is a file, not a folder"):
        shardex.export(tmp_path / "src", tmp_path / "afile" / "out", workers=1)
    result = _cli("export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "afile/x/y"))
    assert result.exit_code == 1
    assert "afile" in _error_line(result.stderr)
    assert (tmp_path / "afile").read_bytes() == b"precious"
    with pytest.raises(OutputExistsError, match="not a folder"):
        shardex.export(tmp_path / "src", tmp_path / "afile", workers=1)


def test_get_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", list(GOOD))
    shardex.export(tmp_path / "src", tmp_path / "out", workers=1)
    dest = tmp_path / "missing" / "x.jpg"
    result = _cli("get", str(tmp_path / "out"), "good0", "-o", str(dest))
    assert result.exit_code == 1
    line = _error_line(result.stderr)
    assert "missing" in line
    assert "create its folder first" in line
    assert not (tmp_path / "missing").exists()


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
        assert "cannot read source folder" in _error_line(done.stderr)
        done = _unprivileged(["export-dataset", "src", "-o", "out", "-q"], tmp_path)
        assert done.returncode == 1, done.stderr
        line = _error_line(done.stderr)
        assert "'locked': cannot read folder: Permission denied" in line
        _assert_no_export(tmp_path / "out")
        for validate in ("header", "none"):
            args = ["export-dataset", "src", "-o", validate, "-q", "--on-error", "skip"]
            done = _unprivileged([*args, "--validate", validate], tmp_path)
            assert done.returncode == 0, done.stderr
            reasons = {e["original_path"]: e["reason"] for e in _errors(tmp_path / validate)}
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
        line = _error_line(done.stderr)
        assert "no permission to write" in line
        assert "ro" in line
        assert list((tmp_path / "ro").iterdir()) == []
    finally:
        (tmp_path / "ro").chmod(0o755)
