"""HDF5 files whose /images is stored in a way the packer never writes are refused before a sample is
read, by the readers and by ``verify`` (issue 23 item 7: a 3.5 MB gzip-filtered data.h5 cost ~12 s
and 2.3 GB per sample read, and verify ran 29 minutes to say OK)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from readers import open_dataset
from readers.contract import spec
from reliability_helpers import set_meta

# name -> (h5py create_dataset options for /images, what the one-line refusal names)
_LAYOUTS = {
    "gzip-one-chunk": (lambda n: {"chunks": (n,), "compression": "gzip"}, "HDF5 filters (gzip)"),
    "gzip-1MiB-chunks": (lambda n: {"chunks": (spec.HDF5_CHUNK_BYTES,), "compression": "gzip",
                                    "shuffle": True}, "HDF5 filters (shuffle, gzip)"),
    "fletcher32": (lambda n: {"chunks": (spec.HDF5_CHUNK_BYTES,), "fletcher32": True}, "HDF5 filters (fletcher32)"),
    "contiguous": (lambda n: {}, "contiguous storage"),
    "4MiB-chunks": (lambda n: {"chunks": (4 << 20,)}, f"chunks of {4 << 20} bytes, not the {spec.HDF5_CHUNK_BYTES}"),
}


def _restore(root, layout: str) -> None:
    """Rewrite /images of the pack at ``root`` with the same bytes, stored as ``layout`` says (and
    index.json records the new file size, as a crafted dataset would)."""
    options, _ = _LAYOUTS[layout]
    path = root / spec.DATA_FILE["hdf5"]
    with h5py.File(path, "r+") as f:
        data = f["images"][:]
        del f["images"]
        f.create_dataset("images", data=data, dtype=np.uint8, maxshape=(None,) if options(1) else None,
                         **options(len(data)))
    set_meta(root, lambda m: m["files"].__setitem__(path.name, path.stat().st_size))


@pytest.mark.slow
@pytest.mark.parametrize("table", [False, True], ids=["no-chunk-table", "chunk-table"])
@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_an_unexpected_images_layout_is_refused_in_one_line(packed_real, tmp_path, layout, table, capsys):
    from packer.tools.verify import main as verify_main

    root = tmp_path / "ds"
    shutil.copytree(packed_real["hdf5"], root)
    data = root / spec.DATA_FILE["hdf5"]
    _restore(root, layout)
    want = _LAYOUTS[layout][1]
    if not table:  # readers go through libhdf5: it would inflate a whole chunk per sample read
        set_meta(root, lambda m: m["storage"].__setitem__("chunk_table", None))
        ds = open_dataset(root, decode=False)
        try:
            with pytest.raises(spec.DatasetFormatError) as err:
                ds.read(0)
        finally:
            ds.close()
        message = str(err.value)
        assert message.startswith(f"{data}: /images ") and want in message and "\n" not in message, message
    code = verify_main([str(root), "-q"])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.out + out.err
    damaged = [line for line in out.out.splitlines() if line.startswith("DAMAGED")]
    assert len(damaged) == 1 and damaged[0].startswith(f"DAMAGED {data}: /images ") and want in damaged[0], out.out
