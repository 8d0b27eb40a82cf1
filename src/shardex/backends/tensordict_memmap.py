"""``tensordict_memmap``: each split one folder that ``TensorDict.load_memmap`` opens
without shardex (layout, keys, dtypes: docs/backends.md).

Files are laid out by tensordict (``memmap_like``) in a ``.tmp-RANDOM`` folder, filled 16
MiB at a time from the workers' parts (no process holds a column), then each moved into
place: a file under its final name is always whole, and a reader mapping an older file
keeps it. Object storage is staged in a scratch folder and uploaded; readers download a
checked copy into the cache (a locked ``download-`` folder while in progress)."""

from __future__ import annotations

import glob
import hashlib
import inspect
import math
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

import numpy as np
import numpy.typing as npt
import xxhash

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.array_files import PartColumn, Written, part_columns
from shardex.backends.arrays import ArrayBackend
from shardex.backends.base import Capabilities, SplitPlan, SplitWriter
from shardex.backends.columns import Columns, Layout, array_names
from shardex.bfloat16 import BFLOAT16, bfloat16_columns, from_tensor
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.errors import ChecksumError, ConfigError, FormatError
from shardex.format.tables import shard_checksum
from shardex.storage.base import Storage
from shardex.storage.cache import cache_dir, remove_legacy_leftovers
from shardex.storage.scratch import LOCK_FILE, locked_folder, remove_stale, scratch

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    import torch

# torch and tensordict are imported where used: the registry reads capabilities without
# the seconds their import takes.

#: The suffixes of the columns that are nested keys ``(NAME, SUFFIX)``.
SUFFIXES: Final = frozenset({"data", "offsets", "shapes", "present"})
#: The nested key of a fixed column whose field also has a ``present`` column.
VALUES: Final = "values"
#: meta.json's own entries: a key of the same name gets a trailing ``_``.
_META_ENTRIES: Final = frozenset({"shape", "device", "_type"})
_CHUNK: Final = 16 << 20


def _split(column: str) -> tuple[str, str | None]:
    base, dot, suffix = column.rpartition(".")
    return (base, suffix) if dot and suffix in SUFFIXES else (column, None)


def _escape(name: str) -> str:
    return f"{name}_" if name.rstrip("_") in _META_ENTRIES else name


def _unescape(key: str) -> str:
    return key[:-1] if key.rstrip("_") in _META_ENTRIES and key.endswith("_") else key


def tensordict_key(column: str, grouped: frozenset[str]) -> tuple[str, ...]:
    """The TensorDict key of a column; ``grouped`` are the fields that have suffixed columns.

    Example: ``jpg.data`` -> ``("jpg", "data")``; ``label__label`` -> ``("label__label",)``,
    or ``("label__label", "values")`` when ``label__label.present`` exists too.
    """
    base, suffix = _split(column)
    if suffix is not None:
        return (_escape(base), suffix)
    return (_escape(base), VALUES) if base in grouped else (_escape(base),)


def column_name(key: tuple[str, ...]) -> str:
    """The column a TensorDict key stores (the inverse of :func:`tensordict_key`)."""
    base = _unescape(key[0])
    if len(key) == 1 or key[1] == VALUES:
        return base
    return f"{base}.{key[1]}"


def _like(column: str, array: Any, bfloat16: bool = False) -> torch.Tensor:
    """A stride-0 tensor of the column's shape and dtype: what ``memmap_like`` lays a
    file out from, without the values."""
    import torch

    dtype = np.dtype(array.dtype)
    one = np.zeros((1,) * len(array.shape), dtype.newbyteorder("="))
    try:
        tensor = torch.from_numpy(one)
    except TypeError as exc:
        raise _dtype_error(column, str(dtype)) from exc
    if bfloat16:
        tensor = tensor.view(torch.int16).view(torch.bfloat16)
    return tensor.expand(tuple(int(d) for d in array.shape))


def _rows(array: Any, start: int, stop: int) -> npt.NDArray[Any]:
    """Rows ``start .. stop`` of a column as its file holds them (contiguous, native)."""
    values = np.asarray(
        array.rows(start, stop) if isinstance(array, PartColumn) else array[start:stop]
    )
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))


