"""Shard lists (``S/shards.wids.json``, ``S/shards.txt``): read by the real wids and
webdataset, relative to their folder, replaced with the export, checked by verify."""

from __future__ import annotations

import gc
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

import shardex
from helpers import labelled_images
from shardex.testing.data import make_image

pytest.importorskip("wids")


def _export(out: Path, n: int = 30, **options: Any) -> shardex.ExportConfig:
    defaults = {"samples_per_shard": 8, "workers": 1, "split_fractions": {"train": 0.7, "val": 0.3}}
    return shardex.export(labelled_images(n), out, **{**defaults, **options})


def _by_wids(index: Path, cache: Path) -> dict[str, bytes]:
    import wids

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # wids leaves its files to gc
        ds = wids.ShardListDataset(str(index), transformations=[], cache_dir=str(cache))
        got = {(s := ds[i])["__key__"]: s[".jpg"].read() for i in range(len(ds))}
        ds.close()
        del ds, s
        gc.collect()
    return got


def _by_webdataset(root: Path, listing: Path) -> dict[str, bytes]:
    import webdataset as wds

    folder = listing.parent.relative_to(root)
    urls = [str(root / folder / name) for name in listing.read_text().split()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves its files to gc
        got = {s["__key__"]: s["jpg"] for s in wds.WebDataset(urls, shardshuffle=False)}
        gc.collect()
    return got


def _expected(out: Path, split: str) -> dict[str, bytes]:
    return {s["__key__"]: s["jpg"] for s in shardex.open_dataset(out, split=split)}


@pytest.mark.parametrize("split", ["train", "val"])
def test_wids_and_webdataset_read_each_split_from_its_lists(split: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = _export(out)
    want = _expected(out, split)
    assert len(want) == config.split(split).num_samples
    assert _by_wids(out / split / "shards.wids.json", tmp_path / "cache") == want
    assert _by_webdataset(out, out / split / "shards.txt") == want
    index = json.loads((out / split / "shards.wids.json").read_text())
    assert index["__kind__"] == "wids-shard-index-v1"
    assert [s["url"] for s in index["shardlist"]] == (
        out / split / "shards.txt"
    ).read_text().split()
    assert sum(s["nsamples"] for s in index["shardlist"]) == len(want)


def test_lists_name_shards_relative_to_their_folder(tmp_path: Path) -> None:
    """A moved export keeps working lists (the tar names are not absolute)."""
    _export(tmp_path / "out")
    want = _expected(tmp_path / "out", "train")
    shutil.move(tmp_path / "out", tmp_path / "moved")
    moved = tmp_path / "moved"
    assert _by_wids(moved / "train" / "shards.wids.json", tmp_path / "cache") == want
    assert _by_webdataset(moved, moved / "train" / "shards.txt") == want
    assert shardex.verify(moved).ok


def test_overwrite_and_append_replace_the_lists(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = shardex.export(labelled_images(20), out, samples_per_shard=8, workers=1)
    old = (out / "train" / "shards.txt").read_text().split()
    shardex.export(
        labelled_images(12, first=100), out, samples_per_shard=5, workers=1, mode="overwrite"
    )
    new = (out / "train" / "shards.txt").read_text().split()
    assert set(new).isdisjoint(old)  # the replaced export's tars are gone, and so are they
    assert not any((out / "train" / name).exists() for name in old)
    assert _by_wids(out / "train" / "shards.wids.json", tmp_path / "c1") == _expected(out, "train")
    appended = shardex.export(
        labelled_images(9, first=200), out, samples_per_shard=5, workers=1, mode="append"
    )
    listed = (out / "train" / "shards.txt").read_text().split()
    assert listed[: len(new)] == new
    assert len(listed) == len(appended.split("train").shards) > len(new)
    got = _by_wids(out / "train" / "shards.wids.json", tmp_path / "c2")
    assert len(got) == 21 == len(_expected(out, "train"))
    assert shardex.verify(out).ok
    assert first.num_samples == 20


def test_verify_reports_a_list_that_differs_from_config(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _export(out)
    listing = out / "val" / "shards.txt"
    listing.write_text(listing.read_text() + "images-000000000000-000009.tar\n")
    report = shardex.verify(out)
    assert [(p.file, p.kind) for p in report.problems] == [("val/shards.txt", "list")]
    (out / "train" / "shards.wids.json").unlink()
    assert ("train/shards.wids.json", "missing") in [
        (p.file, p.kind) for p in shardex.verify(out).problems
    ]


def test_array_backends_write_no_lists(tmp_path: Path) -> None:
    import numpy as np

    shardex.export({"image": np.zeros((4, 2, 2), np.uint8)}, tmp_path / "o", backend="numpy_mmap")
    assert not list((tmp_path / "o").rglob("shards.*"))


KILLED_AFTER_COMMIT = """
import os, signal, sys
import shardex
from shardex.storage import LocalStorage
from shardex.testing.data import make_image

n = int(sys.argv[2])
data = {"jpg": [make_image(i) for i in range(n)], "key": [f"{i:06d}" for i in range(n)]}

class Killing(LocalStorage):
    committed = False
    def put(self, path, data):
        if Killing.committed and path.endswith("shards.txt"):
            os.kill(os.getpid(), signal.SIGKILL)  # the new config.yaml is in, the lists not
        super().put(path, data)
        Killing.committed |= path == "config.yaml"

shardex.export(data, Killing(sys.argv[1]), workers=1, samples_per_shard=4, mode="overwrite")
"""


def test_an_overwrite_killed_between_commit_and_lists_is_finished(tmp_path: Path) -> None:
    """Killed (SIGKILL) after its config.yaml commits and before the lists are replaced:
    the lists still name the replaced export's tars, every one of them still whole, and
    running the command again replaces the lists and deletes those tars."""
    import subprocess
    import sys

    out = tmp_path / "out"
    shardex.export(
        {"jpg": [make_image(i) for i in range(10)], "key": [f"{i:06d}" for i in range(10)]},
        out,
        workers=1,
        samples_per_shard=4,
    )
    old = _by_webdataset(out, out / "train" / "shards.txt")
    child = subprocess.run([sys.executable, "-c", KILLED_AFTER_COMMIT, str(out), "14"], timeout=120)
    assert child.returncode == -9
    assert shardex.read_config(out).num_samples == 14
    assert _by_webdataset(out, out / "train" / "shards.txt") == old  # the old export, whole
    assert shardex.verify(out).ok  # a writer's window (its intent file is there)
    data = {"jpg": [make_image(i) for i in range(14)], "key": [f"{i:06d}" for i in range(14)]}
    shardex.export(data, out, workers=1, samples_per_shard=4, mode="overwrite")  # the same command
    assert _by_webdataset(out, out / "train" / "shards.txt") == _expected(out, "train")
    assert len(_expected(out, "train")) == 14
    listed = (out / "train" / "shards.txt").read_text().split()
    assert sorted(p.name for p in (out / "train").glob("*.tar")) == sorted(listed)
    assert not (out / ".shardex-intent.json").exists()
    assert shardex.verify(out).ok
