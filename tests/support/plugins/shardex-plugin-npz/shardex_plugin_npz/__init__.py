"""``npz``: a plugin backend, one deflated ``.npz`` of a shard's columns per shard.

Layout of a split ``S``::

    S/npz-{hash}-000000.npz     the shard's columns, each a zip member NAME.npy
    S/npz-{hash}-keys.npy       sorted key hashes -> sample number

Written with shardex's public names only: :class:`~shardex.backends.OneFileBackend` plans,
fills, names, checks and indexes the shards; this says how a shard's columns become
bytes and back.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any, ClassVar

import numpy as np

from shardex.backends import Capabilities, OneFileBackend, OneFileDataset
from shardex.errors import FormatError


class NpzDataset(OneFileDataset):
    """A split of an ``npz`` export; ``ds[i]`` reads (and caches) its whole shard."""

    @staticmethod
    def decode_shard(data: bytes, where: str) -> dict[str, np.ndarray]:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise FormatError(f"{where}: not a readable .npz shard ({exc})") from exc


class NpzBackend(OneFileBackend):
    """One deflated ``.npz`` per shard."""

    name: ClassVar[str] = "npz"
    description: ClassVar[str] = "one deflated .npz of columns per shard (plugin)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=False, streaming=True, remote=True, checked_reads=True, shard_windows=True
    )
    stem_name: ClassVar[str] = "npz"  # its files: S/npz-{hash}-...
    extension: ClassVar[str] = "npz"
    loader: ClassVar[str] = "numpy.load({})"
    dataset: ClassVar[Any] = NpzDataset

    def encode_run(self, columns: Any, layout: Any) -> bytes:
        buf = io.BytesIO()
        # not np.savez_compressed: its members carry today's date, and the same input must
        # give the same bytes (a resumed export equals an uninterrupted one)
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as npz:
            for name, array in columns.items():
                with npz.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
        return buf.getvalue()