def _fill(filename: str, array: Any) -> None:
    """Fill a column's file a chunk at a time with plain writes: pages written through a
    mapping count in this process's memory until unmapped."""
    shape = tuple(int(d) for d in array.shape)
    row = np.dtype(array.dtype).itemsize * math.prod(shape[1:])
    if not row * shape[0]:  # tensordict writes no file for an empty tensor
        return
    step = max(1, _CHUNK // row)
    with open(filename, "r+b") as f:
        for start in range(0, shape[0], step):
            f.write(
                _rows(array, start, min(shape[0], start + step)).reshape(-1).view(np.uint8).data
            )


def _dtype_error(column: str, dtype: str) -> ConfigError:
    return ConfigError(
        f"field {column!r} has dtype {dtype}, which a torch tensor cannot hold: the "
        "tensordict_memmap backend stores bool, (u)int8/16/32/64, float16/32/64 and "
        "complex64/128; cast the field, or export with the numpy_mmap or zarr backend"
    )


def _check_dtype(column: str, dtype: str) -> None:
    if dtype == BFLOAT16:
        return
    import torch

    try:
        torch.from_numpy(np.empty(0, dtype=np.dtype(dtype)))
    except TypeError as exc:
        raise _dtype_error(column, dtype) from exc


def _tree(columns: Columns, bfloat16: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The columns as nested dicts of :func:`_like` tensors, sorted (a stable meta.json)."""
    grouped = frozenset(_split(c)[0] for c in columns if _split(c)[1] is not None)
    tree: dict[str, Any] = {}
    for column in sorted(columns):
        key = tensordict_key(column, grouped)
        tensor = _like(column, columns[column], column in bfloat16)
        if len(key) == 1:
            tree[key[0]] = tensor
        else:
            tree.setdefault(key[0], {})[key[1]] = tensor
    return tree


def _memmap(folder: Path, columns: Columns, layout: Layout) -> list[str]:
    """Write the columns as tensordict's memmap folder; return the files' names."""
    from tensordict import MemoryMappedTensor, TensorDict

    tree = _tree(columns, bfloat16_columns(layout))
    laid = TensorDict(tree, batch_size=[]).memmap_like(folder)
    files: dict[str, str] = {}
    for key, tensor in laid.items(include_nested=True, leaves_only=True):
        if not isinstance(tensor, MemoryMappedTensor):  # a tensordict this code does not know
            raise TypeError(f"tensordict's memmap_like made {type(tensor)} for {key!r}")
        files[column_name(key if isinstance(key, tuple) else (key,))] = str(tensor.filename)
    del laid  # its mappings: the files are written, not mapped
    for column, filename in files.items():
        _fill(filename, columns[column])
    return [p.relative_to(folder).as_posix() for p in _files_under(folder)]


def _files_under(folder: Path) -> Iterator[Path]:
    return (p for p in sorted(folder.rglob("*")) if p.is_file())


def _written(root: Path, stem: str, names: list[str]) -> Written:
    """The files, their size and checksum, read back (from the page cache)."""
    files = sorted(f"{stem}/{name}" for name in names)
    hasher = xxhash.xxh3_64()
    num_bytes = 0
    for path in files:
        with open(root / path[len(stem) + 1 :], "rb") as f:
            while chunk := f.read(_CHUNK):
                hasher.update(chunk)
                num_bytes += len(chunk)
    return Written(stem, tuple(files), num_bytes, shard_checksum(hasher))


#: Readers' download folders, locked while written; a dead reader's is removed by the next.
DOWNLOAD: Final = "download-"


def _cached_copy(storage: Storage, shard: ShardInfo, paths: list[str]) -> Path:
    """A local copy of a remote run, checked, then renamed into place (never partial)."""
    digest = hashlib.sha256(f"{storage.uri}\0{shard.path}\0{shard.checksum}".encode())
    target = cache_dir() / "tensordict" / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target.parent, DOWNLOAD)
    remove_legacy_leftovers()  # earlier readers' unlocked .{digest}.tmp-* folders
    tmp, lock = locked_folder(target.parent, DOWNLOAD, target.name)
    try:
        hasher = xxhash.xxh3_64()
        for path in sorted(paths):  # the order the checksum covers them
            local = tmp / path[len(shard.path) + 1 :]
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "wb") as f:
                for chunk in storage.iter_chunks(path):
                    hasher.update(chunk)
                    f.write(chunk)
        found = shard_checksum(hasher)
        if found != shard.checksum:
            raise ChecksumError(
                f"{storage.join(shard.path)}: checksum {found} differs from {shard.checksum} "
                "in config.yaml; the export is damaged (shardex verify)"
            )
        # not part of the copy (the folder's name still says whose it is)
        (tmp / LOCK_FILE).unlink()
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.is_dir():  # another process's copy won the race: use it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)
    return target


def _load_memmap(root: Path) -> TensorDictBase:
    # never unpickle what an export holds (older tensordict versions have no switch)
    from tensordict import TensorDict

    params = inspect.signature(TensorDict.load_memmap).parameters
    safe: dict[str, Any] = {"allow_pickle": False} if "allow_pickle" in params else {}
    try:
        return TensorDict.load_memmap(root, **safe)
    except (OSError, ValueError, RuntimeError) as exc:
        raise FormatError(f"{root}: not a readable TensorDict memmap folder ({exc})") from exc


class TensorDictDataset(ArrayDataset):
    def _load(self, shard: ShardInfo) -> Columns:
        info = self.config.split(self.split)
        paths = [p for p in info.files if p.startswith(f"{shard.path}/") and p != info.keys]
        root = self.storage.local_path(shard.path)
        if root is None:
            root = _cached_copy(self.storage, shard, paths)
        self._check_sizes(shard, root, paths)
        import torch

        columns: dict[str, np.ndarray] = {}
        for key, tensor in _load_memmap(root).items(include_nested=True, leaves_only=True):
            if not isinstance(tensor, torch.Tensor):
                raise FormatError(f"{root}: entry {key!r} is not a tensor; not a shardex export")
            view = from_tensor(tensor) if tensor.dtype == torch.bfloat16 else tensor.numpy()
            # a shared mapping: a sample's array must not write to the file
            view.flags.writeable = False
            columns[column_name(key if isinstance(key, tuple) else (key,))] = view
        missing = [n for n in array_names(self.layout) if n not in columns]
        if missing:
            raise FormatError(f"{root}: columns {missing} are missing; the export is damaged")
        return columns

    def _check_sizes(self, shard: ShardInfo, root: Path, paths: list[str]) -> None:
        """Refuse missing or short files before mapping: tensordict grows them with zeros."""
        found = 0
        for path in paths:
            local = root / path[len(shard.path) + 1 :]
            if not local.is_file():
                raise FormatError(f"{self.storage.join(path)} is missing; the export is damaged")
            found += local.stat().st_size
        if found != shard.num_bytes:
            raise FormatError(
                f"{self.storage.join(shard.path)}: its files hold {found} bytes but config.yaml "
                f"records {shard.num_bytes}; the export is damaged (export it again)"
            )


class TensorDictBackend(ArrayBackend):
    """Each split one memory-mapped TensorDict folder."""

    name: ClassVar[str] = "tensordict_memmap"
    description: ClassVar[str] = "one memory-mapped TensorDict per split (TensorDict.load_memmap)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True, streaming=True, remote=True, bfloat16=True
    )
    per_split: ClassVar[bool] = True
    stem_name: ClassVar[str] = "tensordict"
    dataset: ClassVar[type[ArrayDataset]] = TensorDictDataset

    def split_writer(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> SplitWriter:
        # refuse what cannot be written before any shard's bytes are read
        for spec in plan.fields:
            _check_dtype(spec.name, spec.dtype)
        return super().split_writer(storage, plan, remote=remote)

    @classmethod
    def reader_call(cls, config: ExportConfig, info: SplitInfo, location: str) -> str | None:
        return f"tensordict.TensorDict.load_memmap({location + '/' + info.shards[0].path!r})"

    def join_runs(
        self, storage: Storage, stem: str, runs: list[Written], layout: Layout, num_samples: int
    ) -> Written:
        return self.write_run(storage, stem, part_columns(storage, runs), layout)

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        root = storage.local_path(stem)
        if root is None:  # staged (a killed export's scratch goes with the next), uploaded
            with scratch("tensordict") as staged:
                run = staged / "run"  # (beside the scratch folder's .lock)
                names = _memmap(run, columns, layout)
                written = _written(run, stem, names)
                for name in sorted(names):  # streamed: a column may outgrow memory
                    with open(run / name, "rb") as f, storage.open_writer(f"{stem}/{name}") as out:
                        while chunk := f.read(_CHUNK):
                            out.write(chunk)
            return written
        # A killed attempt may have left an empty .tmp folder no file names; this export
        # holds the output's lock, and only this job writes this run.
        for stale in root.parent.glob(f"{glob.escape(root.name)}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root.with_name(f"{root.name}.tmp-{secrets.token_hex(4)}")
        try:
            names = _memmap(tmp, columns, layout)
            for path in _files_under(tmp):  # each move atomic
                target = root / path.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return _written(root, stem, names)
