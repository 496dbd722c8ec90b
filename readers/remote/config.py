"""Remote URLs, and the client settings they resolve to (``storage_options`` + AWS environment).

Nothing here imports a client library: this is plain parsing, so it is cheap
and its results can be shown in error messages.

Settings for ``s3://`` follow s3fs's ``storage_options`` (what webdataset and
Hugging Face users already pass): ``endpoint_url``, ``key``, ``secret``,
``token``, ``profile``, ``anon``, ``client_kwargs``, ``config_kwargs``; the
boto spellings ``aws_access_key_id``, ``aws_secret_access_key``,
``aws_session_token``, ``region_name`` and ``region`` are accepted too. What
is not given there comes from the standard AWS environment, exactly as boto3
and the AWS CLI read it: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``,
``AWS_REGION`` / ``AWS_DEFAULT_REGION``, and (left to botocore's own chain)
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_PROFILE`` with ``~/.aws/credentials`` and ``~/.aws/config``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from readers.contract.location import REMOTE_SCHEMES, is_url  # the one URL parser (readers.contract.location)

__all__ = ["RemoteURL", "is_url", "parse_url", "S3Settings", "s3_settings", "parse_size", "REMOTE_SCHEMES"]

_ALIASES = {
    "aws_access_key_id": "key",
    "access_key_id": "key",
    "aws_secret_access_key": "secret",
    "secret_access_key": "secret",
    "aws_session_token": "token",
    "session_token": "token",
}


@dataclass(frozen=True)
class RemoteURL:
    """A dataset location: ``s3://bucket/prefix`` or ``http(s)://host[:port]/prefix``."""

    scheme: str
    netloc: str  # bucket for s3, host[:port] for http(s)
    prefix: str  # no leading or trailing slash; may be empty

    @property
    def root(self) -> str:
        base = f"{self.scheme}://{self.netloc}"
        return f"{base}/{self.prefix}" if self.prefix else base

    def child(self, name: str) -> str:
        """URL of the object ``name`` (relative to the prefix)."""
        return f"{self.root}/{name.lstrip('/')}"

    def key(self, name: str) -> str:
        """Path of ``name`` inside the bucket (s3) or on the server (http), no leading slash."""
        name = name.lstrip("/")
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return self.root


def parse_url(url: str) -> RemoteURL:
    """Split a remote URL; a clear ``ValueError`` for anything else."""
    if not is_url(url):
        raise ValueError(f"{url!r}: not a remote URL (expected s3://bucket/prefix or http(s)://host/path)")
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"{url}: query strings and fragments are not supported in a dataset URL")
    if not parts.netloc:
        raise ValueError(f"{url}: no {'bucket' if parts.scheme == 's3' else 'host'} in the URL")
    return RemoteURL(parts.scheme.lower(), parts.netloc, parts.path.strip("/"))


# --------------------------------------------------------------------------- S3 settings
@dataclass(frozen=True)
class S3Settings:
    """Keyword arguments for ``s3fs.S3FileSystem`` plus a description for error messages."""

    kwargs: dict[str, Any]
    endpoint: str  # shown in messages: the endpoint URL or "AWS S3 (default endpoint)"
    credential_sources: str  # where credentials were looked for, one line


def _first(*values: Any) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def s3_settings(storage_options: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None,
                connect_timeout_s: float = 10.0, read_timeout_s: float = 30.0) -> S3Settings:
    """Resolve ``storage_options`` and the AWS environment into s3fs arguments."""
    env = os.environ if env is None else env
    opts = {_ALIASES.get(k, k): v for k, v in dict(storage_options or {}).items()}
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    config_kwargs = dict(opts.pop("config_kwargs", None) or {})

    endpoint = _first(opts.pop("endpoint_url", None), client_kwargs.pop("endpoint_url", None),
                      env.get("AWS_ENDPOINT_URL_S3"), env.get("AWS_ENDPOINT_URL"))
    region = _first(opts.pop("region", None), opts.pop("region_name", None), client_kwargs.pop("region_name", None),
                    env.get("AWS_REGION"), env.get("AWS_DEFAULT_REGION"))
    if region:
        client_kwargs["region_name"] = region
    # Our retry layer owns the retry budget; botocore retrying underneath would multiply it.
    config_kwargs = {"connect_timeout": connect_timeout_s, "read_timeout": read_timeout_s,
                     "retries": {"max_attempts": 1, "mode": "standard"}, **config_kwargs}
    kwargs: dict[str, Any] = {**opts, "endpoint_url": endpoint, "client_kwargs": client_kwargs,
                              "config_kwargs": config_kwargs}
    kwargs.setdefault("skip_instance_cache", True)
    kwargs.setdefault("use_listings_cache", False)
    return S3Settings(kwargs=kwargs, endpoint=endpoint or "AWS S3 (default endpoint)",
                      credential_sources=describe_credential_sources(opts, env))


def describe_credential_sources(opts: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Where botocore looks for credentials, in its order, with what was found at each place."""
    if opts.get("anon"):
        return "none (anon=True in storage_options: requests are unsigned)"
    given = "key and secret given" if opts.get("key") and opts.get("secret") else "no key/secret"
    env_set = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN") if env.get(k)]
    profile = opts.get("profile") or env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    cred_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials").expanduser()
    conf_file = Path(env.get("AWS_CONFIG_FILE") or "~/.aws/config").expanduser()

    def state(p: Path) -> str:
        return "present" if p.is_file() else "missing"

    return (f"storage_options ({given}); environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            f"({'set: ' + ', '.join(env_set) if env_set else 'not set'}); AWS profile {profile!r} in "
            f"{cred_file} ({state(cred_file)}) and {conf_file} ({state(conf_file)})")


# --------------------------------------------------------------------------- sizes
def parse_size(value: int | float | str) -> int:
    """Bytes from ``200GB``, ``200GiB``, ``1.5T``, ``4096`` or an int: binary units (:mod:`readers.contract.units`)."""
    from readers.contract.units import parse_size as parse

    return parse(value)
