"""``shardex browse``: the JSON API through Starlette's test client, and the real server
(the ``shardex browse`` command, and on S3 an in-process uvicorn) driven by a headless
Chromium through Playwright.

The browser tests need a system Chromium (``apt-get install chromium``; .ci/run installs
it); without one they skip, saying so. Screenshots go to ``$SHARDEX_SCREENSHOTS`` when set.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import shardex
from helpers import image_bytes
from shardex.errors import ConfigError
from shardex.pipeline.stages.filter import FilterStage
from shardex.sources.arrays import ArraySource
from shardex.storage.paged import PAGE
from tests.support.s3data import S3Location
from tests.support.serve import serve

pytest.importorskip("starlette", reason="the browse extra is not installed")
from starlette.testclient import TestClient

from shardex.browse import create_app

N = 60
NAMES = ("cat", "dog", "fox", "owl")
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
DAMAGED = 7  # the sample whose image bytes the fixture flips
SCRIPT_ROW = 11  # the sample whose caption holds markup


def _source(n: int) -> ArraySource:
    rng = np.random.default_rng(3)
    sizes = [(int(w), int(h)) for w, h in rng.integers(16, 48, size=(n, 2))]
    captions = [f"a picture number {i}" for i in range(n)]
    captions[SCRIPT_ROW] = HOSTILE
    meta = pa.table(
        {
            "score": np.round(rng.random(n) * 10, 3),
            "width": pa.array([w for w, _ in sizes], pa.int32()),
            "height": pa.array([h for _, h in sizes], pa.int32()),
            "caption": captions,
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(n * 8).astype(np.float32)), 8
            ),
        }
    )
    jpgs = [image_bytes(i, "jpg", size) for i, size in enumerate(sizes)]
    labels = np.arange(n) % len(NAMES)
    return ArraySource({"jpg": jpgs, "label": labels}, label_names=NAMES, metadata=meta)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 small JPEG samples in 3 shards with labels, scores, sizes, captions and an
    embedding; sample DAMAGED has one flipped byte in its image."""
    out = tmp_path_factory.mktemp("browse") / "export"
    shardex.export(_source(N), out, samples_per_shard=20, workers=1)
    ds = shardex.open_dataset(out)
    offset, _checksum, shard, _length = ds.index.record(DAMAGED)  # type: ignore[attr-defined]
    path = out / ds.config.split(ds.split).shards[shard].path
    with open(path, "r+b") as f:  # a byte inside the image data (after the 512-byte header)
        f.seek(offset + 512 + 40)
        byte = f.read(1)
        f.seek(offset + 512 + 40)
        f.write(bytes([byte[0] ^ 0xFF]))
    return out


@pytest.fixture(scope="module")
def dataset(export: Path) -> shardex.Dataset:
    return shardex.open_dataset(export)


@pytest.fixture(scope="module")
def client(export: Path) -> Iterator[TestClient]:
    with TestClient(create_app(export), base_url="http://127.0.0.1") as test_client:
        yield test_client


def _count(client: TestClient, query: str) -> int:
    response = client.get(f"/api/page?{query}")
    assert response.status_code == 200, response.text
    return int(response.json()["total"])


# ---------------------------------------------------------------- API


