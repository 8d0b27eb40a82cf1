"""The unit of a pipeline: a :class:`Stage` turns a batch of samples into a batch.

A pipeline sample is a plain dict:

* ``key`` (str), ``original_path`` (str), and, when the source has them, ``split`` (str)
  and ``label`` (int);
* ``image`` (bytes): the encoded image as stored, with ``image_ext`` (``jpg``, ``png``,
  ``webp`` ...). Passthrough pipelines keep these bytes exactly;
* ``pixels`` (numpy uint8/uint16 array, HWC): the decoded image, present after a decode
  stage. A stage that changes pixels sets ``pixels_changed`` to True; an encode stage turns
  ``pixels`` back into ``image`` bytes;
* any other key: metadata (numbers, strings, numpy arrays such as embeddings), kept with
  its type and written as typed Parquet columns.

Stages run in worker processes (or Ray actors), one batch at a time, in the order the
pipeline lists them; a stage that needs to see every sample (de-duplication) also
implements :meth:`Stage.reduce`, which the driver calls on each batch in sample order.
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
    """One step of a pipeline.

    Subclasses set ``name`` and implement :meth:`process`; ``needs`` are the sample keys
    it reads (checked before anything runs), ``produces`` the keys it adds. Stages are
    pickled to workers, so keep heavy state (models) out of ``__init__``: load it in
    :meth:`setup`, which each worker calls once before its first batch.
    """

    name: ClassVar[str]
    needs: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    resources: Resources = Resources()
    #: Whether it only rewrites its ``needs`` keys, keeping every sample (a resize of
    #: ``pixels``): ``--preprocess-until-key`` runs it on once those keys exist, so the
    #: view holds their final values. A filter on them drops samples: it stays False.
    changes_in_place: ClassVar[bool] = False

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise (MissingDependencyError, ConfigError) when :meth:`setup` could not work
        here: called in the driver by :meth:`Pipeline.plan`, before any worker starts."""

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Prepare in the worker (load a model); called once before the first batch."""

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`setup` took."""

    @abstractmethod
    def process(self, batch: Batch) -> Batch | None:
        """The batch after this stage: samples changed, fewer samples, or None for none."""

    def reduce(self, batch: Batch, state: dict[str, Any]) -> Batch:
        """Driver-side, in sample order, after every stage's :meth:`process`: drop samples
        by what earlier batches held (``state`` persists across batches). Default: keep."""
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
