"""``torch``: one ``.pt`` file per shard, ``{column: tensor}``, loaded with
``torch.load(path, weights_only=True)``; ``S/tensors-{hash}-keys.npy`` maps keys."""

from __future__ import annotations

import io
from typing import Any, ClassVar

import numpy as np

from shardex.backends.array_dataset import ArrayDataset
from shardex.backends.columns import Columns, Layout
from shardex.backends.one_file import OneFileBackend, OneFileDataset
from shardex.bfloat16 import bfloat16_columns, from_tensor
from shardex.errors import FormatError, imported


def _torch() -> Any:
    return imported("torch", "the torch backend needs PyTorch: pip install 'shardex[torch]'")


def load_pt(data: bytes, where: str) -> dict[str, np.ndarray]:
    """The columns of a ``.pt`` shard as numpy arrays (``weights_only``: no pickled code)."""
    torch, buf = _torch(), io.BytesIO(data)
    try:
        tensors = torch.load(buf, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError ...
        raise FormatError(f"{where}: not a readable torch shard ({exc})") from exc
    if not isinstance(tensors, dict):
        raise FormatError(f"{where}: expected a dict of tensors, found {type(tensors).__name__}")
    # numpy has no bfloat16: those tensors become their bit patterns
    return {
        name: from_tensor(t) if t.dtype == torch.bfloat16 else t.numpy()
        for name, t in tensors.items()
    }


class TorchDataset(OneFileDataset):
    decode_shard = staticmethod(load_pt)


class TorchBackend(OneFileBackend):
    name: ClassVar[str] = "torch"
    description: ClassVar[str] = "one .pt of tensors per shard (torch.load weights_only)"
    extension: ClassVar[str] = "pt"
    loader: ClassVar[str] = "torch.load({}, weights_only=True)"
    dataset: ClassVar[type[ArrayDataset]] = TorchDataset

    def encode_run(self, columns: Columns, layout: Layout) -> bytes:
        torch = _torch()
        # torch.save writes a tensor's whole storage: a view would drag its batch along
        tensors = {name: torch.from_numpy(np.array(a, copy=True)) for name, a in columns.items()}
        for name in bfloat16_columns(layout) & set(tensors):
            tensors[name] = tensors[name].view(torch.int16).view(torch.bfloat16)
        buf = io.BytesIO()
        torch.save(tensors, buf)
        return buf.getvalue()
