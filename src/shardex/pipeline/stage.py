"""The unit of a pipeline: a :class:`Stage` turns a batch of samples into a batch.

A sample is a plain dict (``key``, ``image`` bytes, ``pixels``, metadata): see
docs/pipeline.md, "A sample".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

Sample = dict[str, Any]
Batch = list[Sample]


@dataclass(frozen=True, slots=True)
class Resources:
    """What one instance of a stage needs: CPU cores and GPUs (mapped to Ray resources)."""

    cpus: float = 1.0
    gpus: float = 0.0


class Stage(ABC):
    """One step of a pipeline: set ``name``, ``needs``, ``produces``; implement :meth:`process`.

    Stages are pickled to workers: load heavy state (models) in :meth:`setup`, not
    ``__init__``.
    """

    name: ClassVar[str]
    needs: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    resources: Resources = Resources()
    #: Only rewrites its ``needs`` keys, keeping every sample (a resize, not a filter):
    #: ``--preprocess-until-key`` still runs it once those keys exist.
    changes_in_place: ClassVar[bool] = False

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise when :meth:`setup` could not work here; called by :meth:`Pipeline.plan`."""

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Prepare in the worker (load a model); called once before the first batch."""

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`setup` took."""

    @abstractmethod
    def process(self, batch: Batch) -> Batch | None:
        """The batch after this stage: samples changed, fewer samples, or None for none."""

    def reduce(self, batch: Batch, state: dict[str, Any]) -> Batch:
        """Driver-side, in sample order: drop samples by what earlier batches held."""
        return batch

    def params(self) -> dict[str, Any]:
        """What config.yaml records of this stage (its parameters, JSON-able)."""
        return {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_") and isinstance(v, str | int | float | bool | type(None))
        }

    def describe(self) -> dict[str, Any]:
        """``{"stage": name, **params}``: one entry of config.yaml's ``pipeline``."""
        return {"stage": self.name, **self.params()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
