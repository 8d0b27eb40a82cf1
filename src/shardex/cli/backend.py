"""``shardex backend list [data-export|data-loader]``: the backends and loaders, and what each can do."""

from __future__ import annotations

import click

from shardex.cli.app import main, make_console
from shardex.errors import ShardexError


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
    make_console().print(table)


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
    make_console().print(table)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
