"""The image byte budget (``packer.prepare.images.check_file_size``) on every source read, not only a folder's
(issue 23 item 10): a wds-shard member, a Hugging Face image file and an ``s3://`` object over it are a
one-line reject, not read."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc
import uuid
from pathlib import Path

import pytest
from PIL import Image

from packer import PackError, PackOptions, RemoteOptions, pack
from readers import open_dataset
from readers.contract import spec

pytest_plugins = ["servers"]

BUDGET = PackOptions(max_pixels=10_000)  # 30,000 bytes: 3 bytes per pixel
HUGE = 64 << 20  # a sparse member / file: reading it allocates 64 MiB


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (24, 24), (seed * 40 % 256, 80, 120)).save(buf, "JPEG")
    return buf.getvalue()


def _rejects(out: Path) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in map(json.loads, (out / spec.REJECTS_NAME).read_text().splitlines())}


def _packed_with_peak(src, out: Path, **kw) -> tuple[list, int]:
    """pack() in this process (one worker: the reads happen here), and the peak of Python allocations."""
    tracemalloc.start()
    try:
        results = pack(src, out, PackOptions(format="wds", workers=1, max_pixels=BUDGET.max_pixels), **kw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return results, peak


def _member(f, name: str, size: int, data: bytes | None) -> None:
    """A tar member: its header, then ``data`` or (None) a hole of ``size`` bytes (sparse), padded."""
    info = tarfile.TarInfo(name)
    info.size = size
    f.write(info.tobuf(tarfile.USTAR_FORMAT))
    if data is None:
        f.seek(size + (-size % 512), io.SEEK_CUR)
    else:
        f.write(data + b"\0" * (-size % 512))


def test_a_wds_member_over_the_budget_is_a_reject_not_read(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    with open(shards / "shard-0.tar", "wb") as f:
        for key in ("s0", "s1", "s2"):
            data = None if key == "s1" else _jpeg(len(key))
            _member(f, f"{key}.jpg", HUGE if data is None else len(data), data)
            _member(f, f"{key}.cls", 1, b"0")
        f.write(b"\0" * 1024)
    assert (shards / "shard-0.tar").stat().st_blocks * 512 < 1 << 20  # the member is a hole
    out = tmp_path / "out"
    [result], peak = _packed_with_peak(shards, out)
    assert (result.images, result.rejected) == (2, 1)
    assert _rejects(out) == {"shard-0.tar/s1.jpg": f"file too large ({HUGE:,} bytes > 30,000, 3 bytes per pixel "
                                                   "of max_pixels 10,000); not read"}
    assert peak < HUGE // 4, f"{peak:,} bytes allocated: the member was read"  # it was read whole
    assert len(open_dataset(out)) == 2


def test_a_hugging_face_image_file_over_the_budget_is_a_reject_not_read(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face 'datasets' package is not installed")
    datasets.disable_progress_bars()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    images = tmp_path / "images"
    images.mkdir()
    for k in range(3):
        (images / f"{k}.jpg").write_bytes(_jpeg(k))
    with open(images / "1.jpg", "wb") as f:  # a sparse file far over the budget
        f.truncate(HUGE)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    rows = {"image": [{"bytes": None, "path": str(images / f"{k}.jpg")} for k in range(3)], "label": [0, 1, 0]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "train.parquet"))
    out = tmp_path / "out"
    [result], peak = _packed_with_peak(tmp_path / "train.parquet", out)
    assert (result.images, result.rejected) == (2, 1)
    [reason] = _rejects(out).values()
    assert reason == f"file too large ({HUGE:,} bytes > 30,000, 3 bytes per pixel of max_pixels 10,000); not read"
    assert peak < HUGE // 4, f"{peak:,} bytes allocated: the file was read"


@pytest.fixture(autouse=True)
def no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.slow  # a SeaweedFS server
def test_an_s3_object_listed_over_the_budget_is_a_reject_not_read(s3_server, tmp_path):
    """The listing gives the size: the object is rejected without a GET. The proof: it is deleted
    after the listing, and the pack still rejects it as too large (a GET would fail: exit 1)."""
    from readers.remote import open_store

    url = s3_server.url(f"caps-{uuid.uuid4().hex[:8]}/train")
    store = open_store(url, s3_server.storage_options())
    for k in range(4):
        (tmp_path / f"{k}.jpg").write_bytes(_jpeg(k) if k != 2 else b"\xff\xd8\xff" + bytes(40_000))
        store.put(f"class_{k % 2}/img_{k}.jpg", tmp_path / f"{k}.jpg")

    def progress(split, source):
        store.delete("class_0/img_2.jpg")  # after the listing, before any read
        return None

    out = tmp_path / "out"
    try:
        [result] = pack(url, out, PackOptions(format="wds", workers=1, max_pixels=BUDGET.max_pixels),
                        progress=progress, remote=RemoteOptions(storage_options=s3_server.storage_options()))
    except PackError as exc:
        pytest.fail(f"the object was read: {exc}")
    assert (result.images, result.rejected) == (3, 1)
    assert _rejects(out) == {"class_0/img_2.jpg": "file too large (40,003 bytes > 30,000, 3 bytes per pixel of "
                                                  "max_pixels 10,000); not read"}
