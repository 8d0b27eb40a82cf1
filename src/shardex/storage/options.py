"""Object-store options: the names users may give, their checks, and the environment.

Options are checked and merged with the standard ``AWS_*`` environment variables once,
where a storage is made, so that a storage carries them to worker processes (whose
environment may be older) and obstore never sees a name it would panic on.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from shardex.errors import ConfigError

if TYPE_CHECKING:
    from shardex.storage.batch import BatchPolicy

SCHEMES: Final = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "http://", "https://")
#: Every URL scheme a storage opens: the object stores' and ``memory://`` (tests).
URL_SCHEMES: Final = (*SCHEMES, "memory://")


def refuse_credentials_in_url(url: str) -> None:
    """Refuse an object-store URL that holds credentials (``scheme://user:secret@...``):
    a URL is shown in messages and progress and recorded in config.yaml, credentials
    never are. The message leaves them out.

    Raises:
        ConfigError: the URL names a user (and perhaps a password) before its host.
    """
    scheme, _, rest = url.partition("://")
    authority = rest.partition("/")[0]
    if "@" in authority:
        host = authority.rpartition("@")[2]
        raise ConfigError(
            f"the URL {scheme}://***@{host}/... holds credentials before its host; give them "
            "as storage options (access_key_id and secret_access_key, --s3-profile) or "
            "through the AWS_* variables, never in the URL (it is shown and recorded)"
        )


#: How long a request is retried (connection refused or dropped, timeouts, 5xx, throttling)
#: before it fails; storage option ``retry_timeout``. 403 and 404 are never retried.
DEFAULT_RETRY_TIMEOUT: Final = timedelta(minutes=2)
#: Retries back off from 100 ms, doubling up to 4 s (with jitter): a server back after a
#: restart is seen within about 4 s.
_BACKOFF: Final = {
    "init_backoff": timedelta(milliseconds=100),
    "max_backoff": timedelta(seconds=4),
    "base": 2.0,
}


def retry_config(budget: timedelta) -> dict[str, Any]:
    """obstore's retry settings for a time budget: every request made through the store
    (multipart parts included) is retried until ``budget`` has passed since its first try;
    the count is only a backstop, set so that the budget is what ends the retries (the
    backoff is jittered down to ~0 and a refused connection fails at once, so a count of
    one per 10 ms of budget is never reached first)."""
    return {
        "max_retries": max(10, int(budget.total_seconds() * 100)),
        "retry_timeout": budget,
        "backoff": _BACKOFF,
    }


#: Options users may pass (CLI flags --s3-endpoint-url, --s3-region, --s3-profile).
_OPTION_NAMES: Final = {"endpoint_url": "endpoint", "region": "region"}
#: shardex's own options; ``retry_timeout`` is the retry budget of every request,
#: ``coalesce_gap`` the most bytes between two ranges that one batched read fetches in one
#: request (see :func:`byte_size`), ``read_concurrency`` the ranged GETs of a batch in
#: flight at once and ``hedge`` whether slow ones get a second request (:mod:`.batch`).
_BATCH_OPTIONS: Final = frozenset({"coalesce_gap", "read_concurrency", "hedge"})
_SHARDEX_OPTIONS: Final = (
    frozenset({"endpoint_url", "region", "profile", "retry_timeout"}) | _BATCH_OPTIONS
)
#: The default ``coalesce_gap`` of object storage: 0 still merges the reads of adjacent
#: samples (a batch in shard order is one GET per run), and a uniformly random batch
#: fetches no byte it did not ask for (64 KiB cost 3-5% more bytes for ~1% fewer GETs).
DEFAULT_COALESCE_GAP: Final = 0
#: Options that configure shardex, never passed on to obstore.
OWN_OPTIONS: Final = frozenset({"profile", "retry_timeout"}) | _BATCH_OPTIONS
_SIZE: Final = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_UNITS: Final = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_UNITS.update({"KB": 1000, "MB": 1000**2, "GB": 1000**3})


def byte_size(value: Any, name: str) -> int:
    """A size option: bytes as a whole number, or "64KiB", "1MiB", "500KB"."""
    match = None if isinstance(value, bool) else _SIZE.match(str(value))
    if match is None:
        raise ConfigError(
            f"storage option {name!r} must be a size in bytes such as 0, 65536, '64KiB' or "
            f"'1MiB', not {value!r}"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


#: Options of the HTTP client rather than the store (obstore 0.12's ClientConfig):
#: durations such as "500ms", "60s", flags as bools.
CLIENT_OPTIONS: Final = frozenset(
    {
        "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
        "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout",
        "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
        "randomize_addresses", "read_timeout", "timeout", "user_agent",
    }
)  # fmt: skip
#: Store options by scheme (obstore 0.12's S3Config, GCSConfig, AzureConfig), and the
#: prefix obstore also accepts on them (``aws_region``, ``AWS_REGION``).
_STORE_OPTIONS: Final = {
    "s3": ("aws_", frozenset({
        "access_key_id", "bucket", "checksum_algorithm", "conditional_put",
        "container_credentials_relative_uri", "container_credentials_full_uri",
        "container_authorization_token_file", "copy_if_not_exists", "default_region",
        "disable_tagging", "disable_bulk_delete", "endpoint", "metadata_endpoint", "region",
        "request_payer", "role_arn", "role_session_name", "secret_access_key",
        "server_side_encryption", "session_token", "skip_signature", "sse_bucket_key_enabled",
        "sse_kms_key_id", "sts_endpoint", "unsigned_payload", "virtual_hosted_style_request",
        "web_identity_token_file",
    })),
    "gs": ("google_", frozenset({
        "service_account", "service_account_key", "base_url", "bucket",
        "application_credentials", "skip_signature",
    })),
    "az": ("azure_", frozenset({
        "account_name", "account_key", "client_id", "client_secret", "tenant_id",
        "authority_host", "sas_key", "token", "use_emulator", "use_fabric_endpoint",
        "endpoint", "msi_endpoint", "object_id", "msi_resource_id", "federated_token_file",
        "use_azure_cli", "skip_signature", "container_name", "disable_tagging",
        "fabric_token_service_url", "fabric_workload_host", "fabric_session_token",
        "fabric_cluster_identifier",
    })),
    "http": ("", frozenset()),
}  # fmt: skip
#: Options that are durations, given as seconds or "500ms", "30s", "2m", "1h" (obstore
#: alone would refuse a bare number of seconds for the client's).
DURATION_OPTIONS: Final = frozenset({"retry_timeout", "timeout", "connect_timeout"})
_SCHEME_KIND: Final = {
    "s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "abfs": "az", "abfss": "az",
    "http": "http", "https": "http",
}  # fmt: skip
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|min|h)?\s*$")


def duration(value: Any, name: str) -> timedelta:
    """A duration option: seconds as a number, or "500ms", "30s", "2m", "1h"."""
    if isinstance(value, timedelta):
        return value
    match = None if isinstance(value, bool) else _DURATION.match(str(value))
    if match is None:
        raise ConfigError(
            f"storage option {name!r} must be a duration such as 30 (seconds), '500ms', "
            f"'30s' or '2m', not {value!r}"
        )
    scale = {"ms": 0.001, None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}[match.group(2)]
    return timedelta(seconds=float(match.group(1)) * scale)


def client_value(name: str, value: Any) -> str | bool:
    """An HTTP client option as obstore takes it: durations in milliseconds."""
    if isinstance(value, bool):
        return value
    if name in DURATION_OPTIONS:
        return f"{round(duration(value, name).total_seconds() * 1000)}ms"
    return str(value)


def setting(uri: str, name: str) -> str:
    """The setting an option name stands for: ``AWS_REGION``, ``aws_region`` and
    ``region`` are one; ``endpoint_url`` is ``endpoint``."""
    prefix = _STORE_OPTIONS[_SCHEME_KIND[uri.split("://", 1)[0].lower()]][0]
    bare = name.lower()
    bare = bare[len(prefix) :] if prefix and bare.startswith(prefix) else bare
    return _OPTION_NAMES.get(bare, bare)


def merge_options(uri: str, given: dict[str, Any], environment: dict[str, str]) -> dict[str, Any]:
    """The options of a store: the given ones, checked, over those of the environment
    (an environment variable gives way to the same setting given under any name)."""
    check_options(uri, given)
    taken = {setting(uri, name) for name, value in given.items() if value is not None}
    kept = {k: v for k, v in environment.items() if setting(uri, k) not in taken}
    # shardex's own and the HTTP client's options are looked up by their bare names
    # (RETRY_TIMEOUT, aws_coalesce_gap and coalesce_gap are one setting, as for obstore's)
    merged = {_bare(uri, k): v for k, v in {**kept, **given}.items()}
    keys = any(setting(uri, k) == "access_key_id" and v is not None for k, v in merged.items())
    if "profile" in kept and keys:
        # as for the AWS CLI, keys (given, or AWS_ACCESS_KEY_ID) beat AWS_PROFILE: the
        # profile would replace them (see shardex.storage.profiles)
        del merged["profile"]
    return merged


def _bare(uri: str, name: str) -> str:
    """``name``, or the bare setting it stands for where shardex reads it by that name."""
    bare = setting(uri, name)
    return bare if bare in OWN_OPTIONS or bare in CLIENT_OPTIONS else name


def check_options(uri: str, options: dict[str, Any]) -> None:
    """Refuse option names obstore does not know (it panics on some), values that are
    not text, numbers or flags, and one setting given twice; name the nearest option."""
    store = _STORE_OPTIONS[_SCHEME_KIND[uri.split("://", 1)[0].lower()]][1]
    known = _SHARDEX_OPTIONS | CLIENT_OPTIONS | store | set(_OPTION_NAMES.values())
    seen: dict[str, str] = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise ConfigError(f"storage option names must be text, not {name!r}")
        bare = setting(uri, name)
        if bare not in known:
            import difflib  # here: only a misspelt option needs it

            near = difflib.get_close_matches(bare, sorted(known), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(
                f"unknown storage option {name!r} for {uri}; {hint}known options: "
                f"{', '.join(sorted(known))}"
            )
        if value is None:  # unset: the default
            continue
        if bare in seen:
            raise ConfigError(
                f"storage options {seen[bare]!r} and {name!r} name the same setting; "
                "give one of them"
            )
        seen[bare] = name
        allowed = (
            (str, bool, int, float, timedelta)
            if bare in DURATION_OPTIONS
            else (str, bool, int, float)
        )
        if not isinstance(value, allowed):
            raise ConfigError(
                f"storage option {name!r} must be text, a number or a bool, not "
                f"{type(value).__name__}"
            )
        if bare in DURATION_OPTIONS:
            duration(value, name)
        if bare == "coalesce_gap":
            byte_size(value, name)
        if bare in ("read_concurrency", "hedge"):
            batch_policy({bare: value})


def batch_policy(options: dict[str, Any]) -> BatchPolicy:
    """The :class:`~shardex.storage.batch.BatchPolicy` of a store's options."""
    from shardex.storage.batch import DEFAULT_CONCURRENCY, BatchPolicy

    concurrency, hedge = options.get("read_concurrency"), options.get("hedge")
    if concurrency is None:
        concurrency = DEFAULT_CONCURRENCY
    elif isinstance(concurrency, bool) or not str(concurrency).strip().isdigit():
        raise ConfigError(
            f"storage option 'read_concurrency' must be a whole number of requests such as "
            f"64, not {concurrency!r}"
        )
    flag = True if hedge is None else _FLAGS.get(str(hedge).strip().lower())
    if flag is None:
        raise ConfigError(f"storage option 'hedge' must be true or false, not {hedge!r}")
    return BatchPolicy(concurrency=max(1, int(concurrency)), hedge=flag)


_FLAGS: Final = {"true": True, "1": True, "yes": True, "on": True}
_FLAGS.update({"false": False, "0": False, "no": False, "off": False})


_ENVIRONMENT: Final = {
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_REGION": "region",
    "AWS_DEFAULT_REGION": "region",
    "AWS_ENDPOINT_URL": "endpoint_url",
    "AWS_PROFILE": "profile",
}


def from_environment() -> dict[str, str]:
    found: dict[str, str] = {}
    for variable, option in _ENVIRONMENT.items():
        value = os.environ.get(variable)
        if value and option not in found:
            found[option] = value
    return found
