"""The ``shardex`` group and what its commands share: one-line errors and warnings, the
console, sizes, and the object-storage flags of every command that takes a location."""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Final

import click

from shardex.errors import ShardexError, ShardexWarning
from shardex.quoting import one_line
from shardex.version import __version__

SPLIT_HELP = "Split to use (default: the only split, else each split in turn)."


def make_console() -> Any:
    """rich's console; off a terminal as wide as each line needs (not 80), unless COLUMNS."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=_UNWRAPPED)
    return console


#: No line is that long, and rich pads nothing to it.
_UNWRAPPED: Final = 1 << 20


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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
#: Where these flags leave their values (ctx.meta), sparing each command six parameters.
_OUTPUT: Final = "shardex.storage_options"
_TIMES: Final = "shardex.storage_time_options"
_SOURCE: Final = "shardex.source_storage_options"


def _flags(
    fn: Any, rows: tuple[tuple[str, str, str | None, str], ...], where: str, timed: bool = False
) -> Any:
    """Adds ``rows`` as options that leave their values in ``ctx.meta[where]``."""
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


def storage_flags(fn: Any) -> Any:
    """The object-storage flags every command that takes a location accepts."""
    return _flags(_flags(fn, _TIME_FLAGS, _TIMES, timed=True), _S3_FLAGS, _OUTPUT)


def source_storage_flags(fn: Any) -> Any:
    """The object-storage flags of a source on object storage (default: the --s3-* ones)."""
    return _flags(fn, _SOURCE_S3_FLAGS, _SOURCE)


def location_options() -> dict[str, Any] | None:
    """The storage options of the command's location, from its --s3-* flags."""
    meta = click.get_current_context().meta
    return {**meta.get(_OUTPUT, {}), **meta.get(_TIMES, {})} or None


def source_location_options() -> dict[str, Any] | None:
    """A source's storage options (each --source-s3-* flag, else its --s3-* one), or None."""
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
