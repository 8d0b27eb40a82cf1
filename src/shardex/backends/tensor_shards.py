"""``tensor_shards``: uncompressed ``.npz`` shards of exactly ``samples_per_shard``
samples (the last short), plus ``-manifest.json`` and ``-keys.npy``: the layout for
:class:`shardex.torch.TensorShardsLoader`, which batches across a window of whole shards.
bfloat16 fields are stored as ``uint16`` bits (see :mod:`shardex.bfloat16`)."""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from typing import ClassVar

import numpy as np

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.base import SplitPlan
from shardex.backends.columns import Columns, Layout
from shardex.backends.one_file import OneFileBackend, OneFileDataset
from shardex.contract import ShardInfo
from shardex.errors import FormatError
from shardex.storage.base import Storage


def load_npz(data: bytes, where: str) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(f"{where}: not a readable .npz shard ({exc})") from exc


class TensorShardsDataset(OneFileDataset):
    decode_shard = staticmethod(load_npz)


class TensorShardsBackend(OneFileBackend):
    name: ClassVar[str] = "tensor_shards"
    description: ClassVar[str] = "fixed-size .npz sample shards + manifest (window loader)"
    extension: ClassVar[str] = "npz"
    loader: ClassVar[str] = "numpy.load({})"  # an NpzFile: npz[COLUMN] (no pickles)
    dataset: ClassVar[type[ArrayDataset]] = TensorShardsDataset

    def encode_run(self, columns: Columns, layout: Layout) -> bytes:
        buf = io.BytesIO()
        # np.savez, without its keywords (a field may be named `file`); stored: read fast
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as npz:
            for name, array in columns.items():
                with npz.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
        return buf.getvalue()

    def finish_split(
        self, storage: Storage, base: str, plan: SplitPlan, shards: list[ShardInfo]
    ) -> list[str]:
        manifest = {
            "format": "shardex.tensor_shards",
            "version": 1,
            "split": plan.split,
            "num_samples": sum(s.num_samples for s in shards),
            "shards": [dataclasses.asdict(s) for s in shards],
            "fields": [dataclasses.asdict(f) for f in plan.fields],
        }
        path = f"{base}-manifest.json"
        storage.put(path, json.dumps(manifest, indent=1).encode())
        return [path]
