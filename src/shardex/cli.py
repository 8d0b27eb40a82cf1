"""The ``shardex`` command: thin; parses arguments, calls the public API, shows progress."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from shardex.cli_config import config_option
from shardex.errors import (
    SampleNotFoundError,
    ShardexError,
    ShardexWarning,
    SourceNotFoundError,
)
from shardex.quoting import one_line
from shardex.version import __version__

_SPLIT_HELP = "Split to use (default: the only split, else each split in turn)."


def _console() -> Any:
    """rich's console; on a pipe or file (``| grep``, a CI log) as wide as each line needs
    (rich would lay tables out in 80 columns and fold words), unless COLUMNS says."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=_UNWRAPPED)
    return console


#: The console width off a terminal: no line is that long, and rich pads nothing to it.
_UNWRAPPED: Final = 1 << 20


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


if TYPE_CHECKING:
    _ParamType = click.ParamType[str]
else:  # click < 8.2 has no generic ParamType
    _ParamType = click.ParamType


class _Duration(_ParamType):
    """A duration: seconds, or "500ms", "30s", "2m", "1h" (storage options' syntax)."""

    name = "duration"

    def __init__(self, option: str) -> None:
        self.option = option

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from shardex.storage.options import duration

        try:
            duration(value, self.option)
        except ShardexError as exc:
            self.fail(str(exc), param, ctx)
        return str(value)


#: The object-storage flags of every command that takes a location: flag, the storage
#: option it sets, metavar, help; the time limits (type DURATION) last.
_S3_FLAGS: Final = (
    (
        "--s3-endpoint-url",
        "endpoint_url",
        "URL",
        "S3-compatible endpoint, e.g. http://127.0.0.1:8333 (default: AWS_ENDPOINT_URL).",
    ),
    ("--s3-region", "region", None, "Region for s3:// locations (default: AWS_REGION)."),
    (
        "--s3-profile",
        "profile",
        "NAME",
        "Named AWS profile for s3:// locations, read from ~/.aws/credentials and "
        "~/.aws/config (boto3 only for role, SSO or process credentials).",
    ),
)
_TIME_FLAGS: Final = (
    (
        "--s3-retry-timeout",
        "retry_timeout",
        "DURATION",
        "How long a failing object-storage request (connection refused or dropped, timed "
        "out, 5xx, throttled) is retried before the command fails: seconds or 500ms, 30s, "
        "2m (default 2m).",
    ),
    (
        "--s3-timeout",
        "timeout",
        "DURATION",
        "Time limit of one object-storage request, after which it is retried (default 60s).",
    ),
    (
        "--s3-connect-timeout",
        "connect_timeout",
        "DURATION",
        "Time limit of connecting to the object store (default 5s).",
    ),
)
_SOURCE_S3_FLAGS: Final = (
    (
        "--source-s3-endpoint-url",
        "endpoint_url",
        "URL",
        "S3-compatible endpoint for an s3:// SOURCE (default: --s3-endpoint-url).",
    ),
    ("--source-s3-region", "region", None, "Region for an s3:// SOURCE (default: --s3-region)."),
    (
        "--source-s3-profile",
        "profile",
        "NAME",
        "Named AWS profile for an s3:// SOURCE (default: --s3-profile).",
    ),
)
#: Where these flags leave their values (ctx.meta is shared by a command's contexts), so
#: that every command taking a location takes them without six more parameters each.
_OUTPUT: Final = "shardex.storage_options"
_TIMES: Final = "shardex.storage_time_options"
_SOURCE: Final = "shardex.source_storage_options"


def _flags(
    fn: Any, rows: tuple[tuple[str, str, str | None, str], ...], where: str, timed: bool = False
) -> Any:
    """Adds ``rows`` as options that leave their values in ``ctx.meta[where]``, each
    under the storage option it sets."""
    for flag, option, metavar, text in reversed(rows):

        def keep(
            ctx: click.Context, _param: click.Parameter, value: Any, key: str = option
        ) -> None:
            if value:
                ctx.meta.setdefault(where, {})[key] = value

        fn = click.option(
            flag,
            type=_Duration(option) if timed else None,
            default=None,
            metavar=metavar,
            expose_value=False,
            callback=keep,
            help=text,
        )(fn)
    return fn


