"""``Pipeline``: a reader, stages, and (usually) an ``ImageWriterStage``, run by an executor.

.. code-block:: python

    pipeline = Pipeline("curate")
    pipeline.add_stage(ReaderStage("images/"))
    pipeline.add_stage(FilterStage("aesthetic_score > 5"))
    pipeline.add_stage(ImageWriterStage("out", images_per_tar=1000))
    config = pipeline.run(executor=LocalExecutor(workers=4))

The same pipeline gives byte-identical exports on any executor and number of workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shardex.contract import ExportConfig
from shardex.errors import ConfigError
from shardex.pipeline.executors import Executor, LocalExecutor
from shardex.pipeline.readers import READER_KEYS, ReaderStage
from shardex.pipeline.stage import Stage
from shardex.pipeline.writer import ImageWriterStage
from shardex.progress import Progress


@dataclass(frozen=True, slots=True)
class Plan:
    """The stages that will run, and the writer at the end."""

    reader: ReaderStage
    stages: tuple[Stage, ...]
    writer: ImageWriterStage


class Pipeline:
    """An ordered list of stages; the first reads, the last writes."""

    def __init__(self, name: str, stages: Iterable[Stage] = ()) -> None:
        self.name = name
        self.stages: list[Stage] = list(stages)

    def add_stage(self, stage: Stage) -> Pipeline:
        """Append a stage; returns the pipeline (calls chain)."""
        if not isinstance(stage, Stage):
            raise ConfigError(f"{stage!r} is not a shardex Stage")
        self.stages.append(stage)
        return self

    def plan(self, until_keys: tuple[str, ...] = ()) -> Plan:
        """Check the chain and cut it once ``until_keys`` exist (see :meth:`run`)."""
        if not self.stages or not isinstance(self.stages[0], ReaderStage):
            raise ConfigError(f"pipeline {self.name!r}: the first stage must be a ReaderStage")
        if not isinstance(self.stages[-1], ImageWriterStage):
            raise ConfigError(f"pipeline {self.name!r}: the last stage must be an ImageWriterStage")
        reader, writer = self.stages[0], self.stages[-1]
        middle = self.stages[1:-1]
        available = {*READER_KEYS[:2], "image", "image_ext", *reader.scan().table.column_names}
        wanted = set(until_keys)
        kept: list[Stage] = []
        for stage in middle:
            if until_keys and wanted <= available and not _refines(stage, wanted):
                break
            missing = [k for k in stage.needs if k not in available]
            if missing:
                raise ConfigError(
                    f"stage {stage!r} needs {', '.join(missing)}, which no earlier stage "
                    f"produces (available: {', '.join(sorted(available))})"
                )
            stage.check()  # a missing extra: one line now, not a dead worker later
            available |= set(stage.produces)
            kept.append(stage)
        if not wanted <= available:
            never = ", ".join(sorted(wanted - available))
            raise ConfigError(
                f"pipeline {self.name!r}: no stage produces {never} "
                f"(keys after every stage: {', '.join(sorted(available))})"
            )
        return Plan(reader, tuple(kept), writer)

    def run(
        self, executor: Executor | None = None, *, until_keys: Iterable[str] = ()
    ) -> ExportConfig:
        """Run the pipeline; returns the committed export's contract.

        Args:
            executor: where the stages run (default: :class:`LocalExecutor`).
            until_keys: run stages only until these keys exist (stages that then only
                change them in place still run), and write that view.

        Raises:
            ConfigError: (before anything runs) a malformed chain or a key never produced.
        """
        plan = self.plan(tuple(until_keys))
        executor = executor or LocalExecutor()
        chain = [*plan.stages, plan.writer]
        # No stage between reader and writer: shipping images to workers would only copy.
        stages_on = executor if plan.stages else LocalExecutor(1)
        states: list[dict[str, Any]] = [{} for _ in chain]
        scan = plan.reader.scan()
        try:
            with Progress(plan.writer.verbose) as bars:
                bar = bars.task(f"pipeline {self.name}", scan.table.num_rows)
                for batch in stages_on.map_batches(chain, plan.reader.jobs()):
                    bar.advance(len(batch))
                    for stage, state in zip(chain, states, strict=True):
                        if not batch:
                            break
                        batch = stage.reduce(batch, state)
            applied = tuple(s.describe() for s in (plan.reader, *plan.stages))
            return plan.writer.write(
                states[-1],
                scan.label_names,
                plan.reader.source.uri,
                executor.runner(),
                applied,
                scan.table.schema,
                scan.left_out,
            )
        finally:
            plan.writer.cleanup(states[-1])


def _refines(stage: Stage, keys: set[str]) -> bool:
    """Whether a stage only changes some of ``keys`` in place (it still runs after them)."""
    return stage.changes_in_place and bool(stage.needs) and set(stage.needs) <= keys
