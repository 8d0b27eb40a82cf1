"""De-duplication: exact (a content hash of the original bytes) and near (perceptual hash).

Workers hash; the driver drops repeats in sample order, so the first occurrence is kept
whatever the executor.
"""

from __future__ import annotations

import functools
import itertools
from array import array
from typing import Any, ClassVar, Final, Literal

import numpy as np
import numpy.typing as npt
import xxhash

from shardex.errors import ConfigError
from shardex.pipeline.stage import Batch, Sample, Stage
from shardex.pipeline.stages._common import bad_sample, require, sample_name
from shardex.pipeline.stages.pixels import Pixels, check_choice, decode_image, to_mode

DedupMethod = Literal["exact", "phash"]
DEDUP_METHODS: Final = ("exact", "phash")
#: Re-encodes, small resizes and brightness changes stay within it; unrelated images ~32.
DEFAULT_THRESHOLD: Final = 4
MAX_THRESHOLD: Final = 16
_HASH_SIDE: Final = 32
_LOW_SIDE: Final = 8


class DedupStage(Stage):
    """Drop duplicate images, keeping the first in sample order.

    ``state`` records ``kept``, ``dropped`` and ``duplicates`` (dropped key -> kept key).

    Args:
        method: ``"exact"`` (xxh3-128 of the original bytes, as ``content_hash``) or
            ``"phash"`` (64-bit DCT perceptual hash, as ``phash``).
        threshold: phash only: the largest Hamming distance (0-16) still a duplicate.
    """

    name: ClassVar[str] = "dedup"
    needs = ("image",)

    def __init__(self, method: DedupMethod = "exact", threshold: int | None = None) -> None:
        check_choice("method", method, DEDUP_METHODS)
        if method == "exact" and threshold is not None:
            raise ConfigError("threshold applies to method='phash' only (exact matches bytes)")
        if method == "phash":
            threshold = DEFAULT_THRESHOLD if threshold is None else threshold
            if type(threshold) is not int or not 0 <= threshold <= MAX_THRESHOLD:
                raise ConfigError(f"threshold={threshold!r} must be an int 0-{MAX_THRESHOLD}")
        self.method: DedupMethod = method
        self.threshold = threshold
        self.produces = ("content_hash",) if method == "exact" else ("phash",)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            if self.method == "exact":
                data = require(sample, "image", self.name, "a reader stage must provide it")
                sample["content_hash"] = xxhash.xxh3_128_hexdigest(data)
            else:
                sample["phash"] = self._phash(sample)
        return batch

    def _phash(self, sample: Sample) -> int:
        data = sample.get("image")
        try:
            if isinstance(data, bytes | bytearray | memoryview):
                gray = decode_image(bytes(data), "L", size_hint=(_HASH_SIDE, _HASH_SIDE))
            else:
                gray = to_mode(require(sample, "pixels", self.name, "no image bytes"), "L")
        except ValueError as exc:
            raise bad_sample(sample, self.name, exc) from exc
        return perceptual_hash(gray)

    def reduce(self, batch: Batch, state: dict[str, Any]) -> Batch:
        duplicates: dict[str, str] = state.setdefault("duplicates", {})
        kept: Batch = []
        for sample in batch:
            key = str(sample.get("key", len(duplicates) + state.get("kept", 0)))
            match = self._seen(sample, key, state)
            if match is None:
                kept.append(sample)
            else:
                duplicates[key] = match
        state["kept"] = state.get("kept", 0) + len(kept)
        state["dropped"] = len(duplicates)
        return kept

    def _seen(self, sample: Sample, key: str, state: dict[str, Any]) -> str | None:
        """The key of a kept sample ``sample`` duplicates, or None (then it is recorded)."""
        field = self.produces[0]
        value = require(sample, field, self.name, "its process() did not run on this sample")
        if self.method == "exact":
            seen: dict[str, str] = state.setdefault("seen", {})
            if value in seen:
                return seen[value]
            seen[value] = key
            return None
        assert self.threshold is not None
        index: NeighbourIndex = state.setdefault("index", NeighbourIndex(self.threshold))
        keys: list[str] = state.setdefault("keys", [])
        if not isinstance(value, int) or not 0 <= value < 1 << 64:
            raise ConfigError(
                f"dedup: sample {sample_name(sample)} has phash {value!r}, not a uint64"
            )
        found = index.nearest(value)
        if found is not None:
            return keys[found[0]]
        index.add(value)
        keys.append(key)
        return None


