"""Named AWS profiles (``--s3-profile``) read from the shared files, without boto3.

Static keys are read here as the AWS CLI reads them; roles, SSO and
``credential_process`` need boto3.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any, Final

from shardex.errors import ConfigError, MissingDependencyError

#: A named profile is an explicit choice: its keys replace the environment's.
_CREDENTIALS: Final = {
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "aws_session_token": "session_token",
}
_SETTINGS: Final = {"region": "region", "endpoint_url": "endpoint_url"}
_NEEDS_BOTO3: Final = ("role_arn", "sso_session", "sso_start_url", "credential_process")


def _files() -> tuple[tuple[Path, str], tuple[Path, str]]:
    home = Path.home() / ".aws"
    credentials = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials"
    config = os.environ.get("AWS_CONFIG_FILE") or home / "config"
    return (Path(credentials).expanduser(), ""), (Path(config).expanduser(), "profile ")


def _section(path: Path, name: str) -> dict[str, str] | None:
    if not path.is_file():
        return None
    # raw: secrets may hold '%', which interpolation would reject
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as exc:
        # the parser's message quotes the bad line, which may be a secret: name only the file
        raise ConfigError(
            f"the AWS file {str(path)!r} is not an INI file ({type(exc).__name__}); fix it "
            "or point AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE elsewhere"
        ) from None
    return dict(parser[name]) if parser.has_section(name) else None


def profile_options(profile: str, options: dict[str, Any], *, now: bool = False) -> dict[str, Any]:
    """``options`` with the named profile's keys, and its region and endpoint where unset.

    ``now``: a boto3 profile keeps its name (each process makes its own provider). Raises
    ConfigError when neither file has the profile, MissingDependencyError when it needs
    boto3 and that is not installed.
    """
    found: dict[str, str] = {}
    looked: list[str] = []
    for path, prefix in _files():
        name = profile if profile == "default" else prefix + profile
        looked.append(str(path))
        for key, value in (_section(path, name) or {}).items():
            found.setdefault(key, value)
    if not found:
        raise ConfigError(
            f"no AWS profile {profile!r} in {' or '.join(map(repr, looked))}; add it "
            "(aws configure --profile NAME) or give keys through the environment"
        )
    out = dict(options)
    if "aws_access_key_id" in found:
        for key in _CREDENTIALS.values():
            out.pop(key, None)
        out.update({option: found[key] for key, option in _CREDENTIALS.items() if key in found})
    elif any(key in found for key in _NEEDS_BOTO3):
        if now:
            out["profile"] = profile
        else:
            out["_credential_provider"] = _boto3_provider(profile)
    for key, option in _SETTINGS.items():
        if key in found and out.get(option) is None:
            out[option] = found[key]
    return out


def _boto3_provider(profile: str) -> Any:
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        raise MissingDependencyError(
            f"the AWS profile {profile!r} gets its credentials from a role, SSO or a "
            "process, which needs boto3: pip install boto3 (or give the profile keys)"
        ) from exc
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))
