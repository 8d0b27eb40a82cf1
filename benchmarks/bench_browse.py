"""How fast ``shardex browse`` answers on a big export (issue 16: first page of a 1M-sample
export in <= 300 ms).

Builds (once, reused after) an export of N tiny JPEGs with a label, a score, width and
height, a caption and a 64-d embedding, serves it with the real server (uvicorn, loopback)
and times what the grid and the other pages ask for, cold (the first request of each kind)
and warm. With ``--browser`` also times a headless Chromium from navigation to the first
page's thumbnails all shown.

    python benchmarks/bench_browse.py --samples 1000000 --export /tmp/browse-1m [--browser]
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]  # the repository: tests.support
from tests.support.serve import serve  # noqa: E402


def build(out: Path, n: int) -> None:
    """An export of ``n`` tiny JPEGs (16 distinct 8x8 images) and their metadata."""
    from PIL import Image

    import shardex
    from shardex.sources.arrays import ArraySource

    jpegs = []
    for s in range(16):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (s * 15, 255 - s * 15, 100)).save(buf, "JPEG", quality=50)
        jpegs.append(buf.getvalue())
    rng = np.random.default_rng(0)
    pick = rng.integers(0, 16, n)
    meta = pa.table(
        {
            "score": rng.random(n),
            "width": np.full(n, 8, np.int32),
            "height": np.full(n, 8, np.int32),
            "caption": pa.array([f"tiny {i % 97}" for i in range(n)]),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(n * 64, dtype=np.float32)), 64
            ),
        }
    )
    source = ArraySource(
        {"jpg": [jpegs[i] for i in pick], "label": pick % 10},
        label_names=[f"class{i}" for i in range(10)],
        metadata=meta,
    )
    shardex.export(source, out, samples_per_shard=20000, workers=1, overwrite=True)


def timed(url: str) -> float:
    """Milliseconds to fetch ``url`` whole."""
    start = time.perf_counter()
    with urllib.request.urlopen(url) as response:
        response.read()
    return (time.perf_counter() - start) * 1000


def browser_first_page(url: str) -> float:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)  # the first visit: the browser's and the server's first page
        page.wait_for_selector("body[data-loaded]")
        first = float(page.get_attribute("body", "data-loaded-ms"))
        page.goto(url + "?offset=96")
        page.wait_for_selector("body[data-loaded]")
        # milliseconds from the start of the navigation, as the page measures them
        grid = float(page.get_attribute("body", "data-loaded-ms"))
        page.wait_for_function(
            "() => [...document.querySelectorAll('.tile img')]"
            ".filter((i) => i.getBoundingClientRect().top < innerHeight)"
            ".every((i) => i.complete && i.naturalWidth > 0)"
        )
        thumbs = page.evaluate("() => performance.now()")
        browser.close()
    print(f"| browser: first visit, navigation to the grid shown with its data | {first:.0f} ms |")
    print(f"| browser: another page, navigation to the grid shown with its data | {grid:.0f} ms |")
    print(f"| browser: navigation to its thumbnails in view shown (cold) | {thumbs:.0f} ms |")
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--export", type=Path, default=Path("/tmp/shardex-browse-bench"))
    parser.add_argument("--browser", action="store_true", help="also time headless Chromium")
    args = parser.parse_args()
    if not (args.export / "config.yaml").is_file():
        start = time.perf_counter()
        build(args.export, args.samples)
        print(f"built {args.samples} samples in {time.perf_counter() - start:.0f} s")
    from shardex.browse import create_app

    start = time.perf_counter()
    app = create_app(args.export)
    opened = (time.perf_counter() - start) * 1000
    print("| step | time |\n|---|---|")
    print(
        f"| open the split (config, index, metadata of {args.samples:,} rows) | {opened:.0f} ms |"
    )
    start = time.perf_counter()
    for thread in threading.enumerate():
        if thread.name == "shardex-browse-warm":
            thread.join()
    warmed = (time.perf_counter() - start) * 1000
    print(f"| then the embeddings, read in the background | {warmed:.0f} ms more |")
    with serve(app) as url:
        rows = [
            ("grid page HTML (cold)", ""),
            ("/api/info", "api/info"),
            ("first page: /api/page (cold)", "api/page?col=score&col=width"),
            ("first page: /api/page (warm)", "api/page?col=score&col=width&offset=48"),
            ("48 thumbnails (cold, sequential)", None),
            ("label filter (2 labels)", "api/page?label=1&label=2"),
            (
                "score range + text match",
                "api/page?min.score=0.2&max.score=0.4&q=tiny+1&in=caption",
            ),
            ("filter expression", "api/page?expr=score+>+0.5+and+label+in+(1,+2,+3)"),
            ("order by score, descending (cold sort)", "api/page?order=score&desc=1"),
            ("order by score, next page (kept)", "api/page?order=score&desc=1&offset=48"),
            ("plots (labels, 3 histograms, width x height)", "api/plots"),
            (
                "similar images: first query (builds norms)",
                f"api/similar/{12345 % args.samples}?k=12",
            ),
            ("similar images: next query", f"api/similar/{777 % args.samples}?k=12"),
            ("sample page", f"sample/{4242 % args.samples}"),
        ]
        for name, path in rows:
            if path is None:
                start = time.perf_counter()
                for i in range(48):
                    timed(f"{url}thumb/{i}?size=160")
                ms = (time.perf_counter() - start) * 1000
                print(f"| {name} | {ms:.0f} ms ({ms / 48:.1f} ms each) |")
                continue
            print(f"| {name} | {timed(url + path):.1f} ms |")
        if args.browser:
            browser_first_page(url)


if __name__ == "__main__":
    main()
