"""The config.yaml validator is compiled ahead of time; it must match the schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardex.contract import validate
from shardex.errors import SchemaError

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_validator_is_the_schema_compiled() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_validator.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_validation_needs_no_compiler_at_run_time() -> None:
    code = (
        "import sys, shardex.contract as c\n"
        "try:\n    c.validate({'format_version': 1})\nexcept c.SchemaError as e:\n    print(e)\n"
        "print('fastjsonschema' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert "must contain" in out[0]
    assert out[1] == "False"


def test_a_tampered_config_is_still_refused(tmp_path: Path) -> None:
    import shardex

    shardex.export("demo:12", tmp_path / "out", samples_per_shard=4, workers=1)
    config = tmp_path / "out" / "config.yaml"
    config.write_text(config.read_text().replace("num_bytes:", "num_bytez:", 1))
    with pytest.raises(SchemaError, match=r"must contain \[.num_bytes.\]"):
        shardex.open_dataset(tmp_path / "out", split="train")
    with pytest.raises(SchemaError, match="must contain"):
        validate({"format_version": 99})
