"""``ImageWriterStage``: the end of a pipeline, writing the shardex format.

It takes NeMo Curator's parameters and writes through the exporter, so tars are filled to
exactly ``images_per_tar`` across batches and workers, whatever the executor.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardex.backends.registry import check_options
from shardex.contract import ExportConfig
from shardex.errors import ConfigError
from shardex.options import ExportOptions
from shardex.parallel import Runner
from shardex.pipeline.readers import READER_KEYS
from shardex.pipeline.stage import Batch, Stage
from shardex.refs.scan import LeftOut, ScanResult, build_table
from shardex.sources.arrays import npy_bytes
from shardex.sources.base import Source
from shardex.storage import Storage

#: The member of ``pixels`` stored as a key (``--x-key pixels``).
PIXELS_MEMBER = "pixels.npy"
_NOT_METADATA = frozenset({*READER_KEYS, "pixels", "pixels_changed"})
#: Export options ``**options`` may name (NeMo's names map to the others).
_OPTION_NAMES: frozenset[str] = frozenset(
    f.name for f in fields(ExportOptions) if f.name not in ("samples_per_shard", "backend")
) - {"deterministic_name"}


def _check_params(
    output_dir: object,
    images_per_tar: object,
    remove_image_data: object,
    verbose: object,
    deterministic_name: object,
) -> None:
    """NeMo's parameters, checked at construction (not after the pipeline ran)."""
    if not isinstance(output_dir, str | os.PathLike | Storage) or output_dir == "":
        raise ConfigError(
            f"ImageWriterStage: output_dir must be a folder, URL or Storage, got {output_dir!r}"
        )
    if isinstance(images_per_tar, bool) or not isinstance(images_per_tar, int):
        raise ConfigError(
            f"ImageWriterStage: images_per_tar must be an int >= 1, got {images_per_tar!r}"
        )
    if images_per_tar < 1:
        raise ConfigError(f"ImageWriterStage: images_per_tar must be >= 1, got {images_per_tar}")
    for flag, value in (
        ("remove_image_data", remove_image_data),
        ("verbose", verbose),
        ("deterministic_name", deterministic_name),
    ):
        if not isinstance(value, bool):
            raise ConfigError(f"ImageWriterStage: {flag} must be True or False, got {value!r}")


class _Collected(Source):
    """The samples a pipeline produced, as a source for the exporter."""

    kind: ClassVar[str] = "pipeline"

    def __init__(
        self,
        table: pa.Table,
        label_names: tuple[str, ...] | None,
        uri: str,
        left_out: tuple[LeftOut, ...] = (),
    ) -> None:
        self.table, self.label_names, self.uri, self.left_out = table, label_names, uri, left_out

    def scan(self) -> ScanResult:
        return ScanResult(self.table, self.label_names, self.left_out)


