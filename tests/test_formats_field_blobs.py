"""A format writer's ``append`` takes one field blob per extra field of its schema (issue 32 item 4:
the types showed ``fields=None`` reaching ``FieldStore.append``): a wrong count is a ValueError
before anything is written, never a CRC row too long for ``field_checksums.npy``."""

from __future__ import annotations

import numpy as np
import pytest

from packer import WRITERS, PackOptions
from packer.prepare.images import Prepared
from readers.contract import spec
from readers.contract.fields import Schema

SCHEMA = Schema.of({"image": "image", "caption": "text", "score": "float32"})


def _sample(fmt: str) -> Prepared:
    if fmt == "mmap":
        return Prepared(b"", "rgb", 2, 2, False, pixels=np.zeros((2, 2, 3), np.uint8))
    return Prepared(b"\xff\xd8fake", "jpg", 2, 2, False)


@pytest.mark.parametrize("fmt", spec.FORMATS)
@pytest.mark.parametrize("blobs", [None, (b"c",), (b"c", np.float32(1).tobytes(), b"extra")],
                         ids=["none", "too-few", "too-many"])
def test_append_refuses_a_wrong_number_of_field_blobs(fmt, blobs, tmp_path):
    writer = WRITERS[fmt](tmp_path, "t", PackOptions(format=fmt), 1 << 20, schema=SCHEMA)
    writer.open(0, None)
    try:
        writer.append(0, _sample(fmt), 0, (b"a", np.float32(0).tobytes()))
        with pytest.raises(ValueError, match="field blobs for 2 extra fields"):
            writer.append(1, _sample(fmt), 0, blobs)
        assert writer.field_store is not None and writer.field_store.samples == 1  # nothing of sample 1 kept
    finally:
        writer.abort()
