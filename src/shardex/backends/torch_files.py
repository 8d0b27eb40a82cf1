"""``torch``: one ``.pt`` file per shard holding exactly that shard's tensors.

Layout of a split ``S``::

    S/tensors-{hash}-000000.pt     {column name: tensor} of the shard's samples only
    S/tensors-{hash}-keys.npy      sorted key hashes -> sample number

Each tensor owns its storage (``torch.save`` writes a tensor's whole storage, so a view
of a larger batch would drag the batch into every file); files load with
``torch.load(path, weights_only=True)``.
"""

from __future__ import annotations

import io
from typing import Any, ClassVar

import numpy as np

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.columns import Columns, Layout
from shardex.backends.one_file import OneFileBackend, OneFileDataset
from shardex.bfloat16 import bfloat16_columns, from_tensor
from shardex.errors import FormatError, MissingDependencyError


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(
            "the torch backend needs PyTorch: pip install 'shardex[torch]'"
        ) from exc
    return torch


def load_pt(data: bytes, where: str) -> dict[str, np.ndarray]:
    """The columns of a ``.pt`` shard as numpy arrays (``weights_only``: no pickled code)."""
    torch = _torch()
    buf = io.BytesIO(data)
    try:
        tensors = torch.load(buf, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError ...
        raise FormatError(f"{where}: not a readable torch shard ({exc})") from exc
    if not isinstance(tensors, dict):
        raise FormatError(f"{where}: expected a dict of tensors, found {type(tensors).__name__}")
    # bfloat16 tensors (--dtype bfloat16) become their bit patterns (numpy has no bfloat16)
    return {
        name: from_tensor(t) if t.dtype == torch.bfloat16 else t.numpy()
        for name, t in tensors.items()
    }


class TorchDataset(OneFileDataset):
    """A split of a ``torch`` export; ``ds[i]`` loads (and caches) its whole shard."""

    decode_shard = staticmethod(load_pt)


class TorchBackend(OneFileBackend):
    """Per-shard ``.pt`` files of the shard's own tensors."""

    name: ClassVar[str] = "torch"
    description: ClassVar[str] = "one .pt of tensors per shard (torch.load weights_only)"
    extension: ClassVar[str] = "pt"
    loader: ClassVar[str] = "torch.load({}, weights_only=True)"
    dataset: ClassVar[type[ArrayDataset]] = TorchDataset

    def encode_run(self, columns: Columns, layout: Layout) -> bytes:
        torch = _torch()
        # copy=True: a tensor that owns exactly its bytes, never a view of a larger buffer
        tensors = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in columns.items()}
        for name in bfloat16_columns(layout) & set(tensors):
            tensors[name] = tensors[name].view(torch.int16).view(torch.bfloat16)
        buf = io.BytesIO()
        torch.save(tensors, buf)
        return buf.getvalue()
