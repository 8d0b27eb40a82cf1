"""What the PyTorch datasets yield: decoded images, labels and named metadata columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

import torch
from shardex.codecs.images import IMAGE_EXTENSIONS, decode
from shardex.contract import METADATA_FILE
from shardex.dataset import Sample
from shardex.errors import ConfigError, FormatError
from shardex.format.tables import check_local_file, metadata_errors
from shardex.storage.cache import local_copy
from shardex.torch.handle import DatasetHandle

Transform = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """How a raw sample becomes the item a loader yields: the fields are the arguments of
    :class:`~shardex.torch.MapDataset`. ``keys`` columns come as Python scalars or values,
    fixed-size lists as tensors."""

    decode: bool = True
    transform: Transform | None = None
    keys: tuple[str, ...] = ()
    decode_size: tuple[int, int] | None = None


class SampleMaker:
    """Applies a :class:`SampleSpec`; the named columns are read once per process."""

    def __init__(self, spec: SampleSpec, handle: DatasetHandle) -> None:
        self.spec, self.handle = spec, handle
        self._columns: MetadataColumns | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "handle": self.handle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], state["handle"])  # type: ignore[misc]

    def columns(self) -> MetadataColumns | None:
        if self._columns is None and self.spec.keys:
            self._columns = MetadataColumns(self.handle, self.spec.keys)
        return self._columns

    def __call__(self, raw: Sample, index: int) -> Any:
        spec = self.spec
        out: dict[str, Any]
        if spec.decode:
            out = {"__key__": raw["__key__"]}
            image = next(
                (v for k, v in raw.items() if k.rpartition(".")[2].lower() in IMAGE_EXTENSIONS),
                None,
            )
            if image is not None:
                pixels = decode(image, size_hint=spec.decode_size)
                out["image"] = spec.transform(pixels) if spec.transform else to_tensor(pixels)
            if "cls" in raw:
                out["label"] = int(raw["cls"])
        elif not spec.keys and spec.transform is None:
            return raw  # each read makes a fresh dict: nothing to copy or add
        else:
            out = dict(raw)
        columns = self.columns()
        if columns is not None:
            for name in spec.keys:
                out[name] = columns.value(name, index)
        if not spec.decode and spec.transform is not None:
            return spec.transform(out)
        return out


def to_tensor(pixels: npt.NDArray[np.generic]) -> torch.Tensor:
    """An (H, W, C) tensor of a decoded image; grey images get C = 1."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if not pixels.flags.writeable:  # torch warns about (and would share) read-only memory
        pixels = pixels.copy()
    return torch.from_numpy(pixels)


class MetadataColumns:
    """Some columns of ``metadata.parquet`` for one split, in sample order (cached locally)."""

    def __init__(self, handle: DatasetHandle, names: Sequence[str]) -> None:
        ds = handle.dataset()
        storage, config = handle.storage, ds.config
        name = config.metadata_file or METADATA_FILE
        fingerprint = "\n".join(s.checksum for info in config.splits.values() for s in info.shards)
        with metadata_errors(storage.join(name)):
            local = local_copy(storage, name, fingerprint)
            check_local_file(local, config.metadata_checksum, storage.join(name))
            path = str(local)
            available = pq.read_schema(path).names
        missing = [n for n in names if n not in available]
        if missing:
            raise ConfigError(
                f"{storage.join(name)} has no column {', '.join(map(repr, missing))}; "
                f"keys= can name: {', '.join(available)}"
            )
        wanted = list(dict.fromkeys([*names, "sample_index"]))
        with metadata_errors(storage.join(name)):
            table = pq.read_table(path, columns=wanted, filters=[("split", "=", ds.split)])
            table = table.sort_by("sample_index")
        if table.num_rows != len(ds):
            raise FormatError(
                f"{storage.join(name)} has {table.num_rows} rows for split {ds.split!r}, "
                f"its index has {len(ds)} samples"
            )
        self._arrays: dict[str, npt.NDArray[Any]] = {}
        self._objects: dict[str, pa.Array] = {}
        for n in names:
            column = table.column(n).combine_chunks()
            array = _as_numpy(column)
            if array is None:
                self._objects[n] = column
            else:
                self._arrays[n] = array

    def value(self, name: str, index: int) -> Any:
        array = self._arrays.get(name)
        if array is None:
            return self._objects[name][index].as_py()
        if array.ndim == 1:
            return array[index].item()
        return torch.tensor(array[index])


def _as_numpy(column: pa.Array) -> npt.NDArray[Any] | None:
    """Numbers as a 1-d array, fixed-size lists of numbers as a 2-d one; else None."""
    kind = column.type
    if column.null_count:
        return None
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.asarray(column.to_numpy(zero_copy_only=False))
    if pa.types.is_fixed_size_list(kind) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)
    ):
        flat = column.flatten()
        if flat.null_count:
            return None
        return np.asarray(flat.to_numpy(zero_copy_only=False)).reshape(-1, kind.list_size)
    return None
