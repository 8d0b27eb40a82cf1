"""NVIDIA DALI: read an export's tar shards with ``fn.readers.webdataset`` (docs/dali.md).

Each shard's DALI index file lets DALI open an export without scanning its tars. DALI reads
local files and ``s3://`` itself (credentials from *its own* environment; index files are
copied to the shardex cache since older DALI reads them locally only); anything else needs
``shard_root``, a local folder or mount with the export's files.
"""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from shardex.api import read_config, resolve_split
from shardex.backends.registry import backend_for
from shardex.contract import ExportConfig, ShardInfo
from shardex.errors import ConfigError, imported
from shardex.storage import Storage, open_storage
from shardex.storage.cache import local_copy

if TYPE_CHECKING:
    from shardex.dali_staging import Staging

__all__ = ["ReaderArguments", "batches", "pipeline", "reader_arguments"]

#: Schemes whose tars DALI's reader opens itself.
DIRECT_SCHEMES: Final = ("s3://",)
#: Index files fetched at once when staging them from object storage.
_STAGING_THREADS: Final = 16


@dataclass(frozen=True, slots=True)
class ReaderArguments:
    """What ``fn.readers.webdataset`` needs for one split (no ``index_paths``: DALI scans)."""

    paths: tuple[str, ...]
    index_paths: tuple[str, ...] | None
    ext: tuple[str, ...]

    def as_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"paths": list(self.paths), "ext": list(self.ext)}
        if self.index_paths is not None:
            out["index_paths"] = list(self.index_paths)
        return out


def default_ext(
    config: ExportConfig, prefix: str = "tar", keys: Sequence[str] | None = None
) -> tuple[str, ...]:
    """One reader output per x and y key (or per key of ``keys``) stored in the tars, e.g.
    ``("jpg;png", "cls")``; ``prefix`` is the backend's ``key_storage``."""
    out = []
    mark = f"{prefix}:"
    for key in (*config.x_keys, *config.y_keys) if keys is None else keys:
        spec = config.key_spec(key)
        where = spec.storage.split(",") if spec is not None else []
        tar = next((w.removeprefix(mark) for w in where if w.startswith(mark)), None)
        if tar:
            out.append(tar.replace("|", ";"))
        elif keys is not None:
            raise ConfigError(
                f"key {key!r} is not stored in the export's tars, which DALI reads (keys "
                f"there: {', '.join(k.key for k in config.key_specs if mark in k.storage)})"
            )
    if not out:
        raise ConfigError("no x or y key of this export is stored in its tars; pass ext=[...]")
    return tuple(out)


