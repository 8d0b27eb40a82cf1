"""``--config/-c FILE``: a command's options from a YAML file by long flag name.

The values become click's ``default_map``, so flags on the line win and every value passes
the flag's own checks; YAML null leaves the flag's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from shardex.errors import ConfigError
from shardex.quoting import collapsed

#: Options whose flag takes ``NAME=VALUE`` text; the file may give them as a mapping.
_PAIRS_AS_TEXT: dict[str, str] = {"split_fractions": ",", "backend_options": ""}


def config_option(fn: Any) -> Any:
    """The ``--config/-c FILE`` option (eager: read before the other options)."""
    return click.option(
        "--config",
        "-c",
        type=click.Path(dir_okay=False),
        is_eager=True,
        expose_value=False,
        callback=_load,
        metavar="FILE",
        help="YAML file of options by long flag name (e.g. `samples-per-shard: 500`); "
        "flags given on the command line override it.",
    )(fn)


def _load(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    if path is None:
        return
    ctx.default_map = {**(ctx.default_map or {}), **read_config(ctx.command, Path(path))}


def read_config(command: click.Command, path: Path) -> dict[str, Any]:
    """The file's options as ``{parameter name: value}``, each checked by its flag's type.

    Raises:
        ConfigError: the file is unreadable, not a mapping, or names or gives an option
            the command refuses (one line, naming it).
    """
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"--config {str(path)!r}: cannot read it as YAML ({collapsed(exc)})"
        ) from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"--config {str(path)!r}: expected a mapping of option names to values, "
            f"found a {type(raw).__name__}"
        )
    flags = _flags(command)
    out: dict[str, Any] = {}
    spelled: dict[str, object] = {}
    for key, value in raw.items():
        found = flags.get(str(key).replace("_", "-"))
        if found is None:
            known = ", ".join(sorted(f for f, (_, neg) in flags.items() if not neg))
            raise ConfigError(f"--config {str(path)!r}: unknown option {key!r} (options: {known})")
        param, negated = found
        name = str(param.name)
        if name in spelled:
            raise ConfigError(
                f"--config {str(path)!r}: options {spelled[name]!r} and {key!r} set the same "
                "option; keep one"
            )
        spelled[name] = key
        if value is None:  # `key:` with no value: not given
            continue
        if negated:
            if not isinstance(value, bool):
                raise ConfigError(
                    f"--config {str(path)!r}: option {key!r}: expected true or false, got {value!r}"
                )
            value = not value
        out[name] = _checked(command, param, key, _as_flag_value(param, value), path)
    return out


def _flags(command: click.Command) -> dict[str, tuple[click.Option, bool]]:
    """Every long flag name (without ``--``) -> (its option, whether it is the negative)."""
    out: dict[str, tuple[click.Option, bool]] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "config":
            continue
        for opt in param.opts:
            if opt.startswith("--"):
                out[opt[2:]] = (param, False)
        for opt in param.secondary_opts:
            if opt.startswith("--"):
                out[opt[2:]] = (param, True)
    return out


def _as_flag_value(param: click.Option, value: Any) -> Any:
    """A mapping for a ``NAME=VALUE`` option becomes the text the flag takes."""
    sep = _PAIRS_AS_TEXT.get(str(param.name))
    if sep is None or not isinstance(value, dict):
        return value
    pairs = [f"{k}={v}" for k, v in value.items()]
    return sep.join(pairs) if sep else pairs


def _checked(
    command: click.Command, param: click.Option, key: object, value: Any, path: Path
) -> Any:
    where = f"--config {str(path)!r}: option {key!r}"
    if param.multiple:
        values = value if isinstance(value, list | tuple) else [value]
        if not all(_is_scalar(v) for v in values):
            raise ConfigError(f"{where}: expected a value or a list of values, got {value!r}")
        value = [_as_text(v) for v in values]
    elif not _is_scalar(value):
        raise ConfigError(f"{where}: expected one value, got a {type(value).__name__}")
    else:
        value = _as_text(value)
    try:
        with click.Context(command) as ctx:
            return param.type_cast_value(ctx, value)
    except click.BadParameter as exc:
        raise ConfigError(f"{where}: {exc.message}") from None


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _as_text(value: Any) -> Any:
    """A YAML scalar as the flag's text, checked as on the line (``int(1.5)`` truncates)."""
    return value if value is None or isinstance(value, str) else str(value)
