"""The examples in the README and examples/ run as written."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardex.cli import main

ROOT = Path(__file__).resolve().parents[2]
# The docs use the full 5,000-image demo; tests use a small one to stay fast.
_SMALL_DEMO = "demo:120"


def _blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_python_quick_start_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (code,) = [b for b in _blocks("python") if "shardex.export(" in b]
    exec(compile(code.replace('"demo"', f'"{_SMALL_DEMO}"'), "README.md", "exec"), {})
    assert (tmp_path / "demo-export" / "config.yaml").is_file()


def test_readme_cli_quick_start_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (block,) = [b for b in _blocks("bash") if "shardex export-dataset" in b]
    runner = CliRunner()
    for line in block.splitlines():
        command = line.split("#")[0].split()
        if not command or command[0] != "shardex":
            continue
        args = [_SMALL_DEMO if a == "demo" else a for a in command[1:]]
        if args[0] == "get":  # the small demo's first circle
            args[2] = "circle/000000"
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (line, result.output)
    assert (tmp_path / "circle.jpg").stat().st_size > 0


def test_quickstart_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardex

    out = tmp_path / "demo-export"
    shardex.export(_SMALL_DEMO, out, split_fractions={"train": 0.8, "val": 0.2}, workers=1)
    monkeypatch.setattr(sys, "argv", ["quickstart.py", str(out)])
    runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "get_many: 64 random samples" in printed
    assert "decoded: image" in printed


def test_backends_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-memory arrays example, then the numpy_mmap one reading its output."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "backends.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    scope: dict[str, Any] = {}
    for block in (b for b in blocks if "arrays-out" in b):
        exec(compile(block, "docs/backends.md", "exec"), scope)
    ds = scope["ds"]
    assert scope["sample"]["pixels.npy"].shape == (64, 64, 3)
    assert scope["labels"].shape == (len(ds),)
    assert scope["embeddings"].dtype == np.float32
    assert scope["caption_7"] == ds[7]["caption.txt"]


def test_pipeline_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python example, then the spec file: materialize it, and stop at a key."""
    import yaml

    import shardex
    from shardex.pipeline import LocalExecutor, run_spec

    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "pipeline.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/pipeline.md", "exec"), scope)
    counts = [s.num_samples for s in scope["config"].split("train").shards]
    assert counts[:-1] == [100] * (len(counts) - 1)
    spec_text = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)[0]
    (tmp_path / "spec.yaml").write_text(spec_text)
    config = shardex.materialize("spec.yaml", executor=LocalExecutor(1))
    assert [p["stage"] for p in config.pipeline][1:] == [
        s["stage"] for s in yaml.safe_load(spec_text)["stages"]
    ]
    assert shardex.materialize("spec.yaml") == config  # reused, not rebuilt
    view = run_spec("spec.yaml", "emb", until_keys=["clip_embedding"], executor=LocalExecutor(1))
    assert [p["stage"] for p in view.pipeline] == ["read", "filter", "decode", "embed"]


def test_window_loader_guide_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "torch.md").read_text()
    code = next(
        b
        for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
        if "TensorShardsLoader(" in b
    )
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/torch.md", "exec"), scope)
    assert tuple(scope["x"].shape) == (1000 % 64 or 64, 16)
    assert scope["state"]["epoch"] == 2


def _torch_scripts() -> dict[str, str]:
    """The README's and docs/torch.md's PyTorch examples, each as a whole script."""
    readme = [b for b in _blocks("python") if "MapDataset(" in b]
    guide = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "torch.md").read_text(), re.S)
    stateful = [b for b in guide if "StatefulDataLoader(" in b]
    export = f'import shardex\nshardex.export("{_SMALL_DEMO}", "demo-export", workers=1)\n'
    return {
        "README": export + readme[0],
        "torch.md": guide[0],
        "torch.md StatefulDataLoader": guide[0] + stateful[0],
        "torch.md without workers": guide[0].replace("num_workers=2", "num_workers=0"),
    }


@pytest.mark.parametrize("name", list(_torch_scripts()))
def test_torch_examples_run_as_scripts_with_nothing_on_stderr(name: str, tmp_path: Path) -> None:
    """A user's script ends quietly: no "Exception ignored in ... __del__" at exit (a
    destructor that met the interpreter's shutdown), no warning, no traceback."""
    pytest.importorskip("torch")
    if "Stateful" in name:
        pytest.importorskip("torchdata")
    script = tmp_path / "example.py"
    script.write_text(_torch_scripts()[name])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # torchdata's own warning on this torch, which docs/torch.md names as harmless
    vital = r".*UserWarning: 'set_vital' is deprecated.*\n.*torch\.set_vital\(.*\n"
    assert re.sub(vital, "", done.stderr) == ""


def test_images_of_different_sizes_without_a_transform_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    import shardex
    from shardex.errors import ConfigError
    from shardex.torch import MapDataset

    shardex.export(_SMALL_DEMO, tmp_path / "demo-export", workers=1)
    loader = MapDataset(tmp_path / "demo-export", "train").dataloader(16, num_workers=0)
    with pytest.raises(ConfigError) as refused:
        next(iter(loader))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("cannot batch the field 'image'")
    assert "transform=" in message
