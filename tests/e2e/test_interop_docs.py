"""docs/interop.md runs as written: every Python block, section by section, with the real
library each section is about (skipped, naming it, where that library is not installed).

The first section exports the demo the others read; each later section runs in a fresh
namespace holding only what the first defined, in the same folder. The blocks assert
what a reader should see (row counts, images in every row), so a section that stops
working fails here.
"""

from __future__ import annotations

import gc
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "interop.md"
SETUP = "The exports these examples read"
#: Each section (by its heading's start) and the modules its code needs.
NEEDS: dict[str, tuple[str, ...]] = {
    "Mixed image formats": ("datasets", "ray.data"),
    "webdataset": ("webdataset",),
    "wids": ("wids",),
    "NVIDIA DALI": ("nvidia.dali",),
    "Hugging Face `datasets`": ("datasets",),
    "Ray Data": ("ray.data",),
    "pandas, polars, DuckDB": ("pandas", "polars", "duckdb"),
    "zarr": ("zarr",),
    "tensordict": ("tensordict", "torch"),
    "PyTorch": ("torch",),
    "Hugging Face `datasets` as a source": ("datasets",),
    "wids and webdataset": ("wids", "webdataset"),
    "NeMo Curator": ("shardex.pipeline",),  # shardex alone
}
#: Sections whose code starts Ray (a local cluster on loopback is started for them).
USES_RAY = ("Mixed image formats", "Ray Data")


def sections() -> dict[str, list[str]]:
    """Heading -> the Python blocks under it (its ``###`` subsections included)."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
        if blocks:
            out[heading.strip()] = blocks
    return out


def _needs(heading: str) -> tuple[str, ...]:
    """The modules a section needs (the longest matching start wins); () if unknown."""
    return next(
        (
            mods
            for start, mods in sorted(NEEDS.items(), key=lambda kv: -len(kv[0]))
            if heading.startswith(start)
        ),
        (),
    )


def test_every_section_with_code_is_known() -> None:
    """A new section gets its library named here (so the test knows what to skip on)."""
    unknown = [h for h in sections() if h != SETUP and not _needs(h)]
    assert unknown == [], "add these docs/interop.md sections to NEEDS"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("interop")
    scope: dict[str, Any] = {}
    before = Path.cwd()
    os.chdir(root)
    try:
        for block in sections()[SETUP]:
            exec(compile(block, str(DOC), "exec"), scope)
    finally:
        os.chdir(before)
    return root, {k: v for k, v in scope.items() if k.isupper()}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    pytest.importorskip("ray")
    from tests.support.raycluster import local_ray_cluster

    with local_ray_cluster(num_cpus=1):
        yield


@pytest.mark.parametrize("heading", [h for h in sections() if h != SETUP])
# Ray 2.60's DataContext() sets three of its own deprecated fields while it is built
@pytest.mark.filterwarnings("ignore:`use_push_based_shuffle` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`use_polars` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`use_arrow_tensor_v2` is deprecated:DeprecationWarning")
def test_section_runs(
    heading: str,
    exported: tuple[Path, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    for module in _needs(heading):
        pytest.importorskip(module, reason=f"{module} is not installed")
    root, names = exported
    monkeypatch.chdir(root)
    if heading.startswith(USES_RAY):
        request.getfixturevalue("ray_cluster")
    with warnings.catch_warnings():
        # webdataset leaves its last shard's file to the garbage collector
        warnings.simplefilter("ignore", ResourceWarning)
        for block in sections()[heading]:
            exec(compile(block, str(DOC), "exec"), dict(names))
        gc.collect()
