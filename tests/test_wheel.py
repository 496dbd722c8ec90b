"""The built wheel holds exactly the packages ``packer``, ``readers`` and ``dataset_bench``, and,
installed (not editable) into a fresh virtualenv, works with no checkout around: ``pack-dataset``,
``pack-dataset info``, ``dataset-bench --generate 48 --quick``, and ``dataset-bench --chart`` without
matplotlib fails at once, saying what to install.

The native region decoder (``readers/decode/_jpegcrop.c``, the optional extension of ``setup.py``): the wheel
holds its source and, where a C compiler and ``jpeglib.h`` exist, the built library, through which
the installed readers decode a region; a build without a compiler still succeeds, without it."""

from __future__ import annotations

import json
import os
import shutil
import importlib.machinery
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from readers.contract.messages import one_line

REPO = Path(__file__).resolve().parent.parent
#: Not copied into the build folder: git, the venv, build outputs and the caches beside the sources (CI's checkout
#: holds Azurite's node_modules in .cache, which scripts/test.sh installs, and mypy's cache: both ignored by git)
EXCLUDE = {".git", ".venv", "build", "dist", "out", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", ".cache",
           ".mypy_cache", ".hypothesis"}
NATIVE_SOURCE = "readers/decode/_jpegcrop.c"
#: The built decoder in a wheel for this interpreter (setup.py's extension readers.decode._jpegcrop).
NATIVE_BUILT = "readers/decode/_jpegcrop" + importlib.machinery.EXTENSION_SUFFIXES[0]
NOT_BUILT = "the native region decoder readers.decode._jpegcrop was not built"
#: The native tar walk of pack-dataset index (setup.py's extension packer.tools._tarwalk): needs a C compiler only.
TARWALK_SOURCE, TARWALK_BUILT = "packer/tools/_tarwalk.c", "packer/tools/_tarwalk" + importlib.machinery.EXTENSION_SUFFIXES[0]
TARWALK_NOT_BUILT = "the native tar walk packer.tools._tarwalk was not built"
#: The batch gather of whole-batch reads (setup.py's extension readers.formats._gather): needs a C compiler only.
GATHER_SOURCE, GATHER_BUILT = "readers/formats/_gather.c", "readers/formats/_gather" + importlib.machinery.EXTENSION_SUFFIXES[0]
GATHER_NOT_BUILT = "the native batch gather readers.formats._gather was not built"


