"""Result rows and the Markdown table both benchmarks print."""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The benchmarks run as ``python benchmarks/bench_x.py`` (this folder is sys.path[0]); the
# repository root goes on the path too, for the test support they share with the tests
# (``tests.support``: the S3 server, the counting proxy, the Ray cluster), which the wheel
# does not ship. Appended, so it never shadows an installed package.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.append(_REPO_ROOT)


@dataclass
class Row:
    """One line of a results table.

    ``target_on`` says what the target applies to: ``"ratio"`` (value / baseline) or
    ``"value"``; ``higher`` says whether bigger is better.
    """

    name: str
    unit: str
    value: float
    baseline: float | None = None
    target: float | None = None
    target_on: str = "ratio"
    higher: bool = True
    note: str = ""
    ratio: float | None = field(init=False, default=None)
    passed: bool | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.baseline:
            self.ratio = self.value / self.baseline
        if self.target is not None:
            got = self.ratio if self.target_on == "ratio" else self.value
            if got is not None:
                self.passed = got >= self.target if self.higher else got <= self.target


def fmt(x: float | None) -> str:
    """Numbers as people read them: thousands separators, 3 significant-ish digits."""
    if x is None or math.isnan(x):  # nan: not measured (see the row's note)
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3f}"


def _target_text(row: Row) -> str:
    if row.target is None:
        return "—"
    op = "≥" if row.higher else "≤"
    what = "ratio" if row.target_on == "ratio" else row.unit
    return f"{what} {op} {fmt(row.target)}"


def render(rows: Sequence[Row]) -> str:
    """A Markdown table (pastes into RESULTS.md as is)."""
    head = ["measure", "value", "unit", "baseline", "ratio", "target", "result", "note"]
    body = [
        [
            r.name,
            fmt(r.value),
            r.unit,
            fmt(r.baseline),
            fmt(r.ratio),
            _target_text(r),
            {True: "PASS", False: "MISS", None: ""}[r.passed],
            r.note,
        ]
        for r in rows
    ]
    widths = [max(len(line[k]) for line in [head, *body]) for k in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(b) for b in body)])


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs (gc collected before each)."""
    return statistics.median(_timed(fn) for _ in range(repeats))


def median_times(fns: Sequence[Callable[[], object]], repeats: int) -> list[float]:
    """Median wall time of each of ``fns``, run interleaved so that noise hits all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times, strict=True):
            out.append(_timed(fn))
    return [statistics.median(t) for t in times]


def minor_faults(fn: Callable[[], object]) -> int:
    """Minor page faults this process takes while running ``fn()`` once."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def machine() -> dict[str, Any]:
    """What ran the benchmark."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def write_json(
    path: Path, rows: Sequence[Row], *, versions: dict[str, str] | None = None, **fields: Any
) -> None:
    """The ``--json`` report: the given fields, the machine (with ``versions``), the rows."""
    doc = {
        **fields,
        "machine": {**machine(), **(versions or {})},
        "rows": [asdict(r) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
