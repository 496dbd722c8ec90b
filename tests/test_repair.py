"""JPEGs with junk in their headers (real photos with edited bytes): accepted and repaired when the
pixels are intact, rejected when pixels are lost; repairs listed in repairs.jsonl and the summary.

"Intact" is judged against libjpeg itself: the edited file decodes (leniently, with its warning)
to exactly the pixels of the unedited photo, and the stored file decodes strictly (as the readers
decode) to those same pixels.
"""

from __future__ import annotations

import errno
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from conftest import REAL_IMAGES
from packer import PackError, PackOptions, pack
from packer.prepare.images import ImageOptions, RejectedImage, prepare_image
from packer.prepare.jpeg_repair import repair_header
from readers.contract import spec

PHOTOS = [REAL_IMAGES / "people" / "grace_hopper.jpg", REAL_IMAGES / "objects_scenes" / "rocket.jpg"]
ADOBE = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x01"  # APP14, 12 payload bytes, transform 1 (YCbCr)


def segments(data: bytes) -> dict[int, int]:
    """marker -> position of its first occurrence, walking a clean header up to SOS."""
    pos, found = 2, {}
    while True:
        marker = data[pos + 1]
        found.setdefault(marker, pos)
        if marker == 0xDA:
            return found
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")


def at(data: bytes, marker: int, insert: bytes) -> bytes:
    pos = segments(data)[marker]
    return data[:pos] + insert + data[pos:]


EDITS = {  # name -> (edit of a clean JPEG, junk bytes libjpeg reports)
    "zeros-before-dqt": (lambda d: at(d, 0xDB, b"\0" * 7), 7),
    "stray-ff00": (lambda d: at(d, 0xDB, b"\xff\x00"), 2),
    "text-between-segments": (lambda d: at(d, 0xC4, b"created by some-tool v1.2"), 25),
    "junk-before-sos": (lambda d: at(d, 0xDA, b"\x00\x01\x02"), 3),
    "app14-length-short": (lambda d: at(d, 0xDB, ADOBE[:3] + b"\x0b" + ADOBE[4:]), 3),
    "padding-after-app14": (lambda d: at(d, 0xDB, ADOBE + b"\0\0\0\0"), 4),
    # the FF of APP0 gone: libjpeg skips APP0 as junk (Pillow refuses to open the file at all)
    "app0-marker-lost": (lambda d: d[:2] + b"\x00" + d[3:], None),
}


