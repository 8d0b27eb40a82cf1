"""Sources: where samples come from. :func:`open_source` turns user input into a Source."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardex.contract import CONFIG_FILE
from shardex.errors import SourceError, SourceNotFoundError
from shardex.sources.arrays import ArraySource
from shardex.sources.base import ScanResult, Source, check_utf8_path, quoted
from shardex.sources.demo import DEFAULT_COUNT, DemoSource
from shardex.sources.export import ExportSource
from shardex.sources.folder import FolderSource
from shardex.sources.hf import HFSource, is_saved_dataset
from shardex.sources.objectfolder import ObjectFolderSource
from shardex.sources.remote import is_url
from shardex.sources.table import TableSource
from shardex.sources.tars import TarSource
from shardex.storage import open_storage
from shardex.storage.options import refuse_credentials_in_url

__all__ = [
    "ArraySource",
    "DemoSource",
    "ExportSource",
    "FolderSource",
    "ObjectFolderSource",
    "ScanResult",
    "Source",
    "TableSource",
    "TarSource",
    "open_source",
]


def _holds_only_tars(root: Path) -> bool:
    has_tar = False
    for _dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.lower().endswith(".tar"):
                has_tar = True
            elif not name.startswith("."):
                return False
    return has_tar


def _object_source(url: str, options: dict[str, Any] | None) -> Source:
    """The source at an object-store URL (see :func:`open_source`)."""
    if any(c in url for c in "*?["):
        return TarSource(url, options)
    name = url.rstrip("/").rpartition("/")[2].lower()
    if not url.endswith("/"):
        if name.endswith(".tar"):
            return TarSource(url, options)
        if name.endswith((".parquet", ".pq", ".csv", ".tsv")):
            return TableSource(url, storage_options=options)
    storage = open_storage(url.rstrip("/"), options)
    if storage.exists(CONFIG_FILE):
        return ExportSource(url.rstrip("/"), options)
    first = next(storage.list_pages(""), [])
    names = [p.rpartition("/")[2] for p, _ in first if not p.rpartition("/")[2].startswith(".")]
    if names and all(n.lower().endswith(".tar") for n in names):
        return TarSource(url, options)
    return ObjectFolderSource(url, options)


def _is_hf_dataset(spec: object) -> bool:
    """Whether ``spec`` is a ``datasets.Dataset``/``DatasetDict`` (without importing it)."""
    return type(spec).__module__.split(".")[0] == "datasets" and type(spec).__name__ in (
        "Dataset",
        "DatasetDict",
    )


def open_source(
    spec: str | os.PathLike[str] | Source | Mapping[str, Any],
    storage_options: dict[str, Any] | None = None,
) -> Source:
    """The source a user names (``storage_options``: those of a source on object
    storage, see :class:`shardex.storage.ObjectStorage`).

    * ``demo`` or ``demo:N``: the built-in demo dataset (N images, default 5000);
    * a folder with ``config.yaml``: an existing shardex export;
    * a folder holding only ``.tar`` files, a ``.tar`` file, or a glob: WebDataset tars;
    * any other folder: an image folder;
    * a ``.parquet``/``.csv``/``.tsv`` file: a table of paths or bytes plus metadata;
    * a mapping of names to arrays: in-memory arrays (see :class:`ArraySource`);
    * a Hugging Face ``Dataset``/``DatasetDict``, or a folder ``save_to_disk`` wrote;
    * an object-store URL (``s3://bucket/prefix``): an export (it holds ``config.yaml``),
      a ``.tar``, a glob or a prefix of only ``.tar`` objects (WebDataset tars), a
      ``.parquet``/``.csv`` table, else an image folder.
    """
    if isinstance(spec, Source):
        return spec
    if _is_hf_dataset(spec):  # before Mapping: a DatasetDict is a dict
        return HFSource(spec)
    if isinstance(spec, Mapping):
        return ArraySource(spec)
    text = os.fspath(spec)
    if text == "demo" or text.startswith("demo:"):
        count = text.partition(":")[2]
        if count and not count.isdigit():
            raise SourceError(f"bad demo source {text!r}: use 'demo' or 'demo:N' (N images)")
        return DemoSource(int(count) if count else DEFAULT_COUNT)
    if is_url(text):
        refuse_credentials_in_url(text)  # before the URL is shown (progress, messages)
        return _object_source(text, storage_options)
    if any(c in text for c in "*?["):
        return TarSource(text)
    check_utf8_path(text)
    path = Path(text).expanduser()
    if path.is_dir():
        try:
            if (path / CONFIG_FILE).is_file():
                return ExportSource(path)
            if is_saved_dataset(path):
                return HFSource(path)
            os.listdir(path)  # (os.walk below ignores an unreadable folder)
        except OSError as exc:
            raise SourceError(f"cannot read source folder {quoted(text)}: {exc.strerror}") from exc
        return TarSource(path) if _holds_only_tars(path) else FolderSource(path)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".tar":
            return TarSource(path)
        if suffix in (".parquet", ".pq", ".csv", ".tsv"):  # its paths may be URLs
            return TableSource(path, storage_options=storage_options)
        raise SourceError(
            f"source {text}: unsupported file type {suffix!r} (use a folder, a .tar, a glob of "
            ".tar files, a .parquet/.csv table, or 'demo')"
        )
    raise SourceNotFoundError(f"source {text} does not exist")