def sh(cmd: list, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return r


def clean_env(bindir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def build_wheel(src: Path, dist: Path, env: dict) -> tuple[Path, str]:
    """(the wheel ``pip wheel`` builds from ``src`` into ``dist``, the build's output); the next build
    of ``src`` starts afresh (no ``build/`` left whose compiled decoder it would reuse)."""
    build = sh([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", dist, src],
               src.parent, env)
    shutil.rmtree(src / "build", ignore_errors=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [built] = list(dist.glob("dataset_packer-*.whl"))
    return built, build.stdout + build.stderr


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout (dataset_bench/photos copied as files; no built decoder): builds leave the repo alone."""
    src = tmp_path_factory.mktemp("build") / "src"
    shutil.copytree(REPO, src, ignore=lambda d, names: [n for n in names if n in EXCLUDE or n.endswith(".egg-info")
                                                        or n.endswith(".so")])
    return src


@pytest.fixture(scope="module")
def wheel(source) -> Path:
    """The wheel ``pip wheel`` builds from a copy of the checkout."""
    return build_wheel(source, source.parent / "dist", dict(os.environ))[0]


@pytest.fixture(scope="module")
def native_blocker(tmp_path_factory) -> str | None:
    """Why the package build cannot compile the native decoder here (no C compiler, no ``jpeglib.h``, no
    libjpeg to link), or None: a probe with the compiler setuptools uses, independent of setup.py."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not shutil.which(cc[0]):
        return f"no C compiler ({cc[0]}) to build the native region decoder"
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "probe.c").write_text("#include <stdio.h>\n#include <jpeglib.h>\n"
                                 "int probe(void) { struct jpeg_error_mgr e; return jpeg_std_error(&e) != 0; }\n")
    r = subprocess.run([*cc, "-shared", "-fPIC", "-o", tmp / "probe.so", tmp / "probe.c", "-ljpeg"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"{cc[0]} cannot build against libjpeg here: {one_line(r.stderr or r.stdout, first=True)}"
    return None


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


@pytest.mark.slow
def test_wheel_holds_the_native_decoder(wheel, native_blocker):
    """Its C source always; the library built for this platform where a compiler and jpeglib.h exist."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert NATIVE_SOURCE in names and TARWALK_SOURCE in names and GATHER_SOURCE in names
    if native_blocker:
        pytest.skip(native_blocker)
    assert NATIVE_BUILT in names, sorted(n for n in names if n.startswith("readers/decode/_"))
    assert TARWALK_BUILT in names, sorted(n for n in names if n.startswith("packer/tools/_"))
    assert GATHER_BUILT in names, sorted(n for n in names if n.startswith("readers/formats/_"))
    assert wheel.name.endswith(f"-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}.whl"), wheel.name


@pytest.mark.slow
def test_a_build_without_a_compiler_succeeds_without_the_decoder(source, tmp_path):
    """No C compiler (CC names none): the wheel builds, says why in one warning, and holds the source only."""
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    built, output = build_wheel(source, tmp_path / "dist", env)
    with zipfile.ZipFile(built) as z:
        names = z.namelist()
    assert NATIVE_SOURCE in names and not [n for n in names if n.startswith("readers/decode/_jpegcrop") and n.endswith(".so")]
    assert TARWALK_SOURCE in names and not [n for n in names if n.startswith("packer/tools/_") and n.endswith(".so")]
    [warning] = [line.strip() for line in output.splitlines() if NOT_BUILT in line]
    assert "no-such-cc" in warning and "jpeglib.h" in warning and "decode whole JPEGs" in warning, warning
    [warning] = [line.strip() for line in output.splitlines() if TARWALK_NOT_BUILT in line]
    assert "no-such-cc" in warning and "walks tar headers in Python" in warning, warning
    assert GATHER_SOURCE in names and not [n for n in names if n.startswith("readers/formats/_") and n.endswith(".so")]
    [warning] = [line.strip() for line in output.splitlines() if GATHER_NOT_BUILT in line]
    assert "no-such-cc" in warning and "copy with numpy" in warning, warning


@pytest.mark.slow
def test_sdist_holds_the_native_source(source, tmp_path):
    """The sdist (setuptools' PEP 517 hook, as ``python -m build --sdist`` calls it) holds setup.py and the C files."""
    hook = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    r = sh([sys.executable, "-c", hook, tmp_path], source, dict(os.environ))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sdist = tmp_path / r.stdout.split()[-1]
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {NATIVE_SOURCE, TARWALK_SOURCE, GATHER_SOURCE, "setup.py", "pyproject.toml"} <= names


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
        # --no-compile: pip would byte-compile every module of torch; a module is compiled when first imported
        r = sh([bindir / "python", "-m", "pip", "install", "-q", "--no-compile", *args], tmp, env)
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
def test_region_decode_through_the_wheel(installed, native_blocker):
    """The installed readers load the decoder from site-packages and decode a region with it: rows above
    the region are skipped (top > 0), and the pixels equal Pillow's full decode."""
    if native_blocker:
        pytest.skip(native_blocker)
    bindir, env, work = installed
    rng = np.random.default_rng(0)
    image = work / "region.jpg"
    Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)).save(image, quality=90)
    code = (
        "import sys, numpy as np\n"
        "from PIL import Image\n"
        "from readers.decode import jpegcrop\n"
        "from readers.decode.decoders import decode_rgb_region\n"
        "print(jpegcrop.native_path())\n"
        "assert jpegcrop.available(), 'jpegcrop not available'\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "full = np.asarray(Image.open(sys.argv[1]).convert('RGB'))\n"
        "pixels, top, left = decode_rgb_region(data, 1, (120, 160), (100, 150))\n"
        "assert 0 < top <= 120 and pixels.shape[0] < 240, (top, pixels.shape)\n"
        "assert np.array_equal(pixels[120 - top:160 - top, 100 - left:150 - left], full[120:160, 100:150])\n"
    )
    r = sh([bindir / "python", "-c", code, image], work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    native = Path(r.stdout.splitlines()[0])
    assert native.name == Path(NATIVE_BUILT).name and "site-packages" in native.parts and REPO not in native.parents


@pytest.mark.slow
def test_pack_and_info_from_the_wheel(installed, real_images):
    bindir, env, work = installed
    data = work / "data"
    for cls in ("animals", "people"):
        shutil.copytree(real_images / cls, data / cls)
    out = work / "out" / "nested" / "wds"  # parents missing: created
    r = sh([bindir / "pack-dataset", data, "-f", "wds", "-o", out, "-q"], work, env, 300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("data: 10 samples, 2 classes")
    r = sh([bindir / "pack-dataset", "info", out, "--json"], work, env, 120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["state"] == "complete" and info["samples"] == 10
    r = sh([bindir / "pack-dataset", "verify", out, "-q"], work, env, 120)
    assert r.returncode == 0 and "OK" in r.stdout


@pytest.mark.slow
def test_dataset_bench_generate_from_the_wheel(installed):
    bindir, env, work = installed
    r = sh([bindir / "dataset-bench", "--generate", "48", "--quick", "--no-progress", "--json", work / "run.json"],
           work, env, 900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((work / "run.json").read_text())
    assert result["rows"], result.keys()


@pytest.mark.slow
def test_chart_without_matplotlib_fails_before_measuring(installed):
    bindir, env, work = installed
    assert sh([bindir / "python", "-c", "import matplotlib"], work, env).returncode != 0  # not installed there
    tmp = work / "tmp-chart"  # where --generate would write its images: nothing is generated or measured
    tmp.mkdir()
    r = sh([bindir / "dataset-bench", "--generate", "200", "--chart", work / "x.png"], work, dict(env, TMPDIR=str(tmp)),
           300)
    assert r.returncode == 2 and "pip install 'dataset-packer[bench]'" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp.iterdir()) == [] and not (work / "x.png").exists() and r.stdout == "", r.stdout
