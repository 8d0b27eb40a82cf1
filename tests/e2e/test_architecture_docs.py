"""docs/architecture.md's "Adding a storage" and "Adding a CLI command" run as written:
the storage passes the whole storage conformance suite and holds an export; the command
runs from the ``shardex`` group."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardex.cli import main
from shardex.storage import Storage
from shardex.testing import StorageTests

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _section(title: str) -> list[str]:
    """The Python blocks of the section ``## title``."""
    text = DOC.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _run(blocks: list[str], scope: dict[str, Any]) -> dict[str, Any]:
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/architecture.md python block {number}", "exec"), scope)
    return scope


# run in this module, so that its classes pickle as any test module's do
_STORAGE = _run(_section("Adding a storage")[:1], globals())


class TestTheDocsStorage(StorageTests):
    @pytest.fixture
    def storage(self) -> Storage:
        return _STORAGE["DictStorage"]("dict://test")  # type: ignore[no-any-return]


def test_the_docs_storage_holds_an_export() -> None:
    _run(_section("Adding a storage")[1:], dict(_STORAGE))


def test_the_docs_command_runs_from_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardex

    monkeypatch.setattr(main, "commands", dict(main.commands))  # the command goes after
    _run(_section("Adding a CLI command"), {})
    shardex.export("demo:12", tmp_path / "out", split_fractions={"a": 0.5, "b": 0.5}, workers=1)
    runner = CliRunner()
    done = runner.invoke(main, ["count", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    counts = dict(line.split(": ") for line in done.output.splitlines())
    assert sorted(counts) == ["a", "b"]
    assert sum(map(int, counts.values())) == 12
    assert "count" in runner.invoke(main, ["--help"]).output
    (tmp_path / "empty").mkdir()
    failed = runner.invoke(main, ["count", str(tmp_path / "empty")])
    assert failed.exit_code == 1
    assert failed.output.startswith("error: ")
    assert len(failed.output.strip().splitlines()) == 1


def test_the_entry_points_the_docs_show_are_the_plugins_own() -> None:
    plugins = Path(__file__).resolve().parents[1] / "support" / "plugins"
    (shown,) = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert shown in (plugins / "shardex-plugin-npz" / "pyproject.toml").read_text()
    lines = (plugins / "shardex-plugin-lines" / "pyproject.toml").read_text()
    assert 'lines = "shardex_plugin_lines:LinesSource"' in lines
