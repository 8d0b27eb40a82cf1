"""Shared test setup: an isolated shardex cache per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["SHARDEX_CACHE_DIR"] = str(tmp_path_factory.mktemp("shardex-cache"))


@pytest.fixture
def cache_dir() -> Path:
    return Path(os.environ["SHARDEX_CACHE_DIR"])
