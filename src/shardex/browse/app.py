"""The browser's web app (Starlette): pages, a JSON API, thumbnails and images.

Read-only by construction (GET only, samples by number or key); autoescaping, a strict CSP
and a Host check (DNS rebinding) keep markup in metadata inert.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final
from urllib.parse import urlencode

import numpy as np
from jinja2 import Environment, PackageLoader
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardex.api import open_dataset
from shardex.browse.catalog import INTERNAL, Catalog
from shardex.browse.query import Query, integer_param, page_bounds, parse_query
from shardex.browse.samples import THUMB_SIZES, SampleReader
from shardex.browse.similar import Neighbours
from shardex.browse.table import SplitTable
from shardex.dataset import Dataset
from shardex.errors import ConfigError, SampleNotFoundError, ShardexError
from shardex.quoting import one_line
from shardex.storage.base import Storage

log = logging.getLogger(__name__)

#: The most label values the filter lists when config.yaml does not name the labels.
MAX_LABELS: Final = 1000
DEFAULT_PAGE: Final = 48
SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True, slots=True)
class Browser:
    """One split of an export, as the app serves it."""

    dataset: Dataset
    catalog: Catalog
    reader: SampleReader
    neighbours: dict[str, Neighbours]
    location: str

    @classmethod
    def of(cls, dataset: Dataset, location: str, storage: Storage) -> Browser:
        metadata = SplitTable(storage, dataset.config, dataset.split)
        catalog = Catalog(metadata, dataset.config, dataset.split)
        neighbours = {
            name: Neighbours(functools.partial(metadata.column, name), name)
            for name in catalog.columns.embeddings
        }
        catalog.select(Query())  # the first page's selection, made before anyone asks
        browser = cls(dataset, catalog, SampleReader(dataset), neighbours, location)
        if neighbours:  # embeddings are large: read them while the first pages are served
            threading.Thread(target=browser.warm, name="shardex-browse-warm", daemon=True).start()
        return browser

    def warm(self) -> None:
        """Read the embedding columns now, so the first similar-images query is quick."""
        try:
            for neighbours in self.neighbours.values():
                neighbours.prepare()
        except ShardexError as exc:  # the first query will report it
            log.warning("cannot read the embeddings of %s: %s", self.location, exc)


class Splits:
    """Every split of an export, each opened when first asked for (``default`` at once)."""

    def __init__(self, storage: Storage, names: Sequence[str], default: str) -> None:
        self.storage, self.names, self.default = storage, tuple(names), default
        self._opened: dict[str, Browser] = {}
        self._locks = {name: threading.Lock() for name in self.names}  # one split at a time
        self.get(default)

    @property
    def location(self) -> str:
        return self.storage.uri

    def get(self, name: str | None = None) -> Browser:
        """The split ``name`` (default: :attr:`default`). Raises ConfigError (a 400)."""
        name = name or self.default
        if name not in self._locks:
            raise ConfigError(
                f"{name[:80]!r} is not a split of this export (its splits: {', '.join(self.names)})"
            )
        with self._locks[name]:
            if name not in self._opened:
                dataset = open_dataset(self.storage, split=name)
                self._opened[name] = Browser.of(dataset, self.location, self.storage)
            return self._opened[name]


def create_app(splits: Splits, *, host: str = "127.0.0.1") -> Starlette:
    """The ASGI app serving ``splits``; requests must name ``host`` (or loopback) as Host."""
    templates = Jinja2Templates(
        env=Environment(loader=PackageLoader("shardex.browse", "templates"), autoescape=True)
    )
    for name in ("grid.html", "plots.html", "sample.html"):
        templates.env.get_template(name)  # compiled now, not on the first visit
    pages = _Pages(splits, templates)
    routes = [
        Route("/", pages.grid),
        Route("/plots", pages.plots),
        Route("/sample/{index:int}", pages.sample),
        Route("/find", pages.find),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/api/info", pages.info),
        Route("/api/page", pages.page),
        Route("/api/plots", pages.plot_data),
        Route("/api/sample/{index:int}", pages.sample_data),
        Route("/api/similar/{index:int}", pages.similar),
        Route("/thumb/{index:int}", pages.thumb),
        Route("/image/{index:int}", pages.image),
        Mount("/static", StaticFiles(packages=[("shardex.browse", "static")]), name="static"),
    ]
    # a Host header names an IPv6 address in brackets ("[2001:db8::7]:8765")
    named = f"[{host}]" if ":" in host and not host.startswith("[") else host
    allowed = ["*"] if host in ("0.0.0.0", "::", "") else [named, *LOOPBACK_NAMES]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=allowed),
        ],
        exception_handlers={ShardexError: _error, IndexError: _error},
    )


class _SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _error(request: Request, exc: Exception) -> Response:
    """Errors as JSON: 400 bad parameters, 404 no such sample, 500 an unreadable sample."""
    if isinstance(exc, ConfigError):
        status = 400
    elif isinstance(exc, SampleNotFoundError | IndexError):
        status = 404
    else:
        status = 500
        log.warning("%s: %s", request.url.path, exc)
    return JSONResponse({"error": one_line(str(exc))}, status_code=status)


class _Pages:
    """The route handlers; every route takes ``split=NAME``."""

    def __init__(self, splits: Splits, templates: Jinja2Templates) -> None:
        self.splits, self.templates = splits, templates

    def _split(self, request: Request) -> Browser:
        return self.splits.get(request.query_params.get("split"))

    def _sample(self, request: Request) -> tuple[Browser, int]:
        browser = self._split(request)
        index, rows = int(request.path_params["index"]), browser.catalog.num_rows
        if not 0 <= index < rows:
            raise HTTPException(404, f"no sample {index} (the split has {rows})")
        return browser, index

    def _page(
        self, request: Request, browser: Browser, name: str, status: int = 200, **context: Any
    ) -> Response:
        base = {
            "location": browser.location,
            "split": browser.catalog.split,
            "num_samples": browser.catalog.num_rows,
            "info": self._info(browser),  # in the page: one round trip less before the grid
        }
        return self.templates.TemplateResponse(
            request, name, {**base, **context}, status_code=status
        )

    def grid(self, request: Request) -> Response:
        return self._page(request, self._split(request), "grid.html")

    def plots(self, request: Request) -> Response:
        return self._page(request, self._split(request), "plots.html")

    def sample(self, request: Request) -> Response:
        browser, index = self._sample(request)
        catalog = browser.catalog
        detail, error = None, None
        try:
            detail = browser.reader.detail(index)
        except ShardexError as exc:
            error = one_line(str(exc))
        metadata = {name: _shown(v) for name, v in catalog.row(index).items()}
        key = str(metadata.get("key", detail.key if detail else ""))
        return self._page(
            request,
            browser,
            "sample.html",
            index=index,
            key=key,
            detail=detail,
            error=error,
            metadata={k: v for k, v in metadata.items() if k not in INTERNAL},
            internal={k: v for k, v in metadata.items() if k in INTERNAL},
            label_name=catalog.label_name(metadata.get(catalog.columns.label or "")),
            snippet=_snippet(browser.location, catalog.split, key),
            similar=bool(browser.neighbours),
            around=self._around(request, catalog, index),
            status=500 if error else 200,
        )

    def _around(self, request: Request, catalog: Catalog, index: int) -> dict[str, Any]:
        """Previous, next and back links within the grid (whose query the URL carries)."""
        params = _params(request)
        params.pop("offset", None)
        back = {"back": _url("/", params)}
        try:
            selection = catalog.select(parse_query(params, *_kinds(catalog)))
            _, limit = page_bounds(params, DEFAULT_PAGE)
        except ConfigError:
            return back  # a hand-made URL: the sample is shown, without a grid around it
        found = np.flatnonzero(selection.indices == index)
        if not found.size:
            return back
        at, total = int(found[0]), int(selection.indices.size)
        samples = selection.indices
        return {
            "back": _url("/", {**params, "offset": [str(at // limit * limit)]}),
            "prev": _url(f"/sample/{samples[at - 1]}", params) if at > 0 else None,
            "next": _url(f"/sample/{samples[at + 1]}", params) if at + 1 < total else None,
            "position": at + 1,
            "total": total,
        }

    def find(self, request: Request) -> Response:
        browser = self._split(request)
        key = request.query_params.get("key", "")
        try:
            index = browser.catalog.find(key)
        except SampleNotFoundError as exc:  # the grid, saying so, the key kept in the box
            message = one_line(str(exc))
            return self._page(request, browser, "grid.html", 404, message=message, find_key=key)
        split = {"split": [browser.catalog.split]} if "split" in request.query_params else {}
        return RedirectResponse(_url(f"/sample/{index}", split), status_code=303)

    def info(self, request: Request) -> Response:
        return JSONResponse(self._info(self._split(request)))

    def _info(self, browser: Browser) -> dict[str, Any]:
        catalog = browser.catalog
        columns = catalog.columns
        return {
            "location": browser.location,
            "split": catalog.split,
            "splits": list(self.splits.names),
            "backend": catalog.config.backend,
            "num_samples": catalog.num_rows,
            "label": columns.label,
            "label_names": list(columns.label_names),
            # the labels found, for the filter where config.yaml names none
            "label_values": sorted(catalog.select(Query()).label_counts)[:MAX_LABELS],
            "numeric": list(columns.numeric),
            "orderable": list(columns.orderable),
            "text": list(columns.text),
            "shown": list(columns.shown),
            "embeddings": list(columns.embeddings),
            "thumb_sizes": list(THUMB_SIZES),
            "page_size": DEFAULT_PAGE,
        }

    def page(self, request: Request) -> Response:
        catalog = self._split(request).catalog
        params = _params(request)
        query = parse_query(params, *_kinds(catalog))
        offset, limit = page_bounds(params, DEFAULT_PAGE)
        shown = tuple(c for c in params.get("col", ()) if c in catalog.columns.shown)
        selection = catalog.select(query)
        indices = selection.indices[offset : offset + limit]
        return JSONResponse(
            {
                "total": int(selection.indices.size),
                "offset": offset,
                "limit": limit,
                "label_counts": {str(k): v for k, v in selection.label_counts.items()},
                "rows": catalog.rows(indices, shown),
            }
        )

    def plot_data(self, request: Request) -> Response:
        catalog = self._split(request).catalog
        query = parse_query(_params(request), *_kinds(catalog))
        return JSONResponse(catalog.plots(catalog.select(query)))

    def sample_data(self, request: Request) -> Response:
        browser, index = self._sample(request)
        detail = asdict(browser.reader.detail(index))
        return JSONResponse({"index": index, **detail, "metadata": browser.catalog.row(index)})

    def similar(self, request: Request) -> Response:
        browser, index = self._sample(request)
        name = request.query_params.get("column") or next(iter(browser.neighbours), "")
        if name not in browser.neighbours:
            raise ConfigError(
                f"{name[:80]!r} is not an embedding column of this export "
                f"(known: {', '.join(browser.neighbours) or 'none'})"
            )
        k = integer_param("k", request.query_params.get("k", "12"))
        found = browser.neighbours[name].nearest(index, k)
        rows = browser.catalog.rows(np.asarray([i for i, _ in found], dtype=np.int64), ())
        for row, (_, score) in zip(rows, found, strict=True):
            row["score"] = round(score, 4)
        return JSONResponse({"column": name, "rows": rows})

    def thumb(self, request: Request) -> Response:
        browser, index = self._sample(request)
        size = integer_param("size", request.query_params.get("size", "160"))
        if size not in THUMB_SIZES:
            raise ConfigError(f"thumbnail size {size} is not one of {THUMB_SIZES}")
        data = browser.reader.thumbnail(index, size)
        return Response(data, media_type="image/jpeg", headers={"cache-control": "max-age=3600"})

    def image(self, request: Request) -> Response:
        browser, index = self._sample(request)
        data, media_type = browser.reader.image(index)
        headers = {"cache-control": "max-age=3600"}
        if not media_type.startswith("image/"):
            headers["content-disposition"] = "attachment"
        return Response(data, media_type=media_type, headers=headers)


def _kinds(catalog: Catalog) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    columns = catalog.columns
    return columns.numeric, columns.text, columns.orderable


def _url(path: str, params: dict[str, list[str]]) -> str:
    """A link of this server: ``path`` and its query (an empty offset left out)."""
    query = urlencode([(k, v) for k, vs in params.items() for v in vs if (k, v) != ("offset", "0")])
    return f"{path}?{query}" if query else path


def _params(request: Request) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        params.setdefault(name, []).append(value)
    return params


def _shown(value: Any) -> Any:
    """A metadata value for the sample page: long lists (embeddings) cut to their start."""
    if isinstance(value, list) and len(value) > 8:
        return f"[{', '.join(map(str, value[:8]))}, … ({len(value)} values)]"
    return value


def _snippet(location: str, split: str, key: str) -> str:
    return (
        "import shardex\n\n"
        f"ds = shardex.open_dataset({location!r}, split={split!r})\n"
        f"sample = ds.get({key!r})"
    )
