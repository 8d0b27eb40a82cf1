"""Hostile names: split values, split fractions, sample names and keys, and config.yaml paths
never place or read a file outside the export, and fail with one line.

Every export here runs in a sandbox folder; the output sits two levels down
(``sandbox/a/b/out``) so that ``../..`` lands in the sandbox, where the walk before and after
sees it. An empty split name once wrote shards to the file-system root, so ``/`` is watched too.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardex
from helpers import image_bytes, write_image
from shardex.contract import ExportConfig, schema, validate
from shardex.errors import BadSampleError, ConfigError, SchemaError, ShardexError, SourceError
from shardex.names import (
    MAX_SPLIT_NAME,
    relpath_problem,
    split_name_problem,
    stored_split_name_problem,
)
from shardex.options import ExportOptions
from shardex.pipeline import ImageWriterStage, LocalExecutor, Pipeline, ReaderStage
from shardex.pipeline.stage import Batch, Stage
from shardex.quoting import one_line

HOSTILE_SPLITS = [
    "../../evil",
    "ABSOLUTE",  # replaced by an absolute path inside the sandbox
    ".",
    "..",
    "",
    "a\nb",
    "train/../../x",
    "a\\b",
    "config.yaml",
    "x" * (MAX_SPLIT_NAME + 1),
    "trаin",  # a Cyrillic 'а'
]


def _walk(root: Path) -> set[str]:
    return {str(Path(d, f)) for d, _, files in os.walk(root) for f in files}


def _fs_root() -> set[str]:
    return set(os.listdir("/"))


def _outside(sandbox: Path, out: Path, before: set[str]) -> set[str]:
    """Files that appeared in the sandbox outside ``out``."""
    return {p for p in _walk(sandbox) - before if not p.startswith(f"{out}{os.sep}")}


def _table(folder: Path, splits: list[object], **columns: list[object]) -> Path:
    """A Parquet table of len(splits) small JPEGs with the given split values."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(len(splits)):
        write_image(folder / f"img{i}.jpg", i)
    data = {"path": [f"img{i}.jpg" for i in range(len(splits))], "split": splits, **columns}
    pq.write_table(pa.table(data), folder / "t.parquet")
    return folder / "t.parquet"


