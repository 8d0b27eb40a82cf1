"""``layout="flat"`` (``--layout flat``): one split's files at the output's top level, as
NeMo Curator's ImageWriterStage writes ``$output/images-*.tar``; every reader, verify,
re-export and the modes handle it; what cannot be flat is refused before anything is
written."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

import shardex
from helpers import labelled_images
from shardex.cli import main
from shardex.errors import ConfigError, OutputExistsError
from shardex.pipeline import ImageWriterStage, LocalExecutor, Pipeline, ReaderStage
from shardex.testing.data import make_image, make_sample_folder

#: The columns NeMo Curator's ImageWriterStage writes beside each tar.
NEMO_COLUMNS = ("image_id", "tar_file", "member_name", "original_path", "metadata")


def _flat(out: Path, n: int = 20, **options: Any) -> shardex.ExportConfig:
    defaults = {"samples_per_shard": 8, "workers": 1, "layout": "flat"}
    return shardex.export(labelled_images(n), out, **{**defaults, **options})


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_flat_export_keeps_nemo_globs_working(tmp_path: Path) -> None:
    import webdataset as wds

    out = tmp_path / "out"
    config = _flat(out)
    assert config.flat
    assert yaml.safe_load((out / "config.yaml").read_text())["shard_options"]["layout"] == "flat"
    assert not [p for p in out.iterdir() if p.is_dir()]  # no split folder
    tars = sorted(out.glob("images-*.tar"))
    assert [p.name for p in tars] == [s.path for s in config.split("train").shards]
    sidecars = pq.read_table(sorted(out.glob("images-*.parquet")))
    assert sidecars.num_rows == 20
    assert set(NEMO_COLUMNS) <= set(sidecars.column_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its files to gc
        stream = {
            s["__key__"]: s["jpg"]
            for s in wds.WebDataset([str(p) for p in tars], shardshuffle=False)
        }
        gc.collect()
    ds = shardex.open_dataset(out)  # the only split
    want = labelled_images(20)
    assert (
        stream
        == {s["__key__"]: s["jpg"] for s in ds}
        == dict(zip(want["key"], want["jpg"], strict=True))
    )
    assert ds.get("000007")["jpg"] == make_image(7)
    assert shardex.verify(out).ok
    assert (out / "shards.txt").read_text().split() == [p.name for p in tars]
    inspected = CliRunner().invoke(main, ["inspect", str(out)])
    assert f"wids.ShardListDataset({str(out / 'shards.wids.json')!r})" in inspected.output


def test_torch_loader_reads_a_flat_export(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from shardex.torch import MapDataset

    out = tmp_path / "out"
    _flat(out, n=12)
    ds = MapDataset(str(out), "train", decode=False)
    assert sorted(item["__key__"] for item in (ds[i] for i in range(len(ds)))) == [
        f"{i:06d}" for i in range(12)
    ]


def test_a_flat_export_re_exports_into_split_folders(tmp_path: Path) -> None:
    _flat(tmp_path / "flat")
    again = shardex.export(tmp_path / "flat", tmp_path / "split", workers=1)
    assert not again.flat
    assert {p.name for p in (tmp_path / "split").iterdir() if p.is_dir()} == {"train"}
    got = {s["__key__"]: s["jpg"] for s in shardex.open_dataset(tmp_path / "split")}
    assert got == {s["__key__"]: s["jpg"] for s in shardex.open_dataset(tmp_path / "flat")}


def test_overwrite_and_append_keep_a_flat_export_flat(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _flat(out)
    old = set(_files(out))
    replaced = shardex.export(
        labelled_images(11, first=100),
        out,
        samples_per_shard=4,
        workers=1,
        mode="overwrite",
        layout="flat",
    )
    now = _files(out)
    old_shards = {p for s in first.split("train").shards for p in (s.path, s.metadata)}
    assert not (old_shards & now)  # the replaced export's tars and sidecars are gone
    assert now - {"config.yaml"} == set(shardex.exporter.export_files(replaced))
    assert old - now  # (and something changed)
    appended = shardex.export(
        labelled_images(5, first=200), out, samples_per_shard=4, workers=1, mode="append"
    )
    assert appended.flat  # append follows the export's layout
    assert len(shardex.open_dataset(out)) == 16
    assert not [p for p in out.iterdir() if p.is_dir()]
    assert shardex.verify(out).ok


def test_more_than_one_split_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="layout='flat' holds one split"):
        shardex.ExportOptions(layout="flat", split_fractions={"train": 0.5, "val": 0.5})
    with pytest.raises(ConfigError, match="layout='flat' holds one split"):
        ImageWriterStage(tmp_path / "w", layout="flat", splits=("train", "val"))
    source = tmp_path / "src"
    for split in ("train", "val"):
        (source / split / "cat").mkdir(parents=True)
        (source / split / "cat" / "a.jpg").write_bytes(make_image(1))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"gives 2 \('train', 'val'\)"):
        shardex.export(source, out, layout="flat", workers=1)
    assert not out.exists() or not _files(out)
    _flat(out)
    with pytest.raises(ConfigError, match="holds one split"):  # an append may not add one
        shardex.export(source, out, mode="append", splits=("val",), workers=1)
    assert shardex.verify(out).ok


def test_backends_that_cannot_be_flat_are_refused_at_the_start(tmp_path: Path) -> None:
    import numpy as np

    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="zarr backend cannot write layout='flat'"):
        shardex.export({"image": np.zeros((3, 2, 2), np.uint8)}, out, backend="zarr", layout="flat")
    assert not out.exists() or not _files(out)


def test_a_nemo_output_folder_is_not_taken_for_a_flat_export(tmp_path: Path) -> None:
    """NeMo's files carry a flat export's names, but no config.yaml: they are not shardex's."""
    out = tmp_path / "nemo"
    out.mkdir()
    nemo = {
        "images-0123456789ab-000000.tar": b"x" * 1024,
        "images-0123456789ab-000000.parquet": b"PAR1",
    }
    for name, data in nemo.items():
        (out / name).write_bytes(data)
    with pytest.raises(OutputExistsError, match="did not write"):
        _flat(out, mode="overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == nemo


def test_cli_layout_flat(tmp_path: Path) -> None:
    folder = make_sample_folder(tmp_path / "src", 9)
    runner = CliRunner()
    out = tmp_path / "out"
    done = runner.invoke(
        main, ["export-dataset", str(folder.root), "-o", str(out), "--layout", "flat", "-q"]
    )
    assert done.exit_code == 0, done.output
    assert len(list(out.glob("images-*.tar"))) == 1
    assert shardex.read_config(out).flat
    split = runner.invoke(
        main,
        [
            "export-dataset",
            str(folder.root),
            "-o",
            str(tmp_path / "two"),
            "--layout",
            "flat",
            "--split-fractions",
            "train=0.5,val=0.5",
            "-q",
        ],
    )
    assert split.exit_code != 0
    assert "holds one split" in split.output


def test_image_writer_stage_writes_flat(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writer = ImageWriterStage(out, images_per_tar=10, layout="flat")
    config = Pipeline("flat", [ReaderStage("demo:25", batch_size=9), writer]).run(LocalExecutor(1))
    assert config.flat
    assert sorted(p.name for p in out.glob("images-*.tar")) == [
        s.path for s in config.split(next(iter(config.splits))).shards
    ]
    assert len(shardex.open_dataset(out)) == 25


# An export that SIGKILLs itself once it has written its second tar (a real kill, no mock).
KILLED_AFTER_SECOND_TAR = """
import os, signal, sys
import shardex
from shardex.storage import LocalStorage

class Killing(LocalStorage):
    tars = 0
    def open_writer(self, path):
        if path.endswith(".tar"):
            Killing.tars += 1
            if Killing.tars == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().open_writer(path)

shardex.export(sys.argv[1], Killing(sys.argv[2]), workers=1, samples_per_shard=4, layout="flat")
"""


@pytest.mark.parametrize("layout", ["split", "flat"])
def test_foreign_top_level_files_beside_a_split_export_are_kept(
    tmp_path: Path, layout: str
) -> None:
    """A split-folder export does not make the top level shardex's: NeMo's tars (named like
    a flat export's) and a user's shards.txt beside it refuse an overwrite, flat or not,
    and stay as they are."""
    out = tmp_path / "out"
    shardex.export(labelled_images(10), out, workers=1)
    theirs = {"images-0123456789ab-000000.tar": b"x" * 1024, "shards.txt": b"my notes\n"}
    for name, data in theirs.items():
        (out / name).write_bytes(data)
    before = {p: (out / p).read_bytes() for p in _files(out)}
    with pytest.raises(OutputExistsError, match="did not write"):
        shardex.export(labelled_images(12), out, workers=1, mode="overwrite", layout=layout)
    assert {p: (out / p).read_bytes() for p in _files(out)} == before


def test_overwrites_between_layouts_leave_only_the_new_export(tmp_path: Path) -> None:
    """flat -> split -> flat: each overwrite deletes the other layout's files."""
    out = tmp_path / "out"
    _flat(out, 10)
    shardex.export(labelled_images(10), out, workers=1, mode="overwrite")
    assert not list(out.glob("images-*"))
    assert not (out / "shards.txt").exists()
    assert shardex.verify(out).ok
    _flat(out, 10, mode="overwrite")
    assert not (out / "train").exists()
    assert shardex.verify(out).ok
    assert len(list(shardex.open_dataset(out))) == 10


def test_a_killed_flat_export_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    import subprocess
    import sys

    folder = make_sample_folder(tmp_path / "src", 14)
    shardex.export(
        str(folder.table), tmp_path / "whole", workers=1, samples_per_shard=4, layout="flat"
    )
    out = tmp_path / "out"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_SECOND_TAR, str(folder.table), str(out)], timeout=120
    )
    assert child.returncode == -9
    assert not (out / "config.yaml").exists()
    assert list(out.glob("images-*.tar"))  # top-level files of an export at work
    with pytest.raises(OutputExistsError, match="unfinished export"):
        shardex.export(str(folder.table), out, workers=1, samples_per_shard=4, layout="flat")
    shardex.export(
        str(folder.table), out, workers=1, samples_per_shard=4, layout="flat", mode="resume"
    )
    whole = {p: (tmp_path / "whole" / p).read_bytes() for p in _files(tmp_path / "whole")}
    assert {p: (out / p).read_bytes() for p in _files(out)} == whole
