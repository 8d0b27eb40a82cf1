"""Existing WebDataset tars: a folder of ``.tar`` files, a glob, or one tar.

Members are grouped into samples by key (the name up to the first dot of its last path
component), in tar order. ``.cls`` members become the ``label`` column and ``.json``
members become metadata columns; every other member is kept byte for byte.
"""

from __future__ import annotations

import glob
import json
import os
import tarfile
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from shardex.errors import EmptySourceError, SourceError, SourceNotFoundError
from shardex.format.tar import split_name
from shardex.sources.base import ScanResult, Source, build_table, check_metadata_names, safe_key


def _tar_paths(spec: str) -> list[Path]:
    path = Path(spec).expanduser()
    if path.is_dir():
        found = sorted(path.rglob("*.tar"))
    elif any(c in spec for c in "*?["):
        found = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
    elif path.is_file():
        found = [path]
    else:
        raise SourceNotFoundError(f"no tar files at {spec}")
    if not found:
        raise EmptySourceError(f"no .tar files match {spec}")
    return [p.absolute() for p in found]


class _Collector:
    """Accumulates samples from tars into scan-table columns."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.originals: list[str] = []
        self.members: list[list[dict[str, Any]]] = []
        self.labels: list[int | None] = []
        self.meta: list[dict[str, Any]] = []

    def add(
        self,
        key: str,
        original: str,
        members: list[dict[str, Any]],
        label: int | None,
        meta: dict[str, Any],
    ) -> None:
        self.keys.append(key)
        self.originals.append(original)
        self.members.append(members)
        self.labels.append(label)
        self.meta.append(meta)


def scan_tar(path: Path, out: _Collector, *, root: Path, key_prefix: str = "") -> None:
    """Add the samples of one tar to ``out``."""
    try:
        tf = tarfile.open(path, "r:")  # noqa: SIM115 (closed by the with below)
    except (tarfile.TarError, OSError) as exc:
        raise SourceError(f"cannot read tar {path}: {exc}") from exc
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    with tf, open(path, "rb") as raw:
        current: str | None = None
        members: list[dict[str, Any]] = []
        label: int | None = None
        meta: dict[str, Any] = {}

        def flush() -> None:
            if current is not None:
                out.add(safe_key(key_prefix + current), f"{rel}:{current}", members, label, meta)

        for info in tf:
            if not info.isfile():
                continue
            key, ext = split_name(info.name)
            if not ext:
                raise SourceError(f"{path}: member {info.name!r} has no extension")
            if key != current:
                flush()
                current, members, label, meta = key, [], None, {}
            if ext == "cls":
                label = _read_label(raw, info, path)
            elif ext == "json":
                meta = _read_json(raw, info, path)
            else:
                members.append(
                    {
                        "ext": ext,
                        "path": str(path),
                        "offset": info.offset_data,
                        "size": info.size,
                        "data": None,
                    }
                )
        flush()


def _read_label(raw: Any, info: tarfile.TarInfo, path: Path) -> int:
    raw.seek(info.offset_data)
    text = raw.read(info.size).strip()
    try:
        return int(text)
    except ValueError:
        raise SourceError(f"{path}: {info.name} is not an integer class ({text[:40]!r})") from None


def _read_json(raw: Any, info: tarfile.TarInfo, path: Path) -> dict[str, Any]:
    raw.seek(info.offset_data)
    try:
        value = json.loads(raw.read(info.size))
    except ValueError as exc:
        raise SourceError(f"{path}: {info.name} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise SourceError(f"{path}: {info.name} holds a JSON {type(value).__name__}, not an object")
    return value


def collected_table(out: _Collector, where: str) -> pa.Table:
    """The scan table of what was collected."""
    meta = pa.Table.from_pylist(out.meta) if any(out.meta) else None
    if meta is not None:
        meta = meta.drop_columns([c for c in ("label",) if c in meta.column_names])
        check_metadata_names(meta.column_names, where)
    has_labels = any(label is not None for label in out.labels)
    return build_table(
        out.keys,
        out.originals,
        out.members,
        labels=out.labels if has_labels else None,
        metadata=meta,
    )


class TarSource(Source):
    """Samples from existing WebDataset tar files."""

    kind: ClassVar[str] = "webdataset-tars"

    def __init__(self, spec: str | os.PathLike[str]) -> None:
        self.uri = os.fspath(spec)

    def scan(self) -> ScanResult:
        paths = _tar_paths(self.uri)
        root = Path(os.path.commonpath([str(p.parent) for p in paths]))
        out = _Collector()
        for path in paths:
            scan_tar(path, out, root=root)
        if not out.keys:
            raise EmptySourceError(f"the tars at {self.uri} hold no samples")
        return ScanResult(collected_table(out, self.uri))