def _tar(folder: Path, metas: list[dict[str, object]]) -> Path:
    """A WebDataset tar: sample kN is a JPEG and a .json member holding metas[N]."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "s.tar", "w") as tf:
        for i, meta in enumerate(metas):
            for name, data in ((f"k{i}.jpg", image_bytes(i)), (f"k{i}.json", json.dumps(meta))):
                raw = data if isinstance(data, bytes) else data.encode()
                info = tarfile.TarInfo(name)
                info.size = len(raw)
                tf.addfile(info, io.BytesIO(raw))
    return folder / "s.tar"


def _assert_one_line(exc: BaseException) -> None:
    assert isinstance(exc, ShardexError), f"{type(exc).__name__}: {exc}"
    assert "\n" not in str(exc), str(exc)
    assert "\r" not in str(exc), str(exc)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardex.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- split values from the source -----------------------------------------------------------


@pytest.mark.parametrize("split", HOSTILE_SPLITS)
def test_table_split_value_is_refused_naming_key_and_value(tmp_path: Path, split: str) -> None:
    split = str(tmp_path / "abs") if split == "ABSOLUTE" else split
    table = _table(tmp_path / "src", [split, "train", "train"])
    out = tmp_path / "a" / "b" / "out"
    before, root_before = _walk(tmp_path), _fs_root()
    with pytest.raises(BadSampleError) as info:
        shardex.export(table, out, workers=1)
    _assert_one_line(info.value)
    assert "'img0'" in str(info.value)  # the sample's key
    assert repr(split)[:40] in str(info.value)  # and its split value, quoted
    assert _walk(tmp_path) == before
    assert _fs_root() == root_before


@pytest.mark.parametrize("split", ["../../evil", "", "a\nb", "/etc"])
def test_table_split_value_is_a_recorded_skip_under_on_error_skip(
    tmp_path: Path, split: str
) -> None:
    table = _table(tmp_path / "src", [split, "train", "val"])
    out = tmp_path / "a" / "b" / "out"
    before, root_before = _walk(tmp_path), _fs_root()
    config = shardex.export(table, out, workers=1, on_error="skip")
    assert _outside(tmp_path, out, before) == set()
    assert _fs_root() == root_before
    assert list(config.splits) == ["train", "val"]
    assert config.num_samples == 2
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert [e["key"] for e in errors] == ["img0"]
    assert "unsafe split name" in errors[0]["reason"]
    assert repr(split) in errors[0]["reason"]


def test_null_and_non_string_split_values_are_refused(tmp_path: Path) -> None:
    table = _table(tmp_path / "src", [None, "train"])
    with pytest.raises(BadSampleError, match=r"'img0': no split \(null\)"):
        shardex.export(table, tmp_path / "out", workers=1)
    tar = _tar(tmp_path / "tars", [{"split": 5}, {"split": 6}])
    # a tar's .json split field of another type is refused for the whole source
    with pytest.raises(SourceError, match=r"json field 'split' holds int64, not split names"):
        shardex.export(tar, tmp_path / "out2", workers=1)


@pytest.mark.parametrize("on_error", ["error", "skip"])
def test_tar_json_split_cannot_leave_the_output(tmp_path: Path, on_error: str) -> None:
    tar = _tar(tmp_path / "tars", [{"split": "train"}, {"split": "../../x"}])
    out = tmp_path / "a" / "out"
    before = _walk(tmp_path)
    if on_error == "error":
        with pytest.raises(BadSampleError, match=r"'k1': unsafe split name '\.\./\.\./x'"):
            shardex.export(tar, out, workers=1)
        assert _walk(tmp_path) == before
    else:
        config = shardex.export(tar, out, workers=1, on_error="skip")
        assert _outside(tmp_path, out, before) == set()
        assert list(config.splits) == ["train"]
        assert config.num_skipped == 1


# --- split names from options ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["../sf_evil", "", ".", "a/b", "a\nb", "x" * 200])
def test_split_options_are_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"split_fractions: .*split name") as info:
        ExportOptions(split_fractions={name: 0.5, "train": 0.5})
    _assert_one_line(info.value)
    with pytest.raises(ConfigError, match=r"^splits: .*split name"):
        ExportOptions(splits=(name,))
    before = _walk(tmp_path)
    with pytest.raises(ConfigError):
        shardex.export("demo:4", tmp_path / "a" / "out", split_fractions={name: 0.5, "val": 0.5})
    with pytest.raises(ConfigError):  # a pipeline's writer, before any stage runs
        ImageWriterStage(tmp_path / "a" / "out", split_fractions={name: 1.0})
    assert _walk(tmp_path) == before


def test_cli_split_fractions_and_split_column_one_line_nothing_outside(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    before = _walk(tmp_path)
    line = _one_error_line(
        _cli("export-dataset", "demo:4", "-o", str(out), "--split-fractions", "../sf=0.5,t=0.5")
    )
    assert "'../sf'" in line
    table = _table(tmp_path / "src", ["../../evil\nx", "train"])
    before = _walk(tmp_path)
    line = _one_error_line(_cli("export-dataset", str(table), "-o", str(out), "-q"))
    assert "'img0'" in line
    assert "'../../evil\\nx'" in line
    assert _walk(tmp_path) == before


def test_cli_error_naming_a_file_with_a_newline_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_image(src / "ok.jpg", 1)
    (src / "bad\nname.jpg").write_bytes(b"not an image at all")
    line = _one_error_line(_cli("export-dataset", str(src), "-o", str(tmp_path / "out"), "-q"))
    assert "bad\\nname.jpg" in line


def test_one_line_escapes_control_and_line_breaking_characters() -> None:
    assert one_line("plain 'é' text") == "plain 'é' text"
    assert one_line("a\nb\rc\x00d\x1b[31m\u2028e\tf") == "a\\nb\\rc\\x00d\\x1b[31m\\u2028e\\tf"


# --- the read side: config.yaml ---------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "out"
    shardex.export("demo:6", out, workers=1, split_fractions={"train": 0.5, "val": 0.5})
    return out


def _tampered(exported: Path, tmp_path: Path, edit: Callable[[dict[str, object]], None]) -> Path:
    raw = yaml.safe_load((exported / "config.yaml").read_text())
    edit(raw)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in os.listdir(exported):
        if name != "config.yaml":
            os.symlink(exported / name, copy / name)
    (copy / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


BAD_PATHS = ["../../../etc/passwd", "/etc/passwd", "a//b", "./a", "a/./b", "a\\..\\b", "a\x00b", ""]


def _set(field: str, value: str) -> Callable[[dict[str, object]], None]:
    def edit(raw: dict[str, object]) -> None:
        split = raw["splits"]["train"]  # type: ignore[index]
        shard = split["shards"][0]
        if field in ("metadata_file", "errors_file"):
            raw[field] = value
        elif field in ("samples", "keys"):
            split["index"][field] = value
        else:
            shard[field] = value

    return edit


@pytest.mark.parametrize("value", BAD_PATHS)
@pytest.mark.parametrize("field", ["metadata_file", "errors_file", "path", "metadata", "samples"])
def test_config_paths_outside_the_export_are_refused(
    exported: Path, tmp_path: Path, field: str, value: str
) -> None:
    copy = _tampered(exported, tmp_path, _set(field, value))
    where = re.escape(f"{copy}/config.yaml: ")
    with pytest.raises(SchemaError, match=rf"^{where}\S*{field} is ") as info:
        _ = shardex.open_dataset(copy, split="train").metadata
    _assert_one_line(info.value)


def test_config_split_names_are_checked_on_read(exported: Path, tmp_path: Path) -> None:
    def rename(raw: dict[str, object]) -> None:
        raw["splits"] = {"../x": raw["splits"]["train"]}  # type: ignore[index]
        raw["num_samples"] = raw["splits"]["../x"]["num_samples"]  # type: ignore[index]

    copy = _tampered(exported, tmp_path, rename)
    with pytest.raises(SchemaError, match=r"splits: unsafe split name '\.\./x'"):
        shardex.open_dataset(copy)
    with pytest.raises(ConfigError, match=r"split '\.\./x' is not in this export"):
        shardex.open_dataset(exported, split="../x")


def test_split_names_of_the_export_files_are_refused(tmp_path: Path) -> None:
    # a split folder named like a top-level file of the export would block that file
    for name in ("metadata.2.parquet", "Errors.parquet", "config.yaml", "metadata.pending.parquet"):
        with pytest.raises(ConfigError, match=r"is the name of a file of the export"):
            ExportOptions(split_fractions={name: 0.5, "train": 0.5})


def test_exports_with_split_names_older_rules_allowed_still_open(
    exported: Path, tmp_path: Path
) -> None:
    def rename(raw: dict[str, object]) -> None:
        splits: dict[str, object] = raw["splits"]  # type: ignore[assignment]
        raw["splits"] = {("my split" if k == "train" else k): v for k, v in splits.items()}

    copy = _tampered(exported, tmp_path, rename)
    (copy / "train").rename(copy / "my split")
    text = (copy / "config.yaml").read_text().replace("train/", "my split/")
    (copy / "config.yaml").write_text(text)
    ds = shardex.open_dataset(copy, split="my split")
    assert len(ds) == len(shardex.open_dataset(exported, split="train"))
    assert ds[0] == shardex.open_dataset(exported, split="train")[0]


def test_the_writer_refuses_a_config_that_breaks_its_schema(exported: Path) -> None:
    config = shardex.read_config(exported)
    validate(yaml.safe_load(config.to_yaml()))  # a normal export passes its own schema
    for bad in (
        dataclasses.replace(config, metadata_file="../m.parquet"),
        dataclasses.replace(config, splits={"../x": config.splits["train"]}),
    ):
        with pytest.raises(SchemaError, match=r"config.yaml to be written"):
            bad.to_yaml()
    assert isinstance(ExportConfig.from_yaml(config.to_yaml()), ExportConfig)


def test_schema_patterns_match_the_python_rules() -> None:
    defs = schema()["definitions"]
    split_re = re.compile(defs["split_name"]["pattern"].replace("$", r"\Z"))
    path_re = re.compile(defs["relpath"]["pattern"].replace("$", r"\Z"))
    names = [*HOSTILE_SPLITS, "train", "val-1", "v1.0", "A_b", "train\n", "x" * MAX_SPLIT_NAME]
    names += ["my split", "café", "x" * 255, "x" * 256, "..", "."]
    for name in names:
        in_schema = split_re.search(name) is not None
        assert in_schema == (stored_split_name_problem(name) is None), name
    for path in [*BAD_PATHS, "train/x.tar", "a", "a/b/c.npy", "..a/b", "a./b", "a/b/", "a\n"]:
        assert (path_re.search(path) is not None) == (relpath_problem(path) is None), path


# --- hypothesis: generated hostile names ------------------------------------------------------

SPECIAL = st.sampled_from(["", ".", "..", "/", "\\", "\n", "\x00", "\x1b", "\u2028", "é", "ü", "a"])
HOSTILE = st.one_of(
    st.text(max_size=12),
    st.lists(SPECIAL, max_size=8).map("".join),
    st.text(st.sampled_from("./\\a\n"), max_size=10),
    st.integers(150, 400).map(lambda n: "s" * n),
)
BOUNDED = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _export_in_sandbox(make: Callable[[Path], object], **options: object) -> None:
    """Export what ``make(sandbox)`` returns; it either succeeds with every new file inside
    the output, or fails with a one-line ShardexError and leaves nothing anywhere."""
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp)
        source = make(sandbox)
        out = sandbox / "a" / "b" / "out"
        before, root_before = _walk(sandbox), _fs_root()
        try:
            config = shardex.export(source, out, workers=1, **options)  # type: ignore[arg-type]
        except Exception as exc:  # the type is what is checked
            _assert_one_line(exc)
            assert _outside(sandbox, out, before) == set()
        else:
            assert _outside(sandbox, out, before) == set()
            for name in config.splits:
                assert split_name_problem(name) is None
            validate(yaml.safe_load((out / "config.yaml").read_text()))
        assert _fs_root() == root_before


@BOUNDED
@given(split=HOSTILE, on_error=st.sampled_from(["error", "skip"]))
def test_generated_table_split_values(split: str, on_error: str) -> None:
    _export_in_sandbox(lambda s: _table(s / "src", [split, "train"]), on_error=on_error)


@BOUNDED
@given(name=HOSTILE)
def test_generated_split_fraction_names(name: str) -> None:
    def make(sandbox: Path) -> Path:
        for i in range(2):
            write_image(sandbox / "src" / f"img{i}.jpg", i)
        return sandbox / "src"

    _export_in_sandbox(make, split_fractions={name: 0.5, "other": 0.5})


@BOUNDED
@given(key=HOSTILE, on_error=st.sampled_from(["error", "skip"]))
def test_generated_table_keys(key: str, on_error: str) -> None:
    def make(sandbox: Path) -> Path:
        src = sandbox / "src"
        src.mkdir()
        for i in range(2):
            write_image(src / f"img{i}.jpg", i)
        table = {"path": ["img0.jpg", "img1.jpg"], "key": [key, "ok"]}
        pq.write_table(pa.table(table), src / "t.parquet")
        return src / "t.parquet"

    _export_in_sandbox(make, on_error=on_error)


@BOUNDED
@given(
    name=st.text(
        st.characters(exclude_categories=("Cs",), exclude_characters="/\x00"),
        min_size=1,
        max_size=60,
    )
)
def test_generated_file_names(name: str) -> None:
    def make(sandbox: Path) -> Path:
        src = sandbox / "src"
        src.mkdir()
        write_image(src / "ok.jpg", 0)
        if name not in (".", "..") and len(name.encode()) < 240:
            (src / f"{name}.jpg").write_bytes(image_bytes(1))
        return src

    _export_in_sandbox(make, on_error="skip")


class _SplitStage(Stage):
    """Sets ``split`` per sample: a safe name, a path out of the export, or none at all."""

    name: ClassVar[str] = "test_hostile_split"
    produces = ("split",)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            pick = sum(sample["key"].encode()) % 3
            if pick < 2:
                sample["split"] = ("train", "../../evil")[pick]
        return batch


def test_pipeline_split_values_are_checked_like_any_source(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    before = _walk(tmp_path)
    steps = [ReaderStage("demo:30", batch_size=7), _SplitStage()]
    with pytest.raises(BadSampleError, match=r"unsafe split name '\.\./\.\./evil'|no split"):
        Pipeline("p", [*steps, ImageWriterStage(out)]).run(LocalExecutor(1))
    assert _walk(tmp_path) == before
    config = Pipeline("p", [*steps, ImageWriterStage(out, on_error="skip")]).run(LocalExecutor(1))
    assert _outside(tmp_path, out, before) == set()
    assert list(config.splits) == ["train"]
    reasons = [e["reason"] for e in pq.read_table(out / "errors.parquet").to_pylist()]
    assert config.num_samples + len(reasons) == 30
    assert any("unsafe split name '../../evil'" in r for r in reasons)
    assert any("no split (null)" in r for r in reasons)


def test_field_names_that_cannot_name_files_fail_before_writing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        write_image(src / f"img{i}.jpg", i)
    columns = {"path": ["img0.jpg", "img1.jpg"], "a\nb": [[1.0, 2.0], [3.0, 4.0]]}
    pq.write_table(pa.table(columns), src / "t.parquet")
    before = _walk(tmp_path)
    with pytest.raises(ConfigError, match=r"field names \['a\\nb'\] cannot name files") as info:
        shardex.export(src / "t.parquet", tmp_path / "out", backend="numpy", x_keys=("a\nb",))
    _assert_one_line(info.value)
    assert _walk(tmp_path) == before  # refused before any array was written


@pytest.mark.parametrize("gone", [False, True], ids=["changed", "removed"])
def test_a_file_that_changes_before_it_is_read_is_named_on_one_line(
    tmp_path: Path, gone: bool
) -> None:
    # the array backends read members with MemberReader: a file named with a newline that
    # changed (or went) since the scan is refused in one line, as the tar writer does
    from shardex.errors import BadSampleError
    from shardex.storage.fetch.bytes import MemberReader

    path = tmp_path / "a\nb.npy"
    path.write_bytes(b"12345")
    member = {"ext": "npy", "path": str(path), "offset": 0, "size": 9, "data": None}
    if gone:
        path.unlink()
    reader = MemberReader()
    try:
        with pytest.raises(BadSampleError) as caught:
            reader.read(member)
    finally:
        reader.close()
    assert "\n" not in str(caught.value)
    assert "a\\nb.npy" in str(caught.value)
