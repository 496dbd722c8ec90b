"""The file-descriptor police in conftest.py: what it reports, and what it does not."""

from __future__ import annotations

import mmap

from conftest import _leaked_fds, _open_fds


def test_a_file_left_open_is_reported_by_path(tmp_path):
    path = tmp_path / "left-open.bin"
    path.write_bytes(b"x" * 10)
    before = set(_open_fds().items())
    with open(path, "rb") as f:
        assert _leaked_fds(before, grace_s=0) == [(f.fileno(), str(path))]
    assert _leaked_fds(before, grace_s=0) == []


def test_garbage_holding_a_descriptor_is_collected_first(tmp_path):
    path = tmp_path / "mapped.bin"
    path.write_bytes(b"x" * mmap.PAGESIZE)
    before = set(_open_fds().items())

    class Cycle:  # only the garbage collector frees a reference cycle
        pass

    c = Cycle()
    c.me = c
    with open(path, "r+b") as f:
        c.mapping = mmap.mmap(f.fileno(), 0)  # the mapping keeps its own duplicate descriptor
    assert [t for _fd, t in _leaked_fds(before, grace_s=0)] == [str(path)]
    del c
    assert _leaked_fds(before, grace_s=1) == []


def test_a_socket_left_open_names_its_endpoints():
    """A leaked TCP socket is reported with both ends, so the message names the server it talks to."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        before = set(_open_fds().items())
        with socket.create_connection(("127.0.0.1", port)) as conn:
            [(fd, target)] = _leaked_fds(before, grace_s=0, socket_grace_s=0)
            assert fd == conn.fileno()
            assert target.startswith("socket:[") and target.endswith(f"-> 127.0.0.1:{port})"), target
        assert _leaked_fds(before, grace_s=0, socket_grace_s=0) == []
