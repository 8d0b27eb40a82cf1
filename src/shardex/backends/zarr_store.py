"""``zarr``: one zarr v3 group per split, one sharded array per column (layout:
docs/backends.md). ``__key__`` becomes ``key`` (v3 reserves ``__`` names); encoded images
stay flat ``uint8`` (zarr's variable-length bytes have no v3 spec). Each array is encoded
a zarr shard at a time from the runs' parts, and its files put in name order."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Final

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.codecs import Crc32cCodec, ShardingCodecIndexLocation, ZstdCodec
from zarr.core.array import ShardsConfigParam
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import MemoryStore

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.array_files import ArrayWriter, PartColumn, Written, part_columns
from shardex.backends.arrays import ArrayBackend
from shardex.backends.base import Capabilities, SplitPlan, SplitWriter
from shardex.backends.columns import KEY_COLUMN, Columns, Layout, array_names
from shardex.codecs.zarr_images import IMAGE_CODECS, image_codec, register_image_codecs
from shardex.contract import ExportConfig, FieldSpec, ShardInfo, SplitInfo
from shardex.errors import (
    ChecksumError,
    ConfigError,
    FormatError,
    ObjectNotFoundError,
    ShardexError,
    ShardexWarning,
)
from shardex.fields import is_fixed
from shardex.storage.base import Storage

KEY_NODE: Final = "key"
#: Target chunk size of arrays read one sample at a time: small reads, still compressible.
CHUNK_BYTES: Final = 64 << 10
#: Chunk size of arrays read whole when a split is opened (offsets, keys, labels).
BULK_CHUNK_BYTES: Final = 1 << 20
#: A ragged field's chunk holds ~4 samples on average: most reads touch one chunk.
RAGGED_SAMPLES_PER_CHUNK: Final = 4
RAGGED_CHUNK_MIN: Final = 16 << 10
RAGGED_CHUNK_MAX: Final = 4 << 20
#: zarr reads a shard's whole index (16 bytes per chunk) for every partial read.
MAX_CHUNKS_PER_SHARD: Final = 1024
SHARD_BYTES: Final = 1 << 30
#: Fixed fields up to this many bytes per sample are read whole on open (as the index is).
EAGER_ROW_BYTES: Final = 64
_METADATA_FILES: Final = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})


def node_name(name: str) -> str:
    """The zarr array name of a shardex column (``__key__.data`` -> ``key.data``)."""
    prefix = f"{KEY_COLUMN}."
    return KEY_NODE + name[len(KEY_COLUMN) :] if name.startswith(prefix) else name


def _nodes(layout: Layout) -> dict[str, str]:
    names = array_names(layout)
    nodes = {name: node_name(name) for name in names}
    if len(set(nodes.values())) != len(nodes) or any(n.startswith("__") for n in nodes.values()):
        raise ConfigError(
            f"the zarr backend cannot name the arrays of fields {[f.name for f in layout]}: "
            f"zarr v3 reserves names starting with '__' and {KEY_NODE!r} holds the sample "
            "keys; rename the field"
        )
    return nodes


def is_eager(name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> bool:
    """Whether a reader loads the whole array on open."""
    if name.startswith(f"{KEY_COLUMN}.") or name.endswith((".offsets", ".shapes", ".present")):
        return True
    if name.endswith(".data"):
        return False
    return dtype.itemsize * math.prod(shape[1:]) <= EAGER_ROW_BYTES


def _image_channels(spec: FieldSpec) -> tuple[bool, int | None]:
    """Whether a field is a fixed-shape uint8 image, and its channels (None: 2-d grey)."""
    if spec.kind != "array" or spec.dtype != "uint8" or not is_fixed(spec):
        return False, None
    if len(spec.shape) == 2:
        return True, None
    return len(spec.shape) == 3 and spec.shape[2] in (1, 3, 4), spec.shape[-1]


def _chunking(name: str, array: np.ndarray, image: bool, samples: int) -> tuple[int, int]:
    """(rows per chunk, rows per shard) of a run of ``samples``."""
    row = max(1, array.dtype.itemsize * math.prod(array.shape[1:]))
    if image:
        target = row
    elif name.endswith(".data") and not name.startswith(f"{KEY_COLUMN}."):
        want = array.nbytes / max(1, samples) * RAGGED_SAMPLES_PER_CHUNK
        target = min(
            max(1 << math.ceil(math.log2(max(want, 1))), RAGGED_CHUNK_MIN), RAGGED_CHUNK_MAX
        )
    else:
        target = BULK_CHUNK_BYTES if is_eager(name, array.dtype, array.shape) else CHUNK_BYTES
    rows = min(max(1, target // row), max(1, len(array)))
    per_shard = min(MAX_CHUNKS_PER_SHARD, max(1, SHARD_BYTES // (rows * row)))
    return rows, min(rows * per_shard, rows * math.ceil(max(1, len(array)) / rows))


def _encoded(
    array: np.ndarray | PartColumn, name: str, serializer: Any, samples: int
) -> Iterator[tuple[str, bytes]]:
    """The files of one zarr array in name order, encoded a zarr shard at a time."""
    files: dict[str, Buffer] = {}
    shape = tuple(int(d) for d in array.shape)
    like = np.broadcast_to(np.zeros((1,) * len(shape), array.dtype), shape)
    rows, shard = _chunking(name, like, serializer is not None, samples)
    tail = shape[1:]
    # the shard index first: a reader gets it without knowing the object's size
    shards: ShardsConfigParam = {
        "shape": (shard, *tail),
        "index_location": ShardingCodecIndexLocation.start,
    }
    created = zarr.create_array(
        MemoryStore(files),
        shape=shape,
        dtype=array.dtype,
        chunks=(rows, *tail),
        shards=shards,
        serializer=serializer if serializer is not None else "auto",
        # crc32c: every chunk self-checking on read
        compressors=[Crc32cCodec()]
        if serializer is not None
        else [ZstdCodec(level=3), Crc32cCodec()],
        fill_value=0,
        # every chunk written: a missing object is damage, not zeros
        config={"write_empty_chunks": True},
        zarr_format=3,
    )
    # shard objects are named c/K[/0...]: written in name order (the checksum's order)
    count = math.ceil(shape[0] / shard) if math.prod(shape) else 0
    for k in sorted(range(count), key=str):
        start, stop = k * shard, min(shape[0], (k + 1) * shard)
        values = array.rows(start, stop) if isinstance(array, PartColumn) else array[start:stop]
        created[start:stop] = values
        for key in sorted(files):
            if key != "zarr.json":
                yield key, files.pop(key).to_bytes()
    yield "zarr.json", files.pop("zarr.json").to_bytes()
    if files:  # not a zarr this code knows: every file has been written above
        raise FormatError(f"zarr array {name!r}: unexpected files {sorted(files)}")


class StorageStore(Store):
    """A read-only zarr store over a shardex storage folder (fork-safe, countable I/O).
    Local reads run inline (a pread beats a thread hop); remote ones in threads."""

    supports_writes: bool = False
    supports_deletes: bool = False
    supports_listing: bool = True

    def __init__(self, storage: Storage, root: str) -> None:
        super().__init__(read_only=True)
        self.storage, self.root = storage, root.strip("/")
        self._inline = storage.local_path(self.root) is not None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, StorageStore)
            and other.storage is self.storage
            and other.root == self.root
        )

    def __hash__(self) -> int:
        return hash((id(self.storage), self.root))

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _read(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        path = self._path(key)
        try:
            if byte_range is None:
                return self.storage.get(path)
            if isinstance(byte_range, RangeByteRequest):
                return self.storage.get_range(
                    path, byte_range.start, byte_range.end - byte_range.start
                )
            size = self.storage.size(path)
            if isinstance(byte_range, SuffixByteRequest):
                start = max(0, size - byte_range.suffix)
            else:
                start = byte_range.offset
            return self.storage.get_range(path, start, size - start)
        except ObjectNotFoundError:
            # only metadata may be absent (zarr probes); a missing chunk is damage
            if key.rpartition("/")[2] in _METADATA_FILES:
                return None
            raise

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if self._inline:
            data = self._read(key, byte_range)
        else:
            data = await asyncio.to_thread(self._read, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        return self.storage.exists(self._path(key))

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()

    async def delete(self, key: str) -> None:
        self._check_writable()

    async def list(self) -> AsyncIterator[str]:
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        start = len(self.root) + 1 if self.root else 0
        for path in self.storage.list(self._path(prefix)):
            yield path[start:]

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        seen: set[str] = set()
        async for key in self.list_prefix(base):
            child = key[len(base) :].split("/", 1)[0]
            if child not in seen:
                seen.add(child)
                yield child


@contextmanager
def _zarr_errors(where: str) -> Iterator[None]:
    try:
        yield
    except ShardexError:
        raise
    except (ValueError, RuntimeError, KeyError, FileNotFoundError) as exc:
        kind = ChecksumError if "checksum" in str(exc).lower() else FormatError
        raise kind(
            f"{where}: cannot be read as a zarr array ({exc}); the export is damaged or was "
            "changed after it was written (shardex verify)"
        ) from exc


class _Column:
    """A zarr array read one sample (or one byte range) at a time."""

    __slots__ = ("array", "where")

    def __init__(self, array: zarr.Array[Any], where: str) -> None:
        self.array, self.where = array, where

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __getitem__(self, index: Any) -> Any:
        with _zarr_errors(self.where):
            return self.array[index]


class ZarrDataset(ArrayDataset):
    def _load(self, shard: ShardInfo) -> Columns:
        options = self.config.shard_options.get("backend_options") or {}
        if options.get("image_codec", "none") != "none":
            register_image_codecs()
        store = StorageStore(self.storage, shard.path)
        out: dict[str, Any] = {}
        for name, node in _nodes(self.layout).items():
            where = self.storage.join(f"{shard.path}/{node}")
            with _zarr_errors(where):
                array = zarr.open_array(store, path=node, mode="r", zarr_format=3)
                eager = is_eager(name, array.dtype, array.shape)
                out[name] = np.asarray(array[...]) if eager else _Column(array, where)
        return out


class ZarrBackend(ArrayBackend):
    """Every column of a split as a sharded zarr v3 array in one group."""

    name: ClassVar[str] = "zarr"
    description: ClassVar[str] = "one zarr v3 group per split, sharded arrays (N, ...)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True, streaming=True, remote=True, checked_reads=True
    )
    option_help: ClassVar[dict[str, str]] = {
        "image_codec": "none (default), png, webp (lossless) or jpeg (lossy): codec of "
        "fixed-shape uint8 image arrays (H, W[, C]), one image per chunk",
        "image_quality": "JPEG quality 1-100 with image_codec=jpeg (default 90)",
    }
    per_split: ClassVar[bool] = True
    local_reader: ClassVar[bool] = False  # zarr opens URLs too
    stem_name: ClassVar[str] = "zarr"
    dataset: ClassVar[type[ArrayDataset]] = ZarrDataset

    @classmethod
    def reader_call(cls, config: ExportConfig, info: SplitInfo, location: str) -> str | None:
        return f"zarr.open_group({location + '/' + info.shards[0].path!r}, mode='r')"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.image_codec = str(self.options.get("image_codec", "none")).lower()
        if self.image_codec not in IMAGE_CODECS:
            raise ConfigError(
                f"zarr backend: image_codec must be one of {', '.join(IMAGE_CODECS)}, "
                f"got {self.image_codec!r}"
            )
        try:
            self.image_quality = int(self.options.get("image_quality", 90))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"zarr backend: image_quality must be an integer ({exc})") from exc
        if not 1 <= self.image_quality <= 100:
            raise ConfigError(f"zarr backend: image_quality {self.image_quality} is not in 1-100")

    def _serializer(self, spec: FieldSpec) -> Any:
        """A fixed field's image codec, or None (plain bytes + zstd)."""
        if self.image_codec == "none":
            return None
        image, channels = _image_channels(spec)
        if not image:
            return None
        return image_codec(
            self.image_codec, channels, quality=self.image_quality, ndim=len(spec.shape) + 1
        )

    def split_writer(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> SplitWriter:
        if self.image_codec != "none" and not any(_image_channels(f)[0] for f in plan.fields):
            warnings.warn(
                f"zarr backend: image_codec={self.image_codec} applies to fixed-shape uint8 "
                f"pixel arrays (H, W[, C]), and split {plan.split!r} has none: its images "
                "are stored as their encoded bytes (decode and resize them to one shape, "
                "e.g. --preprocess-until-key pixels --x-key pixels, to use the codec)",
                ShardexWarning,
                stacklevel=2,
            )
        return super().split_writer(storage, plan, remote=remote)

    def join_runs(
        self, storage: Storage, stem: str, runs: list[Written], layout: Layout, num_samples: int
    ) -> Written:
        return self.write_run(storage, stem, part_columns(storage, runs), layout)

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        nodes = _nodes(layout)
        # codecs first: a field they cannot store is refused before any file is written
        codecs = {spec.column: self._serializer(spec) for spec in layout if is_fixed(spec)}
        samples = len(columns[f"{KEY_COLUMN}.offsets"]) - 1
        group: dict[str, Buffer] = {}
        fields = [{**dataclasses.asdict(spec), "shape": list(spec.shape)} for spec in layout]
        attributes = {"shardex": {"num_samples": samples, "columns": nodes, "fields": fields}}
        zarr.create_group(MemoryStore(group), zarr_format=3, attributes=attributes)
        # name order (the checksum's): "{node}/" prefixes never interleave
        blocks = sorted([("zarr.json", ""), *((f"{nodes[n]}/", n) for n in columns)])
        out = ArrayWriter(storage, stem, listed=True)
        for prefix, name in blocks:
            if not name:
                for key in sorted(group):
                    out.put(f"{stem}/{key}", group[key].to_bytes())
                continue
            for key, data in _encoded(columns[name], name, codecs.get(name), samples):
                out.put(f"{stem}/{prefix}{key}", data)
        return out.written()