def _storage_flags(fn: Any) -> Any:
    """The object-storage flags every command that takes a location accepts."""
    return _flags(_flags(fn, _TIME_FLAGS, _TIMES, timed=True), _S3_FLAGS, _OUTPUT)


def _source_storage_flags(fn: Any) -> Any:
    """The object-storage flags of a source on object storage (default: the --s3-* ones)."""
    return _flags(fn, _SOURCE_S3_FLAGS, _SOURCE)


def _storage_options() -> dict[str, Any] | None:
    """The storage options of the command's location, from its --s3-* flags."""
    meta = click.get_current_context().meta
    return {**meta.get(_OUTPUT, {}), **meta.get(_TIMES, {})} or None


def _source_options() -> dict[str, Any] | None:
    """A source's storage options: each --source-s3-* flag, else its --s3-* one; None
    (the output's options) when no --source-s3-* flag is given."""
    meta = click.get_current_context().meta
    if not meta.get(_SOURCE):
        return None
    return {**meta.get(_OUTPUT, {}), **meta[_SOURCE], **meta.get(_TIMES, {})}


class _Group(click.Group):
    """Turns shardex errors into one clear line and a non-zero exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except ShardexError as exc:
            # one line whatever the message quotes (a file name may hold a newline)
            click.echo(f"error: {one_line(str(exc))}", err=True)
            ctx.exit(1)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """shardex's warnings as one line, like its errors; others as Python shows them."""
    if issubclass(category, ShardexWarning):
        click.echo(f"warning: {one_line(str(message))}", err=True)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardex")
def main() -> None:
    """shardex: export datasets to sharded storage and read them back fast.

    \b
    Quick start:
      shardex export-dataset demo -o out --split-fractions train=0.8,val=0.1,test=0.1
      shardex inspect out
      shardex ls out --split val --limit 5
      shardex get out circle/000000 -o circle.jpg
    """


