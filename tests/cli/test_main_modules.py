"""Object storage and export workers from every kind of main module, against a real S3
server: a script without an ``if __name__ == "__main__":`` guard, ``python -c``,
``python -`` reading stdin, a notebook run by a real Jupyter kernel, and DataLoader
workers started by fork, spawn and forkserver.

Each program records its pid in a file every time its main module runs: shardex's helper
processes and export workers must never run it again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardex
from shardex.errors import ParallelismWarning
from tests.support.s3data import S3Location

# The user's program: reads the export, exports a copy with two workers, reads it from a
# child forked after this process's requests (a forked DataLoader worker), and says so.
PROGRAM = """
import json, os, sys
import shardex
from shardex.sources import ExportSource
with open(os.environ["T_MARK"], "a") as mark:
    mark.write(f"{os.getpid()}\\n")
url, options = os.environ["T_URL"], json.loads(os.environ["T_OPTIONS"])
ds = shardex.open_dataset(url, split="train", storage_options=options)
keys = [s["__key__"] for s in ds]
copy = url + "/copy-" + os.environ["T_KIND"]
source = ExportSource(url, options)
shardex.export(source, copy, storage_options=options, workers=2, samples_per_shard=7)
copied = shardex.open_dataset(copy, split="train", storage_options=options)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, copied[len(copied) - 1]["__key__"].encode())
    os._exit(0)
os.waitpid(pid, 0)
print("read", len(keys), "copied", len(copied), "forked", os.read(read, 100).decode())
"""


@pytest.fixture
def source(s3: S3Location) -> S3Location:
    shardex.export("demo:30", s3.url, storage_options=s3.direct, samples_per_shard=8, workers=1)
    return s3


def _environment(s3: S3Location, tmp_path: Path, kind: str) -> dict[str, str]:
    return {
        **os.environ,
        "T_URL": s3.url,
        "T_OPTIONS": json.dumps(s3.direct),
        "T_MARK": str(tmp_path / "runs"),
        "T_KIND": kind,
    }


def _expected(s3: S3Location) -> str:
    ds = shardex.open_dataset(s3.url, split="train", storage_options=s3.direct)
    return f"read {len(ds)} copied {len(ds)} forked {ds[len(ds) - 1]['__key__']}"


def _ran_once(tmp_path: Path) -> None:
    assert len((tmp_path / "runs").read_text().split()) == 1  # never re-run by shardex


@pytest.mark.parametrize("kind", ["script", "-c", "stdin"])
def test_reads_and_exports_from_any_main_module(
    kind: str, source: S3Location, tmp_path: Path
) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(PROGRAM)
    command = {
        "script": [sys.executable, str(script)],
        "-c": [sys.executable, "-c", PROGRAM],
        "stdin": [sys.executable, "-"],
    }[kind]
    done = subprocess.run(
        command,
        input=PROGRAM if kind == "stdin" else None,
        env=_environment(source, tmp_path, kind),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == _expected(source)
    assert done.stderr == ""  # no traceback, no warning: the workers did the export
    _ran_once(tmp_path)


def test_a_notebook_reads_and_exports(source: S3Location, tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(PROGRAM)]
    environment = _environment(source, tmp_path, "notebook")
    saved = dict(os.environ)
    os.environ.update(environment)  # the kernel inherits this process's environment
    try:
        nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    outputs = notebook.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    assert [o for o in outputs if o.get("output_type") == "error"] == []
    assert text.strip() == _expected(source)
    assert [o for o in outputs if o.get("name") == "stderr"] == []
    _ran_once(tmp_path)


# Work that needs __main__: a storage class defined in the user's script, without a guard.
NEEDS_MAIN = """
import os, sys, warnings
import shardex
from shardex.storage import LocalStorage
with open(os.environ["T_MARK"], "a") as mark:
    mark.write(f"{os.getpid()}\\n")

class Mine(LocalStorage):
    pass

shardex.export("demo:30", Mine(sys.argv[1]), workers=2, samples_per_shard=8)
print(len(shardex.open_dataset(sys.argv[1], split="train")))
"""


@pytest.mark.parametrize("kind", ["script", "stdin"])
def test_work_that_needs_main_runs_inline_with_one_warning(kind: str, tmp_path: Path) -> None:
    script = tmp_path / "mine.py"
    script.write_text(NEEDS_MAIN)
    out = tmp_path / "out"
    command = [sys.executable, str(script) if kind == "script" else "-", str(out)]
    done = subprocess.run(
        command,
        input=NEEDS_MAIN if kind == "stdin" else None,
        env={**os.environ, "T_MARK": str(tmp_path / "runs")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "30"
    warned = [line for line in done.stderr.splitlines() if "Warning" in line]
    assert len(warned) == 1, done.stderr
    assert "ParallelismWarning: running in this process instead of 2 worker processes" in warned[0]
    assert "Mine" in warned[0]  # says what could not be loaded
    assert "Traceback" not in done.stderr
    _ran_once(tmp_path)
    shardex.export("demo:30", tmp_path / "plain", workers=1, samples_per_shard=8)
    assert (out / "config.yaml").read_bytes() == (tmp_path / "plain" / "config.yaml").read_bytes()


def test_runner_falls_back_for_unpicklable_work() -> None:
    from shardex.parallel import Runner

    with Runner(2) as runner:
        with pytest.warns(ParallelismWarning, match="does not pickle"):
            doubled = list(runner.imap(lambda x: x * 2, range(9)))
        assert doubled == list(range(0, 18, 2))
        assert runner.workers == 1
