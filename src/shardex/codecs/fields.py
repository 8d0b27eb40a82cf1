"""Fields decoded by their extension, the same for every backend's reader."""

from __future__ import annotations

import io
import json
from typing import Any

from shardex.codecs.images import IMAGE_EXTENSIONS, decode


def decode_fields(fields: dict[str, bytes]) -> dict[str, Any]:
    """Decode by extension: images to arrays, cls to int, json to objects, txt to str."""
    out: dict[str, Any] = {}
    for ext, data in fields.items():
        last = ext.rpartition(".")[2].lower()
        if last in IMAGE_EXTENSIONS:
            out[ext] = decode(data)
        elif last in ("cls", "cls2", "index"):
            out[ext] = int(data)
        elif last == "json":
            out[ext] = json.loads(data)
        elif last in ("txt", "text"):
            out[ext] = data.decode("utf-8")
        elif last == "npy":
            import numpy as np  # here: raw reads need no numpy

            out[ext] = np.load(io.BytesIO(data), allow_pickle=False)
        else:
            out[ext] = data
    return out