def test_filters_count_what_the_metadata_says(client: TestClient, dataset: shardex.Dataset) -> None:
    meta = dataset.metadata.to_pylist()
    assert _count(client, "") == N
    assert _count(client, "label=1&label=3") == sum(r["label"] in (1, 3) for r in meta)
    assert _count(client, "min.score=2.5&max.score=7") == sum(2.5 <= r["score"] <= 7 for r in meta)
    assert _count(client, "q=NUMBER+1&in=caption") == sum("number 1" in r["caption"] for r in meta)
    assert _count(client, "q=0000&in=key") == sum("0000" in r["key"] for r in meta)
    page = client.get("/api/page?label=2&limit=5").json()
    # label counts ignore the label filter itself: they say what choosing a label gives
    assert page["label_counts"] == {str(i): N // len(NAMES) for i in range(len(NAMES))}
    assert [r["label_name"] for r in page["rows"]] == ["fox"] * 5


@pytest.mark.parametrize(
    "expr",
    [
        "score > 5",
        "width >= 30 and label != 3",
        "0.2 < score / 10 <= 0.5",
        "label in (1, 2) or height % 2 == 0",
        "not (width * 2 > height + 40)",
        "caption is not None and 'number 2' in caption",
        "width // 10 == 3 and key not in ('000001', '000002')",
        "-score < -9 or label == 0",
    ],
)
def test_expressions_keep_what_the_pipeline_filter_keeps(
    client: TestClient, dataset: shardex.Dataset, expr: str
) -> None:
    stage = FilterStage(expr)
    kept = [i for i, row in enumerate(dataset.metadata.to_pylist()) if stage.holds(row)]
    rows = client.get("/api/page", params={"expr": expr, "limit": 200}).json()["rows"]
    assert [r["index"] for r in rows] == kept


_INTS = st.sampled_from(["width", "height", "label"])
_TERMS = st.one_of(
    _INTS,
    st.just("score"),
    st.integers(-50, 50).map(str),
    st.floats(-20, 20, allow_nan=False).map(lambda x: repr(round(x, 2))),
)


@st.composite
def _numbers(draw: st.DrawFn, depth: int = 2) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(_TERMS)
    left, right = draw(_numbers(depth - 1)), draw(_numbers(depth - 1))
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    if op == "/":  # a non-zero divisor: Python would raise where Arrow gives inf
        right = draw(st.sampled_from(["3", "-7", "2.5"]))
    if draw(st.booleans()):  # // and %, by integers and by floats that no binary float is
        divisor = draw(st.sampled_from(["4", "-3", "2.5", "(-8 / -7)"]))
        return f"({draw(_TERMS)} {draw(st.sampled_from(['//', '%']))} {divisor})"
    return f"({left} {op} {right})"


@st.composite
def _conditions(draw: st.DrawFn, depth: int = 2) -> str:
    if depth == 0 or draw(st.booleans()):
        ops = draw(
            st.lists(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), min_size=1, max_size=2)
        )
        parts = [draw(_numbers()) for _ in range(len(ops) + 1)]
        chain = parts[0] + "".join(f" {op} {p}" for op, p in zip(ops, parts[1:], strict=True))
        if draw(st.booleans()):
            return chain
        return f"{draw(_INTS)} {draw(st.sampled_from(['in', 'not in']))} (1, 2, 30)"
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(_conditions(depth - 1))})"
    return f"({draw(_conditions(depth - 1))}) {kind} ({draw(_conditions(depth - 1))})"


@settings(max_examples=60, deadline=None)
@given(expr=_conditions())
@example(expr="(width + -15) < (-8 / -7)")  # constants alone divided as integers once
@example(expr="not (1 - 1) and width > 0")
@example(expr="((label * label) % (-8 / -7)) in (1, 2, 30, 2.5)")  # Arrow's rounding once
def test_random_expressions_agree_with_the_pipeline_filter(
    dataset: shardex.Dataset, expr: str
) -> None:
    from shardex.browse.query import expression_mask

    stage = FilterStage(expr)
    rows = dataset.metadata.to_pylist()
    kept = np.flatnonzero(expression_mask(dataset.metadata, expr)).tolist()
    assert kept == [i for i, row in enumerate(rows) if stage.holds(row)], expr


