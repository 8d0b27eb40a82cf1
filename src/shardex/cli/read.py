"""The commands that read an export: ``inspect``, ``ls``, ``get``, ``browse``, ``verify``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import click

from shardex.cli.app import (
    SPLIT_HELP,
    location_options,
    main,
    make_console,
    size_text,
    storage_flags,
)
from shardex.errors import SampleNotFoundError, ShardexError


@main.command()
@click.argument("output")
@click.option("--json", "as_json", is_flag=True, help="Print config.yaml as JSON.")
@storage_flags
def inspect(output: str, as_json: bool) -> None:
    """Summarise the export at OUTPUT (config.yaml, splits, shards, keys)."""
    from rich.table import Table

    from shardex.api import read_config

    storage = _location(output)
    config = read_config(storage)
    if as_json:
        click.echo(json.dumps(config.to_dict(), indent=2))
        return
    console = make_console()
    console.print(
        f"[bold]{output}[/]: backend {config.backend}, format {config.format_version}, "
        f"{config.num_samples} samples, written by shardex {config.shardex_version}"
    )
    splits = Table("split", "samples", "shards", "bytes", "samples/shard")
    for name, info in config.splits.items():
        per = info.num_samples / max(1, len(info.shards))
        splits.add_row(
            name,
            str(info.num_samples),
            str(len(info.shards)),
            size_text(info.num_bytes),
            f"{per:.0f}",
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
@click.option("--split", default=None, help=SPLIT_HELP)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show at most N rows.")
@click.option("--no-header", is_flag=True, help="Leave out the header line.")
@storage_flags
def ls(output: str, split: str | None, limit: int | None, no_header: bool) -> None:
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

    return open_storage(output, location_options())


def _open(storage: Any, split: str) -> Any:
    from shardex.api import open_dataset

    return open_dataset(storage, split=split)


@main.command()
@click.argument("output")
@click.argument("key")
@click.option("--split", default=None, help=SPLIT_HELP)
@click.option(
    "-o",
    "--out",
    "dest",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write one field's exact bytes to this file (default field: the image).",
)
@click.option("--field", default=None, help="Field (extension) to write with -o, e.g. cls.")
@storage_flags
def get(output: str, key: str, split: str | None, dest: str | None, field: str | None) -> None:
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
@storage_flags
def browse_command(export: str, split: str | None, host: str, port: int) -> None:
    """Look at EXPORT in the browser: thumbnails, filters, plots, one sample in full.

    A local, read-only web app (needs `pip install 'shardex[browse]'`); Ctrl-C stops it.
    """
    from shardex.browse import browse

    options = location_options()
    browse(export, split, host=host, port=port, storage_options=options)


@main.command("verify")
@click.argument("output")
@click.option("--deep", is_flag=True, help="Also decode every image.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_flags
def verify_command(output: str, deep: bool, as_json: bool, quiet: bool) -> None:
    """Check OUTPUT byte for byte: config, index, shards, every sample's checksum.

    Exits 1 when anything is wrong, listing each problem with its file and sample key.
    """
    from shardex.verification import verify

    report = verify(_location(output), deep=deep, progress=not (quiet or as_json))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for problem in report.problems:
            click.echo(str(problem))
        state = "OK" if report.ok else f"{len(report.problems)} problem(s)"
        click.echo(
            f"{output}: {state}; checked {report.samples} samples in {report.shards} "
            f"shards ({size_text(report.bytes)}){', images decoded' if deep else ''}"
        )
    if not report.ok:
        sys.exit(1)
