"""What ``shardex verify`` reports, and the checks every backend's verification shares;
apart from :mod:`shardex.verification` so backends need not import the dispatcher.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardex.errors import ShardexError
from shardex.format.tables import read_npy
from shardex.storage import Storage


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an export."""

    file: str
    kind: str
    message: str
    key: str | None = None

    def __str__(self) -> str:
        where = f"{self.file} [{self.key}]" if self.key else self.file
        return f"{where}: {self.kind}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What verify found; ``ok`` when nothing is wrong."""

    uri: str
    problems: list[Problem] = field(default_factory=list)
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    deep: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, file: str, kind: str, message: str, key: str | None = None) -> None:
        """Record a problem."""
        self.problems.append(Problem(file, kind, message, key))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (``shardex verify --json``)."""
        out = {k: v for k, v in asdict(self).items() if k != "problems"}
        return {**out, "ok": self.ok, "problems": [asdict(p) for p in self.problems]}


def load_npy(storage: Storage, path: str, report: VerifyReport) -> np.ndarray | None:
    """A ``.npy`` file of the export, or None with the problem recorded."""
    try:
        return read_npy(storage, path, ".npy")  # type: ignore[no-any-return]
    except ShardexError as exc:  # missing, or not a .npy file (a hostile header too)
        report.add(path, "index", f"cannot be read: {exc}")
        return None


def verify_key_table(
    storage: Storage, path: str, n: int, report: VerifyReport
) -> np.ndarray | None:
    """The key table if it is uint64 (2, n), hashes sorted, sample numbers a permutation."""
    keys = load_npy(storage, path, report)
    if keys is None:
        return None
    if keys.dtype != np.uint64 or keys.shape != (2, n):
        report.add(path, "index", f"expected uint64 (2, {n}), found {keys.dtype} {keys.shape}")
        return None
    if n and np.any(keys[0][1:] < keys[0][:-1]):
        report.add(path, "index", "key hashes are not sorted: lookups by key would miss")
        return None
    if n and not np.array_equal(np.sort(keys[1]), np.arange(n, dtype=np.uint64)):
        report.add(path, "index", "the key table's sample numbers do not cover every sample")
        return None
    return keys
