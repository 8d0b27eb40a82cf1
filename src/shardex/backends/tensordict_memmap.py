"""``tensordict_memmap``: each split is one TensorDict, memory-mapped the way tensordict writes it.

A split ``S`` is a folder that ``tensordict.TensorDict.load_memmap`` opens without shardex
(see :mod:`shardex.backends.columns` for the column names)::

    S/tensordict-{hash}/meta.json             the root TensorDict, batch_size []
    S/tensordict-{hash}/{field}.memmap        a fixed field: (N, ...)
    S/tensordict-{hash}/{field}/meta.json     a ragged or optional field: a nested TensorDict
    S/tensordict-{hash}/{field}/data.memmap   ... its values back to back
    S/tensordict-{hash}/{field}/offsets.memmap, shapes.memmap, present.memmap, values.memmap
    S/tensordict-{hash}-keys.npy              sorted key hashes -> sample number (shardex's)

**Keys.** A column ``NAME.SUFFIX`` (``SUFFIX`` one of ``data``, ``offsets``, ``shapes``,
``present``) is the nested key ``(NAME, SUFFIX)``; a fixed column ``NAME`` is the leaf
``NAME``, or ``(NAME, "values")`` when the field also has a ``NAME.present`` column (a key
cannot be a tensor and a TensorDict at once). tensordict's ``meta.json`` keeps its own entries
``shape``, ``device`` and ``_type`` beside the keys, so a field named like one of them (or
like one of them followed by underscores) gets one more trailing underscore: ``shape`` is
stored as ``shape_``. :func:`tensordict_key` and :func:`column_name` are the two directions.

**Batch size.** The root and the nested TensorDicts have ``batch_size=[]``: ragged ``data``
columns, the ``N + 1`` offsets and the ``(N, ...)`` fixed columns have different first
dimensions, and tensordict requires every entry to start with the batch size.

**Dtypes.** Every dtype that torch tensors hold is stored as it is: bool, (u)int8/16/32/64,
float16/32/64 and complex64/128 (uint16/32/64 are torch's limited-support dtypes: they store
and load faithfully); ``--dtype bfloat16`` fields are ``torch.bfloat16`` tensors. Arrays in non-native byte order are stored in native order (same
values). Other dtypes (strings, datetimes, structured) are refused with a ConfigError before
anything is written.

**Writes and reads.** The workers write each run's columns as ``.npy`` parts; this process
joins them (:meth:`TensorDictBackend.join_runs`) into ``S/tensordict-{hash}.tmp-RANDOM/``:
tensordict lays the folder out (``memmap_like``: its meta.json files, each column's file
at its final size), then each file is filled from the parts a 16 MiB chunk at a time with
plain writes, so no process holds a split's column (the bytes are those that
``TensorDict(...).memmap`` writes). Each file is then moved to its final name, so that a
file under the final name is always whole (as :meth:`Storage.put` gives the other
backends) and a reader mapping a previous export's file keeps its old copy. config.yaml, written last, is the commit point. Reading maps every file
(``load_memmap`` with tensordict's default mode: shared, because a copy-on-write mapping counts
against the memory commit limit and fails for a column larger than RAM plus swap) and hands
out read-only numpy views.

**Object storage.** tensordict maps local files, so an export to ``s3://...`` is staged: the
split's folder is written in an export scratch folder under ``$TMPDIR`` (room for one
split's arrays), checksummed, then each file is uploaded (each object whole or absent) and
the staging folder removed; a killed export's staging is removed by the next export
(:mod:`shardex.storage.scratch`). Reading downloads the split's folder once into shardex's cache
(``$SHARDEX_CACHE_DIR/tensordict/``, named by the run's checksum, so a replaced export never
meets a stale copy), checks its bytes against config.yaml, and maps the copy. A reader
downloads into a folder of its own there, locked while it writes (see
:func:`shardex.storage.scratch.locked_folder`); one killed mid-download leaves it, and the
next reader to download removes it (its lock is free).
"""

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

# torch and tensordict are imported where they are used: the registry reads this
# backend's capabilities (a refused --dtype names the backends that can) without the
# seconds their import takes.

#: The suffixes of the columns that are nested keys ``(NAME, SUFFIX)``.
SUFFIXES: Final = frozenset({"data", "offsets", "shapes", "present"})
#: The nested key of a fixed column whose field also has a ``present`` column.
VALUES: Final = "values"
#: Entries of tensordict's meta.json that would overwrite a key of the same name.
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
    """A tensor of the column's shape and dtype (native byte order) that holds one value,
    seen through a stride-0 view: what ``memmap_like`` lays a file out from, without the
    column's values; ``bfloat16``: the column holds bfloat16 bit patterns."""
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
    """Rows ``start .. stop`` of a column (an array or a :class:`PartColumn`), contiguous
    and in native byte order: the bytes its file holds for them."""
    values = np.asarray(
        array.rows(start, stop) if isinstance(array, PartColumn) else array[start:stop]
    )
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))


