"""The wds writer builds its ustar headers itself (fast); they are the bytes Python's tarfile writes."""

from __future__ import annotations

import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.formats.wds import tar_header, tarfile_header

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
                 min_size=1, max_size=100)


@settings(max_examples=500, deadline=None)
@given(name=_names, size=st.integers(0, 8**11 - 1))
def test_header_is_tarfiles(name, size):
    assert tar_header(name, size) == tarfile_header(name, size)


def test_edges_and_the_fallback():
    for name, size in (("0000000042.jpg", 0), ("0000000042.cls", 1), ("a" * 100, 8**11 - 1)):
        assert tar_header(name, size) == tarfile_header(name, size)
    for name, size in (("x.jpg", 8**11), ("b" * 101, 5)):  # past ustar's fields: tarfile's own error
        with pytest.raises(ValueError):
            tarfile_header(name, size)
        with pytest.raises(ValueError):
            tar_header(name, size)
    assert tarfile.TarInfo.frombuf(tar_header("y.png", 7), "utf-8", "strict").size == 7
