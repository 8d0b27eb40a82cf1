"""``tensor_shards``: fixed-size sample shards of column arrays, for window loading.

Layout of a split ``S``::

    S/tensors-{hash}-000000.npz       exactly ``samples_per_shard`` samples (the last one
    S/tensors-{hash}-000001.npz       short, never padded): the columns of
    ...                               :mod:`shardex.backends.columns`, uncompressed
    S/tensors-{hash}-manifest.json    shards, sample counts, checksums and fields
    S/tensors-{hash}-keys.npy         sorted key hashes -> sample number

``--dtype bfloat16`` fields are stored as their bit patterns (``uint16``; numpy has no
bfloat16) and read back as ``torch.bfloat16`` (see :mod:`shardex.bfloat16`).

A shard is one object read whole: this is the layout for
:class:`shardex.torch.TensorShardsLoader`, which keeps a window of shards in memory and
batches across them, so batch size and shard size are independent.
"""

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
    """Every array of an ``.npz`` shard (no pickles)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(f"{where}: not a readable .npz shard ({exc})") from exc


class TensorShardsDataset(OneFileDataset):
    """A split of a ``tensor_shards`` export; ``ds[i]`` reads (and caches) its whole shard."""

    decode_shard = staticmethod(load_npz)


class TensorShardsBackend(OneFileBackend):
    """Shards of exactly ``samples_per_shard`` rows of every column, plus a manifest."""

    name: ClassVar[str] = "tensor_shards"
    description: ClassVar[str] = "fixed-size .npz sample shards + manifest (window loader)"
    extension: ClassVar[str] = "npz"
    loader: ClassVar[str] = "numpy.load({})"  # an NpzFile: npz[COLUMN] (no pickles)
    dataset: ClassVar[type[ArrayDataset]] = TensorShardsDataset

    def encode_run(self, columns: Columns, layout: Layout) -> bytes:
        buf = io.BytesIO()
        # What np.savez writes, without its keyword arguments: a field may be named `file`
        # or `allow_pickle`. Stored, not deflated: the shard is read whole, fast.
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
