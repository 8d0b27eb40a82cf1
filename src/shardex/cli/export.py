"""``shardex export-dataset``: a source (or a spec file, or a scenario's name) to an export."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import click

from shardex.cli.app import (
    location_options,
    main,
    size_text,
    source_location_options,
    source_storage_flags,
    storage_flags,
)
from shardex.cli.config import config_option
from shardex.errors import ShardexError, SourceNotFoundError

if TYPE_CHECKING:  # their modules load when the command runs
    from shardex.contract import ExportConfig
    from shardex.options import ExportOptions


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
@storage_flags
@source_storage_flags
@config_option
def export_dataset(
    source: str,
    output: str,
    preprocess: bool,
    until_keys: tuple[str, ...],
    executor: str | None,
    ray_address: str | None,
    quiet: bool,
    **option_params: Any,
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
    opts = _checked_options(executor, **option_params)  # first: it starts the workers
    from shardex.pipeline.spec import find_scenario

    storage_options = location_options()
    spec_file = find_scenario(source)
    if spec_file is None:
        _check_no_spec(source, preprocess, until_keys)
        config = _export_source(source, output, opts, executor, ray_address, not quiet)
    elif source_location_options():
        raise click.UsageError(
            "--source-s3-* flags work with a SOURCE that is not a spec file; with a spec "
            "file, give the source's store through AWS_* variables"
        )
    else:  # the spec's source, options and stages, with the flags given on top
        from shardex.pipeline.spec import Spec, run_spec

        spec = Spec.load(str(spec_file))
        config = run_spec(
            spec,
            output,
            executor=spec.executor(executor, opts.workers, ray_address),
            preprocess=preprocess,
            until_keys=until_keys,
            mode=opts.mode,
            verbose=not quiet,
            **_given_options(opts, storage_options),
        )
    click.echo(_summary(output, config))
    if config.num_skipped:
        click.echo(_skipped_summary(output, config, storage_options))


def _checked_options(executor: str | None, **option_params: Any) -> ExportOptions:
    """export-dataset's options, checked before the source is looked at. The workers' fork
    server starts first: their start-up then overlaps this process's imports."""
    from shardex.parallel import default_workers, start_server

    if (option_params["workers"] or default_workers()) > 1 and executor in (None, "local"):
        start_server(("shardex.engine.shards",))
    from shardex.backends.registry import check_options

    opts = _export_options(**option_params)
    check_options(opts)
    return opts


def _export_options(
    *,
    splits: tuple[str, ...],
    x_keys: tuple[str, ...],
    y_keys: tuple[str, ...],
    split_fractions: str | None,
    max_pixels: int | None,
    backend_options: tuple[str, ...],
    **same: Any,
) -> ExportOptions:
    """export-dataset's flags as ExportOptions, converting those it spells otherwise."""
    from shardex.codecs.images import MAX_PIXELS
    from shardex.errors import ConfigError
    from shardex.options import ExportOptions, parse_split_fractions

    try:
        fractions = parse_split_fractions(split_fractions) if split_fractions else None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--split-fractions") from None
    return ExportOptions(
        splits=splits or None,
        x_keys=x_keys or None,
        y_keys=y_keys or None,
        split_fractions=fractions,
        max_pixels=max_pixels or MAX_PIXELS,
        backend_options=_backend_options(backend_options),
        **same,
    )


def _check_no_spec(source: str, preprocess: bool, until_keys: tuple[str, ...]) -> None:
    from shardex.pipeline.spec import is_scenario_name, scenario_not_found

    if preprocess or until_keys:
        if is_scenario_name(source):
            raise scenario_not_found(source)
        raise click.UsageError("--preprocess and --preprocess-until-key need a spec file SOURCE")


def _export_source(
    source: str,
    output: str,
    opts: ExportOptions,
    executor: str | None,
    ray_address: str | None,
    progress: bool,
) -> ExportConfig:
    from shardex.exporter import export
    from shardex.pipeline.spec import is_scenario_name, scenario_not_found

    try:
        return export(
            source,
            output,
            opts,
            progress=progress,
            storage_options=location_options(),
            source_storage_options=source_location_options(),
            executor="ray" if executor == "ray" else "local",
            ray_address=ray_address,
        )
    except SourceNotFoundError:
        if is_scenario_name(source):
            raise scenario_not_found(source) from None
        raise


def _summary(output: str, config: ExportConfig) -> str:
    parts = ", ".join(f"{name} {info.num_samples}" for name, info in config.splits.items())
    shards = sum(len(s.shards) for s in config.splits.values())
    size = sum(s.num_bytes for s in config.splits.values())
    return (
        f"exported {config.num_samples} samples ({parts}) in {shards} shards, "
        f"{size_text(size)}, to {output}"
    )


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


def _given_options(opts: ExportOptions, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The options the command line set explicitly: they apply on top of a spec's."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = {
        f.name: getattr(opts, f.name)
        for f in dataclasses.fields(opts)
        if f.name not in ("workers", "mode", "overwrite")  # run_spec takes these apart
        and ctx.get_parameter_source(f.name) == ParameterSource.COMMANDLINE
    }
    if storage_options:
        given["storage_options"] = storage_options
    return given


def _backend_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs, values read as YAML scalars."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--backend-option")
        parsed = yaml.safe_load(value) if value else ""
        out[name] = parsed if isinstance(parsed, bool | int | float | str) else value
    return out