def lenient(data: bytes) -> np.ndarray:
    """libjpeg through Pillow, which skips what libjpeg warns about (simplejpeg raises even when not strict)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def strict(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, "RGB", strict=True)


@pytest.mark.parametrize("photo", PHOTOS, ids=lambda p: p.stem)
@pytest.mark.parametrize("edit", EDITS, ids=str)
def test_header_junk_is_repaired_losslessly(photo, edit):
    clean = photo.read_bytes()
    make, junk = EDITS[edit]
    damaged = make(clean)
    with pytest.raises(ValueError, match="extraneous bytes before marker"):
        strict(damaged)  # what a strict reader would do with the file as it is
    if edit != "app0-marker-lost":
        assert np.array_equal(lenient(damaged), lenient(clean))  # libjpeg: the pixels are intact
    prep = prepare_image(damaged, ImageOptions())
    assert prep.changed and prep.ext == "jpg" and prep.repair.startswith("removed junk from the JPEG header")
    if junk is not None:
        assert f"{junk} byte" in prep.repair
        assert len(prep.data) == len(damaged) - junk
    assert np.array_equal(strict(prep.data), strict(clean))  # every reader, strict ones included
    assert np.array_equal(lenient(prep.data), lenient(clean))
    assert prep.data[-200:] == clean[-200:]  # the entropy-coded data is the file's own


def test_a_clean_header_needs_no_repair():
    for photo in REAL_IMAGES.rglob("*.jpg"):
        assert repair_header(photo.read_bytes()) is None, photo.name


def test_repair_also_without_validation():
    damaged = EDITS["zeros-before-dqt"][0](PHOTOS[0].read_bytes())
    prep = prepare_image(damaged, ImageOptions(validate=False))
    assert prep.repair and np.array_equal(lenient(prep.data), lenient(damaged))
    strict(prep.data)


def test_repaired_and_rotated_is_counted_as_reencoded():
    with Image.open(PHOTOS[0]) as im:
        exif = im.getexif()
        exif[0x0112] = 6
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    damaged = EDITS["text-between-segments"][0](buf.getvalue())
    prep = prepare_image(damaged, ImageOptions())
    assert prep.changed and not prep.repair  # re-encoded anyway: not a repair of the file's bytes
    assert "removed junk" in prep.note and "exif-rotate (orientation 6)" in prep.note
    assert (prep.width, prep.height) == (600, 512)


# ---------------------------------------------------------------- lost pixels are still rejected
def _corrupt_entropy(data: bytes, seed: int = 1) -> bytes:
    d = bytearray(data)
    mid = len(data) // 2  # well inside the entropy-coded data (the headers are < 1 KB)
    d[mid:mid + 64] = np.random.default_rng(seed).integers(0, 256, 64, dtype=np.uint8).tobytes()
    return bytes(d)


def test_extraneous_bytes_inside_the_image_data_are_not_repaired():
    """The same libjpeg warning from inside the entropy-coded data means lost pixels: rejected."""
    damaged = _corrupt_entropy(PHOTOS[0].read_bytes(), seed=0)
    with pytest.raises(ValueError, match="extraneous bytes before marker"):
        strict(damaged)
    assert repair_header(damaged) is None
    with pytest.raises(RejectedImage, match="corrupt JPEG data"):
        prepare_image(damaged, ImageOptions())


@pytest.mark.parametrize("damage", ["truncated", "corrupt-entropy", "app14-length-long"])
def test_junk_plus_lost_pixels_is_rejected(damage):
    clean = PHOTOS[0].read_bytes()
    damaged = EDITS["zeros-before-dqt"][0](clean)
    if damage == "truncated":
        damaged = damaged[: len(damaged) * 2 // 3]
        expected = "truncated JPEG"
    elif damage == "corrupt-entropy":
        damaged = _corrupt_entropy(damaged)
        expected = "corrupt JPEG data"
    else:  # the length swallows the next marker: libjpeg loses the quantization table
        damaged = at(clean, 0xDB, ADOBE[:3] + b"\x10" + ADOBE[4:])
        expected = "JPEG"
    with pytest.raises(RejectedImage) as info:
        prepare_image(damaged, ImageOptions())
    assert expected in str(info.value)


# ---------------------------------------------------------------- packing: repairs.jsonl, summary, info
@pytest.fixture
def damaged_folder(tmp_path) -> Path:
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    clean = PHOTOS[0].read_bytes()
    (root / "a" / "clean.jpg").write_bytes(clean)
    (root / "a" / "padded.jpg").write_bytes(EDITS["padding-after-app14"][0](clean))
    (root / "b" / "stray.jpg").write_bytes(EDITS["stray-ff00"][0](PHOTOS[1].read_bytes()))
    (root / "b" / "lost.jpg").write_bytes(_corrupt_entropy(EDITS["stray-ff00"][0](clean)))
    return root


@pytest.mark.slow  # subprocess
def test_pack_lists_repairs(damaged_folder, tmp_path, stored_bytes):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "packer.cli", damaged_folder, "-f", "wds", "-o", out, "-q",
                        "--order", "source"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr  # lost.jpg is rejected
    assert "1 rejected" in r.stdout and f"2 repaired (listed in {out / spec.REPAIRS_NAME})" in r.stdout
    repairs = [json.loads(line) for line in (out / spec.REPAIRS_NAME).read_text().splitlines()]
    assert [(x["path"], x["sample"]) for x in repairs] == [("a/padded.jpg", 1), ("b/stray.jpg", 2)]
    assert all(x["repair"].startswith("removed junk from the JPEG header") for x in repairs)
    rejects = [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text().splitlines()]
    assert [x["path"] for x in rejects] == ["b/lost.jpg"]
    for i in (1, 2):
        strict(stored_bytes(out, i))  # the stored files decode strictly
    info = json.loads(subprocess.run([sys.executable, "-m", "packer.cli", "info", out, "--json"],
                                     capture_output=True, text=True, timeout=60).stdout)
    assert (info["repaired"], info["rejected"], info["reencoded"]) == (2, 1, 0)


def test_no_repairs_no_file(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.jpg").write_bytes(PHOTOS[0].read_bytes())
    [res] = pack(tmp_path / "src", tmp_path / "out", PackOptions(format="lmdb", workers=1))
    assert res.repaired == 0 and not (tmp_path / "out" / spec.REPAIRS_NAME).exists()
    assert "repaired" not in res.summary()


def test_repairs_survive_an_interrupted_pack(damaged_folder, tmp_path):
    """repairs.jsonl is journaled like rejects.jsonl: a resumed pack lists each repair once."""
    from packer.api import WRITERS, plan
    from packer.pipeline import pack_split
    from packer.prepare.workers import prepare

    (damaged_folder / "b" / "lost.jpg").unlink()
    for k in range(3):
        (damaged_folder / "c" / f"more{k}.jpg").parent.mkdir(exist_ok=True)
        (damaged_folder / "c" / f"more{k}.jpg").write_bytes(EDITS["junk-before-sos"][0](PHOTOS[1].read_bytes()))
    opts = PackOptions(format="lmdb", workers=1, checkpoint_bytes=1)
    ref = tmp_path / "ref"
    pack(damaged_folder, ref, opts)
    out = tmp_path / "out"
    [(split, source, dest)] = plan(damaged_folder, out, opts)

    def failing(source, start, image_opts, workers):
        for k, outcome in enumerate(prepare(source, start, image_opts, workers)):
            if k == 4:
                raise OSError(errno.EIO, "simulated")
            yield outcome

    with pytest.raises(PackError):
        pack_split(source, dest, split, opts, WRITERS["lmdb"], 1, prepare=failing)
    [res] = pack(damaged_folder, out, PackOptions(format="lmdb", workers=1, checkpoint_bytes=1, resume=True))
    assert res.repaired == 5
    assert (out / spec.REPAIRS_NAME).read_bytes() == (ref / spec.REPAIRS_NAME).read_bytes()
