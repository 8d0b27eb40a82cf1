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
def test_workers_get_references_and_hand_back_no_image_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images: dict[str, bytes] = {}
    for i in range(24):  # noise JPEGs of ~160 KB: no slice of one is found by chance
        data = make_image(i, size=(512, 512))
        path = tmp_path / "src" / f"c{i % 2}" / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        images[f"c{i % 2}/{i:04d}"] = data
    total = sum(map(len, images.values()))
    # a first export loads every module an export needs: their reads are not counted
    shardex.export(tmp_path / "src", tmp_path / "warm", workers=1, samples_per_shard=4)

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
    config = shardex.export(tmp_path / "src", tmp_path / "out", workers=2, samples_per_shard=4)
    read = _read_bytes() - before

    assert config.num_samples == 24
    assert len(config.splits["train"].shards) == 6
    assert len(payloads) >= 12  # six shard jobs went to the workers and came back
    for key, data in images.items():
        middle = data[len(data) // 2 : len(data) // 2 + 64]
        assert not any(middle in p for p in payloads), f"bytes of {key} were pickled"
    assert sum(map(len, payloads)) < total // 20, (sum(map(len, payloads)), total)
    # the images were read by the workers: this process read a small part of their size
    assert read < total // 4, (read, total)
    ds = shardex.open_dataset(tmp_path / "out")
    assert {s["__key__"]: s["jpg"] for s in ds} == images
