"""The export the read tests damage: made once a module, copied for each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import copy_of, small_export


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of 30 samples of ``make_sample_folder`` in shards of 8."""
    return small_export(tmp_path_factory.mktemp("clean"), 30, 8)


@pytest.fixture
def export(clean: Path, tmp_path: Path) -> Path:
    """A copy of ``clean`` for one test to damage."""
    return copy_of(clean, tmp_path)
