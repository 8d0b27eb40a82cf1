"""Write tests/slow.txt from a JUnit report: every test that took over a threshold.

    python -m pytest -n 2 --junitxml=run.xml         # the whole suite, as scripts/test.sh
    python scripts/slow_tests.py run.xml [SECONDS]  # default 3.0; rewrites tests/slow.txt

The times are the machine's under the suite's own load (two workers on two cores), so
measure on the machine that will run the fast tier, and keep the list as it comes: tests
that the markers s3, ray, browser or dali exclude anyway are listed too (for the record).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SLOW = Path(__file__).resolve().parents[1] / "tests" / "slow.txt"


def main(report: str, threshold: float = 3.0) -> None:
    times: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # JUnit names a test module.path[.Class]::name; pytest's node ID is path::[Class::]name
        parts = [p for p in module if p and p[0].isupper()]
        path = "/".join(p for p in module if p not in parts) + ".py"
        node = "::".join([path, *parts, case.get("name", "")])
        base = node.split("[")[0]
        times[base] = max(times.get(base, 0.0), float(case.get("time", 0)))
    slow = sorted((t, name) for name, t in times.items() if t > threshold)
    lines = [
        f"# Tests over {threshold:g} s in a run of the whole suite on two xdist workers (the",
        "# 2-core machine); made by scripts/slow_tests.py. A test ID without its parameters",
        "# covers every parametrised case. The fast tier (scripts/test.sh --fast) leaves them out.",
        *(f"{name}  # {t:.1f} s" for t, name in sorted(slow, key=lambda x: x[1])),
    ]
    SLOW.write_text("\n".join(lines) + "\n")
    print(f"{len(slow)} tests over {threshold:g} s written to {SLOW}")


if __name__ == "__main__":
    main(sys.argv[1], *(float(a) for a in sys.argv[2:3]))
