"""A split's index files built as shards complete, in flat memory: records go to local
scratch and stream out under their ``.npy`` header, keys are merged from sorted runs. The
bytes are those of ``np.save`` of the whole arrays."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Final

import numpy as np
import numpy.typing as npt

from shardex.backends.array_files import npy_header_bytes
from shardex.format.index import (
    SAMPLE_DTYPE,
    MemberSpans,
    build_members,
    member_columns,
    members_dtype,
)
from shardex.format.runs import HashRuns
from shardex.storage.base import Storage
from shardex.storage.scratch import scratch

_KEY: Final = np.dtype([("h", "<u8"), ("sample", "<u8")])
_COPY: Final = 1 << 20


class IndexSink:
    """A split's index records in sample order (a context manager: scratch goes with it)."""

    def __init__(self) -> None:
        self._scratch = scratch("index")
        folder = self._scratch.__enter__()
        self._samples_path = folder / "samples.bin"
        self._samples: BinaryIO = open(self._samples_path, "wb")  # noqa: SIM115
        self._keys = HashRuns(folder, "keys", _KEY, 0)  # in files: memory flat locally
        self._folder: Path = folder
        self.num_samples = 0
        self._members_path = folder / "members.bin"
        self._members_out: BinaryIO = open(self._members_path, "wb")  # noqa: SIM115
        self._members: list[tuple[tuple[str, ...], int]] = []  # each part's columns and rows

    def __enter__(self) -> IndexSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._samples.close()
        self._members_out.close()
        self._keys.close()
        self._scratch.__exit__(None, None, None)

    def add(self, records: npt.NDArray[np.void], key_hashes: npt.NDArray[np.uint64]) -> None:
        keys = np.empty(len(key_hashes), _KEY)
        keys["h"] = key_hashes
        keys["sample"] = np.arange(self.num_samples, self.num_samples + len(key_hashes))
        self._keys.add(keys)
        self._samples.write(np.ascontiguousarray(records, SAMPLE_DTYPE).tobytes())
        self.num_samples += len(records)

    def add_members(self, spans: MemberSpans, checksums: npt.NDArray[np.uint64]) -> None:
        """The next samples' member spans and checksums (which seed the rows' checks)."""
        self._members_out.write(np.ascontiguousarray(checksums, np.uint64).tobytes())
        self._members_out.write(np.ascontiguousarray(spans.spans, np.uint32).tobytes())
        self._members.append((spans.exts, len(spans.spans)))

    def member_columns(self) -> list[str]:
        return member_columns([exts for exts, _ in self._members])

    def put_members(self, storage: Storage, members_path: str) -> None:
        """Write ``index-members.npy`` part by part."""
        exts = self.member_columns()
        total = sum(n for _, n in self._members)
        self._members_out.flush()
        with storage.open_writer(members_path) as out, open(self._members_path, "rb") as f:
            out.write(npy_header_bytes(members_dtype(exts), (total,)))
            for part_exts, n in self._members:
                width = 2 + 2 * len(part_exts)
                checksums = np.frombuffer(f.read(8 * n), np.uint64)
                spans = np.frombuffer(f.read(4 * n * width), np.uint32).reshape(n, width)
                part = MemberSpans(part_exts, spans)
                out.write(build_members([part], checksums, exts).tobytes())

    def put(self, storage: Storage, samples_path: str, keys_path: str) -> None:
        """Write ``index-samples.npy`` and ``index-keys.npy`` (each atomically)."""
        self._samples.close()
        n = self.num_samples
        with storage.open_writer(samples_path) as out, open(self._samples_path, "rb") as f:
            out.write(npy_header_bytes(SAMPLE_DTYPE, (n,)))
            while chunk := f.read(_COPY):
                out.write(chunk)
        samples = self._folder / "key-samples.bin"
        with storage.open_writer(keys_path) as out, open(samples, "wb") as rows:
            out.write(npy_header_bytes(np.dtype(np.uint64), (2, n)))
            for run in self._keys.sorted_runs():  # row 0: sorted hashes
                out.write(np.ascontiguousarray(run["h"]).tobytes())
                rows.write(np.ascontiguousarray(run["sample"]).tobytes())
            rows.close()
            with open(samples, "rb") as f:  # row 1: the sample of each
                while chunk := f.read(_COPY):
                    out.write(chunk)