@main.command("export-dataset")
@click.argument("source")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder to write the export to (new or empty, or see --overwrite).",
)
@click.option(
    "--backend",
    default="webdataset",
    show_default=True,
    help="Export backend (see `shardex backend list`).",
)
@click.option(
    "--split",
    "splits",
    multiple=True,
    help="Export only this split (repeatable). Default: every split.",
)
@click.option(
    "--x-key",
    "x_keys",
    multiple=True,
    help="Input key to store (repeatable): a source field (image, NAME of NAME.npy) or a "
    "metadata column (stored as a field, e.g. an embedding). Default: every source field.",
)
@click.option(
    "--y-key",
    "y_keys",
    multiple=True,
    help="Target key to store (repeatable). Default: label, when the source has one.",
)
@click.option(
    "--labels/--no-labels",
    default=True,
    show_default=True,
    help="Store class labels (.cls members and the label column).",
)
@click.option(
    "--samples-per-shard",
    "--images-per-tar",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Samples per shard; only the last shard of a split may hold fewer. Never padded.",
)
@click.option(
    "--max-shard-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Also close a shard before it would pass this many bytes.",
)
@click.option(
    "--deterministic-name/--random-name",
    default=True,
    show_default=True,
    help="Shard names from a hash of the input and options (same input, same bytes), or random.",
)
@click.option(
    "--split-fractions",
    default=None,
    metavar="NAME=F,...",
    help="Split a source that has no splits, by a seeded hash of each key, e.g. "
    "train=0.8,val=0.1,test=0.1. Default: one split, train.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of --split-fractions (recorded in config.yaml).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Processes (default: one per core, at most 8); with --executor ray, the most Ray "
    "tasks at once (default: one per cluster CPU). Output is identical for any number.",
)
@click.option(
    "--mode",
    type=click.Choice(["error", "overwrite", "resume", "append"]),
    default="error",
    show_default=True,
    help="If OUTPUT holds an export: refuse (error); replace it, readable at every "
    "moment (overwrite: unchanged shards are kept, stale files removed); finish an "
    "interrupted export, overwrite or append run with the same SOURCE and options "
    "(resume: shards that verify against the source are kept); or add SOURCE's samples "
    "to it as new shards (append: same split rule, labels and keys). One export writes "
    "to an OUTPUT at a time: a second one is refused.",
)
@click.option("--overwrite", is_flag=True, help="Shorthand for --mode overwrite.")
@click.option(
    "--on-error",
    type=click.Choice(["error", "skip"]),
    default="error",
    show_default=True,
    help="On a bad sample, or a file the source cannot export (a .heic, a broken "
    "symlink ...): stop with an error naming it, or skip it and record it in errors.parquet.",
)
@click.option(
    "--validate",
    type=click.Choice(["none", "header", "decode"]),
    default="header",
    show_default=True,
    help="How images are checked: header (magic bytes and "
    "end markers; cheap), decode (full decode), or none.",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=None,
    help="Refuse images larger than this many pixels (decompression bombs); default 178956970.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float16", "float32", "float64", "bfloat16"]),
    default=None,
    help="Cast floating-point array fields to this dtype (recorded in config.yaml). "
    "Integers, booleans and images are never cast. bfloat16: torch, tensor_shards and "
    "tensordict_memmap backends only (read back as torch.bfloat16 tensors). "
    "Default: keep every dtype.",
)
@click.option(
    "--image-member",
    type=click.Choice(["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"]),
    default=None,
    help="Store every sample's image as KEY.<this> (e.g. jpg) whatever its format, the "
    "bytes unchanged and the format in the image_format column: readers that make one "
    "column per extension (Hugging Face datasets, Ray Data) then read mixed "
    "jpg/png/webp exports (recorded in config.yaml; see docs/interop.md).",
)
@click.option(
    "--layout",
    type=click.Choice(["split", "flat"]),
    default="split",
    show_default=True,
    help="Where a split's files go: a folder per split, or (flat, one split only, webdataset "
    "backend) the output's top level, as NeMo Curator writes OUTPUT/images-*.tar.",
)
@click.option(
    "--backend-option",
    "backend_options",
    multiple=True,
    metavar="NAME=VALUE",
    help="An option of the backend (repeatable; `shardex backend list` shows them), "
    "e.g. --backend-option image_codec=webp for zarr.",
)
@click.option(
    "--preprocess/--no-preprocess",
    default=False,
    help="SOURCE is a spec file: run its stages before writing (without it, the spec's "
    "source is exported as is, with the spec's options).",
)
@click.option(
    "--preprocess-until-key",
    "until_keys",
    multiple=True,
    metavar="KEY",
    help="SOURCE is a spec file: run its stages in order only until KEY exists "
    "(repeatable: all of them; stages that only change KEY in place, such as a resize of "
    "pixels, still run), then write that view. With --x-key pixels the decoded pixels "
    "are stored as a tensor field. Fails before running if no stage produces KEY.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where the work runs: local processes (default) or a Ray cluster.",
)
@click.option(
    "--ray-address",
    default=None,
    help=(
        "Ray cluster to join with --executor ray: HOST:PORT, ray://HOST:PORT or auto "
        "(default: start or join a local one). Refused in one line when nothing answers "
        "within SHARDEX_RAY_CONNECT_TIMEOUT seconds (default 10)."
    ),
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@_storage_flags
@_source_storage_flags
@config_option
def export_dataset(
    source: str,
    output: str,
    backend: str,
    splits: tuple[str, ...],
    x_keys: tuple[str, ...],
    y_keys: tuple[str, ...],
    labels: bool,
    samples_per_shard: int,
    max_shard_bytes: int | None,
    deterministic_name: bool,
    split_fractions: str | None,
    seed: int,
    workers: int | None,
    mode: str,
    overwrite: bool,
    on_error: str,
    validate: str,
    max_pixels: int | None,
    dtype: str | None,
    image_member: str | None,
    layout: str,
    backend_options: tuple[str, ...],
    preprocess: bool,
    until_keys: tuple[str, ...],
    executor: str | None,
    ray_address: str | None,
    quiet: bool,
) -> None:
    """Export SOURCE to sharded storage at OUTPUT.

    SOURCE is an image folder ([split/][class/]image.jpg), a .parquet/.csv table, a .tar
    file, a folder or glob of WebDataset tars, an existing export, or `demo` (`demo:N`):
    the built-in labelled demo images (no download). It can also be a spec file (.yaml)
    naming the source, stages, backend and options (see docs/pipeline.md), or a
    scenario's name: a bare NAME (no such file or folder) is NAME.yaml or NAME.yml in
    the current folder, else in the folders of SHARDEX_SCENARIO_PATH.

    SOURCE may be on object storage (s3://bucket/prefix/): an image folder, WebDataset
    tars (a prefix, a glob or one .tar), a .parquet/.csv table, or an export. Its
    endpoint, region and profile are the --s3-* ones unless --source-s3-* are given.

    Coming from NexuML's export-dataset or NeMo Curator's ImageWriterStage?
    docs/migrating.md maps every flag and snippet. NexuML's flags keep their names and
    meaning here; defaults that may differ from yours: --backend webdataset,
    --samples-per-shard 1000, and config.yaml's format_version 3 (shardex's own).
    """
    from shardex.backends.registry import check_options
    from shardex.codecs.images import MAX_PIXELS
    from shardex.errors import ConfigError
    from shardex.exporter import export
    from shardex.options import ExportOptions, parse_split_fractions
    from shardex.pipeline.spec import find_scenario, is_scenario_name, scenario_not_found

    try:
        fractions = parse_split_fractions(split_fractions) if split_fractions else None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--split-fractions") from None
    opts = ExportOptions(
        backend=backend,
        splits=splits or None,
        x_keys=x_keys or None,
        y_keys=y_keys or None,
        labels=labels,
        samples_per_shard=samples_per_shard,
        max_shard_bytes=max_shard_bytes,
        deterministic_name=deterministic_name,
        split_fractions=fractions,
        seed=seed,
        workers=workers,
        mode=mode,  # type: ignore[arg-type]
        max_pixels=max_pixels or MAX_PIXELS,
        overwrite=overwrite,
        on_error=on_error,  # type: ignore[arg-type]
        validate=validate,  # type: ignore[arg-type]
        dtype=dtype,
        image_member=image_member,
        backend_options=_backend_options(backend_options),
        layout=layout,  # type: ignore[arg-type]
    )
    check_options(opts)  # what the backend cannot store: before the source is looked at
    storage_options = _storage_options()
    source_options = _source_options()
    spec_file = find_scenario(source)
    if source_options and spec_file is not None:
        raise click.UsageError(
            "--source-s3-* flags work with a SOURCE that is not a spec file; with a spec "
            "file, give the source's store through AWS_* variables"
        )
    if spec_file is not None:
        config = _export_spec(
            str(spec_file),
            output,
            opts,
            preprocess,
            until_keys,
            executor,
            ray_address,
            not quiet,
            storage_options,
        )
    elif preprocess or until_keys:
        if is_scenario_name(source):
            raise scenario_not_found(source)
        raise click.UsageError("--preprocess and --preprocess-until-key need a spec file SOURCE")
    else:
        try:
            # on Ray, tasks write the shards; this process reads references, writes metadata
            config = export(
                source,
                output,
                opts,
                progress=not quiet,
                storage_options=storage_options,
                source_storage_options=source_options,
                executor="ray" if executor == "ray" else "local",
                ray_address=ray_address,
            )
        except SourceNotFoundError:
            if is_scenario_name(source):
                raise scenario_not_found(source) from None
            raise
    parts = ", ".join(f"{name} {info.num_samples}" for name, info in config.splits.items())
    shards = sum(len(s.shards) for s in config.splits.values())
    size = sum(s.num_bytes for s in config.splits.values())
    click.echo(
        f"exported {config.num_samples} samples ({parts}) in {shards} shards, "
        f"{_size(size)}, to {output}"
    )
    if config.num_skipped:
        click.echo(_skipped_summary(output, config, storage_options))


#: How many skipped samples or files the export summary names.
_SKIPPED_SHOWN = 5


def _skipped_summary(output: str, config: Any, storage_options: dict[str, Any] | None) -> str:
    """What an export left out: a count, then the first few names with their reasons."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    head = (
        f"skipped {config.num_skipped} samples or files (bad, unreadable, or not exportable): "
        f"see {output}/{config.errors_file}"
    )
    from shardex.format.tables import arrow_reader
    from shardex.quoting import quoted
    from shardex.storage import open_storage

    try:
        storage = open_storage(output, storage_options)
        rows = pq.read_table(arrow_reader(storage.get(config.errors_file))).to_pylist()
    except (ShardexError, OSError, pa.ArrowException):  # the summary must not fail the export
        return head
    lines = [
        head,
        *(f"  {quoted(r['original_path'])}: {r['reason']}" for r in rows[:_SKIPPED_SHOWN]),
    ]
    if len(rows) > _SKIPPED_SHOWN:
        lines.append(f"  ... and {len(rows) - _SKIPPED_SHOWN} more")
    return "\n".join(lines)


@main.command()
@click.argument("output")
@click.option("--json", "as_json", is_flag=True, help="Print config.yaml as JSON.")
@_storage_flags
def inspect(
    output: str,
    as_json: bool,
) -> None:
    """Summarise the export at OUTPUT (config.yaml, splits, shards, keys)."""
    from rich.table import Table

    from shardex.api import read_config

    storage = _location(output)
    config = read_config(storage)
    if as_json:
        click.echo(json.dumps(config.to_dict(), indent=2))
        return
    console = _console()
    console.print(
        f"[bold]{output}[/]: backend {config.backend}, format {config.format_version}, "
        f"{config.num_samples} samples, written by shardex {config.shardex_version}"
    )
    splits = Table("split", "samples", "shards", "bytes", "samples/shard")
    for name, info in config.splits.items():
        per = info.num_samples / max(1, len(info.shards))
        splits.add_row(
            name, str(info.num_samples), str(len(info.shards)), _size(info.num_bytes), f"{per:.0f}"
        )
    console.print(splits)
    keys = Table()
    keys.add_column("key", no_wrap=True)
    for header in ("role", "dtype", "shape", "encoding"):
        keys.add_column(header)
    keys.add_column("storage", overflow="fold")
    for spec in config.key_specs:
        shape = "" if spec.shape is None else str(list(spec.shape)).replace("None", "?")
        keys.add_row(spec.key, spec.role, spec.dtype, shape, spec.encoding or "", spec.storage)
    console.print(keys)
    if config.label_names:
        console.print(f"labels ({config.num_classes}): {', '.join(config.label_names)}")
    if config.split_method == "fractions":
        console.print(
            f"split by seeded key hash: {config.split_fractions} (seed {config.split_seed})"
        )
    if config.num_skipped:
        console.print(f"[yellow]{config.num_skipped} samples skipped[/] (see {config.errors_file})")
    _print_plain_readers(console, config, storage)


def _print_plain_readers(console: Any, config: Any, storage: Any) -> None:
    """Per split, the call that opens it with the stock library (no shardex): the array
    backends' folders carry a content hash (see docs/backends.md, *Where the files are*)."""
    from shardex.backends.registry import REGISTRY

    try:
        backend = REGISTRY.backend_class(config.backend)
    except ShardexError:  # not installed here: the summary above is all there is
        return
    location = storage.uri.rstrip("/")
    calls = [
        (name, backend.plain_reader(config, name, location, storage)) for name in config.splits
    ]
    if any(call for _, call in calls):
        console.print("without shardex:")
    for name, call in calls:
        if call:
            # one line each, as written (no markup, no wrapping), to copy into Python
            console.print(f"  {name}: {call}", markup=False, highlight=False, soft_wrap=True)


#: The columns of ``shardex ls``, in order (its --help and the README name them).
_LS_COLUMNS: Final = ("split", "key", "shard", "offset", "length", "original_path")


@main.command("ls")
@click.argument("output")
@click.option("--split", default=None, help=_SPLIT_HELP)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show at most N rows.")
@click.option("--no-header", is_flag=True, help="Leave out the header line.")
@_storage_flags
def ls(
    output: str,
    split: str | None,
    limit: int | None,
    no_header: bool,
) -> None:
    """List the samples of OUTPUT, one tab-separated line each, under a header line:
    split, key, shard, offset, length, original_path. Offset and length are the sample's
    byte range in its tar (empty for the array backends: their shards are no tars)."""
    from shardex.api import read_config

    storage = _location(output)
    config = read_config(storage)
    splits = [split] if split else list(config.splits)
    if not no_header:
        click.echo("\t".join(_LS_COLUMNS))
    shown = 0
    for name in splits:
        info = config.split(name)
        meta = _open(storage, name).metadata
        if "tar_file" in meta.column_names:
            places = [
                meta.column(c).to_pylist() for c in ("tar_file", "sample_offset", "sample_length")
            ]
        else:  # an array backend: its shards hold their samples in order
            shards = [s.path for s in info.shards for _ in range(s.num_samples)]
            places = [shards, [""] * len(shards), [""] * len(shards)]
        keys, originals = (meta.column(c).to_pylist() for c in ("key", "original_path"))
        for key, shard, offset, length, original in zip(keys, *places, originals, strict=True):
            if limit is not None and shown >= limit:
                return
            click.echo(f"{name}\t{key}\t{shard}\t{offset}\t{length}\t{original}")
            shown += 1


def _location(output: str) -> Any:
    from shardex.storage import open_storage

    return open_storage(output, _storage_options())


def _open(storage: Any, split: str) -> Any:
    from shardex.api import open_dataset

    return open_dataset(storage, split=split)


@main.command()
@click.argument("output")
@click.argument("key")
@click.option("--split", default=None, help=_SPLIT_HELP)
@click.option(
    "-o",
    "--out",
    "dest",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write one field's exact bytes to this file (default field: the image).",
)
@click.option("--field", default=None, help="Field (extension) to write with -o, e.g. cls.")
@_storage_flags
def get(
    output: str,
    key: str,
    split: str | None,
    dest: str | None,
    field: str | None,
) -> None:
    """Fetch the sample KEY from OUTPUT: show its fields, or write one with -o."""
    from shardex.api import read_config
    from shardex.codecs.images import IMAGE_EXTENSIONS

    storage = _location(output)
    config = read_config(storage)
    sample, where = None, ""
    for name in [split] if split else list(config.splits):
        try:
            sample, where = _open(storage, name).get(key), name
            break
        except SampleNotFoundError:
            continue
    if sample is None:
        raise SampleNotFoundError(
            f"no sample with key {key!r} in {output}" + (f" split {split!r}" if split else "")
        )
    fields = {k: v for k, v in sample.items() if k != "__key__"}
    if dest is None:
        click.echo(f"{key} (split {where})")
        for ext, data in fields.items():
            text = data.decode("utf-8", "replace") if ext in ("cls", "json", "txt") else ""
            click.echo(f"  {ext}: {len(data)} bytes {text}".rstrip())
        return
    ext = field or next(
        (e for e in fields if e.rpartition(".")[2] in IMAGE_EXTENSIONS), next(iter(fields))
    )
    if ext not in fields:
        raise SampleNotFoundError(
            f"sample {key!r} has no field {ext!r} (it has {', '.join(fields)})"
        )
    try:
        Path(dest).write_bytes(fields[ext])
    except OSError as exc:
        from shardex.errors import StorageError
        from shardex.quoting import quoted

        hint = "; create its folder first" if isinstance(exc, FileNotFoundError) else ""
        raise StorageError(f"cannot write {quoted(dest)}: {exc.strerror or exc}{hint}") from exc
    click.echo(f"wrote {len(fields[ext])} bytes ({key}.{ext}) to {dest}")


@main.command("browse")
@click.argument("export")
@click.option(
    "--split",
    default=None,
    help="Split shown first (default: the only one, else the first); the page switches splits.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; any other than loopback shows the export to the network.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to bind (0: any free port; the URL printed names it).",
)
@_storage_flags
def browse_command(
    export: str,
    split: str | None,
    host: str,
    port: int,
) -> None:
    """Look at EXPORT in the browser: thumbnails, filters, plots, one sample in full.

    A local, read-only web app (needs `pip install 'shardex[browse]'`); Ctrl-C stops it.
    """
    from shardex.browse import browse

    options = _storage_options()
    browse(export, split, host=host, port=port, storage_options=options)


@main.command("verify")
@click.argument("output")
@click.option("--deep", is_flag=True, help="Also decode every image.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_storage_flags
def verify_command(
    output: str,
    deep: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Check OUTPUT byte for byte: config, index, shards, every sample's checksum.

    Exits 1 when anything is wrong, listing each problem with its file and sample key.
    """
    from shardex.verification import verify

    report = verify(
        _location(output),
        deep=deep,
        progress=not (quiet or as_json),
    )
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for problem in report.problems:
            click.echo(str(problem))
        state = "OK" if report.ok else f"{len(report.problems)} problem(s)"
        click.echo(
            f"{output}: {state}; checked {report.samples} samples in {report.shards} "
            f"shards ({_size(report.bytes)}){', images decoded' if deep else ''}"
        )
    if not report.ok:
        sys.exit(1)


@main.group()
def backend() -> None:
    """Export backends."""


@backend.command("list")
@click.argument("category", required=False, type=click.Choice(["data-export", "data-loader"]))
def backend_list(category: str | None) -> None:
    """List the registered backends, whether each is usable here, and what it can do;
    `data-loader`: the loaders, the backends each reads, and what each supports."""
    from rich.markup import escape
    from rich.table import Table

    from shardex.backends.registry import REGISTRY

    if category == "data-loader":
        _loader_list()
        return
    table = Table()
    table.add_column("name", no_wrap=True)
    for header in ("available", "random", "stream", "remote"):
        table.add_column(header, no_wrap=True)
    table.add_column("implementation / description", overflow="fold")
    for entry in REGISTRY.entries():
        if not entry.available:
            hint = entry.install_hint or "missing dependency"
            table.add_row(entry.name, "no", "", "", "", escape(f"{entry.target}\n{hint}"))
            continue
        try:
            be = REGISTRY.get(entry.name)
        except ShardexError as exc:  # a plugin that fails to import is listed, not fatal
            table.add_row(entry.name, "no", "", "", "", escape(f"{entry.target}\n{exc}"))
            continue
        if category and category not in be.categories:
            continue
        caps = be.capabilities
        flags = (_yes(caps.random_access), _yes(caps.streaming), _yes(caps.remote))
        options = "".join(f"\noption {k}: {v}" for k, v in be.option_help.items())
        text = escape(f"{entry.target}\n{be.description}{options}")
        table.add_row(entry.name, "yes", *flags, text)
    _console().print(table)


def _loader_list() -> None:
    """The loaders table: the backends each reads come from the backends' capabilities."""
    from rich.markup import escape
    from rich.table import Table

    from shardex.backends.registry import REGISTRY
    from shardex.loaders import LOADERS

    capabilities = {}
    for entry in REGISTRY.entries():
        if entry.available:
            try:
                capabilities[entry.name] = REGISTRY.get(entry.name).capabilities
            except ShardexError:  # a plugin that fails to import reads with no loader
                continue
    table = Table()
    table.add_column("loader", no_wrap=True)
    table.add_column("available", no_wrap=True)
    table.add_column("backends", overflow="fold")
    table.add_column("import / supports", overflow="fold")
    for loader in LOADERS:
        hint = "" if loader.available else f"\n{loader.install_hint}"
        needs = f" ({loader.needs})" if loader.needs else " (any)"
        text = f"{loader.target}\n{loader.description}{hint}"
        names = ", ".join(loader.backends(capabilities)) + needs
        table.add_row(loader.name, _yes(loader.available), escape(names), escape(text))
    _console().print(table)


def _export_spec(
    path: str,
    output: str,
    opts: Any,
    preprocess: bool,
    until_keys: tuple[str, ...],
    executor: str | None,
    ray_address: str | None,
    progress: bool,
    storage_options: dict[str, Any] | None,
) -> Any:
    """``export-dataset SPEC.yaml``: the spec's source, options and (with --preprocess)
    stages; -o, --mode/--overwrite and the executor flags apply on top."""
    from shardex.pipeline.spec import Spec, run_spec

    spec = Spec.load(path)
    runner = spec.executor(executor, opts.workers, ray_address)
    return run_spec(
        spec,
        output,
        executor=runner,
        preprocess=preprocess,
        until_keys=until_keys,
        mode=opts.mode,
        verbose=progress,
        **_given_options(opts, storage_options),
    )


#: export-dataset parameters -> the ExportOptions field each sets.
_OPTION_PARAMS = {
    "backend": "backend",
    "splits": "splits",
    "x_keys": "x_keys",
    "y_keys": "y_keys",
    "labels": "labels",
    "samples_per_shard": "samples_per_shard",
    "max_shard_bytes": "max_shard_bytes",
    "deterministic_name": "deterministic_name",
    "split_fractions": "split_fractions",
    "seed": "seed",
    "on_error": "on_error",
    "validate": "validate",
    "max_pixels": "max_pixels",
    "dtype": "dtype",
    "image_member": "image_member",
    "backend_options": "backend_options",
    "layout": "layout",
}


def _given_options(opts: Any, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The options the command line set explicitly: they apply on top of a spec's."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = {
        field: getattr(opts, field)
        for param, field in _OPTION_PARAMS.items()
        if ctx.get_parameter_source(param) == ParameterSource.COMMANDLINE
    }
    if storage_options:
        given["storage_options"] = storage_options
    return given


def _backend_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs; values read as YAML scalars (``90`` is a number, ``true`` a
    bool, anything else a string)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--backend-option")
        parsed = yaml.safe_load(value) if value else ""
        out[name] = parsed if isinstance(parsed, bool | int | float | str) else value
    return out


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


@main.group()
def pipeline() -> None:
    """Run curation pipelines described by spec files."""


@pipeline.command("run")
@click.argument("spec")
@click.option("-o", "--output", default=None, help="Export location (default: the spec's output).")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where the stages run (default: the spec's, else local processes).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Local processes (default: one per core, at most 8).",
)
@click.option("--ray-address", default=None, help="Ray cluster to join with --executor ray.")
@click.option(
    "--preprocess-until-key",
    "until_keys",
    multiple=True,
    metavar="KEY",
    help="Run stages only until KEY exists (repeatable).",
)
@click.option("--overwrite", is_flag=True, help="Replace an export at the output.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def pipeline_run(
    spec: str,
    output: str | None,
    executor: str | None,
    workers: int | None,
    ray_address: str | None,
    until_keys: tuple[str, ...],
    overwrite: bool,
    quiet: bool,
) -> None:
    """Run every stage of SPEC (a .yaml spec file, or a scenario's name) and write the
    export."""
    from shardex.pipeline.spec import load_spec, run_spec

    loaded = load_spec(spec)
    config = run_spec(
        loaded,
        output,
        executor=loaded.executor(executor, workers, ray_address),
        until_keys=until_keys,
        mode="overwrite" if overwrite else "error",
        verbose=not quiet,
    )
    click.echo(
        f"exported {config.num_samples} samples through {len(config.pipeline) - 1} stages "
        f"to {output or loaded.raw.get('output')}"
    )


@pipeline.command("stages")
def pipeline_stages() -> None:
    """List the built-in stages (use them by name in a spec's `stages:`)."""
    from shardex.pipeline.spec import builtin_stages

    for name, cls in sorted(builtin_stages().items()):
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        click.echo(f"{name:14} {cls.__module__}:{cls.__name__}  {doc}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
