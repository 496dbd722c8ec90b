"""``pack-dataset view``: the pages as aiohttp's client and a raw socket get them from the real server,
``--html``, and the command line (packer/tools/view). The same pages in a real browser:
tests/test_view_browser.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import PackOptions, pack
from packer.cli import main
from packer.tools.view.data import THUMB, DatasetView
from packer.tools.view.server import Server, make_app
from readers.contract.spec import FORMATS
from readers.decode.decoders import decode_rgb_scaled, read_header, reduction_for
from readers.formats.registry import open_dataset
from reliability_helpers import AS_TYPED

REPO = Path(__file__).resolve().parent.parent
THUMBS = re.compile(r'<div class="cell" data-index="(\d+)">\s*(?:<a class="open"[^>]*>)?<img class="thumb" '
                    r'alt="[^"]*"\s+src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def expected_thumbnail(stored) -> np.ndarray:
    """The oracle: the readers' reduced-scale decode of the stored image, every k-th pixel down to ~THUMB."""
    if isinstance(stored, np.ndarray):
        pixels = stored
    else:
        h = read_header(stored)
        pixels = decode_rgb_scaled(stored, reduction_for(h.height, h.width, THUMB, THUMB, jpeg=h.is_jpeg))
    step = max(1, min(pixels.shape[:2]) // THUMB)
    return np.asarray(pixels[::step, ::step])


def thumbnails(html: str) -> dict[int, np.ndarray]:
    """index -> the pixels of each inlined thumbnail of a grid page."""
    return {int(i): np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB"))
            for i, b in THUMBS.findall(html)}


def get(app_view, *paths: str, token: str = "", seed=None) -> list[tuple[int, str]]:
    """(status, body) of each GET, through aiohttp's test client on the real application."""
    from aiohttp.test_utils import TestClient, TestServer

    async def run():
        async with TestClient(TestServer(make_app(app_view, token, seed))) as client:
            out = []
            for p in paths:
                r = await client.get(p)
                out.append((r.status, (await r.read()).decode("utf-8", "replace")))
            return out

    return asyncio.run(run())


@pytest.fixture(scope="module")
def views(packed_generated):
    out = {fmt: DatasetView(packed_generated[fmt]) for fmt in FORMATS}
    for v in out.values():
        v.split(None).cell(0)  # the readers' handles (lmdb, hdf5) open lazily: here, not in a test
    yield out
    for v in out.values():
        v.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_overview_grid_and_sample_of_each_format(views, packed_generated, fmt):
    view = views[fmt]
    meta = json.loads((packed_generated[fmt] / "index.json").read_text())
    [(s1, overview), (s2, grid), (s3, sample), (s4, sample_json)] = get(
        view, "/", "/grid?per=100", "/sample/train/5", "/sample/train/5.json")
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    assert f'<td class="format">{fmt}</td>' in overview
    assert f'<td class="samples">{meta["num_samples"]}</td>' in overview
    rows = re.findall(r'<td class="cname"><a\s+href="[^"]*">([^<]+)</a></td>\s*<td class="ccount">(\d+)</td>', overview)
    assert rows == [(c, str(n)) for c, n in zip(meta["classes"], meta["class_counts"])]
    assert "<svg" in overview  # the class histogram, inline
    shown = thumbnails(grid)
    assert sorted(shown) == list(range(meta["num_samples"]))
    reader = open_dataset(packed_generated[fmt], decode=False)
    try:
        for i, pixels in shown.items():
            np.testing.assert_array_equal(pixels, expected_thumbnail(reader.read(i)), err_msg=f"{fmt} sample {i}")
        label = int(reader.labels[5])
    finally:
        reader.close()
    assert f'<span id="class">{meta["classes"][label]}</span>' in sample
    d = json.loads(sample_json)
    crc = int(np.load(packed_generated[fmt] / "checksums.npy")[5])
    assert d["label"] == label and d["key"] == "train/5" and d["crc32"] == f"{crc:08x}"
    assert d["source"].startswith(f"class_{label:02d}/"), d["source"]  # names.jsonl's line 5


def test_an_in_place_index_of_shards(packed_generated, tmp_path):
    """``pack-dataset index`` over wds shards (their bytes never copied): the view reads the samples from the
    shards where they are, thumbnails equal to the readers' decode, the overview counts the index's samples."""
    shards = packed_generated["wds"]
    assert main(["index", str(shards), "-o", str(tmp_path / "idx"), "-q"]) == 0
    view = DatasetView(tmp_path / "idx")
    try:
        [split] = view.splits  # named after the index folder
        [(s1, overview), (s2, grid), (s3, sample_json)] = get(view, "/", "/grid?per=100", f"/sample/{split}/3.json")
    finally:
        view.close()
    assert (s1, s2, s3) == (200, 200, 200)
    meta = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert f'<td class="samples">{meta["num_samples"]}</td>' in overview
    reader = open_dataset(tmp_path / "idx", decode=False)
    try:
        shown = thumbnails(grid)
        assert sorted(shown) == list(range(meta["num_samples"]))
        for i, pixels in shown.items():
            np.testing.assert_array_equal(pixels, expected_thumbnail(reader.read(i)), err_msg=f"in place, sample {i}")
        assert json.loads(sample_json)["label"] == int(reader.labels[3])
    finally:
        reader.close()


def test_grid_shuffled_and_filtered(views, packed_generated):
    view, n = views["lmdb"], 28
    pages = [body for _, body in get(view, *(f"/grid?seed=7&per=5&page={p}" for p in range(6)))]
    order = [i for body in pages for i in map(int, re.findall(r'data-index="(\d+)"', body))]
    assert sorted(order) == list(range(n)) and order != list(range(n))  # a permutation, not index order
    [(_, again)] = get(view, "/grid?seed=7&per=5&page=0")
    assert re.findall(r'data-index="(\d+)"', again) == re.findall(r'data-index="(\d+)"', pages[0])  # the seed repeats
    [(_, default_seeded)] = get(view, "/grid?per=5", seed=7)  # --seed: the grid's default
    assert re.findall(r'data-index="(\d+)"', default_seeded) == re.findall(r'data-index="(\d+)"', pages[0])
    labels = np.load(packed_generated["lmdb"] / "labels.npy")
    [(_, cls)] = get(view, "/grid?cls=2&per=100")
    assert [int(i) for i in re.findall(r'data-index="(\d+)"', cls)] == np.flatnonzero(labels == 2).tolist()
    assert set(re.findall(r'<div class="caption">#\d+ ([^<]*)</div>', cls)) == {"class_02"}
    [(status, _)] = get(view, "/grid?cls=x")
    assert status == 400


def _corrupt_one(root: Path, i: int) -> None:
    """Overwrite the first bytes of sample ``i``'s stored image where the data file holds them."""
    reader = open_dataset(root, decode=False)
    try:
        stored, where = bytes(reader.read(i)), Path(reader.where(i))
    finally:
        reader.close()
    data = bytearray(where.read_bytes())
    at = data.index(stored)
    data[at:at + 16] = b"\0" * 16
    where.write_bytes(bytes(data))


def test_a_damaged_sample_shows_its_one_line_error(packed_generated, tmp_path):
    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    _corrupt_one(root, 3)
    with DatasetView(root) as view:
        [(s1, grid), (s2, sample), (s3, image)] = get(view, "/grid", "/sample/train/3", "/image/train/3")
    errors = re.findall(r'<div class="cell" data-index="(\d+)">\s*<div class="err">([^<]*)</div>', grid)
    assert [int(i) for i, _ in errors] == [3]
    message = errors[0][1]
    assert "\n" not in message and "sample 3" in message and ".tar" in message, message
    assert len(thumbnails(grid)) == 27  # every other sample still shows
    assert s1 == s2 == 200 and 'class="err" id="error"' in sample
    assert s3 == 500 and "\n" not in image.strip()


def test_requests_cannot_leave_the_dataset(views):
    """Crafted paths (``../``, encoded or not) match no route: 404, and nothing of the disk is served."""
    crafted = ["/../../../../etc/passwd", "/sample/../../../etc/passwd", "/sample/%2e%2e%2f%2e%2e%2fetc/0",
               "/image/..%2F..%2Fetc/0", "/image/train/0?field=../../../etc/passwd", "/grid?split=../../../etc",
               "/sample/train/../../../../etc/passwd", "/static/../../etc/passwd", "/sample/train/99999",
               "/image/train/-1", "//etc/passwd"]
    with Server(views["wds"]) as server:
        for path in crafted:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
            status = int(reply.split(b" ", 2)[1])
            assert status in (400, 404), (path, reply[:200])
            assert b"root:" not in reply and b"PNG" not in reply, path


def test_token_when_bound_beyond_localhost(views):
    from urllib.error import HTTPError
    from urllib.request import build_opener, HTTPCookieProcessor

    with Server(views["hdf5"], host="0.0.0.0") as server:
        assert server.token and f"?token={server.token}" in server.url
        base = f"http://127.0.0.1:{server.port}"
        opener = build_opener(HTTPCookieProcessor())
        with pytest.raises(HTTPError) as refused:
            opener.open(f"{base}/grid")
        assert refused.value.code == 403
        refused.value.close()
        with opener.open(server.url) as r:  # the printed URL; it sets the cookie
            assert r.status == 200
        with opener.open(f"{base}/grid") as r:  # the cookie alone now
            assert r.status == 200 and "thumb" in r.read().decode()
    with Server(views["hdf5"]) as local:
        assert local.token == "" and "token" not in local.url


def test_read_only(views):
    from aiohttp.test_utils import TestClient, TestServer

    async def run():
        async with TestClient(TestServer(make_app(views["mmap"]))) as client:
            return [(await client.post("/")).status, (await client.delete("/sample/train/0")).status]

    assert all(s in (404, 405) for s in asyncio.run(run()))


def test_rejects_grouped_by_reason_with_thumbnails(real_images, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(real_images / "animals", src / "animals")
    (src / "animals" / "bad.jpg").write_bytes(b"not an image at all")
    (src / "animals" / "short.jpg").write_bytes((real_images / "animals" / "ocelot.jpg").read_bytes()[:300])
    [result] = pack(src, tmp_path / "out", PackOptions(format="lmdb", workers=1, max_pixels=400_000))
    assert result.rejected >= 3  # bad, short, and the photos over 400k pixels
    with DatasetView(tmp_path / "out") as view:
        [(status, page)] = get(view, "/rejects")
    assert status == 200
    groups = dict(re.findall(r'<summary>([^<]+?)\s*\(<span class="count">(\d+)</span>\)</summary>', page))
    records = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sum(map(int, groups.values())) == len(records) and len(groups) >= 2, groups
    # the photos rejected for their size still decode: a thumbnail each; the broken files have none
    thumbs = set(re.findall(r'<img class="thumb" alt="([^"]+)" src="data:image/png', page))
    assert "animals/ocelot.jpg" in thumbs and not thumbs & {"animals/bad.jpg", "animals/short.jpg"}


def test_html_report_is_self_contained(packed_generated, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["view", str(packed_generated["hdf5"]), "--html", str(out), "--samples", "10", "--seed", "3"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    html = out.read_text()
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.findall(r'url\((?!#)', html)  # the chart's own clip paths only
    assert not re.findall(r'(?:src|href)="(?!data:|#)[^"]*"', html)  # no fetch, no link to a server
    assert len(thumbnails(html)) == 10 and '<td class="samples">28</td>' in html


def test_cli_errors_are_one_line(tmp_path, packed_generated, capsys):
    cases = [["view", str(tmp_path / "nothing")],
             ["view", str(packed_generated["lmdb"]), "--html", str(tmp_path / "no" / "such" / "dir" / "x.html")],
             ["view", str(packed_generated["lmdb"]), "--host", "203.0.113.1"]]  # not an address of this machine
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("pack-dataset view: error: ") and err.count("\n") == 1, err
    assert not list(tmp_path.glob("**/*.html*"))
    for argv in (["view", "ftp://host/x"], ["view", str(packed_generated["lmdb"]), "--port", "70000"]):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2
        assert capsys.readouterr().err.count("\n") == 2  # the error and where to look (cli.Parser)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "view" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_serves_until_ctrl_c(packed_generated):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    typed = AS_TYPED + "import sys\nfrom packer.cli import main\nsys.exit(main(sys.argv[1:]))\n"  # pack-dataset view
    proc = subprocess.Popen([sys.executable, "-c", typed, "view", str(packed_generated["mmap"])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+/) ", line).group(1)
        from urllib.request import urlopen

        with urlopen(url + "grid?per=4", timeout=30) as r:
            assert r.status == 200 and len(thumbnails(r.read().decode())) == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_source_names_are_names_jsonl_lines(packed_generated, monkeypatch):
    """The sample page's source name is line ``i`` of names.jsonl, found through the table of every
    k-th line's start (k = 4 here, so that 28 samples cross several marks)."""
    import packer.tools.view.data as data

    monkeypatch.setattr(data, "_NAME_STRIDE", 4)
    lines = [json.loads(line) for line in (packed_generated["hdf5"] / "names.jsonl").read_text().splitlines()]
    with DatasetView(packed_generated["hdf5"]) as view:
        split = view.split(None)
        assert [split.source_name(i) for i in (27, 0, 13, 4, 3)] == [lines[i] for i in (27, 0, 13, 4, 3)]


def test_a_folder_of_splits(tmp_path):
    from conftest import make_image_folder

    make_image_folder(tmp_path / "src" / "train", classes=2, per_class=3)
    make_image_folder(tmp_path / "src" / "val", classes=2, per_class=2, seed=1)
    pack(tmp_path / "src", tmp_path / "out", PackOptions(format="mmap", workers=1))
    with DatasetView(tmp_path / "out") as view:
        assert list(view.splits) == ["train", "val"]
        [(_, overview), (_, val), (status, _)] = get(view, "/", "/grid?split=val", "/grid?split=test")
    assert re.findall(r'<td class="samples">(\d+)</td>', overview) == ["6", "4"]
    assert len(thumbnails(val)) == 4 and status == 404


@pytest.mark.parametrize("fmt", ["lmdb", "mmap"])
def test_a_second_image_field_shows_beside_the_first(real_images, tmp_path, fmt):
    """``--fields mask:image``: the sample page shows the mask beside the image; /image?field=mask serves
    its stored bytes (mmap too: the mask stays encoded beside the pixels)."""
    photos = [next(real_images.rglob(n)) for n in ("chelsea.png", "china.jpg")]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"image": str(a), "mask": str(b)}) + "\n" for a, b in zip(photos, photos[::-1])))
    pack(rows, tmp_path / fmt, PackOptions(format=fmt, workers=1, order="source", fields="mask:image"))
    with DatasetView(tmp_path / fmt) as view:
        name = view.split(None).name
        [(s1, page), (s2, _)] = get(view, f"/sample/{name}/0", f"/image/{name}/0?field=image")
        [(s3, _)] = get(view, f"/image/{name}/0?field=nope")

        async def mask():
            from aiohttp.test_utils import TestClient, TestServer

            async with TestClient(TestServer(make_app(view))) as client:
                r = await client.get(f"/image/{name}/0?field=mask")
                return r.status, r.content_type, await r.read()

        status, kind, body = asyncio.run(mask())
    assert (s1, s2, s3, status) == (200, 200, 404, 200)
    assert re.search(rf'<img class="second" alt="mask"\s+src="/image/{name}/0\?field=mask">', page)
    assert kind == "image/jpeg" and body == photos[1].read_bytes()  # china.jpg, as stored


def test_a_page_that_fails_is_one_line(views, monkeypatch, caplog):
    """An unexpected error in a page: a 500 whose body is one line, the same line logged (no traceback)."""
    def broken(*args, **kwargs):
        raise RuntimeError("the template\nbroke")

    monkeypatch.setattr("packer.tools.view.server.render_rejects", broken)
    [(status, body)] = get(views["lmdb"], "/rejects")
    assert status == 500 and body == "/rejects: RuntimeError: the template broke"
    assert [r.getMessage() for r in caplog.records if r.name == "packer.tools.view.server"] == [body]


def test_opening_and_the_overview_read_no_sample(packed_generated, tmp_path):
    """Random access only: with every shard gone, the view still opens and shows its overview (index.json
    and the index arrays); each grid cell then shows its sample's one-line error."""
    root = tmp_path / "wds"
    shutil.copytree(packed_generated["wds"], root)
    for shard in root.glob("*.tar"):
        shard.unlink()
    with DatasetView(root) as view:
        [(s1, overview), (s2, grid)] = get(view, "/", "/grid?per=4")
    assert s1 == s2 == 200 and '<td class="samples">28</td>' in overview
    errors = re.findall(r'<div class="err">([^<]*)</div>', grid)
    assert len(errors) == 4 and all("shard file is missing" in e for e in errors), errors
