"""``pack-dataset view`` in a real browser: Debian's Chromium driven by Playwright (one browser for the
module, small datasets). The overview's counts and classes, the grid's thumbnails pixel for pixel
against the readers' decode, a click from the grid to a sample's caption and json, a COCO sample's
boxes at their pixel coordinates, crafted ``../`` requests refused, each format and a dataset on the
S3 emulator. The screenshots in docs/img/view-* come from here (written there when missing or
with ``DATASET_PACKER_SCREENSHOTS=1``; elsewhere into the test's temp folder)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

from packer import PackOptions, RemoteOptions, pack
from packer.tools.view.data import DatasetView
from packer.tools.view.server import Server
from readers.contract.safeio import atomic_write
from readers.contract.spec import FORMATS
from readers.formats.registry import open_dataset
from test_view import expected_thumbnail

pytest_plugins = ["servers"]
pytestmark = pytest.mark.slow  # Chromium is a subprocess (conftest.py: the rule of what is slow)

CHROMIUM = "/usr/bin/chromium"
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
#: the pixels Chromium decoded, drawn on a canvas and read back as a (lossless) PNG
PIXELS_JS = """img => { const c = document.createElement('canvas'); c.width = img.naturalWidth;
c.height = img.naturalHeight; c.getContext('2d').drawImage(img, 0, 0); return c.toDataURL('image/png'); }"""
CATEGORIES = [{"id": 1, "name": "cat"}, {"id": 18, "name": "dog"}, {"id": 90, "name": "tree"}]
#: file -> its boxes (COCO xywh, category id): drawn over the photos at these pixel coordinates
BOXES = {"ocelot.jpg": [([40.5, 440.25, 540, 250], 1), ([440, 0, 150, 360.5], 90)],
         "chelsea.png": [([120.5, 20, 200, 180], 1)], "china.jpg": []}
CAPTIONS = {"ocelot.jpg": "an ocelot on a branch", "domestic_dog.jpg": "a dog looks up",
            "chelsea.png": "Chelsea the cat", "china.jpg": "a vase of painted china"}


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} not found: apt-get install chromium (.ci/run installs it)"
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the 'test' extra has it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def _serve(view: DatasetView) -> Server:
    for split in view.splits.values():
        split.cell(0)  # the readers' handles (lmdb, hdf5) open lazily: in the fixture, not in a test
    return Server(view)


@pytest.fixture(scope="module")
def served(tmp_path_factory, real_images, packed_generated):
    """name -> (Server, dataset folder): the four formats of the generated folder, the bundled photos,
    photos with captions and json, and a COCO instances json over three photos."""
    root = tmp_path_factory.mktemp("view")
    folders = {fmt: packed_generated[fmt] for fmt in FORMATS}
    folders["photos"] = root / "photos"
    pack(real_images, folders["photos"], PackOptions(format="lmdb", workers=1))
    rows = root / "captions.jsonl"
    rows.write_text("".join(json.dumps({"image": str(next(real_images.rglob(name))), "caption": caption,
                                        "meta": {"file": name, "rank": k, "tags": ["photo", name[:3]]}}) + "\n"
                            for k, (name, caption) in enumerate(CAPTIONS.items())))
    folders["captions"] = root / "captions"
    pack(rows, folders["captions"], PackOptions(format="wds", workers=1, order="source"))
    images = root / "coco" / "val"
    images.mkdir(parents=True)
    annotations, images_json = [], []
    for k, (name, boxes) in enumerate(BOXES.items()):
        shutil.copyfile(next(real_images.rglob(name)), images / name)
        images_json.append({"id": k + 1, "file_name": name, "height": 10, "width": 10})
        annotations += [{"id": 100 * k + j, "image_id": k + 1, "category_id": c, "bbox": b, "area": b[2] * b[3],
                         "iscrowd": 0, "segmentation": []} for j, (b, c) in enumerate(boxes)]
    instances = root / "coco" / "instances_val.json"
    instances.write_text(json.dumps({"images": images_json, "annotations": annotations, "categories": CATEGORIES}))
    folders["coco"] = root / "coco-hdf5"
    pack(instances, folders["coco"], PackOptions(format="hdf5", workers=1, order="source", images=str(images)))
    views = {name: DatasetView(folder) for name, folder in folders.items()}
    servers = {name: _serve(v) for name, v in views.items()}
    try:
        yield {name: (servers[name], folders[name]) for name in folders}
    finally:
        for name in folders:
            servers[name].close()
            views[name].close()


def _screenshot(page, name: str, tmp_path: Path, **kw) -> None:
    target = DOCS_IMG / name
    if target.exists() and not os.environ.get("DATASET_PACKER_SCREENSHOTS"):
        target = tmp_path / name
    if name.endswith(".jpg"):
        kw.update(type="jpeg", quality=80)
    png = page.screenshot(**kw)  # bytes (with path=, Playwright writes it from a non-daemon executor thread)
    assert len(png) > 10_000  # a real rendering, not a blank page
    with atomic_write(target) as f:
        f.write(png)


def _thumbnail_pixels(img) -> np.ndarray:
    import base64
    import io

    from PIL import Image

    url = img.evaluate(PIXELS_JS)
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))


def _check_grid(page, url: str, folder: Path, expected: int) -> None:
    """The grid's thumbnails as Chromium decoded them, against the readers' decode of the stored image."""
    page.goto(url + "grid?per=100")
    cells = page.locator(".cell")
    assert cells.count() == expected
    page.wait_for_function("() => [...document.images].every(i => i.complete && i.naturalWidth > 0)")
    reader = open_dataset(folder, decode=False)
    try:
        for k in sorted({0, expected // 2, expected - 1}):
            cell = cells.nth(k)
            i = int(cell.get_attribute("data-index"))
            np.testing.assert_array_equal(_thumbnail_pixels(cell.locator("img.thumb")),
                                          expected_thumbnail(reader.read(i)), err_msg=f"{folder} sample {i}")
    finally:
        reader.close()


def test_overview_counts_and_classes(page, served, tmp_path):
    server, folder = served["photos"]
    meta = json.loads((folder / "index.json").read_text())
    page.goto(server.url)
    assert page.locator("td.format").inner_text() == "lmdb"
    assert page.locator("td.samples").inner_text() == str(meta["num_samples"])
    assert page.locator("td.cname").all_inner_texts() == meta["classes"]
    assert page.locator("td.ccount").all_inner_texts() == [str(n) for n in meta["class_counts"]]
    assert page.locator(".hist svg").is_visible()
    assert page.locator("table.fields td").first.inner_text() == "image"
    _screenshot(page, "view-overview.png", tmp_path, full_page=True)


def test_grid_thumbnails_are_the_readers_decode(page, served, tmp_path):
    server, folder = served["photos"]
    _check_grid(page, server.url, folder, json.loads((folder / "index.json").read_text())["num_samples"])
    page.set_viewport_size({"width": 1000, "height": 760})
    _screenshot(page, "view-grid.jpg", tmp_path)
    meta = json.loads((folder / "index.json").read_text())
    page.select_option('select[name="cls"]', label="people")  # the filter form: a class, shuffled
    page.fill('input[name="seed"]', "5")
    page.click('button[type="submit"]')
    captions = [c.split(" ", 1)[1] for c in page.locator(".cell .caption").all_inner_texts()]
    assert captions == ["people"] * meta["class_counts"][meta["classes"].index("people")]
    assert "shuffled (seed 5)" in page.locator("h2.gridtitle").inner_text()


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format(page, served, fmt):
    server, folder = served[fmt]
    page.goto(server.url)
    assert page.locator("td.format").inner_text() == fmt
    assert page.locator("td.samples").inner_text() == "28"
    _check_grid(page, server.url, folder, 28)
    page.locator('.cell[data-index="9"] a.open').click()
    assert page.locator("#key").inner_text() == "train/9"
    page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")


def test_clicking_a_sample_shows_caption_and_json(page, served):
    server, _ = served["captions"]
    page.goto(server.url + "grid")
    captions = page.locator(".cell .caption").all_inner_texts()
    assert captions == [f"#{k} {c}" for k, c in enumerate(CAPTIONS.values())]
    page.locator('.cell[data-index="2"] a.open').click()
    assert page.locator("#caption").inner_text() == "Chelsea the cat"
    meta = json.loads(page.locator('tr[data-field="meta"] pre').inner_text())
    assert meta == {"file": "chelsea.png", "rank": 2, "tags": ["photo", "che"]}
    assert page.locator("#source").inner_text().endswith("chelsea.png")
    page.locator("#json").click()
    shown = json.loads(page.locator("body").inner_text())
    assert {f["name"]: f["text"] for f in shown["fields"]}["caption"] == "Chelsea the cat"


def test_coco_boxes_sit_at_their_pixel_coordinates(page, served, tmp_path):
    server, _ = served["coco"]
    for k, (name, boxes) in enumerate(BOXES.items()):
        page.goto(f"{server.url}sample/val/{k}")
        assert page.locator('tr[data-field="file_name"] pre').inner_text() == name
        page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")
        image = page.locator("#image").bounding_box()
        shown = page.locator(".box")
        assert shown.count() == len(boxes)
        for j, (box, category) in enumerate(boxes):
            b = shown.nth(j).bounding_box()
            got = [b["x"] - image["x"], b["y"] - image["y"], b["width"], b["height"]]
            np.testing.assert_allclose(got, box, atol=0.5, err_msg=f"{name} box {j}")
            want = next(c["name"] for c in CATEGORIES if c["id"] == category)
            assert shown.nth(j).get_attribute("data-name") == want and shown.nth(j).inner_text() == want
        if name == "ocelot.jpg":
            _screenshot(page, "view-sample.jpg", tmp_path, full_page=True)


def test_crafted_dotdot_requests_are_refused(page, served):
    server, _ = served["wds"]
    base = server.url.rstrip("/")
    for path in ["/sample/%2e%2e%2f%2e%2e%2fetc%2fpasswd/0", "/image/..%2F..%2F..%2Fetc%2Fpasswd/0",
                 "/grid?split=../../../../etc/passwd", "/image/train/0?field=../../../etc/passwd",
                 "/sample/train/..%2F..%2F..%2Fetc%2Fpasswd"]:
        response = page.goto(base + path)
        assert response.status in (400, 404), path
        assert "root:" not in page.content()
    response = page.request.get(base + "/%2e%2e/%2e%2e/%2e%2e/etc/passwd")
    assert response.status == 404 and b"root:" not in response.body()


def test_a_dataset_on_the_s3_emulator(page, s3_server, generated, tmp_path):
    """Packed to SeaweedFS and viewed from there. The pack and the view's open and close run in a thread of
    their own: Playwright's sync API keeps an event loop running in this one, where s3fs would schedule
    the closing of its connections (and never run it)."""
    from concurrent.futures import ThreadPoolExecutor

    s3_server.start()
    url = s3_server.url(f"view-{uuid.uuid4().hex[:8]}") + "/wds"
    with pytest.MonkeyPatch.context() as mp, ThreadPoolExecutor(1) as aside:
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        aside.submit(pack, generated, url, PackOptions(format="wds", workers=1, shard_count=3),
                     remote=RemoteOptions(stage_dir=tmp_path / "stage")).result()
        view = aside.submit(DatasetView, url).result()
        try:
            with Server(view) as server:
                page.goto(server.url)
                assert page.locator("#path").inner_text() == url
                assert page.locator("td.samples").inner_text() == "28"
                page.goto(server.url + "grid?per=6")
                page.wait_for_function("() => [...document.images].every(i => i.complete && i.naturalWidth > 0)")
                assert page.locator("img.thumb").count() == 6 and page.locator(".err").count() == 0
                page.locator('.cell[data-index="4"] a.open').click()
                page.wait_for_function("() => document.querySelector('#image').naturalWidth > 0")
                assert page.locator("#where").inner_text().startswith(url)
        finally:
            aside.submit(view.close).result()
