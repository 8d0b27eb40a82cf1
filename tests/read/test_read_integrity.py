"""Read-side integrity: every read path binds an index record to its sample, files the
config names are checksummed, missing files give shardex errors naming them, the key table
is checked, `shardex verify` exits cleanly, and readers during an overwrite fail with one
clear error, never with wrong bytes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import shardex
from shardex.errors import (
    ChecksumError,
    ExportReplacedError,
    FormatError,
    ObjectNotFoundError,
    SampleNotFoundError,
)
from shardex.testing import make_sample_folder
from shardex.verification import verify


def _config(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / "config.yaml").read_text())  # type: ignore[no-any-return]


def _write_config(root: Path, raw: dict[str, Any]) -> None:
    (root / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _samples_file(root: Path) -> Path:
    return root / "train" / "index-samples.npy"


def _swap_records(root: Path, i: int, j: int) -> None:
    path = _samples_file(root)
    rec = np.load(path)
    rec[[i, j]] = rec[[j, i]]
    np.save(path, rec)


def _raw(root: Path) -> list[dict[str, Any]]:
    return list(shardex.open_dataset(root))


# ---------------------------------------------------------------- 1. records bound to samples


@pytest.mark.parametrize("pair", [(1, 2), (3, 20)], ids=["same-shard", "other-shard"])
def test_swapped_index_records_fail_every_read_path(export: Path, pair: tuple[int, int]) -> None:
    """Two swapped 24-byte records: each read of either sample raises ChecksumError naming
    the shard, the byte offset and the sample number expected; others still read."""
    i, j = pair
    before = _raw(export)
    _swap_records(export, i, j)
    ds = shardex.open_dataset(export)
    for n in (i, j):
        with pytest.raises(ChecksumError, match=rf"sample {n} at byte \d+ of .*\.tar"):
            ds[n]
    with pytest.raises(ChecksumError, match=rf"sample ({i}|{j}) "):
        ds.get_many([0, i, 5])
    with pytest.raises(ChecksumError, match=rf"sample {i} "):
        list(ds)
    assert ds[0] == before[0]
    assert ds.get_many([0, 5]) == [before[0], before[5]]
    skipping = shardex.open_dataset(export, on_error="skip")
    read = list(skipping)
    assert sorted(n for n, _ in skipping.skipped) == [i, j]
    assert read == [s for k, s in enumerate(before) if k not in (i, j)]
    assert not verify(export).ok


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(i=st.integers(0, 29), j=st.integers(0, 29), swap=st.booleans())
def test_any_record_moved_to_another_position_fails_its_read(
    export: Path, i: int, j: int, swap: bool
) -> None:
    """A record copied over another, or two swapped: the read at the moved position raises
    ChecksumError naming that sample, whatever the positions (same shard or not)."""
    assume(i != j)
    path = _samples_file(export)
    original = np.load(path)
    rec = original.copy()
    rec[i] = original[j]
    if swap:
        rec[j] = original[i]
    np.save(path, rec)
    try:
        ds = shardex.open_dataset(export)
        with pytest.raises(ChecksumError, match=rf"sample {i} "):
            ds[i]
        with pytest.raises(ChecksumError, match=rf"sample {i} "):
            ds.get_many([i])
        if not swap:  # the copied record still reads at its own position
            assert ds[j]["__key__"]
    finally:
        np.save(path, original)


def test_swapped_records_fail_through_torch(export: Path) -> None:
    torch_map = pytest.importorskip("shardex.torch.map", exc_type=ImportError)  # no torch
    _swap_records(export, 1, 2)
    ds = torch_map.MapDataset(export, decode=False)
    with pytest.raises(ChecksumError, match="sample 1 "):
        ds[1]
    with pytest.raises(ChecksumError, match=r"sample [12] "):
        ds.__getitems__([0, 2])
    assert ds[0]["__key__"]


def _as_format_1(root: Path) -> None:
    """Rewrite an export as format 1 wrote it: unseeded checksums, no file checksums."""
    rec = np.load(_samples_file(root))
    raw = _config(root)
    for shard_no, shard in enumerate(raw["splits"]["train"]["shards"]):
        data = (root / shard["path"]).read_bytes()
        for k in np.flatnonzero(rec["shard"] == shard_no):
            off, length = int(rec["offset"][k]), int(rec["length"][k])
            rec["checksum"][k] = xxhash.xxh3_64_intdigest(data[off : off + length])
        del shard["metadata_checksum"]
    np.save(_samples_file(root), rec)
    raw["format_version"] = 1
    del raw["metadata_checksum"], raw["errors_checksum"]
    (root / raw["splits"]["train"]["index"].pop("members")).unlink()  # from format 3
    _write_config(root, raw)


def test_format_1_exports_still_read_verify_and_append(export: Path, tmp_path: Path) -> None:
    before = _raw(export)
    _as_format_1(export)
    ds = shardex.open_dataset(export)
    assert ds.config.format_version == 1
    assert list(ds) == before
    assert ds[7] == before[7]
    assert ds.get_many([3, 1]) == before[3:0:-2]
    assert ds.metadata.num_rows == 30
    assert verify(export).ok, verify(export).problems
    # an append keeps the export's format: old and new samples read and verify
    more = make_sample_folder(tmp_path / "more", n=40)
    tail = more.table.with_name("tail.parquet")
    pq.write_table(pq.read_table(more.table).slice(30), tail)
    shardex.export(tail, export, workers=1, samples_per_shard=8, mode="append")
    ds = shardex.open_dataset(export)
    assert ds.config.format_version == 1
    assert len(ds) == 40
    assert list(ds)[:30] == before
    assert verify(export).ok, verify(export).problems


def test_new_exports_are_format_3_with_file_checksums(clean: Path) -> None:
    raw = _config(clean)
    assert raw["format_version"] == 3
    assert raw["splits"]["train"]["index"]["members"] == "train/index-members.npy"
    meta = (clean / raw["metadata_file"]).read_bytes()
    assert raw["metadata_checksum"] == f"xxh3_64:{xxhash.xxh3_64_hexdigest(meta)}"
    for shard in raw["splits"]["train"]["shards"]:
        side = (clean / shard["metadata"]).read_bytes()
        assert shard["metadata_checksum"] == f"xxh3_64:{xxhash.xxh3_64_hexdigest(side)}"


# ---------------------------------------------------------------- 2. file checksums


def _problems(root: Path) -> list[str]:
    return [str(p) for p in verify(root).problems]


def _parseable_flip(path: Path) -> int:
    """The first byte whose flip leaves the Parquet file readable (the damage no Parquet
    reader notices, as a flipped bit in a stored value)."""
    data = path.read_bytes()
    for at in range(len(data) - 9, 4, -1):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        try:
            pq.read_table(pa.BufferReader(bytes(damaged)))
        except (pa.ArrowException, OSError):
            continue
        return at
    raise AssertionError(f"no flip of {path} leaves it readable")


def test_flipped_byte_in_a_sidecar_fails_verify(export: Path) -> None:
    side = sorted(export.glob("train/*.parquet"))[1]
    _flip(side, _parseable_flip(side))
    found = _problems(export)
    assert any(side.name in p and "whole-file checksum" in p for p in found), found


def test_flipped_byte_in_metadata_fails_verify_and_reads(export: Path) -> None:
    meta = export / "metadata.parquet"
    _flip(meta, _parseable_flip(meta))
    found = _problems(export)
    assert any("metadata.parquet" in p and "whole-file checksum" in p for p in found), found
    with pytest.raises(ChecksumError, match=r"metadata\.parquet is damaged"):
        _ = shardex.open_dataset(export).metadata


def test_flipped_byte_in_errors_file_fails_verify(tmp_path: Path) -> None:
    folder = make_sample_folder(tmp_path / "src", n=10)
    (folder.table.parent / "images" / "class0" / "0000.jpg").write_bytes(b"not an image")
    out = tmp_path / "out"
    shardex.export(folder.table, out, workers=1, on_error="skip")
    assert _config(out)["errors_checksum"]
    assert verify(out).ok
    _flip(out / "errors.parquet", _parseable_flip(out / "errors.parquet"))
    found = _problems(out)
    assert any("errors.parquet" in p and "whole-file checksum" in p for p in found), found


def test_old_configs_without_checksums_still_load(export: Path) -> None:
    raw = _config(export)
    del raw["metadata_checksum"], raw["errors_checksum"]
    for shard in raw["splits"]["train"]["shards"]:
        del shard["metadata_checksum"]
    _write_config(export, raw)
    assert verify(export).ok
    assert shardex.open_dataset(export).metadata.num_rows == 30


# ---------------------------------------------------------------- 3. missing files


def test_deleted_shard_gives_a_shardex_error_naming_it(export: Path) -> None:
    shard = sorted(export.glob("train/*.tar"))[1]  # samples 8..15
    shard.unlink()
    ds = shardex.open_dataset(export)
    pattern = rf"shard .*{shard.name} of split 'train' does not exist"
    with pytest.raises(ObjectNotFoundError, match=pattern):
        ds[9]
    with pytest.raises(ObjectNotFoundError, match=pattern):
        ds.get_many([0, 9])
    with pytest.raises(ObjectNotFoundError, match=pattern):
        list(ds)
    assert ds[0]["__key__"]
    skipping = shardex.open_dataset(export, on_error="skip")
    assert len(list(skipping)) == 22
    assert [n for n, _ in skipping.skipped] == list(range(8, 16))
    torch_map = pytest.importorskip("shardex.torch.map", exc_type=ImportError)  # no torch
    with pytest.raises(ObjectNotFoundError, match=pattern):
        torch_map.MapDataset(export, decode=False)[9]


def test_deleted_or_corrupt_metadata_gives_a_shardex_error(export: Path) -> None:
    meta = export / "metadata.parquet"
    data = meta.read_bytes()
    meta.unlink()
    with pytest.raises(ObjectNotFoundError, match=r"metadata\.parquet does not exist"):
        _ = shardex.open_dataset(export).metadata
    torch_map = pytest.importorskip("shardex.torch.map", exc_type=ImportError)  # no torch
    with pytest.raises(ObjectNotFoundError, match=r"metadata\.parquet"):
        torch_map.MapDataset(export, decode=False, keys=("score",))[0]
    # a changed byte that leaves the file readable: every reader of it says so
    flipped = bytearray(data)
    flipped[33] ^= 0x01
    meta.write_bytes(bytes(flipped))
    with pytest.raises(ChecksumError, match=r"metadata\.parquet is damaged"):
        _ = shardex.open_dataset(export).metadata
    with pytest.raises(ChecksumError, match=r"metadata\.parquet is damaged"):
        torch_map.MapDataset(export, decode=False, keys=("score",))[0]
    # without a recorded checksum, a file that is not Parquet is a FormatError
    raw = _config(export)
    raw["metadata_checksum"] = None
    _write_config(export, raw)
    meta.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match=r"metadata\.parquet is not a readable metadata"):
        _ = shardex.open_dataset(export).metadata


# ---------------------------------------------------------------- 5. the key table


def _keys_file(root: Path) -> Path:
    return root / "train" / "index-keys.npy"


def test_swapped_key_table_entries_fail_verify_and_get(export: Path) -> None:
    keys = [s["__key__"] for s in _raw(export)]
    table = np.load(_keys_file(export))
    table[:, [3, 4]] = table[:, [4, 3]]  # two whole entries: hashes out of order
    np.save(_keys_file(export), table)
    found = _problems(export)
    assert any("index-keys.npy" in p and "not sorted" in p for p in found), found
    ds = shardex.open_dataset(export)
    hidden = []
    for key in keys:
        try:
            assert ds.get(key)["__key__"] == key
        except FormatError as exc:
            hidden.append(str(exc))
    assert hidden  # the swap hid at least one key, and said so
    assert all("index-keys.npy is damaged" in m for m in hidden)
    with pytest.raises(FormatError, match="out of order"):
        ds.get("no/such/key")


def test_swapped_sample_numbers_in_key_table_fail_verify_and_get(export: Path) -> None:
    keys = [s["__key__"] for s in _raw(export)]
    table = np.load(_keys_file(export))
    table[1, [3, 4]] = table[1, [4, 3]]  # hashes still sorted, pointing at wrong samples
    np.save(_keys_file(export), table)
    found = _problems(export)
    assert any("index-keys.npy" in p and "do not match" in p for p in found), found
    ds = shardex.open_dataset(export)
    wrong = [int(table[1, 3]), int(table[1, 4])]
    for n in wrong:
        key = keys[wrong[0] if n == wrong[1] else wrong[1]]
        with pytest.raises(FormatError, match=r"index-keys\.npy is damaged: it files sample"):
            ds.get(key)


def test_a_missing_key_on_an_intact_table_is_not_found(export: Path) -> None:
    ds = shardex.open_dataset(export)
    with pytest.raises(SampleNotFoundError):
        ds.get("no/such/key")
    assert verify(export).ok


# ---------------------------------------------------------------- 4. verify exits cleanly


def _run_all(cmds: list[list[str]], at_once: int = 4) -> list[tuple[int, str]]:
    """Run commands, ``at_once`` at a time; (exit code, stderr tail) of each."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    results = []
    for k in range(0, len(cmds), at_once):
        procs = [
            subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for c in cmds[k : k + at_once]
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            results.append((proc.returncode, err.decode(errors="replace")[-300:]))
    return results


def test_reading_parquet_from_bytes_never_aborts_at_exit(clean: Path) -> None:
    """A Parquet table read from Python bytes, then the interpreter exits: Arrow's pool
    threads must not hold the bytes (their release at exit took the GIL inside a C++
    destructor and aborted the process in about 2-7% of runs, as `shardex verify` did)."""
    code = (
        "import sys\n"
        "from shardex.api import read_config\n"
        "from shardex.backends.metadata import read_metadata\n"
        "from shardex.storage import open_storage\n"
        "storage = open_storage(sys.argv[1])\n"
        "assert read_metadata(storage, read_config(storage), 'train').num_rows == 30\n"
    )
    results = _run_all([[sys.executable, "-c", code, str(clean)]] * 30)
    assert all(rc == 0 for rc, _ in results), [r for r in results if r[0] != 0][:3]


def test_verify_with_progress_exits_cleanly_every_time(clean: Path) -> None:
    cmd = [sys.executable, "-m", "shardex.cli", "verify", str(clean)]
    results = _run_all([cmd] * 12)
    assert all(rc == 0 for rc, _ in results), [r for r in results if r[0] != 0][:3]


def test_progress_leaves_no_thread_running() -> None:
    """rich's refresh thread is joined when the display stops, not left to run into
    interpreter exit."""
    code = (
        "import threading\n"
        "from shardex.progress import Progress\n"
        "for _ in range(20):\n"
        "    with Progress(True) as bars:\n"
        "        bars.task('x', 3).advance(3)\n"
        "    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]\n"
        "    assert not alive, alive\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- 6. readers during an overwrite


def test_readers_during_an_overwrite_get_old_bytes_or_export_replaced(tmp_path: Path) -> None:
    """Readers of the old export, reading while an overwrite runs, get the old export's
    exact bytes or ExportReplacedError, never another error or other bytes. Afterwards,
    shards they had opened still read (locally the open file outlives its name); every
    other read says the export was replaced. A reader opened afterwards reads the new one."""
    old_src = make_sample_folder(tmp_path / "old", n=60)
    new_src = make_sample_folder(tmp_path / "new", n=90)
    out = tmp_path / "out"
    shardex.export(old_src.table, out, workers=1, samples_per_shard=6)
    expected = _raw(out)
    ds, unread = shardex.open_dataset(out), shardex.open_dataset(out, on_error="skip")
    stop = threading.Event()
    failures: list[BaseException] = []
    replaced: list[ExportReplacedError] = []
    reads = [0]

    def read(seed: int) -> None:  # samples 0..29: shards 0..4 of 10
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            picks = rng.integers(0, 30, size=4).tolist()
            try:
                assert ds[picks[0]] == expected[picks[0]]
                assert ds.get_many(picks) == [expected[i] for i in picks]
                reads[0] += 1
            except ExportReplacedError as exc:
                replaced.append(exc)
            except BaseException as exc:
                failures.append(exc)
            # Without a pause, two reading threads pass the GIL to each other and the
            # export in this thread waits up to seconds for it after each system call
            # (its 0.15 s took 260-460 s): readers still interleave with every step.
            stop.wait(0.0005)

    readers = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in readers:
        t.start()
    try:
        shardex.export(new_src.table, out, workers=1, samples_per_shard=6, mode="overwrite")
        during = reads[0]
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not failures, failures[:3]
    assert during > 0, "no read overlapped the overwrite"
    text = f"export at {out} was replaced since it was opened; reopen it"
    message = re.escape(text)
    assert all(text in str(e) for e in replaced)
    for n in range(30):
        try:
            assert ds[n] == expected[n]
        except ExportReplacedError as exc:  # a shard first opened after its removal
            replaced.append(exc)
    assert all(text in str(e) for e in replaced)
    for attempt in (lambda: ds[45], lambda: ds.get_many([50, 1]), lambda: list(ds)):
        with pytest.raises(ExportReplacedError, match=message):
            attempt()
    with pytest.raises(ExportReplacedError, match=message):  # never skipped over
        list(unread)
    with pytest.raises(ExportReplacedError, match=message):  # metadata.parquet was replaced
        _ = unread.metadata
    fresh = shardex.open_dataset(out)
    assert len(fresh) == 90
    assert len(list(fresh)) == 90
    assert fresh.metadata.num_rows == 90
    assert verify(out).ok


def test_damage_without_a_replacement_is_not_called_a_replacement(export: Path) -> None:
    shard = sorted(export.glob("train/*.tar"))[0]
    ds = shardex.open_dataset(export)
    _flip(shard, 600)  # inside the first sample's data
    with pytest.raises(ChecksumError) as info:
        ds[0]
    assert not isinstance(info.value, ExportReplacedError)
    shard.unlink()
    with pytest.raises(ObjectNotFoundError):
        shardex.open_dataset(export)[0]


def test_on_s3_missing_shards_and_replaced_exports_give_shardex_errors(
    s3: Any, tmp_path: Path
) -> None:
    """On object storage no file handle outlives an overwrite: every read of a removed
    shard says the export was replaced; a shard deleted without a new config is named."""
    from shardex.storage.object import ObjectStorage

    old_src = make_sample_folder(tmp_path / "old", n=24)
    new_src = make_sample_folder(tmp_path / "new", n=30)
    opts = {"storage_options": s3.direct, "workers": 1, "samples_per_shard": 6}
    shardex.export(old_src.table, s3.url, **opts)
    store = ObjectStorage(s3.url, s3.direct)
    ds = shardex.open_dataset(s3.url, storage_options=s3.direct, on_error="skip")
    shard = ds.config.splits["train"].shards[1].path
    expected = ds[7]
    store.delete(shard)
    with pytest.raises(ObjectNotFoundError, match=re.escape(shard)):
        ds[7]
    assert len(list(ds)) == 18
    assert [n for n, _ in ds.skipped] == list(range(6, 12))
    shardex.export(new_src.table, s3.url, mode="overwrite", **opts)
    message = "was replaced since it was opened; reopen it"
    for attempt in (lambda: ds[0], lambda: ds.get_many([0, 13]), lambda: list(ds)):
        with pytest.raises(ExportReplacedError, match=message):
            attempt()
    fresh = shardex.open_dataset(s3.url, storage_options=s3.direct)
    assert len(fresh) == 30
    assert fresh[7]["__key__"] == expected["__key__"]


def test_get_after_two_overwrites_says_replaced_never_a_wrong_answer(tmp_path: Path) -> None:
    """The key table is read by name when first needed; overwrites alternate its names, so
    an export replaced twice names another export's table: ``get`` says the export was
    replaced instead of "no such key" or another table's shape error."""
    srcs = [make_sample_folder(tmp_path / f"src{k}", n=12 - 2 * k) for k in range(3)]
    out = tmp_path / "out"
    shardex.export(srcs[0].table, out, workers=1)
    ds = shardex.open_dataset(out)
    key = ds[1]["__key__"]
    for src in srcs[1:]:
        shardex.export(src.table, out, workers=1, mode="overwrite")
        with pytest.raises(ExportReplacedError, match="reopen it"):
            ds.get(key)
    assert shardex.open_dataset(out).get(key)["__key__"] == key


def test_append_refuses_a_damaged_metadata_file_instead_of_copying_it(tmp_path: Path) -> None:
    src = make_sample_folder(tmp_path / "src", n=12)
    more = make_sample_folder(tmp_path / "more", n=16)
    new_rows = pq.read_table(more.table).slice(12)  # samples the export does not have
    pq.write_table(new_rows, more.table)
    out = tmp_path / "out"
    shardex.export(src.table, out, workers=1)
    _flip(out / "metadata.parquet", 33)  # the file still parses: only its checksum tells
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(ChecksumError, match=r"metadata\.parquet is damaged"):
        shardex.export(more.table, out, workers=1, mode="append")
    assert sorted(p.name for p in out.rglob("*")) == before


@pytest.mark.parametrize("chunk", [1, 700, 5000, 1 << 20])
def test_iteration_in_chunks_reads_what_ds_i_reads_and_catches_damage(
    export: Path, chunk: int
) -> None:
    """Local iteration reads shards a chunk at a time: at any chunk size (smaller than a
    sample, cutting samples, holding a whole shard) it yields exactly the samples ds[i]
    gives, and a flipped byte inside one sample skips that sample alone."""
    ds = shardex.open_dataset(export, on_error="skip")
    ds.read_chunk_size = chunk
    before = [ds[i] for i in range(len(ds))]
    assert list(ds) == before
    offset, _, shard, _ = ds.index.record(9)
    _flip(export / ds._paths[shard], offset + 512 + 3)
    damaged = shardex.open_dataset(export, on_error="skip")
    damaged.read_chunk_size = chunk
    assert list(damaged) == before[:9] + before[10:]
    assert [n for n, _ in damaged.skipped] == [9]
    assert "checksum mismatch for sample 9" in damaged.skipped[0][1]


def test_datasets_opened_in_a_loop_keep_no_shard_descriptors(clean: Path) -> None:
    """A dataset dropped closes the shards it opened (each read opens them): a loop
    that opens an export, reads it and drops it does not run out of descriptors."""
    import gc

    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    shards = len(list((clean / "train").glob("*.tar")))
    assert shards >= 3
    warm = shardex.open_dataset(clean)  # what a first read starts once per process
    assert len(list(warm)) == len(warm)
    del warm
    gc.collect()
    before = open_files()
    for _ in range(40):
        ds = shardex.open_dataset(clean)
        assert len(list(ds)) == len(ds)
        assert ds[len(ds) - 1]["__key__"]
        del ds
    gc.collect()
    assert open_files() - before <= 2  # not 40 x the shards