def reader_arguments(
    location: str | os.PathLike[str] | Storage,
    split: str | None = None,
    *,
    ext: Sequence[str] | None = None,
    shard_root: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ReaderArguments:
    """``paths``, ``index_paths`` and ``ext`` for DALI's webdataset reader over one split.

    Args:
        location: the export (a folder, an ``s3://`` URL or a storage).
        split: which split; may be left out when the export has only one.
        ext: the reader's outputs, each an extension or a ``;``-separated set
            (default: :func:`default_ext`).
        shard_root: a local folder or mount holding the export's files, read instead.
        storage_options: for reading config.yaml and index files; DALI does not see them.

    Raises:
        ConfigError: the backend writes no tar shards, or DALI cannot read them where
            they are and no ``shard_root`` was given.
    """
    storage = open_storage(location, storage_options)
    config = read_config(storage)
    backend = backend_for(config)
    if not backend.capabilities.dali:
        raise ConfigError(
            f"{storage.uri} is a {config.backend!r} export, whose shards DALI's webdataset "
            "reader cannot read; DALI reads exports of tar shards (backend 'webdataset')"
        )
    shards = config.split(resolve_split(config, split, storage.uri)).shards
    chosen = (
        tuple(ext) if ext is not None else default_ext(config, backend.key_storage or backend.name)
    )
    local = shard_root if shard_root is not None else storage.local_path("")
    if local is not None:
        root = os.path.abspath(os.fspath(local))
        return ReaderArguments(
            tuple(os.path.join(root, s.path) for s in shards),
            _indexes(shards, lambda p: os.path.join(root, p)),
            chosen,
        )
    if not storage.uri.startswith(DIRECT_SCHEMES):
        raise ConfigError(
            f"DALI's webdataset reader cannot read shards at {storage.uri} (it opens local "
            f"files and {', '.join(DIRECT_SCHEMES)} URLs); mount or copy the export and pass "
            "shard_root=<that folder>"
        )
    return ReaderArguments(
        tuple(storage.join(s.path) for s in shards), _staged(storage, shards), chosen
    )


def _indexes(shards: Sequence[ShardInfo], where: Callable[[str], str]) -> tuple[str, ...] | None:
    paths = [s.dali_index for s in shards if s.dali_index is not None]
    return tuple(where(p) for p in paths) if len(paths) == len(shards) else None


def _staged(storage: Storage, shards: Sequence[ShardInfo]) -> tuple[str, ...] | None:
    """Local copies of the index files, keyed by the shards' checksums (never stale)."""
    paths = [s.dali_index for s in shards if s.dali_index is not None]
    if len(paths) != len(shards):
        return None
    fingerprint = "\n".join(s.checksum for s in shards)
    with ThreadPoolExecutor(min(_STAGING_THREADS, max(1, len(paths)))) as pool:
        return tuple(str(p) for p in pool.map(lambda p: local_copy(storage, p, fingerprint), paths))


def pipeline(
    location: str | os.PathLike[str] | Storage,
    split: str | None = None,
    *,
    batch_size: int,
    ext: Sequence[str] | None = None,
    num_threads: int = 4,
    device_id: int | None = None,
    random_shuffle: bool = False,
    seed: int | None = None,
    shard_id: int = 0,
    num_shards: int = 1,
    shard_root: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    int_labels: bool = True,
    image_size: tuple[int, int] | None = None,
    stage: bool | None = None,
    **reader_options: Any,
) -> Any:
    """A DALI pipeline with one output per ``ext`` entry (raw ``uint8`` bytes), except
    ``cls``: an int64 label per sample (-1 where none) unless ``int_labels=False``; with
    ``image_size=(height, width)``, images are decoded (RGB) and resized.

    Args:
        location, split, ext, shard_root, storage_options: as for :func:`reader_arguments`.
        batch_size, num_threads, device_id, seed: the ``Pipeline``'s (``device_id=None``:
            CPU only).
        stage: download a remote split to a local folder DALI reads, removed with the
            pipeline (default: when ``storage_options`` name an endpoint, region or
            profile, which DALI's own S3 client would not see).
        random_shuffle, shard_id, num_shards: the reader's.
        reader_options: more ``fn.readers.webdataset`` arguments.

    Returns:
        An ``nvidia.dali.Pipeline``; its reader is named ``"Reader"`` for DALI's framework
        iterators (``DALIGenericIterator(pipe, [...], reader_name="Reader")``).

    Raises:
        MissingDependencyError: DALI is not installed.
        ConfigError: as for :func:`reader_arguments`.
    """
    fn, pipeline_class = _dali()
    args, staging = _arguments(location, split, ext, shard_root, storage_options, stage)
    # seed is left out unless given: DALI 1.x wants -1 for "any", DALI 2.x warns at -1
    seeded = {} if seed is None else {"seed": seed}
    pipe = pipeline_class(
        batch_size=batch_size, num_threads=num_threads, device_id=device_id, **seeded
    )
    reader = {"random_shuffle": random_shuffle, "shard_id": shard_id, "num_shards": num_shards}
    _set_outputs(pipe, fn, args, reader | reader_options, int_labels, image_size, device_id)
    if staging is not None:  # held until the pipeline is collected
        pipe.shardex_staging = staging
        weakref.finalize(pipe, staging.close)
    return pipe


def _arguments(
    location: str | os.PathLike[str] | Storage,
    split: str | None,
    ext: Sequence[str] | None,
    shard_root: str | os.PathLike[str] | None,
    storage_options: dict[str, Any] | None,
    stage: bool | None,
) -> tuple[ReaderArguments, Staging | None]:
    """:func:`pipeline`'s reader arguments and staging folder, if any."""
    storage = open_storage(location, storage_options)
    staging = None
    if stage is None:  # options that DALI's own S3 client would not see
        stage = any((storage_options or {}).get(k) for k in ("endpoint_url", "region", "profile"))
    if shard_root is None and storage.local_path("") is None and stage:
        from shardex.dali_staging import Staging

        config = read_config(storage)
        staging = Staging(storage, config.split(resolve_split(config, split, storage.uri)).shards)
        shard_root = staging.path
    try:
        args = reader_arguments(
            storage, split, ext=ext, shard_root=shard_root, storage_options=storage_options
        )
        if staging is None:
            _check_endpoint(args, storage_options)
    except BaseException:
        if staging is not None:
            staging.close()
        raise
    return args, staging


def _set_outputs(
    pipe: Any,
    fn: Any,
    args: ReaderArguments,
    reader_options: dict[str, Any],
    int_labels: bool,
    image_size: tuple[int, int] | None,
    device_id: int | None,
) -> None:
    with pipe:
        outputs = fn.readers.webdataset(**args.as_kwargs(), name="Reader", **reader_options)
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        if int_labels:
            from shardex.dali_labels import DaliOps, ascii_label

            ops = DaliOps()
        for i, (name, out) in enumerate(zip(args.ext, outputs, strict=True)):
            if int_labels and name == "cls":
                outputs[i] = ascii_label(out, ops)
            elif image_size is not None and _is_image(name):
                rgb = importlib.import_module("nvidia.dali.types").RGB
                device = "cpu" if device_id is None else "mixed"
                image = fn.decoders.image(out, device=device, output_type=rgb)
                outputs[i] = fn.resize(image, resize_y=image_size[0], resize_x=image_size[1])
        pipe.set_outputs(*outputs)


def _is_image(ext: str) -> bool:
    from shardex.codecs.images import IMAGE_EXTENSIONS

    return any(e.rpartition(".")[2].lower() in IMAGE_EXTENSIONS for e in ext.split(";"))


def batches(
    location: str | os.PathLike[str],
    split: str | None = None,
    *,
    features: Sequence[str],
    labels: Sequence[str],
    batch_size: int,
    storage_options: dict[str, Any] | None = None,
    **options: Any,
) -> Iterator[dict[str, Any]]:
    """One pass of :func:`pipeline` through ``DALIGenericIterator``: batches
    ``{"features": {key: tensor}, "labels": {key: tensor}}``; the last may be short."""
    iterator_module = importlib.import_module("nvidia.dali.plugin.pytorch")
    storage = open_storage(location, storage_options)
    config = read_config(storage)
    backend = backend_for(config)
    keys = (*features, *labels)
    ext = default_ext(config, backend.key_storage or backend.name, keys)
    pipe = pipeline(
        storage, split, batch_size=batch_size, ext=ext, storage_options=storage_options,
        **options,
    )  # fmt: skip
    iterator = iterator_module.DALIGenericIterator(
        pipe,
        list(keys),
        reader_name="Reader",
        last_batch_policy=iterator_module.LastBatchPolicy.PARTIAL,
    )
    labels_of = {k for k, e in zip(keys, ext, strict=True) if e == "cls"}
    try:
        for (batch,) in iterator:
            # a parsed label is one int64 per sample: (batch, 1) -> (batch,)
            out = {k: batch[k].reshape(-1) if k in labels_of else batch[k] for k in keys}
            yield {"features": {k: out[k] for k in features}, "labels": {k: out[k] for k in labels}}
    finally:
        staging = getattr(pipe, "shardex_staging", None)
        if staging is not None:
            staging.close()  # the loader ended (or was closed): its staged files go


def _check_endpoint(args: ReaderArguments, storage_options: dict[str, Any] | None) -> None:
    """Refuse to let DALI's S3 client (configured by the environment) reach another server."""
    endpoint = (storage_options or {}).get("endpoint_url")
    if not endpoint or not any(p.startswith(DIRECT_SCHEMES) for p in args.paths):
        return
    if os.environ.get("AWS_ENDPOINT_URL") != endpoint:
        raise ConfigError(
            f"DALI reads the shards through its own S3 client, configured from the "
            f"environment only: set AWS_ENDPOINT_URL={endpoint} (and AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, AWS_REGION) before the first pipeline, or pass shard_root"
        )


def _dali() -> tuple[Any, Any]:
    missing = (
        "shardex.dali.pipeline needs NVIDIA DALI: pip install 'shardex[dali]' (DALI for "
        "CUDA 12; for CUDA 13 install nvidia-dali-cuda130)"
    )
    return imported("nvidia.dali.fn", missing), imported("nvidia.dali.pipeline", missing).Pipeline
