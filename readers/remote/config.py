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

``gs://bucket/prefix`` follows gcsfs's options (``token``, ``project``,
``endpoint_url``); the environment gives ``STORAGE_EMULATOR_HOST`` (an
emulator's endpoint), ``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account
key file) and ``GOOGLE_CLOUD_PROJECT``; otherwise Google's default chain
(``gcloud auth application-default login``, the metadata server).
``az://container/prefix`` and ``abfs://container/prefix`` follow adlfs's
(``account_name``, ``account_key``, ``sas_token``, ``connection_string``,
``anon``); the environment gives ``AZURE_STORAGE_CONNECTION_STRING``,
``AZURE_STORAGE_ACCOUNT_NAME`` / ``AZURE_STORAGE_ACCOUNT_KEY`` /
``AZURE_STORAGE_SAS_TOKEN``, else Azure's default credential chain.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from readers.contract.location import REMOTE_SCHEMES, is_url  # the one URL parser (readers.contract.location)
from readers.remote.errors import RemoteAuthError

__all__ = ["RemoteURL", "is_url", "parse_url", "StoreSettings", "S3Settings", "store_settings",
           "s3_settings", "gcs_settings", "azure_settings", "OBJECT_STORES", "parse_size", "REMOTE_SCHEMES"]

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
    """A dataset location: ``s3://`` / ``gs://bucket/prefix``, ``az://`` / ``abfs://container/prefix``
    or ``http(s)://host[:port]/prefix``."""

    scheme: str
    netloc: str  # bucket (s3, gs), container (az, abfs), host[:port] for http(s)
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
        raise ValueError(f"{url!r}: not a remote URL (expected s3://, gs://, az://, abfs:// or http(s)://)")
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"{url}: query strings and fragments are not supported in a dataset URL")
    if not parts.netloc:
        what = "host" if parts.scheme.lower() in ("http", "https") else "bucket or container"
        raise ValueError(f"{url}: no {what} in the URL")
    return RemoteURL(parts.scheme.lower(), parts.netloc, parts.path.strip("/"))


# --------------------------------------------------------------------------- client settings
#: Schemes of object stores (buckets or containers, writable); the others (http, https) are read-only servers.
OBJECT_STORES = ("s3", "gs", "az", "abfs")


@dataclass(frozen=True)
class StoreSettings:
    """Keyword arguments for the fsspec filesystem of an object store, plus a description for error messages."""

    kwargs: dict[str, Any]
    endpoint: str  # shown in messages: the endpoint URL or "AWS S3 (default endpoint)"
    credential_sources: str  # where credentials were looked for, one line


S3Settings = StoreSettings  # the name s3_settings has returned since the first release


def store_settings(scheme: str, storage_options: Mapping[str, Any] | None = None,
                   env: Mapping[str, str] | None = None, connect_timeout_s: float = 10.0,
                   read_timeout_s: float = 30.0) -> StoreSettings:
    """The settings of an object store's client for ``scheme`` (one of :data:`OBJECT_STORES`)."""
    if scheme == "s3":
        return s3_settings(storage_options, env, connect_timeout_s, read_timeout_s)
    if scheme == "gs":
        return gcs_settings(storage_options, env, read_timeout_s)
    if scheme in ("az", "abfs"):
        return azure_settings(storage_options, env, connect_timeout_s, read_timeout_s)
    raise ValueError(f"{scheme}:// is not an object store (served: {', '.join(OBJECT_STORES)})")


def _first(*values: Any) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def s3_settings(storage_options: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None,
                connect_timeout_s: float = 10.0, read_timeout_s: float = 30.0) -> StoreSettings:
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


