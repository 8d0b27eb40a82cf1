"""Iteration over an export on a storage that streams its shards (no local file to map):
each sample checked and given in order wherever the stream's chunks end. The shards are
streamed from memory:// (whose ``iter_objects`` is its ``iter_chunks``, which the tests
patch to cut the chunks); on the S3 server, storage/test_s3.py streams one GET a shard."""

from __future__ import annotations

import pytest

import shardex
from shardex.errors import ChecksumError
from shardex.storage.memory import MemoryStorage


def _export(storage: MemoryStorage) -> str:
    """demo:120 exported into ``storage`` (train: 96 samples in shards of 25); its URL."""
    shardex.export(
        "demo:120",
        storage.uri,
        split_fractions={"train": 0.8, "val": 0.2},
        samples_per_shard=25,
        workers=1,
    )
    return storage.uri


def test_iteration_checks_samples_that_stream_chunks_cut_in_two(
    memory_storage: MemoryStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iteration gives exactly the samples in order, each checked against its checksum,
    also where a chunk of the shard's stream ends inside a sample."""
    url = _export(memory_storage)
    ds = shardex.open_dataset(url, split="train")
    want = [ds[i] for i in range(len(ds))]
    records = [ds.index.record(i) for i in range(len(ds))]  # type: ignore[attr-defined]
    paths = [s.path for s in ds.config.splits["train"].shards]
    damaged = list(range(1, len(ds), 3))
    for shard, path in enumerate(paths):  # one byte flipped inside each damaged sample
        data = bytearray(memory_storage.get(path))
        for i in damaged:
            offset, _checksum, in_shard, length = records[i]
            if in_shard == shard:
                data[offset + length // 2] ^= 0x20
        memory_storage.put(path, bytes(data))

    ends: dict[str, list[int]] = {}  # where each chunk of each shard's stream ended

    def cut_in_two(i: int) -> bool:
        offset, _checksum, shard, length = records[i]
        return any(offset < end < offset + length for end in ends[paths[shard]])

    for on_error in ("raise", "skip"):
        reader = shardex.open_dataset(url, split="train", on_error=on_error)
        reader.stream_chunk_size = 4096  # type: ignore[attr-defined]  # < every sample
        chunks_of = reader.storage.iter_chunks  # what iteration streams a shard with

        def recorded(path: str, size: int, chunks_of: object = chunks_of) -> object:
            ends[path], at = [], 0
            for chunk in chunks_of(path, size):  # type: ignore[operator]
                at += len(chunk)
                ends[path].append(at)
                yield chunk

        monkeypatch.setattr(reader.storage, "iter_chunks", recorded)
        if on_error == "raise":
            with pytest.raises(ChecksumError, match=f"checksum mismatch for sample {damaged[0]} "):
                list(reader)
            continue
        got = list(reader)
        assert got == [want[i] for i in range(len(want)) if i not in damaged]
        assert [number for number, _ in reader.skipped] == damaged  # type: ignore[attr-defined]
        assert any(cut_in_two(i) for i in damaged)
        assert any(cut_in_two(i) for i in range(len(want)) if i not in damaged)


def test_iteration_reads_samples_that_start_a_chunk_or_span_several(
    memory_storage: MemoryStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks cut exactly at sample boundaries (each sample starts a chunk, or a chunk
    holds two), and chunks smaller than a sample: iteration gives the samples of ds[i]
    in order, and a damaged sample is refused wherever it lies in the chunks."""
    url = _export(memory_storage)
    ds = shardex.open_dataset(url, split="train")
    want = [ds[i] for i in range(len(ds))]
    records = [ds.index.record(i) for i in range(len(ds))]  # type: ignore[attr-defined]
    damaged = 2  # in the first shard: it starts a chunk in the first two cuts
    first_shard = ds.config.splits["train"].shards[0].path

    def ends(path: str, cut: str) -> list[int]:
        stops = [off + n for off, _c, shard, n in records if ds._paths[shard] == path]  # type: ignore[attr-defined]
        if cut == "each sample":
            return stops
        if cut == "two samples":
            return stops[1::2]
        return list(range(100, stops[-1], 100))  # 100 bytes: every sample spans chunks

    for cut in ("each sample", "two samples", "100 bytes"):

        def rechunked(path: str, size: int, cut: str = cut) -> object:
            data = bytearray(memory_storage.get(path))
            if path == first_shard:
                offset, _checksum, _shard, length = records[damaged]
                data[offset + length // 2] ^= 0x20
            at = 0
            for end in [*ends(path, cut), len(data)]:
                if end > at:
                    yield bytes(data[at:end])
                    at = end

        for on_error in ("raise", "skip"):
            reader = shardex.open_dataset(url, split="train", on_error=on_error)
            monkeypatch.setattr(reader.storage, "iter_chunks", rechunked)
            if on_error == "raise":
                with pytest.raises(ChecksumError, match=f"mismatch for sample {damaged} "):
                    list(reader)
                continue
            assert list(reader) == [w for i, w in enumerate(want) if i != damaged], cut
            assert [number for number, _ in reader.skipped] == [damaged]  # type: ignore[attr-defined]
