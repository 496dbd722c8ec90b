"""Issue 33 (reliability, round three), items 4 and 14, with real packs in subprocesses.

* 4: a manifest image URL whose server sends an endless body (or declares a body over the image
  budget) is one row reject at the per-image byte budget local files get; the rest is packed and
  the read stops at the budget (the server counts what it sent).
* 14: a pack whose every image was rejected is one line naming the source file, exit 1, and leaves
  nothing that blocks the same command again; ``--resume`` on it says why there is nothing to
  resume. A re-run without ``--resume`` of an interrupted pack says it was interrupted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from readers import open_dataset
from readers.contract import spec
from reliability_helpers import CLI, assert_one_line, cli, env, pack_killed_at

pytest_plugins = ["servers"]

pytestmark = pytest.mark.slow  # every test runs pack-dataset in a subprocess

MB = 1 << 20
#: --max-pixels of the remote tests: the image budget is 3 bytes per pixel of it (packer.prepare.images.max_image_bytes)
MAX_PIXELS = 1_000_000
BUDGET = 3 * MAX_PIXELS


def _jpeg(path: Path, seed: int) -> Path:
    Image.new("RGB", (40 + seed, 30), (seed * 40 % 256, 90, 160)).save(path, "JPEG", quality=85)
    return path


def _csv(path: Path, images: list[str]) -> Path:
    path.write_text("image,label\n" + "".join(f"{im},{i % 2}\n" for i, im in enumerate(images)), encoding="utf-8")
    return path


def _rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text(encoding="utf-8").splitlines()]


def _pack_in(cwd: Path, *args) -> subprocess.CompletedProcess:
    """``pack-dataset ARGS`` run in ``cwd`` (relative paths, as a user types them)."""
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=180, env=env())


# ------------------------------------------------------------------------------------------- item 4
@pytest.mark.parametrize("mode", ["endless", "declared"])
def test_a_remote_image_over_the_budget_is_one_row_reject(bad_http, tmp_path, mode):
    """An endless body (no Content-Length) and one declaring 10 GB: each a row reject at the image budget
    (3 bytes per pixel of --max-pixels, as a local file), the other rows packed, the read cut there."""
    for i in range(3):
        _jpeg(tmp_path / f"ok{i}.jpg", i)
    server = bad_http("endless", max_s=20) if mode == "endless" else bad_http("trickle", length=10**10,
                                                                               interval_s=0.2, max_s=20)
    with server as srv:
        url = f"{srv.url}/images/big.jpg"
        manifest = _csv(tmp_path / "rows.csv", ["ok0.jpg", url, "ok1.jpg", "ok2.jpg"])
        out = tmp_path / "out"
        r = cli(manifest, "-f", "lmdb", "-o", out, "-q", "-w", "1", "--max-pixels", MAX_PIXELS)
        sent = srv.bytes_sent
    assert r.returncode == 3, r.stderr  # done, some rows rejected (was: 1, "re-run with --resume")
    assert "Traceback" not in r.stderr and "--resume" not in r.stderr, r.stderr
    rejects = _rejects(out)
    assert len(rejects) == 1, rejects
    assert rejects[0]["path"] == url
    reason = rejects[0]["reason"]
    assert reason.startswith(f"{manifest} row 2 column 'image': file too large ("), reason
    assert f"{BUDGET:,}" in reason and f"max_pixels {MAX_PIXELS:,}" in reason, reason
    assert "\n" not in reason
    ds = open_dataset(out, decode=False)
    try:
        assert len(ds) == 3
    finally:
        ds.close()
    # the read stopped at the budget: what the server could send before the client left (socket buffers
    # on both sides aside), far below the 2 GiB any remote read accepts
    assert sent < BUDGET + 64 * MB, sent


def test_the_store_says_how_much_more_an_object_declares(bad_http):
    """The message of a remote read over its cap reads as a sentence ("declares N bytes, more than ...")."""
    from readers.remote import open_store
    from readers.remote.errors import RemoteTooLargeError

    with bad_http("trickle", length=5000, interval_s=0.2, max_s=10) as srv:
        store = open_store(f"{srv.url}/x")
        try:
            with pytest.raises(RemoteTooLargeError) as err:
                store.read("a.jpg", max_bytes=100)
        finally:
            store.close()
    assert "the object declares 5000 bytes, more than the 100 bytes this read accepts" in str(err.value)
    assert (err.value.limit, err.value.declared) == (100, 5000)


# ------------------------------------------------------------------------------------------ item 14
def test_every_row_rejected_names_the_manifest_and_does_not_block_a_rerun(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"not an image")
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg either")
    _csv(tmp_path / "rows.csv", ["a.jpg", "b.jpg"])
    out = tmp_path / "rows-lmdb"
    args = ("rows.csv", "-f", "lmdb", "-q", "-w", "1")
    line = assert_one_line(_pack_in(tmp_path, *args), 1, "every image of rows.csv was rejected (2, listed in "
                           "rows-lmdb/rejects.jsonl); nothing was packed")
    assert "--resume" not in line and "every image of . " not in line, line
    assert sorted(p.name for p in out.iterdir()) == [spec.REJECTS_NAME]
    # the same command again: the same failure (the report replaced), not "already exists"
    again = _pack_in(tmp_path, *args)
    assert assert_one_line(again, 1) == line
    assert len(_rejects(out)) == 2
    # --resume: there is nothing to resume, and it says why and what to do
    assert_one_line(_pack_in(tmp_path, *args, "--resume"), 1, "rows-lmdb: nothing to resume",
                    "every image was rejected", "without --resume")
    # the images fixed, the same command packs them
    _jpeg(tmp_path / "a.jpg", 1)
    _jpeg(tmp_path / "b.jpg", 2)
    r = _pack_in(tmp_path, *args)
    assert r.returncode == 0, r.stderr
    assert not (out / spec.REJECTS_NAME).exists()
    ds = open_dataset(out, decode=False)
    try:
        assert len(ds) == 2
    finally:
        ds.close()


def test_a_folder_of_a_user_file_named_rejects_is_not_replaced(tmp_path):
    """Only a report the packer wrote (JSON lines with path and reason) is replaced by a re-run."""
    (tmp_path / "a.jpg").write_bytes(b"not an image")
    _csv(tmp_path / "rows.csv", ["a.jpg"])
    out = tmp_path / "out"
    out.mkdir()
    (out / spec.REJECTS_NAME).write_text("my own notes\n")
    assert_one_line(cli(tmp_path / "rows.csv", "-f", "lmdb", "-o", out, "-q"), 2, "already exists")
    assert (out / spec.REJECTS_NAME).read_text() == "my own notes\n"


@pytest.mark.parametrize("layout", ["one split", "splits"])
def test_rerunning_an_interrupted_pack_without_resume_says_it_was_interrupted(tmp_path, layout):
    from conftest import make_image_folder

    src = tmp_path / "src"
    if layout == "splits":
        for split in ("train", "val"):
            make_image_folder(src / split, classes=2, per_class=3, seed=len(split))
    else:
        make_image_folder(src, classes=2, per_class=3)
    out = tmp_path / "out"
    args = (src, "-f", "wds", "-o", out, "-q", "-w", "1")
    killed = pack_killed_at("packer.pipeline:_WriteStage._finish", *args)  # a real pack, killed like kill -9
    assert killed.returncode == 137, killed.stderr
    journal = (out / "train" if layout == "splits" else out) / spec.STATE_NAME
    assert journal.exists()
    assert_one_line(cli(*args), 2, f"{out} holds an interrupted pack", "--resume")
    r = cli(*args, "--resume")
    assert r.returncode == 0, r.stderr  # finished (notes.txt is not an image by name: ignored)
