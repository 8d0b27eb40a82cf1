"""``shardex pipeline run SPEC`` and ``shardex pipeline stages``."""

from __future__ import annotations

import click

from shardex.cli.app import main


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
