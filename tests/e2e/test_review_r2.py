"""Defects found in review round 2: what an export's checks may delete or let pass in its
output, the threads a failed merge keeps, a killed reader's download folders, and a Ray
address where something other than Ray answers."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import shardex
from helpers import files_of, image_bytes, make_tree
from shardex.engine.parts import MetadataJob, new_staging, put_part, write_metadata
from shardex.errors import ExportError, OutputExistsError
from shardex.storage import open_storage

RELS = [
    f"{split}/{cls}/img{i:02d}.jpg" for split in ("train", "val") for cls in "ab" for i in range(3)
]


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    make_tree(tmp_path / "src", RELS)
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    return tmp_path / "src", out


# -- 1. check_output deleted every temporary-named file of the output -------------------


@pytest.mark.parametrize(
    "name", [".notes.txt.tmp-1a2b", "reports/.summary.csv.tmp-77", "train/.my.json.tmp-0"]
)
@pytest.mark.parametrize("mode", ["overwrite", "resume", "error"])
def test_a_users_file_named_like_an_unfinished_write_is_refused_and_kept(
    exported: tuple[Path, Path], name: str, mode: str
) -> None:
    """A program of the user's writing ``NAME`` the way shardex does (``.NAME.tmp-X``)
    leaves a file the old check deleted with every overwrite; now it is a foreign file."""
    src, out = exported
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(b"the user's half-written file")
    before = files_of(out)
    with pytest.raises(OutputExistsError) as refused:
        shardex.export(src, out, samples_per_shard=4, workers=1, mode=mode)
    message = str(refused.value)
    assert "\n" not in message
    assert f"'{name}'" in message, message
    assert "did not write" in message, message
    assert files_of(out) == before  # the user's file and the committed export


def test_a_killed_exports_unfinished_writes_still_go(exported: tuple[Path, Path]) -> None:
    src, out = exported
    shard = sorted((out / "train").glob("images-*.tar"))[0]
    left = shard.with_name(f".{shard.name}.tmp-0badf00d")  # a write a kill cut short
    left.write_bytes(b"half a tar")
    shardex.export(src, out, samples_per_shard=4, workers=1, mode="overwrite")
    assert not left.exists()
    assert shardex.verify(out).ok


# -- 2. a user's own .shardex-staging/ ---------------------------------------------------


@pytest.mark.parametrize(
    "name", [".shardex-staging/notes.txt", ".shardex-staging/images-0123abcd-000000.tar"]
)
def test_a_users_own_staging_folder_is_foreign(tmp_path: Path, name: str) -> None:
    make_tree(tmp_path / "src", RELS)
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_bytes(b"mine")
    with pytest.raises(OutputExistsError) as refused:
        shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    assert f"'{name}'" in str(refused.value)
    assert files_of(out) == {name: b"mine"}  # nothing written, nothing deleted


def test_a_users_staging_folder_beside_an_export_survives_an_overwrite(
    exported: tuple[Path, Path],
) -> None:
    src, out = exported
    mine = out / ".shardex-staging" / "train" / "images-0123abcd-000000.tar"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"mine")
    with pytest.raises(OutputExistsError, match="shardex-staging"):
        shardex.export(src, out, samples_per_shard=4, workers=1, mode="overwrite")
    assert mine.read_bytes() == b"mine"


# -- 3. the threads of a failed merge ----------------------------------------------------


def test_a_failed_merge_leaves_no_thread_behind_while_its_error_is_held(tmp_path: Path) -> None:
    """A merge that fails part-way (the rows' columns differ) raises; the caller holds the
    error (its traceback holds the merge's frame): no reading thread may stay alive."""
    storage = open_storage(tmp_path / "out")
    staging = new_staging()
    names = [put_part(storage, staging, pa.table({"k": [i]}), {}) for i in range(9)]
    names.insert(2, put_part(storage, staging, pa.table({"k": ["text"]}), {}))
    before = set(threading.enumerate())
    job = MetadataJob(storage, "metadata.parquet", tuple(("part", n) for n in names))
    with pytest.raises(ExportError, match="columns differ") as failed:
        write_metadata(job)
    assert failed.value.__traceback__ is not None  # held, frames and all
    assert [t.name for t in threading.enumerate() if t not in before] == []
    assert not (tmp_path / "out" / "metadata.parquet").exists()


def test_a_users_own_staging_folder_on_object_storage_is_foreign(tmp_path: Path, s3: Any) -> None:
    make_tree(tmp_path / "src", RELS)
    out = open_storage(s3.child("out"), s3.direct)
    name = ".shardex-staging/0123456789ab/notes.txt"  # a run's folder, not a name it stages
    out.put(name, b"mine")
    with pytest.raises(OutputExistsError, match=re.escape(repr(name))):
        shardex.export(tmp_path / "src", s3.child("out"), storage_options=s3.direct, workers=1)
    assert list(out.list()) == [name]
    assert out.get(name) == b"mine"
