"""Staged parts (``shardex.storage.staging``, ``shardex.engine.parts``): what the tasks of an export on Ray or of
``write_shardex`` stage under ``.shardex-staging/`` before the commit. A part that cannot
be read says so, a merge that fails keeps no thread, and what a killed run staged goes
with the next export, whatever runs it."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

import shardex
from helpers import make_tree
from shardex.engine.parts import MetadataJob, write_metadata
from shardex.errors import ExportError, FormatError, ObjectNotFoundError
from shardex.storage import LocalStorage, open_storage
from shardex.storage.staging import new_staging, put_part, read_part

RELS = [
    f"{split}/{cls}/img{i:02d}.jpg" for split in ("train", "val") for cls in "ab" for i in range(5)
]


def test_a_part_that_cannot_be_read_is_a_storage_error_not_a_foreign_file(
    tmp_path: Path,
) -> None:
    """A staged part gone (or a store that fails) is said as such, not as a file another
    process wrote; bytes that are no part are a one-line FormatError."""
    storage = LocalStorage(tmp_path / "out")
    name = put_part(storage, new_staging(), pa.table({"a": [1]}), {})
    storage.delete(name)
    with pytest.raises(ObjectNotFoundError):
        read_part(storage, name)
    storage.put(name, b"PK\x03\x04 not a zip file at all")
    with pytest.raises(FormatError, match="not a staged part"):
        read_part(storage, name)


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


#: What killed runs left in their staging folder, by who ran them.
KILLED_RUNS = {
    # an export on Ray: a part of its tasks
    "ray": ["0123456789ab/part-0123456789abcdef.npz"],
    # write_shardex: the rows and the dataset's bytes its write tasks staged
    "write_shardex": [
        "0123456789ab/task-000000-0123abcd.bin",
        "0123456789ab/task-000000-0123abcd.parquet",
    ],
}


@pytest.mark.parametrize("run", list(KILLED_RUNS))
def test_what_a_killed_run_staged_goes_with_a_local_export(tmp_path: Path, run: str) -> None:
    """A killed run's staged files go with the next export (here a local one), not only
    with the next run of the same kind."""
    make_tree(tmp_path / "src", RELS)
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    staged = [out / ".shardex-staging" / name for name in KILLED_RUNS[run]]
    for path in staged:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"what a killed {run} run staged".encode())
    shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1, mode="overwrite")
    assert [p for p in staged if p.exists()] == []
    assert not (out / ".shardex-staging").exists()
