"""Workers read their samples' bytes themselves: an export of a file-backed source hands
them references and gets back small results, so no image byte is pickled either way and
the main process does not read the images."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import shardex
from shardex.parallel import Runner
from shardex.testing import make_image


def _read_bytes() -> int:
    """Bytes this process has read so far through read calls (``rchar``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("backend", ["webdataset", "numpy", "tensor_shards", "numpy_mmap"])
def test_workers_get_references_and_hand_back_no_image_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Also for the array backends: their workers read, check and store the images. A
    per-split backend's process then reads the runs' parts once (the output's bytes, not
    the source's) to join the split and checksum it."""
    images: dict[str, bytes] = {}
    for i in range(24):  # noise JPEGs of ~160 KB: no slice of one is found by chance
        data = make_image(i, size=(512, 512))
        path = tmp_path / "src" / f"c{i % 2}" / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        images[f"c{i % 2}/{i:04d}"] = data
    total = sum(map(len, images.values()))
    # a first export loads every module an export needs: their reads are not counted
    opts = {"samples_per_shard": 4, "backend": backend}
    shardex.export(tmp_path / "src", tmp_path / "warm", workers=1, **opts)

    payloads: list[bytes] = []
    imap = Runner.imap

    def recorded(self: Runner, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        def sent(items: Iterable[Any]) -> Iterator[Any]:
            for item in items:
                payloads.append(pickle.dumps((fn, item)))
                yield item

        for result in imap(self, fn, sent(items)):
            payloads.append(pickle.dumps(result))
            yield result

    monkeypatch.setattr(Runner, "imap", recorded)
    before = _read_bytes()
    config = shardex.export(tmp_path / "src", tmp_path / "out", workers=2, **opts)
    read = _read_bytes() - before

    assert config.num_samples == 24
    per_split = backend == "numpy_mmap"
    assert len(config.splits["train"].shards) == (1 if per_split else 6)
    assert len(payloads) >= 12  # six shard jobs went to the workers and came back
    for key, data in images.items():
        middle = data[len(data) // 2 : len(data) // 2 + 64]
        assert not any(middle in p for p in payloads), f"bytes of {key} were pickled"
    assert sum(map(len, payloads)) < total // 20, (sum(map(len, payloads)), total)
    # the images were read by the workers: this process read a small part of their size
    # (a per-split backend's: the parts once, to join them)
    assert read < (total * 3 // 2 if per_split else total // 4), (read, total)
    ds = shardex.open_dataset(tmp_path / "out")
    assert {s["__key__"]: s["jpg"] for s in ds} == images