class ImageWriterStage(Stage):
    """Write the pipeline's samples as a shardex export (NeMo's parameters, and ours).

    Args:
        output_dir: the export's folder or URL (``s3://`` with ``storage_options``).
        images_per_tar: samples per shard; only the last shard of a split may hold fewer.
        remove_image_data: drop image bytes and pixels from the samples passed on (the
            export keeps them).
        deterministic_name: shard names from a hash of the content, else random.
        spec_fingerprint: the spec file's hash, recorded in config.yaml.
        name: NeMo's stage name, recorded as ``stage_name``.
        **options: more export options (``layout="flat"``, ``split_fractions``, ``seed``,
            ``mode`` ...; see :class:`shardex.ExportOptions`).
    """

    name: ClassVar[str] = "image_writer"
    needs = ("key",)

    def __init__(
        self,
        output_dir: str | os.PathLike[str] | Storage,
        images_per_tar: int = 1000,
        remove_image_data: bool = False,
        verbose: bool = False,
        deterministic_name: bool = True,
        *,
        backend: str = "webdataset",
        storage_options: dict[str, Any] | None = None,
        spec_fingerprint: str | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        _check_params(output_dir, images_per_tar, remove_image_data, verbose, deterministic_name)
        if name is not None and (not isinstance(name, str) or not name.strip() or "\n" in name):
            raise ConfigError(
                f"ImageWriterStage: name must be a non-empty one-line str, got {name!r}"
            )
        self.stage_name = name
        self.output_dir = output_dir
        self.images_per_tar = images_per_tar
        self.remove_image_data = remove_image_data
        self.verbose = verbose
        self.deterministic_name = deterministic_name
        self.backend = backend
        self.storage_options = storage_options
        self.spec_fingerprint = spec_fingerprint
        self.options = options
        # bad options fail here, before any stage runs
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise ConfigError(
                f"ImageWriterStage: unknown parameter {unknown[0]!r}; expected one of NeMo's "
                f"(output_dir, images_per_tar, remove_image_data, verbose, deterministic_name, "
                f"name) or an export option ({', '.join(sorted(_OPTION_NAMES))})"
            )
        check_options(
            ExportOptions(
                backend=backend,
                samples_per_shard=images_per_tar,
                deterministic_name=deterministic_name,
                **options,
            )
        )

    def params(self) -> dict[str, Any]:
        out = super().params()
        target = self.output_dir
        out["output_dir"] = target.uri if isinstance(target, Storage) else str(target)
        if self.stage_name is None:
            # an unnamed stage records what it always did (config.yaml stays byte-identical)
            del out["stage_name"]
        return out

    def process(self, batch: Batch) -> Batch:
        x_keys = self.options.get("x_keys")  # None: every member is stored
        keys = frozenset((*x_keys, *(self.options.get("y_keys") or ()))) if x_keys else None
        for sample in batch:
            _finish_pixels(sample, keys)
        return batch

    def reduce(self, batch: Batch, state: dict[str, Any]) -> Batch:
        """Collect the samples, their bytes spooled to disk (the driver holds no images)."""
        spool = state.get("spool")
        if spool is None:
            spool = state["spool"] = _Spool(self.output_dir)
        state.setdefault("samples", []).extend(spool.add(s) for s in batch)
        if not self.remove_image_data:
            return batch
        return [{k: v for k, v in s.items() if k not in ("image", "pixels")} for s in batch]

    def cleanup(self, state: dict[str, Any]) -> None:
        """Remove the spool (after the export, or when the pipeline failed)."""
        spool = state.pop("spool", None)
        if spool is not None:
            spool.close()

    def write(
        self,
        state: dict[str, Any],
        label_names: tuple[str, ...] | None,
        source_uri: str,
        runner: Runner,
        pipeline: tuple[dict[str, Any], ...],
        schema: pa.Schema | None = None,
        left_out: tuple[LeftOut, ...] = (),
    ) -> ExportConfig:
        """Export what :meth:`reduce` collected; source columns keep their ``schema`` types."""
        from shardex.engine.run import export_options, run_export

        samples: Batch = state.get("samples", [])
        if not samples:
            first = f"; the source left out {len(left_out)}, e.g. " if left_out else ""
            if left_out:
                first += f"{left_out[0].original_path!r}: {left_out[0].reason}"
            raise ConfigError(f"the pipeline produced no samples; nothing to write{first}")
        if "spool" in state:
            state["spool"].flush()
        table = samples_table(samples, schema)
        options = {
            "samples_per_shard": self.images_per_tar,
            "deterministic_name": self.deterministic_name,
            "backend": self.backend,
            **self.options,
        }
        return run_export(
            _Collected(table, label_names, source_uri, left_out),
            self.output_dir,
            export_options(None, options),
            progress=self.verbose,
            storage_options=self.storage_options,
            runner=runner,
            pipeline=pipeline,
            spec_fingerprint=self.spec_fingerprint,
        )


def _finish_pixels(sample: dict[str, Any], keys: frozenset[str] | None = None) -> None:
    """Store ``pixels`` as ``pixels.npy`` if asked for, changed pixels as PNG; drop the rest."""
    pixels = sample.pop("pixels", None)
    if pixels is not None and keys is not None and "pixels" in keys:
        sample[f"member:{PIXELS_MEMBER}"] = npy_bytes(pixels)
    wants_image = keys is None or "image" in keys
    if pixels is not None and sample.pop("pixels_changed", False) and wants_image:
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(pixels)).save(buf, format="PNG")
        sample["image"], sample["image_ext"] = buf.getvalue(), "png"
    sample.pop("pixels_changed", None)


