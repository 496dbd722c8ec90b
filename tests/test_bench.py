"""dataset_bench (``dataset-bench``): generator, cache control, measurements, report, CLI, the layer rule."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dataset_bench import machine
from dataset_bench.cache import CacheControl
from dataset_bench.cli import main
from dataset_bench.isolate import run_isolated
from dataset_bench.limits import decode_rates
from dataset_bench.measure import eval_transform, measure_format, measure_loader
from dataset_bench.naive import NaiveImageFolder, naive_load
from dataset_bench.plan import BenchConfig, plan_cases
from dataset_bench.report import draw_chart, format_limits, format_table, headline, report_text
from dataset_bench.results import BenchResult, add_ratios
from dataset_bench.run import BenchProgress, run_benchmark
from dataset_bench.synth import generate_image_folder
from dataset_bench.targets import dataset_target

REPO = Path(__file__).resolve().parent.parent


def _fs_type(path: Path) -> str:
    """Filesystem type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", ""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mnt, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fstype
    except OSError:
        pass
    return kind


# --------------------------------------------------------------------------- generator


def test_generate_image_folder(tmp_path):
    seen = []
    root = generate_image_folder(tmp_path / "a", 12, classes=3, seed=1, progress=seen.append)
    files = sorted(root.rglob("*.JPEG"))
    assert len(files) == 12 and seen == [12]
    assert len([p for p in root.iterdir() if p.is_dir()]) == 3
    sizes = []
    for f in files:
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            w, h = im.size
            assert 420 <= w <= 540 and 340 <= h <= 460
        sizes.append(f.stat().st_size)
    assert 40_000 < np.mean(sizes) < 250_000  # ~100 KB, like ImageNet
    again = generate_image_folder(tmp_path / "b", 12, classes=3, seed=1, threads=1)
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in sorted(again.rglob("*.JPEG"))]
    with pytest.raises(ValueError):
        generate_image_folder(tmp_path / "c", 0)


# --------------------------------------------------------------------------- page cache, memory


def test_cache_control_evicts_and_verifies(tmp_path):
    cache = CacheControl()
    if not (cache.can_evict and cache.can_verify):
        pytest.skip("posix_fadvise or mincore not available here")
    if _fs_type(tmp_path) in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"{tmp_path} is on {_fs_type(tmp_path)}: its pages cannot be evicted")
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(4 << 20))
    cache.warm([f])
    assert cache.resident_fraction([f]) > 0.9
    cache.evict([f])
    assert cache.resident_fraction([f]) < 0.1
    assert cache.resident(f)[1] == (4 << 20) // os.sysconf("SC_PAGE_SIZE")
    empty = tmp_path / "empty"
    empty.touch()
    assert cache.resident(empty) == (0, 0)


def test_pss():
    assert machine.pss_bytes(os.getpid()) > 1_000_000
    main_pss, workers = machine.process_tree_pss()
    assert main_pss > 0 and workers >= 0
    assert machine.pss_bytes(2**22 + 12345) is None  # no such process


def test_machine_info():
    info = machine.machine_info()
    for key in ("hostname", "cpu_model", "usable_cpus", "ram_gb", "python", "torch", "decoders"):
        assert info[key], key
    assert info["usable_cpus"] >= 1
    assert info["cpu_model"] in machine.machine_label(info)


# --------------------------------------------------------------------------- measuring


def test_naive_image_folder(generated):
    ds = NaiveImageFolder(generated)
    assert len(ds) == 28  # 4 classes x 7 (notes.txt is not an image)
    x, label = ds[5]
    assert x.dtype == torch.float32 and x.shape == (3, 224, 224)
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert label == ds.labels[5]