def gcs_settings(storage_options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                 read_timeout_s: float = 30.0) -> StoreSettings:
    """Resolve ``storage_options`` and the Google environment into ``gcsfs.GCSFileSystem`` arguments."""
    env = os.environ if env is None else env
    opts = dict(storage_options or {})
    emulator = env.get("STORAGE_EMULATOR_HOST")
    endpoint = _first(opts.pop("endpoint_url", None), emulator)
    key_file = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    token = opts.get("token")
    if token is None:  # an emulator takes no credentials (as google-cloud-storage does with STORAGE_EMULATOR_HOST)
        token = "anon" if emulator and endpoint == emulator else key_file or "google_default"
    project = _first(opts.pop("project", None), env.get("GOOGLE_CLOUD_PROJECT"), env.get("GCLOUD_PROJECT"))
    kwargs: dict[str, Any] = {**opts, "token": token, "endpoint_url": endpoint, "project": project or None,
                              "requests_timeout": read_timeout_s, "skip_instance_cache": True}
    if token == "anon":
        sources = ("none (token='anon' in storage_options: requests are unsigned)" if "token" in opts else
                   f"none (STORAGE_EMULATOR_HOST={emulator}: an emulator, requests are unsigned)")
    else:
        adc = Path(env.get("CLOUDSDK_CONFIG") or "~/.config/gcloud").expanduser() / \
            "application_default_credentials.json"
        given = f"token {token!r} given" if "token" in opts else "no token given"
        sources = (f"storage_options ({given}); GOOGLE_APPLICATION_CREDENTIALS "
                   f"({key_file if key_file else 'not set'}); application default credentials {adc} "
                   f"({'present' if adc.is_file() else 'missing'}); the GCE metadata server")
    return StoreSettings(kwargs=kwargs, endpoint=endpoint or "Google Cloud Storage (default endpoint)",
                         credential_sources=sources)


_AZURE_ENV = {"connection_string": "AZURE_STORAGE_CONNECTION_STRING", "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
              "account_key": "AZURE_STORAGE_ACCOUNT_KEY", "sas_token": "AZURE_STORAGE_SAS_TOKEN"}


def azure_settings(storage_options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                   connect_timeout_s: float = 10.0, read_timeout_s: float = 30.0) -> StoreSettings:
    """Resolve ``storage_options`` and the Azure environment into ``adlfs.AzureBlobFileSystem`` arguments."""
    env = os.environ if env is None else env
    opts = dict(storage_options or {})
    found = []
    for option, variable in _AZURE_ENV.items():
        if opts.get(option) in (None, "") and env.get(variable):
            opts[option] = env[variable]
            found.append(variable)
    conn = str(opts.get("connection_string") or "")
    parts = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
    account = opts.get("account_name") or parts.get("AccountName")
    endpoint = parts.get("BlobEndpoint") or (f"https://{account}.blob.core.windows.net" if account else None)
    if not (account or conn):
        raise RemoteAuthError("az:// needs a storage account: set AZURE_STORAGE_ACCOUNT_NAME (with a key, a SAS token or "
                         "an Azure login) or AZURE_STORAGE_CONNECTION_STRING, or pass account_name / "
                         "connection_string in storage_options")
    kwargs: dict[str, Any] = {**opts, "skip_instance_cache": True, "connection_timeout": connect_timeout_s,
                              "read_timeout": read_timeout_s, "retry_total": 0}
    if opts.get("anon"):
        sources = "none (anon=True in storage_options: requests are unsigned)"
    else:
        given = [k for k in ("connection_string", "account_key", "sas_token", "credential") if opts.get(k)]
        env_part = f"set: {', '.join(found)}" if found else f"none of {', '.join(_AZURE_ENV.values())}"
        sources = (f"storage_options and environment ({', '.join(given) if given else 'no key or SAS token'}; "
                   f"environment variables {env_part}); then Azure's default credential chain (az login, "
                   "managed identity)")
    return StoreSettings(kwargs=kwargs, endpoint=endpoint or "Azure Blob Storage", credential_sources=sources)


# --------------------------------------------------------------------------- sizes
def parse_size(value: int | float | str) -> int:
    """Bytes from ``200GB``, ``200GiB``, ``1.5T``, ``4096`` or an int: binary units (:mod:`readers.contract.units`)."""
    from readers.contract.units import parse_size as parse

    return parse(value)
