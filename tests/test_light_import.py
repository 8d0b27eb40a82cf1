"""`import shardex` and opening a local export stay light (issue 19: import <= 150 ms,
open <= 5 ms in a fresh process): the modules made lazy are not imported by either, so a
change that imports one again at module level fails here rather than in a benchmark."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import shardex

#: Each was imported by `import shardex` before, and costs 2-30 ms: PyYAML (config.yaml is
#: read by shardex.yaml_subset), importlib.resources (and tempfile, shutil, random, bz2,
#: lzma under it: only the schema file needs it), the object-storage modules (only s3://
#: and the like), the output lock (writers), secrets, socket, hashlib, decimal, difflib,
#: configparser, subprocess, logging (only a skipped sample logs), and the optional extras.
#: numpy (120-170 ms here, most of the import before): the index files are mapped and
#: read with struct (shardex.format.mapped), so opening and ds[i] need none of it.
LAZY = (
    "numpy",
    "yaml",
    "importlib.resources",
    "tempfile",
    "random",
    "shutil",
    "bz2",
    "lzma",
    "secrets",
    "socket",
    "hashlib",
    "decimal",
    "difflib",
    "configparser",
    "subprocess",
    "asyncio",
    "logging",
    "shardex.storage.object",
    "shardex.storage.direct",
    "shardex.storage.helper",
    "shardex.storage.lock",
    "obstore",
    "pyarrow",
    "PIL",
    "torch",
    "fastjsonschema",
)

_CODE = """
import json, sys
lazy = json.loads(sys.argv[1])
import shardex
imported = [m for m in lazy if m in sys.modules]
ds = shardex.open_dataset(sys.argv[2], split="train")
ds[0]
opened = [m for m in lazy if m in sys.modules]
print(json.dumps([imported, opened]))
"""


def test_import_and_local_open_import_none_of_the_lazy_modules(tmp_path: Path) -> None:
    shardex.export("demo:12", tmp_path / "o", samples_per_shard=4, workers=1)
    out = subprocess.run(
        [sys.executable, "-c", _CODE, json.dumps(LAZY), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    imported, opened = json.loads(out)
    assert imported == [], f"`import shardex` imports {imported}"
    assert opened == [], f"open_dataset + ds[0] on a local export imports {opened}"


def test_the_public_names_resolve_in_a_fresh_process() -> None:
    code = (
        "import shardex, shardex.storage\n"
        "missing = [n for n in shardex.__all__ if getattr(shardex, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert shardex.storage.ObjectStorage.__name__ == 'ObjectStorage'\n"
        "assert callable(shardex.export) and callable(shardex.open_dataset)\n"
        "assert set(shardex.__all__) <= set(dir(shardex))\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "ok"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_shardex_torch_imports_in_a_fresh_process() -> None:
    code = "import shardex.torch as t; print(t.MapDataset.__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "MapDataset"