def test_naive_baseline_sees_what_the_eval_transform_sees():
    """Same geometry (readers.decode.geometry): the naive crop and the readers' eval crop are the same picture."""
    from readers.decode.transforms import imagenet_eval_transform

    rng = np.random.default_rng(0)
    for w, h in ((500, 375), (333, 500), (257, 256)):
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], axis=-1).astype(np.uint8)
        img = np.clip(img.astype(int) + rng.integers(-3, 4, img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "PNG")
        naive = (naive_load(io.BytesIO(buf.getvalue())) * 255).round().to(torch.uint8)
        ours = imagenet_eval_transform(backend="pillow")(img)
        assert naive.shape == ours.shape == (3, 224, 224)
        assert (naive.int() - ours.int()).abs().float().mean() < 2.0, (w, h)


def test_measure_loader_counts_and_pss():
    batches = [(torch.zeros(4, 3), torch.zeros(4)) for _ in range(5)]
    seen = []
    stats = measure_loader(lambda: batches, bytes_per_sample=1e6, on_batch=seen.append)
    assert stats.samples == 20 and stats.batches == 5 and len(seen) == 5
    assert stats.samples_per_s > 0 and stats.first_batch_s >= 0
    assert stats.mb_per_s == pytest.approx(stats.samples_per_s)
    assert stats.pss_main_mb > 0 and stats.pss_workers_mb == 0
    short = measure_loader(lambda: batches, max_samples=7)
    assert short.samples == 8


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5", "mmap"])
def test_measure_format(packed_generated, fmt):
    from readers import make_loader, open_dataset

    target = dataset_target(packed_generated[fmt])
    assert target.name == fmt and target.samples == 28 and target.files
    for mode in ("raw", "decoded"):
        stats = measure_format(target.path, mode=mode, num_workers=0, batch_size=8,
                               bytes_per_sample=target.bytes_per_sample)
        assert stats.samples == 28 and stats.batches == 4 and stats.mb_per_s > 0
    shapes = []
    ds = open_dataset(target.path, transform=eval_transform())
    measure_loader(lambda: make_loader(ds, batch_size=8, num_workers=0), on_batch=lambda b: shapes.append(b[0].shape))
    assert all(s[1:] == (3, 224, 224) for s in shapes)
    with pytest.raises(ValueError):
        measure_format(target.path, mode="jpeg", num_workers=0, batch_size=8)


@pytest.mark.slow  # subprocess
def test_run_isolated(packed_generated):
    path = packed_generated["wds"]
    stats = run_isolated(measure_format, {"path": path, "mode": "raw", "num_workers": 1, "batch_size": 8,
                                          "workers": "processes"},  # (the default, threads, has no worker PSS)
                               torch_threads=1)
    assert stats.samples == 28 and stats.pss_main_mb > 0 and stats.pss_workers_mb > 0
    with pytest.raises(RuntimeError, match="ValueError"):
        run_isolated(measure_format, {"path": path, "mode": "jpeg", "num_workers": 0, "batch_size": 8})


def test_decode_rates(generated):
    files = NaiveImageFolder(generated).files
    before = torch.get_num_threads()
    probe = 3 if before != 3 else 2  # a count decode_rates' own setting (1) cannot be mistaken for
    torch.set_num_threads(probe)
    try:
        rates = decode_rates(files, limit=5)
        assert torch.get_num_threads() == probe  # restored to what it was, not left at 1
    finally:
        torch.set_num_threads(before)
    assert {"pil_decode", "decode_rgb", "eval_transform", "naive_item"} <= set(rates)
    for v in rates.values():
        assert v["images"] == 5 and v["images_per_s"] > 0


# --------------------------------------------------------------------------- config, report


def test_config_validation():
    with pytest.raises(ValueError, match="nothing to measure"):
        BenchConfig()
    with pytest.raises(ValueError, match="unknown formats"):
        BenchConfig(generate=4, formats=("zip",))
    with pytest.raises(ValueError):
        BenchConfig(generate=4, workers=(-1,))
    quick = BenchConfig.quick_defaults()
    assert quick.quick and quick.repeats == 1 and quick.generate and not quick.isolate
    assert BenchConfig(generate=4).isolate
    assert BenchConfig.quick_defaults(src="x").generate is None


def test_plan_cases():
    cfg = BenchConfig(generate=4, workers=(0, 2), caches=("warm", "cold"))
    cases = plan_cases(cfg, ["naive", "wds", "mmap"])
    assert len(cases) == len(set(cases)) == 2 * 2 * (1 + 2 * 2)  # caches x workers x (naive + 2 formats x 2 modes)
    assert {c.mode for c in cases if c.target == "naive"} == {"decoded"}
    assert [c.cache for c in cases] == sorted((c.cache for c in cases), key=("warm", "cold").index)
    assert all(cases[i].target == "naive" for i in range(0, len(cases), 5))  # the baseline leads each group


def _fake_result() -> BenchResult:
    rows = []
    for cache in ("warm", "cold"):
        for w in (0, 2):
            rows.append({"target": "naive", "mode": "decoded", "workers": w, "cache": cache,
                         "samples_per_s": 100.0 * (w + 1), "mb_per_s": 10.0, "first_batch_s": 0.5,
                         "pss_total_mb": 300.0, "pss_workers_mb": 100.0 * w, "x_naive": None})
            for fmt, speed in (("wds", 3.0), ("mmap", 9.0)):
                for mode in ("raw", "decoded"):
                    rows.append({"target": fmt, "mode": mode, "workers": w, "cache": cache,
                                 "samples_per_s": speed * 100.0 * (w + 1) * (3 if mode == "raw" else 1),
                                 "mb_per_s": 30.0, "first_batch_s": 0.1, "pss_total_mb": None,
                                 "pss_workers_mb": None})
    add_ratios(rows)
    return BenchResult(machine=machine.machine_info(), config={"workers": [0, 2], "batch_size": 64, "repeats": 3},
                       targets=[{"name": "naive", "samples": 10, "data_mb": 1.0, "files": 10}], rows=rows,
                       limits={"sequential_read": {"wds": {"files": 1, "cold": {"mb": 1.0, "mb_per_s": 100.0},
                                                           "warm": {"mb": 1.0, "mb_per_s": 1000.0}}},
                               "decode_single_core": {"pil_decode": {"images_per_s": 250.0, "mb_per_s": 25.0}}},
                       notes=["a note"], transform="T()")


def test_ratios_table_headline_chart(tmp_path):
    result = _fake_result()
    r = result.row("mmap", "decoded", 2, "warm")
    assert r["x_naive"] == pytest.approx(9.0)
    assert result.row("mmap", "raw", 2, "warm")["x_naive"] is None
    assert result.row("naive", "decoded", 0, "cold")["x_naive"] == pytest.approx(1.0)
    table = format_table(result)
    assert table.count("\n") == 2 + len(result.rows) - 1
    assert "| decoded | warm | 2 | mmap | 2,700 | 30.0 | 9.00x |" in table
    lines = headline(result)
    assert len(lines) == 4 and "mmap 9.0x" in lines[0] and "naive" not in lines[0].split(":")[1].split("the")[0]
    limits = format_limits(result)
    assert "| wds (1 files) | 1.0 | 100 | 1,000 |" in limits and "PIL decode" in limits
    png = draw_chart(result, tmp_path / "img" / "chart.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = result.save_json(tmp_path / "r.json")
    assert BenchResult.load_json(saved).rows == json.loads(json.dumps(result.rows))
    assert "a note" in report_text(result)


def test_cli_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--workers", "a,b"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--formats", "zip", "--generate", "3"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main([])  # nothing to measure
    assert exc.value.code == 2
    assert "nothing to measure" in capsys.readouterr().err


def test_cli_reports_failures(tmp_path, capsys):
    assert main(["--src", str(tmp_path / "missing"), "--no-progress", "--quick"]) == 1
    assert "dataset-bench: error" in capsys.readouterr().err


# --------------------------------------------------------------------------- whole runs


@pytest.mark.slow
def test_run_benchmark_on_given_datasets(packed_generated):
    """--datasets without --src: the baseline reads the source recorded in the index."""
    seen: list[BenchProgress] = []
    result = run_benchmark(datasets=tuple(str(p) for p in packed_generated.values()), workers=(0,),
                           caches=("warm",), repeats=1, batch_size=8, limits=False, progress=seen.append,
                           isolate=False)  # in this process: test_run_isolated covers the fresh interpreter
    assert {r["target"] for r in result.rows} == {"naive", "wds", "lmdb", "hdf5", "mmap"}
    assert len(result.rows) == 1 + 4 * 2
    # one report as each of the 9 cases starts, then the end; counts only go up
    assert [p.done for p in seen] == list(range(10)) and {p.total for p in seen} == {9}
    assert seen[-1].step == "done" and "mmap decoded w=0 warm" in seen[-2].step
    assert all(r["samples"] == 28 for r in result.rows)
    assert any("source recorded" in n for n in result.notes)
    assert result.limits == {}


@pytest.mark.slow
def test_quick_cli_end_to_end(tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert main(["--quick", "--no-progress", "--json", str(out_json), "--chart", str(out_png)]) == 0
    printed = capsys.readouterr().out
    assert "| mode | cache | workers | reader |" in printed and "machine:" in printed
    assert "raw limits" in printed
    data = json.loads(out_json.read_text())
    assert set(data) >= {"machine", "config", "targets", "rows", "limits", "notes", "transform", "seconds"}
    # naive (decoded) + 4 formats x 2 modes, for 2 worker counts and 2 cache states
    assert len(data["rows"]) == (1 + 4 * 2) * 2 * 2
    for row in data["rows"]:  # 3 batches a pass: timed, but refused as a figure (too short a window)
        assert row["samples"] == 48 and row["repeats"]["samples_per_s"][0] > 0 and row["first_batch_s"] > 0
        assert row["pss_total_mb"] > 0 and row["window_batches"] <= 2
        assert row["refused"] and row["samples_per_s"] is None and row["x_naive"] is None
    assert "REFUSED" in printed
    cold = [r for r in data["rows"] if r["cache"] == "cold"]
    cache = CacheControl()
    if cache.can_evict and cache.can_verify and _fs_type(Path(os.environ.get("TMPDIR", "/tmp"))) != "tmpfs":
        assert all(r["cached_after_evict"] is not None and r["cached_after_evict"] < 0.05 for r in cold)
    assert set(data["limits"]["sequential_read"]) == {"naive", "wds", "lmdb", "hdf5", "mmap"}
    assert data["limits"]["decode_single_core"]["pil_decode"]["images_per_s"] > 0
    assert out_png.stat().st_size > 10_000
