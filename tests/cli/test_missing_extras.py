"""An optional extra that is not installed: one ``error:`` line naming the install command,
before any work, and nothing left in the output (the retry after installing it works).

Each case runs the CLI in a fresh process where the extra's modules cannot be imported
(a ``sitecustomize`` on ``PYTHONPATH`` blocks them in that process and in every worker it
starts), as on a machine without the extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN_CLI = "import sys; from shardex.cli import main; sys.argv[0] = 'shardex'; main()"


def _cli(tmp_path: Path, blocked: tuple[str, ...], *args: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", RUN_CLI, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _refused(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines[:40]
    assert says in lines[0], lines[0]


def test_browse_without_its_extra(tmp_path: Path) -> None:
    import shardex

    shardex.export("demo:20", tmp_path / "exp", workers=1)
    done = _cli(tmp_path, ("uvicorn",), "browse", "exp", "--port", "0")
    _refused(done, "pip install 'shardex[browse]'")


def test_torch_backend_without_torch_is_refused_before_the_source_is_read(tmp_path: Path) -> None:
    done = _cli(
        tmp_path, ("torch",), "export-dataset", "demo:50", "-o", "out", "--backend", "torch"
    )
    _refused(done, "pip install 'shardex[torch]'")
    assert not (tmp_path / "out").exists()  # no intent file: the retry is not refused


def test_embed_stage_without_torch_is_refused_before_workers_start(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(
        "source: demo:40\n"
        "output: curated\n"
        "batch_size: 8\n"
        "stages:\n"
        "  - {stage: decode}\n"
        "  - {stage: embed, model: 'shardex.testing.models:tiny_embedder', key: emb, "
        "input_size: 32}\n"
        "executor: {kind: local, workers: 2}\n"
    )
    done = _cli(tmp_path, ("torch",), "pipeline", "run", "spec.yaml", "--workers", "2")
    _refused(done, "EmbedStage needs torch: pip install 'shardex[torch]'")
    assert not (tmp_path / "curated").exists()


def test_a_refused_dtype_imports_no_torch_or_tensordict(tmp_path: Path) -> None:
    """``--backend numpy --dtype bfloat16`` is refused from the options alone: naming the
    backends that can store bfloat16 does not import torch or tensordict (seconds)."""
    pytest.importorskip("tensordict")
    code = (
        "import sys, shardex\n"
        "try:\n"
        "    shardex.export('demo:5', 'out', backend='numpy', dtype='bfloat16')\n"
        "except shardex.errors.ConfigError as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in ('torch', 'tensordict') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    refusal, imported = done.stdout.strip().splitlines()
    assert "use one that can (tensor_shards, tensordict_memmap, torch)" in refusal
    assert imported == "[]"
    assert not (tmp_path / "out").exists()


def test_the_pipeline_guides_model_imports_without_pytest(tmp_path: Path) -> None:
    """docs/pipeline.md's embedder lives in shardex.testing, which must not need pytest."""
    code = "import shardex.testing.models as m; print(m.tiny_embedder.__name__)"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['pytest'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "tiny_embedder"
