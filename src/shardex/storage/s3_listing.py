"""An S3 listing that goes past keys obstore cannot read as paths.

obstore refuses a whole LIST page with one key holding a control character, so this
lists the prefix itself: ListObjectsV2 with ``encoding-type=url`` (keys arrive exactly),
SigV4-signed with static credentials, or unsigned (``skip_signature``).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any, Final

from shardex.storage.profiles import profile_options

_NS: Final = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()


def _option(options: dict[str, Any], *names: str) -> str | None:
    """The first of ``names`` that ``options`` sets (any case, ``aws_`` prefix or not)."""
    flat = {k.lower().removeprefix("aws_"): v for k, v in options.items() if v is not None}
    for name in names:
        if name in flat:
            return str(flat[name])
    return None


def _endpoint(bucket: str, options: dict[str, Any]) -> tuple[str, str]:
    """(scheme://host[:port], the path of the bucket on it)."""
    endpoint = _option(options, "endpoint_url", "endpoint")
    if endpoint:
        return endpoint.rstrip("/"), f"/{bucket}"
    region = _option(options, "region", "default_region") or "us-east-1"
    return f"https://{bucket}.s3.{region}.amazonaws.com", ""


def _signed(url: str, options: dict[str, Any], now: datetime.datetime) -> dict[str, str] | None:
    """The headers of a SigV4-signed GET of ``url`` (None: no static credentials)."""
    if str(_option(options, "skip_signature") or "").lower() in ("true", "1"):
        return {}
    key = _option(options, "access_key_id")
    secret = _option(options, "secret_access_key")
    if not key or not secret:
        return None
    token = _option(options, "session_token", "token")
    region = _option(options, "region", "default_region") or "us-east-1"
    parts = urllib.parse.urlsplit(url)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"host": parts.netloc, "x-amz-content-sha256": _EMPTY_SHA256, "x-amz-date": stamp}
    if token:
        headers["x-amz-security-token"] = token
    names = ";".join(sorted(headers))
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    signed = [f"{k}:{headers[k]}" for k in sorted(headers)]
    canonical = "\n".join(["GET", parts.path or "/", query, *signed, "", names, _EMPTY_SHA256])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signing = f"AWS4{secret}".encode()
    for part in (day, region, "s3", "aws4_request"):
        signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={names}, Signature={signature}"
    )
    return headers


def raw_pages(
    uri: str, options: dict[str, Any], folder: str, after: str | None
) -> Iterator[list[tuple[str, int]]] | None:
    """Pages of ``(name below the root, size)`` under ``folder`` after ``after``; None
    unless S3 with static credentials (or unsigned)."""
    scheme, _, rest = uri.partition("://")
    if scheme not in ("s3", "s3a"):
        return None
    if options.get("profile"):
        options = profile_options(str(options["profile"]), dict(options))
    bucket, _, root = rest.partition("/")
    root = f"{root.strip('/')}/" if root.strip("/") else ""
    base, bucket_path = _endpoint(bucket, options)
    now = datetime.datetime.now(datetime.UTC)
    if _signed(f"{base}{bucket_path}", options, now) is None:
        return None
    prefix = f"{root}{folder.strip('/')}/" if folder.strip("/") else root
    start = f"{root}{after}" if after else None
    return _pages(base, bucket_path, options, prefix, start, len(root))


def _pages(
    base: str, bucket_path: str, options: dict[str, Any], prefix: str, start: str | None, cut: int
) -> Iterator[list[tuple[str, int]]]:
    token: str | None = None
    while True:
        query = {"list-type": "2", "encoding-type": "url", "prefix": prefix}
        if token is not None:
            query["continuation-token"] = token
        elif start is not None:
            query["start-after"] = start
        encoded = urllib.parse.urlencode(sorted(query.items()), quote_via=urllib.parse.quote)
        url = f"{base}{bucket_path}?{encoded}"
        headers = _signed(url, options, datetime.datetime.now(datetime.UTC)) or {}
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as answer:
            root = ET.fromstring(answer.read())
        page = [
            (
                urllib.parse.unquote_plus(entry.findtext(f"{_NS}Key") or "")[cut:],
                int(entry.findtext(f"{_NS}Size") or 0),
            )
            for entry in root.iter(f"{_NS}Contents")
        ]
        if page:
            yield page
        token = root.findtext(f"{_NS}NextContinuationToken")
        if root.findtext(f"{_NS}IsTruncated") != "true" or not token:
            return
