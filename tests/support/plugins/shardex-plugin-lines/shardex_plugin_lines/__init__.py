"""``lines:LIST``: a plugin source, the images a text file names, one path a line.

A path is relative to the list's folder; the sample's key is the path without its
extension (``cats/001.jpg`` -> ``cats/001``); blank lines are ignored. Written with
shardex's public names only. No image is read here: the export reads each file once,
when it writes the sample's shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from shardex.errors import SourceError
from shardex.sources import (
    SampleStream,
    ScanBatch,
    Source,
    SourceSpec,
    build_table,
    file_member,
)


class LinesSource(Source):
    """The images a text file lists."""

    kind: ClassVar[str] = "lines"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.uri = f"lines:{path}"

    @classmethod
    def probe(cls, spec: SourceSpec) -> bool:
        return spec.text is not None and spec.text.startswith("lines:")

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        assert spec.text is not None  # the probe took it
        return cls(spec.text.removeprefix("lines:"))

    def stream(self) -> SampleStream:
        if not self.path.is_file():
            raise SourceError(f"{self.uri}: no such list file")
        return SampleStream(self._batches())

    def _batches(self) -> Iterator[ScanBatch]:
        chunk: list[str] = []
        with self.path.open() as lines:  # read as it goes: the list may be long
            for line in lines:
                if line.strip():
                    chunk.append(line.strip())
                if len(chunk) == self.batch_size:
                    yield self._batch(chunk)
                    chunk = []
        if chunk:
            yield self._batch(chunk)

    def _batch(self, names: list[str]) -> ScanBatch:
        members = [[self._member(self.path.parent / name)] for name in names]
        keys = [name.rpartition(".")[0] for name in names]
        return ScanBatch(build_table(keys, names, members))

    def _member(self, file: Path) -> dict[str, object]:
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise SourceError(f"{self.uri} names {str(file)!r}, which cannot be read") from exc
        return file_member(str(file), size, file.suffix[1:].lower())
