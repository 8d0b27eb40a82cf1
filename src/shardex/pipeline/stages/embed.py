"""The embedding stage: a user-provided model turns ``pixels`` into one vector per sample.

torch is imported only when the stage is set up in a worker, never by ``import shardex``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from shardex.errors import ConfigError, MissingDependencyError, imported
from shardex.pipeline.stage import Batch, Resources, Sample, Stage
from shardex.pipeline.stages._common import require, sample_name
from shardex.pipeline.stages.pixels import (
    INTERPOLATIONS,
    Interpolation,
    Pixels,
    center_crop,
    check_choice,
    resize,
    scaled_size,
    to_mode,
)

if TYPE_CHECKING:
    import torch

_TORCH_HINT = "EmbedStage needs torch: pip install 'shardex[torch]'"


class EmbedStage(Stage):
    """Run a user-provided model on ``pixels`` and store one float32 vector per sample.

    See docs/pipeline.md, "Embeddings", for the model, weights and preprocessing.

    Args:
        model: ``"module:factory"``; ``factory()`` gives a ``torch.nn.Module`` or a callable
            from a float32 ``(B, 3, H, W)`` tensor to ``(B, D)``.
        weights: path of a state-dict file (``.safetensors`` or ``torch.load``-able), or
            None to use the factory's weights.
        key: the sample key written (a float32 array of shape (D,)).
        input_size: side of the square model input.
        crop: resize the shorter side and centre-crop (True) or squash to the square.
        mean, std: per-channel normalisation (3 floats each, on the [0, 1] scale), or None.
        cpus, gpus: per worker (Ray resources, torch threads); ``gpus > 0`` means ``"cuda"``.
        pad_batches: pad short batches to ``batch_size``, so a vector does not depend on
            its batch (BLAS picks kernels by batch size).
    """

    name: ClassVar[str] = "embed"
    needs = ("pixels",)

    def __init__(
        self,
        model: str,
        weights: str | Path | None = None,
        *,
        key: str = "embedding",
        batch_size: int = 32,
        input_size: int = 224,
        interpolation: Interpolation = "bicubic",
        crop: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        cpus: int = 1,
        gpus: float = 0,
        device: str | None = None,
        pad_batches: bool = True,
    ) -> None:
        _check_options(model, key, interpolation, gpus, batch_size, input_size, cpus)
        self.model = model
        self.weights = None if weights is None else str(weights)
        self.key = key
        self.batch_size = batch_size
        self.input_size = input_size
        self.interpolation: Interpolation = interpolation
        self.crop = crop
        self.mean, self.std = _normalisation(mean, std)
        self.cpus = cpus
        self.gpus = gpus
        self.device = device
        self.pad_batches = pad_batches
        self.produces = (key,)
        self.resources = Resources(cpus=float(cpus), gpus=float(gpus))
        self._model: Callable[[torch.Tensor], Any] | None = None
        self._threads_before: int | None = None

    def params(self) -> dict[str, Any]:
        params = super().params()
        params["mean"] = None if self.mean is None else list(self.mean)
        params["std"] = None if self.std is None else list(self.std)
        return params

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_model": None, "_threads_before": None}

    def check(self) -> None:
        """torch is installed (found, not imported)."""
        if importlib.util.find_spec("torch") is None:
            raise MissingDependencyError(_TORCH_HINT)

    def setup(self) -> None:
        """Import torch, set its threads to ``cpus``, build the model, load the weights."""
        torch = imported("torch", _TORCH_HINT)
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(self.cpus)
        built = load_factory(self.model)()
        if self.weights is not None:
            load_weights(built, self.weights, self.model)
        if isinstance(built, torch.nn.Module):
            built = built.eval().to(self._device())
        elif not callable(built):
            raise ConfigError(
                f"model={self.model!r} returned a {type(built).__name__}, not a torch "
                "module or a callable"
            )
        self._model = built

    def teardown(self) -> None:
        """Drop the model and give torch back its previous thread count."""
        self._model = None
        if self._threads_before is not None:
            import torch

            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def _device(self) -> str:
        return self.device or ("cuda" if self.gpus > 0 else "cpu")

    def process(self, batch: Batch) -> Batch:
        if self._model is None:
            self.setup()
        for start in range(0, len(batch), self.batch_size):
            chunk = batch[start : start + self.batch_size]
            vectors = self.embed([self._model_input(s) for s in chunk], chunk)
            for sample, vector in zip(chunk, vectors, strict=True):
                sample[self.key] = vector
        return batch

    def _model_input(self, sample: Sample) -> Pixels:
        """The (input_size, input_size, 3) uint8 image the model sees."""
        pixels = require(sample, "pixels", self.name, "put a DecodeStage before it")
        try:
            rgb = to_mode(pixels, "RGB")
        except (ValueError, IndexError) as exc:
            raise ConfigError(f"embed stage: sample {sample_name(sample)}: {exc}") from exc
        side = self.input_size
        if not self.crop:
            return resize(rgb, (side, side), self.interpolation)
        height, width = rgb.shape[:2]
        rgb = resize(rgb, scaled_size(width, height, side, "shorter"), self.interpolation)
        return center_crop(rgb, (side, side))

    def embed(self, images: list[Pixels], chunk: Batch) -> list[Pixels]:
        """One float32 (D,) vector per image of ``images`` (model inputs of ``chunk``)."""
        import torch

        stack = np.stack(images)
        if self.pad_batches and len(images) < self.batch_size:
            padding = np.zeros((self.batch_size - len(images), *stack.shape[1:]), np.uint8)
            stack = np.concatenate([stack, padding])
        assert self._model is not None
        with torch.inference_mode():
            x = torch.from_numpy(stack).to(self._device()).permute(0, 3, 1, 2).float() / 255
            if self.mean is not None and self.std is not None:
                x = (x - _channels(self.mean, x)) / _channels(self.std, x)
            out = self._model(x)
        return self._rows(out, len(stack), chunk)[: len(images)]

    def _rows(self, out: Any, expected: int, chunk: Batch) -> list[Pixels]:
        import torch

        if isinstance(out, torch.Tensor):
            out = out.detach().to("cpu", torch.float32).numpy()
        matrix = np.asarray(out, dtype=np.float32) if isinstance(out, np.ndarray) else None
        if matrix is None or matrix.ndim != 2 or matrix.shape[0] != expected:
            shape = getattr(out, "shape", type(out).__name__)
            raise ConfigError(
                f"embed stage: model {self.model!r} returned {shape} for a batch of "
                f"{expected} images starting at sample {sample_name(chunk[0])}; it must "
                f"return a (B, D) tensor"
            )
        return [row.copy() for row in matrix]


def _check_options(model: str, key: str, interpolation: str, gpus: float, *positive: int) -> None:
    module, _, attr = model.partition(":") if isinstance(model, str) else ("", "", "")
    if not module or not attr:
        raise ConfigError(f"model={model!r} must be an import path 'module:factory'")
    check_choice("interpolation", interpolation, tuple(INTERPOLATIONS))
    for name, value in zip(("batch_size", "input_size", "cpus"), positive, strict=True):
        if type(value) is not int or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive int")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"key={key!r} must be a non-empty string")
    if gpus < 0:
        raise ConfigError(f"gpus={gpus!r} must be >= 0")


def _channels(values: tuple[float, float, float], like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.tensor(values, dtype=like.dtype, device=like.device).view(1, 3, 1, 1)


def _normalisation(
    mean: Sequence[float] | None, std: Sequence[float] | None
) -> tuple[tuple[float, float, float] | None, tuple[float, float, float] | None]:
    if mean is None and std is None:
        return None, None
    if mean is None or std is None or len(mean) != 3 or len(std) != 3 or 0 in std:
        raise ConfigError(
            f"mean={mean!r}, std={std!r}: give both, three floats each, std non-zero "
            "(or neither, for inputs in [0, 1])"
        )
    m, s = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    return (m[0], m[1], m[2]), (s[0], s[1], s[2])


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by ``"module:attr"`` (``attr`` may be dotted)."""
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"model={spec!r}: cannot import {module_name!r} ({exc}); it must be importable "
            "in every worker (installed, or on PYTHONPATH)"
        ) from exc
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise ConfigError(f"model={spec!r}: {module_name!r} has no {attr!r}") from exc
    if not callable(obj):
        raise ConfigError(f"model={spec!r} names a {type(obj).__name__}, not a factory")
    return obj  # type: ignore[no-any-return]


def load_weights(model: Any, path: str, spec: str) -> None:
    """Load the state dict in ``path`` into ``model`` (strict)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"weights={path!r} given, but model={spec!r} returned a {type(model).__name__}, "
            "not a torch.nn.Module to load them into"
        )
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"weights file {path!r} does not exist (on this worker)")
    state = _read_state(file)
    if not isinstance(state, Mapping):
        raise ConfigError(f"weights file {path!r} holds a {type(state).__name__}, not a state dict")
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(f"weights {path!r} do not fit model={spec!r}: {exc}") from exc


def _read_state(file: Path) -> Any:
    import torch

    if file.suffix == ".safetensors":
        missing = f"reading {file.name} needs safetensors: pip install safetensors"
        safetensors_torch = imported("safetensors.torch", missing)
        return safetensors_torch.load_file(str(file), device="cpu")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError ...
        raise ConfigError(
            f"cannot load weights {str(file)!r} with torch.load(weights_only=True): {exc}. "
            "Save a state dict: torch.save(model.state_dict(), path)"
        ) from exc
