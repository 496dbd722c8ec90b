"""The built wheel holds exactly the packages ``packer``, ``readers`` and ``dataset_bench``, and,
installed (not editable) into a fresh virtualenv, works with no checkout around: ``pack-dataset``,
``pack-dataset info``, ``dataset-bench --generate 200 --quick``, and ``dataset-bench --chart`` without
matplotlib fails at once, saying what to install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
EXCLUDE = {".git", ".venv", "build", "dist", "out", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}


def sh(cmd: list, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return r


def clean_env(bindir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel`` builds from a copy of the checkout."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"  # a copy of the checkout (dataset_bench/photos copied as files): the build leaves the repo alone
    shutil.copytree(REPO, src, ignore=lambda d, names: [n for n in names if n in EXCLUDE or n.endswith(".egg-info")])
    build = sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src],
               tmp, dict(os.environ))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [built] = list((tmp / "dist").glob("dataset_packer-*.whl"))
    return built


@pytest.mark.slow
def test_wheel_holds_exactly_three_packages(wheel):
    """packer, readers and dataset_bench: no ``bench`` (a PyPI project of that name exists), no ``benchmarks``,
    no tests or notebooks; the bundled photos ride along and ``dataset-bench`` points into dataset_bench."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"packer", "readers", "dataset_bench"}, sorted(top)
    photos = [n for n in names if n.startswith("dataset_bench/photos/")]
    assert "dataset_bench/photos/SOURCES.md" in photos and sum(n.endswith(".jpg") for n in photos) >= 10
    assert "dataset-bench = dataset_bench.cli:main" in scripts and "pack-dataset = packer.cli:main" in scripts


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel) -> tuple[Path, dict, Path]:
    """(bin folder of a fresh venv holding the installed wheel, its environment, a work folder outside the repo)."""
    tmp = tmp_path_factory.mktemp("wheel")
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(tmp / "venv")
    bindir = tmp / "venv" / "bin"
    env = clean_env(bindir)
    torch_pin = "torch==" + torch.__version__.split("+")[0]
    (tmp / "constraints.txt").write_text(torch_pin + "\n")
    for args in ([torch_pin], ["-c", tmp / "constraints.txt", wheel]):  # torch first: the local CPU build
        r = sh([bindir / "python", "-m", "pip", "install", "-q", *args], tmp, env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    work = tmp / "elsewhere"
    work.mkdir()
    return bindir, env, work


@pytest.mark.slow
def test_wheel_is_a_real_install(installed):
    bindir, env, work = installed
    r = sh([bindir / "python", "-c", "import packer, readers, dataset_bench.synth as s; "
            "print(packer.__file__); print(s.BUNDLED_PHOTOS)"], work, env)
    assert r.returncode == 0, r.stderr
    for line in r.stdout.splitlines():
        assert "site-packages" in line and str(REPO) not in line, line
    photos = Path(r.stdout.splitlines()[1])
    assert len(list(photos.glob("*/*.jpg"))) >= 10 and (photos / "SOURCES.md").is_file()


@pytest.mark.slow
def test_pack_and_info_from_the_wheel(installed, real_images):
    bindir, env, work = installed
    data = work / "data"
    for cls in ("animals", "people"):
        shutil.copytree(real_images / cls, data / cls)
    out = work / "out" / "nested" / "wds"  # parents missing: created
    r = sh([bindir / "pack-dataset", data, "-f", "wds", "-o", out, "-q"], work, env, 300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("data: 10 images, 2 classes")
    r = sh([bindir / "pack-dataset", "info", out, "--json"], work, env, 120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["state"] == "complete" and info["samples"] == 10
    r = sh([bindir / "pack-dataset", "verify", out, "-q"], work, env, 120)
    assert r.returncode == 0 and "OK" in r.stdout


@pytest.mark.slow
def test_dataset_bench_generate_from_the_wheel(installed):
    bindir, env, work = installed
    r = sh([bindir / "dataset-bench", "--generate", "200", "--quick", "--no-progress", "--json", work / "run.json"],
           work, env, 900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((work / "run.json").read_text())
    assert result["rows"], result.keys()


@pytest.mark.slow
def test_chart_without_matplotlib_fails_before_measuring(installed):
    bindir, env, work = installed
    assert sh([bindir / "python", "-c", "import matplotlib"], work, env).returncode != 0  # not installed there
    t0 = time.perf_counter()
    r = sh([bindir / "dataset-bench", "--generate", "200", "--chart", work / "x.png"], work, env, 300)
    seconds = time.perf_counter() - t0
    assert r.returncode == 2 and "pip install 'dataset-packer[bench]'" in r.stderr and "Traceback" not in r.stderr
    assert seconds < 60 and not (work / "x.png").exists()