def samples_table(samples: Batch, schema: pa.Schema | None = None) -> pa.Table:
    """A scan table of pipeline samples: image and other members inline, metadata typed."""
    members = [
        ([_inline(s["image_ext"], s["image"])] if "image" in s else [])
        + [_inline(k.removeprefix("member:"), v) for k, v in s.items() if k.startswith("member:")]
        for s in samples
    ]
    names = sorted(
        {k for s in samples for k in s if k not in _NOT_METADATA and not k.startswith("member:")}
    )
    types = {f.name: f.type for f in schema} if schema is not None else {}
    metadata = pa.table(
        {name: _column([s.get(name) for s in samples], name, types.get(name)) for name in names}
    )
    has = {k: any(k in s for s in samples) for k in ("split", "label")}
    splits = [None if s.get("split") is None else str(s["split"]) for s in samples]
    return build_table(
        [str(s["key"]) for s in samples],
        [str(s.get("original_path", s["key"])) for s in samples],
        members,
        splits=splits if has["split"] else None,
        labels=[s.get("label") for s in samples] if has["label"] else None,
        metadata=metadata,
    )


def _inline(ext: str, data: bytes | _Ref) -> dict[str, Any]:
    if isinstance(data, _Ref):
        return {
            "ext": ext,
            "path": data.path,
            "offset": data.offset,
            "size": data.size,
            "data": None,
        }
    return {"ext": ext, "path": None, "offset": -1, "size": len(data), "data": data}


@dataclass(frozen=True, slots=True)
class _Ref:
    path: str
    offset: int
    size: int


class _Spool:
    """An append-only file of sample bytes, beside a local output or in the temp folder."""

    def __init__(self, output: str | os.PathLike[str] | Storage) -> None:
        local = output.local_path("") if isinstance(output, Storage) else None
        if local is None and not isinstance(output, Storage) and "://" not in os.fspath(output):
            local = Path(output)
        where = local.resolve().parent if local is not None else None
        if where is not None and not where.is_dir():
            where = None
        self.dir = tempfile.mkdtemp(prefix=".shardex-spool-", dir=where)
        self.path = os.path.join(self.dir, "samples.bin")
        self._file = open(self.path, "wb")  # noqa: SIM115 - lives as long as the spool
        self._at = 0

    def add(self, sample: dict[str, Any]) -> dict[str, Any]:
        out = dict(sample)
        for name, value in sample.items():
            if (name == "image" or name.startswith("member:")) and isinstance(value, bytes):
                self._file.write(value)
                out[name] = _Ref(self.path, self._at, len(value))
                self._at += len(value)
        return out

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _column(values: list[Any], name: str, hint: pa.DataType | None) -> pa.Array:
    """The source's type (``hint``) if it fits; 1-D arrays of one shape as fixed-size lists."""
    if hint is not None:
        try:
            return pa.array([v.tolist() if isinstance(v, np.ndarray) else v for v in values], hint)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # a stage changed the column's type: infer it below
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    one_shape = len({a.shape for a in arrays}) == 1 and arrays[0].ndim == 1
    if one_shape and len(arrays) == sum(v is not None for v in values):
        width, dtype = arrays[0].shape[0], arrays[0].dtype
        flat = np.concatenate([np.zeros(width, dtype) if v is None else v for v in values])
        mask = pa.array([v is None for v in values]) if len(arrays) < len(values) else None
        return pa.FixedSizeListArray.from_arrays(pa.array(flat), width, mask=mask)
    plain = [v.tolist() if isinstance(v, np.ndarray) else v for v in values]
    try:
        return pa.array(plain)
    except OverflowError:  # ints past int64 (64-bit hashes): unsigned when they all fit
        return pa.array(plain, pa.uint64())
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ConfigError(f"metadata {name!r} mixes types across samples ({exc})") from exc