@functools.cache
def _dct_matrix(n: int) -> npt.NDArray[np.float64]:
    """The (unnormalised) DCT-II matrix: ``C @ x`` transforms the columns of ``x``."""
    k, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.cos(np.pi * (2 * i + 1) * k / (2 * n))


def perceptual_hash(gray: Pixels) -> int:
    """The 64-bit DCT perceptual hash of a grayscale uint8 image (``imagehash.phash``'s layout).

    32x32 Lanczos, 2-D DCT-II; each of the 8x8 lowest frequencies above their median is a 1.
    """
    from PIL import Image

    small = Image.fromarray(gray).resize((_HASH_SIDE, _HASH_SIDE), Image.Resampling.LANCZOS)
    dct = _dct_matrix(_HASH_SIDE)
    freq = dct @ np.asarray(small, np.float64) @ dct.T
    low = freq[:_LOW_SIDE, :_LOW_SIDE]
    bits = np.packbits((low > np.median(low)).ravel())
    return int.from_bytes(bits.tobytes(), "big")


_POPCOUNT8: Final = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def hamming(hashes: npt.NDArray[np.uint64], value: int) -> npt.NDArray[np.intp]:
    diff = np.ascontiguousarray(hashes ^ np.uint64(value))
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0: one pass, no lookup table
        return np.bitwise_count(diff).astype(np.intp)
    counts = _POPCOUNT8[diff.view(np.uint8)].reshape(-1, 8)
    total: npt.NDArray[np.intp] = counts.sum(axis=1, dtype=np.intp)
    return total


class NeighbourIndex:
    """64-bit hashes, searched for one within Hamming distance ``threshold``.

    Multi-index hashing: hashes ``threshold`` apart agree on one of ``threshold + 1``
    chunks (pigeonhole), so a query checks only ids sharing a chunk (~0.08% of N at 4).
    """

    def __init__(self, threshold: int) -> None:
        parts = threshold + 1
        bounds = [round(i * 64 / parts) for i in range(parts + 1)]
        self.threshold = threshold
        self._chunks = [(lo, (1 << (hi - lo)) - 1) for lo, hi in itertools.pairwise(bounds)]
        # buckets are array('q'): appends are cheap and numpy reads them without a copy
        self._tables: list[dict[int, array[int]]] = [{} for _ in self._chunks]
        self._hashes = np.zeros(1024, np.uint64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _keys(self, value: int) -> list[int]:
        return [(value >> shift) & mask for shift, mask in self._chunks]

    def nearest(self, value: int) -> tuple[int, int] | None:
        """``(id, distance)`` of the nearest hash within the threshold (lowest id on ties)."""
        buckets = [
            np.frombuffer(bucket, np.int64)
            for table, k in zip(self._tables, self._keys(value), strict=True)
            if (bucket := table.get(k)) is not None
        ]
        if not buckets:
            return None
        candidates = np.concatenate(buckets) if len(buckets) > 1 else buckets[0]
        distances = hamming(self._hashes[candidates], value)
        best = int(distances.min())
        if best > self.threshold:
            return None
        return int(candidates[distances == best].min()), best

    def add(self, value: int) -> int:
        """Store ``value``; returns its id (0, 1, 2 ... in the order added)."""
        if self._size == len(self._hashes):
            self._hashes = np.concatenate([self._hashes, np.zeros_like(self._hashes)])
        ident = self._size
        self._hashes[ident] = value
        self._size += 1
        for table, k in zip(self._tables, self._keys(value), strict=True):
            bucket = table.get(k)
            if bucket is None:
                table[k] = bucket = array("q")
            bucket.append(ident)
        return ident