def _fill(filename: str, array: Any) -> None:
    """The file ``memmap_like`` made for a column (its final size), filled from the column
    a chunk at a time. Plain writes, not the mapping: pages written through a mapping
    count in this process's memory until it unmaps them, a whole column's worth."""
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
    """The columns' layout as nested dicts of :func:`_like` tensors, keys in sorted order (a
    stable meta.json); ``bfloat16``: the columns that hold bfloat16 bit patterns."""
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
    """The columns as tensordict's memmap folder: tensordict lays it out (its meta.json
    files, each column's file at its final size, not yet written), then each file is
    filled from its column a chunk at a time (:func:`_fill`: a column is never held).
    Returns the files' names under ``folder``."""
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


def _move_into(tmp: Path, root: Path) -> None:
    """Move every file tensordict wrote to its final name (each move atomic)."""
    for path in _files_under(tmp):
        target = root / path.relative_to(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)


def _written(root: Path, stem: str, names: list[str]) -> Written:
    """What was written: the files by name (relative to the storage root), their total
    size and the checksum of their bytes in that order (read back: the meta.json files are
    tensordict's bytes, and the column files were just written, so they come from the page
    cache)."""
    files = sorted(f"{stem}/{name}" for name in names)
    hasher = xxhash.xxh3_64()
    num_bytes = 0
    for path in files:
        with open(root / path[len(stem) + 1 :], "rb") as f:
            while chunk := f.read(_CHUNK):
                hasher.update(chunk)
                num_bytes += len(chunk)
    return Written(stem, tuple(files), num_bytes, shard_checksum(hasher))


def _upload(storage: Storage, staged: Path, stem: str, names: list[str]) -> None:
    """Each staged file put under ``stem/`` (streamed: a column may be larger than memory)."""
    for name in sorted(names):
        with open(staged / name, "rb") as f, storage.open_writer(f"{stem}/{name}") as out:
            while chunk := f.read(_CHUNK):
                out.write(chunk)


#: The folders that readers download runs into (``{DOWNLOAD}{pid}-{digest}-...``, beside
#: the finished copies): locked while a reader writes one, removed by the next reader to
#: download once the process that made it is gone (killed mid-download).
DOWNLOAD: Final = "download-"


def _cached_copy(storage: Storage, shard: ShardInfo, paths: list[str]) -> Path:
    """A local copy of a run on object storage: downloaded once, checked against the run's
    checksum in config.yaml, then renamed into place (a reader never maps a partial copy)."""
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
        # not part of the copy; the folder stays this process's (its ID is in the name)
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
    # An export may come from elsewhere: never unpickle what its folder holds (a shardex
    # export has tensors only). tensordict versions before allow_pickle have no such switch.
    from tensordict import TensorDict

    params = inspect.signature(TensorDict.load_memmap).parameters
    safe: dict[str, Any] = {"allow_pickle": False} if "allow_pickle" in params else {}
    try:
        return TensorDict.load_memmap(root, **safe)
    except (OSError, ValueError, RuntimeError) as exc:
        raise FormatError(f"{root}: not a readable TensorDict memmap folder ({exc})") from exc


class TensorDictDataset(ArrayDataset):
    """A split of a ``tensordict_memmap`` export: every column memory-mapped."""

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
            # the mapping is shared with the file: a sample's array must not write to it
            view.flags.writeable = False
            columns[column_name(key if isinstance(key, tuple) else (key,))] = view
        missing = [n for n in array_names(self.layout) if n not in columns]
        if missing:
            raise FormatError(f"{root}: columns {missing} are missing; the export is damaged")
        return columns

    def _check_sizes(self, shard: ShardInfo, root: Path, paths: list[str]) -> None:
        """Refuse a run whose files (under ``root``, the run's folder or its cached copy)
        are missing or not their recorded size, before mapping them: tensordict would grow
        a short file with zeros instead of failing."""
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
    """Each split one TensorDict memory-mapped folder (``TensorDict.load_memmap`` reads it)."""

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
        """The split's folder from its runs' parts, each file filled a chunk at a time
        from the parts (:func:`_memmap`): the split's columns are never held."""
        return self.write_run(storage, stem, part_columns(storage, runs), layout)

    def write_run(self, storage: Storage, stem: str, columns: Columns, layout: Layout) -> Written:
        root = storage.local_path(stem)
        if root is None:  # object storage: staged locally, then uploaded
            # in a scratch folder: a killed export's staging goes with the next export
            with scratch("tensordict") as staged:
                run = staged / "run"  # (beside the scratch folder's .lock)
                names = _memmap(run, columns, layout)
                written = _written(run, stem, names)
                _upload(storage, run, stem, names)
            return written
        # A killed attempt at this run may have left its folder, empty if the kill came
        # before tensordict's first file (so no file names it for the next export to
        # remove). This export holds the output's lock and only this job writes this run.
        for stale in root.parent.glob(f"{glob.escape(root.name)}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root.with_name(f"{root.name}.tmp-{secrets.token_hex(4)}")
        try:
            names = _memmap(tmp, columns, layout)
            _move_into(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return _written(root, stem, names)
