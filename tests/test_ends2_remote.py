"""Loose ends of issue 23 on remote datasets: index arrays are read only up to the size they can
have, and ``verify`` on a missing bucket says so in one line with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from readers.contract import spec
from readers.remote import RetryPolicy, open_store
from readers.remote.errors import RemoteTooLargeError

pytest_plugins = ["servers"]

MB = 1 << 20
QUICK = RetryPolicy(budget_s=1.0, read_timeout_s=2.0, base_delay_s=0.2, max_delay_s=0.5, connect_timeout_s=2.0)


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_remote_index_array_is_cut_at_its_expected_size(bad_http, packed_generated):
    """index.json served properly, every array an endless body: the first array read stops at the
    largest .npy header plus num_samples values (not the 2 GiB any read accepts)."""
    folder = Path(packed_generated["lmdb"])
    raw = (folder / spec.INDEX_NAME).read_bytes()
    n = spec.read_index(folder).num_samples
    with bad_http("endless", max_s=25, files={spec.INDEX_NAME: raw}) as srv:
        store = open_store(f"{srv.url}/ds", retry=QUICK)
        try:
            with pytest.raises(RemoteTooLargeError) as err:
                spec.read_index(store)
        finally:
            store.close()
        caps = {spec.array_bytes_limit(a, n) for a in spec.REQUIRED_ARRAYS["lmdb"]}
        assert any(f"than the {cap} bytes this read accepts" in str(err.value) for cap in caps), str(err.value)
        assert max(caps) < 1 * MB
        time.sleep(0.3)
        assert srv.bytes_sent < max(caps) + 64 * MB, srv.bytes_sent


@pytest.mark.slow
def test_verify_on_a_missing_bucket_says_it_once_and_exits_2(s3_server):
    url = "s3://no-such-bucket-ends2/x"
    env = {**os.environ, **s3_server.env()}
    runs = {cmd: subprocess.run([sys.executable, "-m", "packer.cli", cmd, url], env=env, capture_output=True,
                                text=True, timeout=120) for cmd in ("verify", "info")}
    for cmd, run in runs.items():
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2, (cmd, run.returncode, run.stderr)
        assert len(lines) == 1 and lines[0].startswith(f"pack-dataset {cmd}: error: "), (cmd, run.stderr)
        assert lines[0].count(url) == 1 and "no such bucket" in lines[0], lines[0]
        assert "Traceback" not in run.stderr
