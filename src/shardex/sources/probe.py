"""What a user names as a source, and the built-in sources' probes of it: a
:class:`SourceSpec` finds each fact once (one HEAD and one LIST for a URL at most).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Final

from shardex.contract import CONFIG_FILE
from shardex.errors import SourceError, SourceNotFoundError
from shardex.quoting import printable, quoted
from shardex.storage import Storage, open_storage
from shardex.storage.fetch.objects import is_url
from shardex.storage.options import refuse_credentials_in_url

__all__ = ["TABLE_SUFFIXES", "SourceSpec", "check_utf8_path", "is_saved_dataset"]

TABLE_SUFFIXES: Final = (".parquet", ".pq", ".csv", ".tsv")


def check_utf8_path(uri: str) -> None:
    """Refuse a source path that is not UTF-8 (config.yaml and member paths are UTF-8 text)."""
    if printable(uri) != uri:
        raise SourceError(
            f"source path {quoted(uri)} is not valid UTF-8: rename it, or point a symlink "
            "with a UTF-8 name at it"
        )


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a ``save_to_disk`` folder (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


class SourceSpec:
    """A source as the user named it: ``value`` (a path, URL, glob, ``demo[:N]``, or an
    object) and its ``storage_options``. A URL holding credentials is refused here.
    """

    def __init__(self, value: object, storage_options: dict[str, Any] | None = None) -> None:
        self.value = value
        self.storage_options = storage_options
        text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
        self.text: str | None = text if isinstance(text, str) else None
        self.is_url = self.text is not None and is_url(self.text)
        if self.is_url:
            refuse_credentials_in_url(self.text or "")

    @cached_property
    def glob(self) -> bool:
        """Whether the text is a glob (of tars)."""
        return self.text is not None and any(c in self.text for c in "*?[")

    @cached_property
    def path(self) -> Path:
        """The local path (refused unless valid UTF-8)."""
        check_utf8_path(self.text or "")
        return Path(self.text or "").expanduser()

    @cached_property
    def local(self) -> bool:
        """Whether the text names a local path (not a URL, glob or the demo)."""
        return self.text is not None and not (self.is_url or self.glob)

    @cached_property
    def is_dir(self) -> bool:
        """Whether it is a local folder."""
        return self.local and self.path.is_dir()

    @cached_property
    def is_file(self) -> bool:
        """Whether it is a local file."""
        return self.local and not self.is_dir and self.path.is_file()

    @cached_property
    def object_name(self) -> str:
        """A URL's last part, lower case, when it names one object."""
        text = self.text or ""
        return "" if text.endswith("/") else text.rpartition("/")[2].lower()

    @cached_property
    def storage(self) -> Storage:
        """The storage of a URL, as a prefix."""
        return open_storage((self.text or "").rstrip("/"), self.storage_options)

    def in_folder(self, look: Any) -> Any:
        """``look()`` at a local folder, its failure a SourceError."""
        try:
            return look()
        except OSError as exc:
            raise SourceError(
                f"cannot read source folder {quoted(self.text or '')}: {exc.strerror}"
            ) from exc

    @cached_property
    def has_config(self) -> bool:
        """Whether the folder or prefix holds ``config.yaml`` (an export)."""
        if self.is_url:
            return self.storage.exists(CONFIG_FILE)
        return self.is_dir and bool(self.in_folder((self.path / CONFIG_FILE).is_file))

    @property
    def location(self) -> str | Path:
        """What a stored source is made with: the text of a URL or glob, else the local path."""
        return (self.text or "") if self.is_url or self.glob else self.path

    def nothing_matched(self) -> Exception:
        """The error when no source reads this spec."""
        if self.text is None:
            try:
                os.fspath(self.value)  # type: ignore[call-overload]
            except TypeError as exc:  # the same words as any path argument's
                return exc
            return SourceError(f"unsupported source {self.value!r}")
        if self.is_file:
            suffix = self.path.suffix.lower()
            return SourceError(
                f"source {self.text}: unsupported file type {suffix!r} (use a folder, a .tar, "
                "a glob of .tar files, a .parquet/.csv table, or 'demo')"
            )
        return SourceNotFoundError(f"source {self.text} does not exist")


def _holds_only_tars(root: Path) -> bool:
    has_tar = False
    for _dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.lower().endswith(".tar"):
                has_tar = True
            elif not name.startswith("."):
                return False
    return has_tar


# The built-in probes, in the order the registry asks them (see shardex.sources.registry).


def demo(spec: SourceSpec) -> bool:
    return spec.text is not None and (spec.text == "demo" or spec.text.startswith("demo:"))


def table(spec: SourceSpec) -> bool:
    if spec.is_url:
        return not spec.glob and spec.object_name.endswith(TABLE_SUFFIXES)
    return spec.is_file and spec.path.suffix.lower() in TABLE_SUFFIXES


def export(spec: SourceSpec) -> bool:
    if spec.is_url and (spec.glob or spec.object_name.endswith(".tar")):
        return False
    return (spec.is_url or spec.is_dir) and spec.has_config


def hf(spec: SourceSpec) -> bool:
    kind = type(spec.value)  # a datasets.Dataset/DatasetDict, without importing datasets
    if kind.__module__.split(".")[0] == "datasets" and kind.__name__ in ("Dataset", "DatasetDict"):
        return True
    return spec.is_dir and bool(spec.in_folder(lambda: is_saved_dataset(spec.path)))


def arrays(spec: SourceSpec) -> bool:
    return isinstance(spec.value, Mapping)


def tars(spec: SourceSpec) -> bool:
    """A glob, a ``.tar``, or a folder or prefix of only tars."""
    if spec.glob:
        return True
    if spec.is_url:
        if spec.object_name.endswith(".tar"):
            return True
        first = next(spec.storage.list_pages(""), [])
        names = [n for p, _ in first if not (n := p.rpartition("/")[2]).startswith(".")]
        return bool(names) and all(n.lower().endswith(".tar") for n in names)
    if spec.is_dir:
        spec.in_folder(lambda: os.listdir(spec.path))  # (os.walk ignores an unreadable folder)
        return _holds_only_tars(spec.path)
    return spec.is_file and spec.path.suffix.lower() == ".tar"


def folder(spec: SourceSpec) -> bool:
    """Any other local folder or URL: an image folder."""
    return spec.is_url or spec.is_dir
