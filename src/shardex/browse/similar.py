"""Nearest neighbours of a sample by cosine similarity over an embedding column (numpy).

A query is one matrix-vector product and one partial sort, with temporaries of N floats
(timings in docs/browse.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.errors import ConfigError

MAX_NEIGHBOURS: Final = 100

Matrix = npt.NDArray[np.float32]


class Neighbours:
    """Cosine nearest neighbours over one embedding column (thread-safe)."""

    def __init__(self, column: Callable[[], pa.ChunkedArray], name: str) -> None:
        self.name = name
        self._column = column  # read when first needed: an embedding column is large
        self._lock = threading.Lock()
        self._matrix: Matrix | None = None
        self._norms: npt.NDArray[np.float32] | None = None

    def nearest(self, index: int, k: int) -> list[tuple[int, float]]:
        """``(sample number, cosine similarity)`` of the ``k`` nearest to ``index``, best first."""
        if not 1 <= k <= MAX_NEIGHBOURS:
            raise ConfigError(f"k={k} neighbours is out of bounds (1 to {MAX_NEIGHBOURS})")
        matrix, norms = self._prepared()
        query = matrix[index].astype(np.float32)
        q_norm = float(np.linalg.norm(query))
        if q_norm == 0.0:
            return []  # an all-zero embedding is similar to nothing
        scores = matrix @ query  # N floats: no temporary of the matrix's size
        denom = norms * q_norm
        np.divide(scores, denom, out=scores, where=denom > 0)
        scores[denom == 0] = 0.0
        scores[index] = -np.inf
        take = min(k, len(scores) - 1)
        if take <= 0:
            return []
        top = np.argpartition(scores, len(scores) - take)[-take:]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(i), float(scores[i])) for i in top if np.isfinite(scores[i])]

    def prepare(self) -> None:
        """Read the column and make the row norms now, not at the first query."""
        self._prepared()

    def _prepared(self) -> tuple[Matrix, npt.NDArray[np.float32]]:
        with self._lock:
            if self._matrix is None or self._norms is None:
                self._matrix = embedding_matrix(self._column())
                # einsum: one pass, no squared copy (25x faster than linalg.norm here)
                squares = np.einsum("ij,ij->i", self._matrix, self._matrix)
                self._norms = np.sqrt(squares).astype(np.float32)
            return self._matrix, self._norms


def embedding_matrix(column: pa.ChunkedArray) -> Matrix:
    """An (N, D) float32 matrix of a fixed-size-list column; missing rows are zeros."""
    width = column.type.list_size
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if array.null_count == 0:
        values = array.flatten().to_numpy(zero_copy_only=False)
        return np.asarray(values, dtype=np.float32).reshape(len(array), width)
    matrix = np.zeros((len(array), width), dtype=np.float32)
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    matrix[valid] = np.asarray(array.flatten().to_numpy(zero_copy_only=False)).reshape(-1, width)
    return matrix