@pytest.mark.parametrize(
    "expr", ["__import__('os').system('id')", "score.real > 1", "key[0] == 'a'", "lambda: 1"]
)
def test_expressions_outside_the_language_are_refused_as_the_stage_refuses(
    client: TestClient, expr: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        FilterStage(expr)
    response = client.get("/api/page", params={"expr": expr})
    assert response.status_code == 400
    assert response.json()["error"] == str(refused.value)


def test_bad_queries_are_400_with_one_line(client: TestClient) -> None:
    for query in (
        "limit=201",
        "limit=0",
        "offset=-1",
        "limit=x",
        "min.nope=1",
        "min.score=abc",
        "order=caption",
        "in=embedding&q=a",
        "expr=nope+>+1",
        "expr=caption+>+1",
        "split=nope",
    ):
        response = client.get(f"/api/page?{query}")
        assert response.status_code == 400, query
        assert "\n" not in response.json()["error"]
    assert client.get("/thumb/1?size=4000").status_code == 400
    assert client.get("/api/similar/1?k=1000").status_code == 400


def test_order_by_a_numeric_column_pages_through_the_sorted_split(
    client: TestClient, dataset: shardex.Dataset
) -> None:
    scores = dataset.metadata.column("score").to_numpy()
    want = np.argsort(-scores, kind="stable").tolist()
    got: list[int] = []
    for offset in range(0, N, 25):
        page = client.get(f"/api/page?order=score&desc=1&offset={offset}&limit=25").json()
        got += [r["index"] for r in page["rows"]]
    assert got == want
    by_export = client.get(f"/api/page?order=export_index&desc=1&limit={N}").json()["rows"]
    assert [r["index"] for r in by_export] == list(range(N))[::-1]


def test_import_shardex_stays_light_and_browse_is_the_function() -> None:
    code = (
        "import sys, shardex; print(sorted(m for m in ('starlette', 'uvicorn', 'jinja2', "
        "'playwright') if m in sys.modules)); import shardex.browse.app; "
        "print(callable(shardex.browse))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]


def test_sample_data_gives_each_fields_bytes_in_the_shard(
    client: TestClient, export: Path, dataset: shardex.Dataset
) -> None:
    data = client.get("/api/sample/12").json()
    sample = dataset[12]
    assert data["key"] == sample["__key__"]
    assert data["verified"] is True
    shard = (export / data["shard"]).read_bytes()
    fields = {f["name"]: shard[f["start"] : f["end"]] for f in data["fields"]}
    assert fields == {k: v for k, v in sample.items() if k != "__key__"}
    assert {f["name"]: f["size"] for f in data["fields"]} == {k: len(v) for k, v in fields.items()}
    image = client.get("/image/12")
    assert image.headers["content-type"] == "image/jpeg"
    assert image.content == sample["jpg"]
    assert data["metadata"]["caption"] == "a picture number 12"


def test_a_damaged_sample_is_an_error_not_a_crash(client: TestClient) -> None:
    thumb = client.get(f"/thumb/{DAMAGED}")
    assert thumb.status_code == 500
    assert "checksum mismatch" in thumb.json()["error"]
    page = client.get(f"/sample/{DAMAGED}")
    assert page.status_code == 500
    assert "checksum mismatch" in page.text
    assert client.get(f"/thumb/{DAMAGED + 1}").status_code == 200  # the server goes on


def test_markup_in_metadata_is_escaped(client: TestClient) -> None:
    html = client.get(f"/sample/{SCRIPT_ROW}").text
    assert "<script>window.pwned" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;window.pwned=2&lt;/script&gt;" in html
    rows = client.get(f"/api/page?col=caption&offset={SCRIPT_ROW}&limit=1").json()["rows"]
    assert rows[0]["caption"] == HOSTILE  # JSON data; the page sets it as text


def test_only_samples_by_number_or_key_are_reachable(client: TestClient, export: Path) -> None:
    for path in (
        "/sample/../config.yaml",
        "/static/../config.yaml",
        "/static/..%2f..%2fconfig.yaml",
        "/image/-1",
        f"/image/{N}",
        "/thumb/%2e%2e%2fconfig.yaml",
        "/config.yaml",
        "/find?key=../config.yaml",
    ):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 404, path
        assert b"format_version" not in response.content
    found = client.get("/find", params={"key": "000005"}, follow_redirects=False)
    assert (found.status_code, found.headers["location"]) == (303, "/sample/5")
    assert client.post("/api/page").status_code == 405
    assert client.delete("/sample/1").status_code == 405
    # DNS rebinding: a page of another site naming this server by its own host name
    assert client.get("/", headers={"host": "attacker.example"}).status_code == 400
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"


def test_similar_images_are_the_nearest_by_cosine(
    client: TestClient, dataset: shardex.Dataset
) -> None:
    emb = np.asarray(dataset.metadata.column("embedding").to_pylist(), dtype=np.float64)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    scores = unit @ unit[4]
    scores[4] = -np.inf
    want = np.argsort(-scores, kind="stable")[:5].tolist()
    rows = client.get("/api/similar/4?k=5").json()["rows"]
    assert [r["index"] for r in rows] == want
    assert [r["score"] for r in rows] == pytest.approx(scores[want], abs=1e-3)


def test_plot_data_follows_the_filter(client: TestClient, dataset: shardex.Dataset) -> None:
    meta = dataset.metadata.to_pylist()
    plots = client.get("/api/plots?min.score=5").json()
    kept = [r for r in meta if r["score"] >= 5]
    assert plots["total"] == len(kept)
    assert sum(d["count"] for d in plots["labels"]) == len(kept)
    assert {d["name"] for d in plots["labels"]} <= set(NAMES)
    for column in ("score", "width", "height"):
        assert sum(plots["histograms"][column]["counts"]) == len(kept)
    assert sum(map(sum, plots["sizes"]["counts"])) == len(kept)
    shards = dataset.config.split(dataset.split).shards
    assert [s["bytes"] for s in plots["shards"]] == [s.num_bytes for s in shards]


def test_cli_help_names_the_options() -> None:
    from click.testing import CliRunner

    from shardex.cli import main

    result = CliRunner().invoke(main, ["browse", "--help"])
    assert result.exit_code == 0
    for option in ("--split", "--host", "--port", "127.0.0.1", "8765", "read-only"):
        assert option in result.output


def test_cli_refuses_a_port_in_use_in_one_line(export: Path) -> None:
    from click.testing import CliRunner

    from shardex.cli import main

    with _bound_socket() as port:
        result = CliRunner().invoke(main, ["browse", str(export), "--port", str(port)])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot serve on '127.0.0.1' port ")
    assert result.output.count("\n") == 1


@contextlib.contextmanager
def _bound_socket() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# ---------------------------------------------------------------- real server, real browser


def _chromium() -> str:
    found = os.environ.get("SHARDEX_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None
    )
    if not found:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert errors == []  # no script failed on any page


@contextlib.contextmanager
def _browse_server(export: Path) -> Iterator[str]:
    """``shardex browse EXPORT --port 0`` in a subprocess; its URL."""
    command = [sys.executable, "-m", "shardex.cli", "browse", str(export), "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, f"shardex browse printed {line!r}"
        yield found.group()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="module")
def server(export: Path) -> Iterator[str]:
    with _browse_server(export) as url:
        yield url


def _screenshot(page: Any, name: str) -> None:
    folder = os.environ.get("SHARDEX_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


_THUMBS_LOADED = """() => {
  const images = [...document.querySelectorAll('.tile img')];
  return images.length > 0 && images.every((i) => i.complete)
    && document.querySelectorAll('.tile').length
       === images.length + document.querySelectorAll('.tile.error').length;
}"""


def _grid(page: Any, url: str, *, thumbs: bool = True) -> None:
    """Open a grid page; wait for its thumbnails (all in view: they load lazily)."""
    page.goto(url)
    page.wait_for_selector("body[data-loaded]")
    if thumbs:
        page.wait_for_function(_THUMBS_LOADED)


def _wait_count(page: Any, text: str) -> None:
    # a function, not an expression: the page's CSP forbids eval, which expressions need
    page.wait_for_function(
        "(text) => document.querySelector('#count').textContent.includes(text)", arg=text
    )


def test_grid_shows_thumbnails_and_pages(page: Any, server: str, dataset: shardex.Dataset) -> None:
    _grid(page, f"{server}?limit=12")
    widths = page.eval_on_selector_all(".tile img", "els => els.map(e => e.naturalWidth)")
    assert len(widths) == 11
    assert all(w > 0 for w in widths)
    keys = dataset.metadata.column("key").to_pylist()
    assert page.locator(".tile .key").all_text_contents() == keys[:12]
    assert page.text_content("#count").startswith(f"1–12 of {N} matching")
    _screenshot(page, "grid")
    page.click("#next")
    _wait_count(page, "13–24 of")
    assert page.locator(".tile .key").all_text_contents() == keys[12:24]
    assert "offset=12" in page.url


def test_label_filter_changes_count_and_tiles(
    page: Any, server: str, dataset: shardex.Dataset
) -> None:
    _grid(page, f"{server}?limit=50", thumbs=False)
    page.check("input[name=label][value='1']")
    want = dataset.metadata.column("label").to_pylist().count(1)
    _wait_count(page, f"of {want} matching")
    assert set(page.locator(".tile .label").all_text_contents()) == {"dog"}
    assert page.locator(".tile").count() == want
    page.fill("#expr", "score > 5")
    page.press("#expr", "Enter")
    both = sum(r["label"] == 1 and r["score"] > 5 for r in dataset.metadata.to_pylist())
    _wait_count(page, f"of {both} matching")


def test_plots_render_in_the_page(page: Any, server: str, dataset: shardex.Dataset) -> None:
    page.goto(f"{server}plots")
    page.wait_for_selector("body[data-loaded]")
    assert page.locator("#plot-labels svg rect").count() == len(NAMES)
    assert page.locator("#histograms figure").count() == 3  # score, width, height
    assert page.locator("#plot-sizes svg rect").count() > 0
    shards = len(dataset.config.split(dataset.split).shards)
    assert page.locator("#plot-shards svg rect").count() == shards
    _screenshot(page, "plots")


def test_sample_page_shows_the_verified_bytes(
    page: Any, server: str, dataset: shardex.Dataset
) -> None:
    page.goto(f"{server}sample/12")
    page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")
    sample = dataset[12]
    assert "verified on read" in page.text_content("#checksum")
    cells = page.locator("#fields tbody tr").all_inner_texts()
    assert [c.split("\t")[:2] for c in cells] == [
        [k, str(len(v))] for k, v in sample.items() if k != "__key__"
    ]
    assert f"ds.get('{sample['__key__']}')" in page.text_content("#snippet")
    page.wait_for_selector("#similar .tile")
    _screenshot(page, "sample")


def test_markup_in_a_caption_is_shown_as_text(page: Any, server: str) -> None:
    _grid(page, f"{server}?col=caption&q=window&in=caption")
    assert page.locator(".tile .meta").all_text_contents() == [f"caption: {HOSTILE}"]
    page.goto(f"{server}sample/{SCRIPT_ROW}")
    page.wait_for_selector("#metadata")
    assert HOSTILE in page.text_content("#metadata")
    assert page.evaluate("window.pwned") is None
    assert page.locator("img[src=x]").count() == 0


def test_a_damaged_sample_shows_an_error_tile(page: Any, server: str) -> None:
    _grid(page, f"{server}?limit=12")
    errors = page.locator(".tile.error")
    assert errors.count() == 1
    assert errors.first.get_attribute("data-index") == str(DAMAGED)
    assert "cannot read" in errors.first.text_content()
    assert page.locator(".tile img").count() == 11
    page.goto(f"{server}sample/{DAMAGED}")
    assert "checksum mismatch" in page.text_content("#error")


def test_a_score_column_is_the_users_not_a_cosine(page: Any, server: str) -> None:
    # a metadata column named "score" is the user's; only similar images show a cosine
    _grid(page, f"{server}?col=score&limit=12")
    metas = page.locator(".tile .meta").all_text_contents()
    assert len(metas) == 12
    assert all(re.fullmatch(r"score: \d\.\d+", m) for m in metas), metas
    assert "cosine" not in page.text_content("#grid")
    page.goto(f"{server}sample/12")
    page.wait_for_selector("#similar .tile")
    cosines = page.locator("#similar .tile .score").all_text_contents()
    assert len(cosines) == 12
    assert all(c.startswith("cosine ") for c in cosines)


def test_go_to_an_unknown_key_says_so_and_keeps_the_search(
    page: Any, server: str, dataset: shardex.Dataset
) -> None:
    _grid(page, f"{server}?limit=12", thumbs=False)
    page.fill("input[name=key]", "no-such-key")
    page.press("input[name=key]", "Enter")
    page.wait_for_selector("#message")
    assert "no sample with key 'no-such-key'" in page.text_content("#message")
    assert page.input_value("input[name=key]") == "no-such-key"
    page.wait_for_selector("body[data-loaded]")  # the page goes on: the grid is there
    assert page.locator(".tile").count() == 12
    key = dataset.metadata.column("key")[5].as_py()
    page.fill("input[name=key]", key)
    page.press("input[name=key]", "Enter")
    page.wait_for_url(f"{server}sample/5")
    assert key in page.text_content("h1")


@pytest.fixture(scope="module")
def splits_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("browse-splits") / "export"
    shardex.export("demo:40", out, split_fractions={"train": 0.75, "val": 0.25}, workers=1)
    return out


def test_the_split_selector_switches_the_grid_to_another_split(
    page: Any, splits_export: Path
) -> None:
    val = shardex.open_dataset(splits_export, split="val").metadata
    keys, labels = val.column("key").to_pylist(), val.column("label").to_pylist()
    label = labels[0]
    with _browse_server(splits_export) as url:  # started without --split: train
        _grid(page, f"{url}?label={label}")
        assert page.locator("#split option").all_text_contents() == ["train", "val"]
        assert page.input_value("#split") == "train"
        page.select_option("#split", "val")
        page.wait_for_url(re.compile(r"split=val"))
        _wait_count(page, f"of {labels.count(label)} matching ({len(keys)} in the split)")
        page.wait_for_function(_THUMBS_LOADED)
        assert page.locator(".tile.error").count() == 0
        chosen = [k for k, n in zip(keys, labels, strict=True) if n == label]
        assert page.locator(".tile .key").all_text_contents() == chosen
        _screenshot(page, "grid-val")
        page.click(".tile >> nth=0")
        page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")
        assert chosen[0] in page.text_content("h1")
        assert page.input_value("#split") == "val"
        page.fill("input[name=key]", keys[-1])  # go to key looks in the split shown
        page.press("input[name=key]", "Enter")
        page.wait_for_url(f"{url}sample/{len(keys) - 1}?split=val")
        assert keys[-1] in page.text_content("h1")


def test_sample_image_fits_the_page_and_toggles_to_native_size(page: Any, server: str) -> None:
    page.goto(f"{server}sample/12")
    page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")
    natural = page.eval_on_selector("#image", "e => [e.naturalWidth, e.naturalHeight]")
    box = page.locator("#image").bounding_box()
    assert box["height"] > 5 * natural[1]  # a 16-48 px image, enlarged to fit the page
    assert box["height"] <= 1000
    page.click("#zoom")
    box = page.locator("#image").bounding_box()
    # its own size (the 1 px border on each side aside)
    assert (round(box["width"]) - 2, round(box["height"]) - 2) == tuple(natural)
    assert page.text_content("#zoom") == "fit to page"


def test_sample_page_steps_through_the_grid_and_goes_back_to_it(
    page: Any, server: str, dataset: shardex.Dataset
) -> None:
    meta = dataset.metadata
    scores, labels = meta.column("score").to_numpy(), meta.column("label").to_pylist()
    order = [int(i) for i in np.argsort(-scores, kind="stable") if labels[i] == 1]
    keys = meta.column("key").to_pylist()
    _grid(page, f"{server}?label=1&order=score&desc=1&limit=5")
    page.click("#next")
    _wait_count(page, f"6–10 of {len(order)}")
    page.click(".tile >> nth=1")  # the 7th of the filtered, ordered grid
    page.wait_for_url(re.compile(rf"/sample/{order[6]}\?"))
    assert page.text_content("#position") == f"7 of {len(order)} in the grid"
    page.keyboard.press("ArrowRight")
    page.wait_for_url(re.compile(rf"/sample/{order[7]}\?"))
    assert keys[order[7]] in page.text_content("h1")
    page.click("#prev")
    page.wait_for_url(re.compile(rf"/sample/{order[6]}\?"))
    page.keyboard.press("ArrowLeft")
    page.wait_for_url(re.compile(rf"/sample/{order[5]}\?"))
    page.click("#back")  # the grid's page that holds it, its filters and order kept
    _wait_count(page, f"6–10 of {len(order)} matching")
    assert page.is_checked("input[name=label][value='1']")
    assert page.input_value("#order") == "score"
    shown = page.eval_on_selector_all(".tile", "tiles => tiles.map(t => Number(t.dataset.index))")
    assert shown == order[5:10]
    page.goto(f"{server}sample/{order[0]}?label=1&order=score&desc=1")
    assert page.locator("#prev").count() == 0  # the first of the grid
    page.goto(f"{server}sample/{order[-1]}?label=1&order=score&desc=1")
    assert page.locator("#next").count() == 0  # and its last
    assert page.text_content("#position") == f"{len(order)} of {len(order)} in the grid"


def test_sample_page_groups_internal_columns_apart(page: Any, server: str) -> None:
    from shardex.browse.catalog import INTERNAL

    page.goto(f"{server}sample/12")
    page.wait_for_selector("#metadata")
    users = page.locator("#metadata th").all_text_contents()
    assert {"key", "label", "score", "width", "height", "caption", "embedding"} <= set(users)
    assert not set(users) & INTERNAL
    internal = page.locator("#internal th").all_text_contents()
    assert {"sample_offset", "sample_checksum", "metadata", "export_index"} <= set(internal)
    assert page.get_attribute("#internal", "open") is None  # collapsed
    assert not page.is_visible("#internal th >> text=sample_offset")
    page.click("#internal summary")
    assert page.is_visible("#internal th >> text=sample_offset")


def test_s3_export_costs_one_ranged_get_per_image(page: Any, s3: S3Location) -> None:
    shardex.export(
        ArraySource({"jpg": [image_bytes(i) for i in range(30)]}),
        s3.url,
        storage_options=s3.direct,
        samples_per_shard=10,
        workers=1,
    )
    app = create_app(s3.url, storage_options=s3.counted)
    ds = shardex.open_dataset(s3.url, storage_options=s3.direct)
    with serve(app) as url:
        s3.proxy.wait_idle()
        s3.proxy.reset()
        _grid(page, f"{url}?offset=4&limit=12")
        s3.proxy.wait_idle()
        gets = s3.proxy.requests
        want = set()
        for i in range(4, 16):
            offset, _checksum, _shard, length = ds.index.record(i)  # type: ignore[attr-defined]
            want.add(f"bytes={offset}-{offset + length - 1}")
        assert [r.method for r in gets] == ["GET"] * 13
        # the first read also fetches index-members.npy's first page (all of it), once
        assert {r.range for r in gets} == {*want, f"bytes=0-{PAGE - 1}"}
        s3.proxy.reset()
        page.reload()
        page.wait_for_function(_THUMBS_LOADED)
        for path in ("api/sample/9", "image/9", "sample/9"):  # thumbnail 9 was read, not this
            with urllib.request.urlopen(url + path) as response:
                assert response.status == 200
        s3.proxy.wait_idle()
        assert len(s3.proxy.requests) == 1  # thumbnails are cached; the sample read once
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url + "image/30")


def test_docs_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    shardex.export("demo:60", "demo-export", split_fractions={"train": 0.8, "val": 0.2}, workers=1)
    text = (Path(__file__).resolve().parents[2] / "docs" / "browse.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(code, "docs/browse.md", "exec"), {})
    meta = shardex.open_dataset("demo-export", split="train").metadata.to_pylist()
    want = sum(r["label"] in (0, 4) and r["aesthetic_score"] > 5 for r in meta)
    assert capsys.readouterr().out.startswith(f"{want} samples match; [")


def test_other_backends_are_browsed_through_their_reader(tmp_path: Path) -> None:
    shardex.export(_source(12), tmp_path / "np", backend="numpy", workers=1)
    ds = shardex.open_dataset(tmp_path / "np")
    with TestClient(create_app(tmp_path / "np"), base_url="http://127.0.0.1") as client:
        assert client.get("/api/page").json()["total"] == 12
        assert client.get("/thumb/3").headers["content-type"] == "image/jpeg"
        assert client.get("/image/3").content == ds[3]["jpg"]
        page = client.get("/sample/3")
        assert page.status_code == 200
        assert "numpy backend keeps no per-sample byte range" in page.text


def test_thumbnails_are_small_jpegs_and_refuse_what_is_not_an_image() -> None:
    import io

    from PIL import Image

    from shardex.browse.samples import BadImageError, make_thumbnail

    for fmt, size in (("jpg", (1200, 900)), ("png", (300, 40)), ("webp", (50, 70))):
        thumb = make_thumbnail(image_bytes(1, fmt, size), 160, "x")
        with Image.open(io.BytesIO(thumb)) as image:
            assert image.format == "JPEG"
            assert max(image.size) == min(160, max(size))
    with pytest.raises(BadImageError, match=r"sample 3 .* is not a decodable image"):
        make_thumbnail(b"\xff\xd8\xff not really a jpeg", 160, "sample 3 (jpg)")


def test_bound_to_an_ipv6_address_its_own_urls_are_served(export: Path) -> None:
    # a browser names an IPv6 server in brackets (http://[2001:db8::7]:8765/ is what
    # `shardex browse --host 2001:db8::7` prints)
    app = create_app(export, host="2001:db8::7")
    with TestClient(app, base_url="http://[2001:db8::7]:8765") as bound:
        assert bound.get("/api/info").status_code == 200
        assert bound.get("/", headers={"host": "[2001:db8::7]"}).status_code == 200
        assert bound.get("/", headers={"host": "attacker.example"}).status_code == 400
        assert bound.get("/", headers={"host": "[2001:db8::8]:8765"}).status_code == 400


def test_integers_beyond_int64_are_400_with_one_line(client: TestClient) -> None:
    # the metadata columns are 64-bit: a larger number in a URL is a bad query, not a crash
    big = "99999999999999999999"
    for path in (
        f"/api/page?label={big}",
        f"/api/page?label=-{big}",
        f"/api/plots?label={big}",
        f"/api/page?expr=score+>+{big}",
        f"/api/page?expr=width+*+{big}",
        f"/api/page?expr=width+in+(1,+{big})",
        f"/api/plots?expr=width+==+-{big}",
    ):
        response = client.get(path)
        assert response.status_code == 400, path
        error = response.json()["error"]
        assert "\n" not in error, path
        assert big in error, path


def test_every_column_the_grid_offers_shows_the_metadatas_value(tmp_path: Path) -> None:
    # `df.reset_index()` leaves a column named "index": the grid's rows also carry each
    # sample's number as "index" (and "label_name"); neither may show in that column's place
    n = 14
    source = _source(n)
    extra = pa.table({"index": pa.array(range(1000, 1000 + n)), "label_name": ["mine"] * n})
    meta = source.metadata
    assert meta is not None
    for name in extra.column_names:
        meta = meta.append_column(name, extra.column(name))
    source.metadata = meta
    shardex.export(source, tmp_path / "e", workers=1)
    with TestClient(create_app(tmp_path / "e"), base_url="http://127.0.0.1") as client:
        shown = client.get("/api/info").json()["shown"]
        rows = client.get("/api/page", params={"col": shown}).json()["rows"]
        for row in rows:
            metadata = client.get(f"/api/sample/{row['index']}").json()["metadata"]
            for name in shown:
                assert row[name] == metadata[name], (name, row)
        assert [row["index"] for row in rows] == list(range(n))
        assert client.get("/api/page", params={"min.index": 1003}).json()["total"] == n - 3


def test_division_by_zero_is_400_as_the_filter_stage_stops(client: TestClient) -> None:
    # the stage raises on a zero divisor; Arrow would give inf and keep every row
    for expr in ("width+/+0+>+1", "width+//+(height+-+height)+>+0", "score+%+0+<+1"):
        response = client.get(f"/api/page?expr={expr}")
        assert response.status_code == 400, expr
        error = response.json()["error"]
        assert "divides by zero" in error, expr
        assert "\n" not in error, expr
    assert client.get("/api/page?expr=width+/+2+>+0").status_code == 200


def test_a_large_png_gets_a_thumbnail_without_pillows_bomb_warning() -> None:
    # 95 Mpx: past Pillow's warning threshold (89 Mpx), under shardex's own cap, which is
    # what decides; the test suite turns warnings into errors, as a user's -W error would
    import io

    from PIL import Image

    from shardex.browse.samples import make_thumbnail

    buf = io.BytesIO()
    Image.new("1", (10_000, 9_500)).save(buf, "PNG")
    thumb = make_thumbnail(buf.getvalue(), 96, "a large png")
    with Image.open(io.BytesIO(thumb)) as image:
        assert image.size == (96, 91)


def test_the_demo_export_in_the_browser(page: Any, tmp_path: Path) -> None:
    # what a newcomer sees first: the built-in demo, exported and browsed with the CLI
    out = tmp_path / "demo-export"
    shardex.export("demo:120", out, workers=1)
    ds = shardex.open_dataset(out)
    labels = ds.metadata.column("label").to_pylist()
    with _browse_server(out) as url:
        _grid(page, f"{url}?limit=24")
        widths = page.eval_on_selector_all(".tile img", "els => els.map(e => e.naturalWidth)")
        assert len(widths) == 24
        assert all(w > 0 for w in widths)
        _screenshot(page, "demo-grid")
        page.check("input[name=label][value='2']")
        _wait_count(page, f"of {labels.count(2)} matching")
        page.goto(f"{url}sample/5")
        page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")
        assert "verified on read" in page.text_content("#checksum")
        cells = page.locator("#fields tbody tr").all_inner_texts()
        sample = ds[5]
        assert [c.split("\t")[:2] for c in cells] == [
            [k, str(len(v))] for k, v in sample.items() if k != "__key__"
        ]
