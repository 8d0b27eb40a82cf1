"""docs/migrating.md runs as written: its bash blocks in a shell (``shardex`` this
checkout's CLI), then its Python blocks, in order, in one folder; the blocks assert what a
user migrating from NexuML or NeMo Curator should see."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    cli = f"{shlex.quote(sys.executable)} -m shardex.cli"
    script = "\n".join([f'shardex() {{ {cli} "$@"; }}', "set -e", *_blocks("bash")])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    environment.pop("SHARDEX_SCENARIO_PATH", None)
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exported 40 samples (train 32, val 8)" in done.stdout
    assert "tensor_shards" in done.stdout  # backend list
    monkeypatch.chdir(tmp_path)
    for number, block in enumerate(_blocks("python"), 1):
        exec(compile(block, f"docs/migrating.md python block {number}", "exec"), {})


def test_export_dataset_help_points_to_the_page() -> None:
    from click.testing import CliRunner

    from shardex.cli import main

    result = CliRunner().invoke(main, ["export-dataset", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "docs/migrating.md" in text
    assert "NexuML" in text and "NeMo Curator" in text
    for default in ("--backend webdataset", "--samples-per-shard 1000", "format_version 3"):
        assert default in text, default
