"""Shared fixtures (the bundled real photos, a generated ImageNet-like folder, packed datasets)
and the police that fail a test which leaves threads or file descriptors behind.

The tests' oracles live in ``tests/reference.py``.

Which tests are ``@pytest.mark.slow`` (one rule, also in pyproject.toml's marker line): a test
that starts a subprocess, uses the spawn or forkserver start method or a DataLoader with
worker processes (``num_workers > 0``), or takes more than about 2 s on the 2-core dev
machine (``python -m pytest --durations=0``). ``pytest -m "not slow"`` is the quick loop.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing.resource_tracker
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer import PackOptions, pack
from readers.contract.spec import FORMATS
from reference import stored_samples

REPO = Path(__file__).resolve().parent.parent
REAL_IMAGES = REPO / "examples" / "real-images"


def make_image_folder(root: Path, classes: int = 3, per_class: int = 5, size=(96, 80), seed: int = 0,
                      png_every: int = 4) -> Path:
    """An ImageFolder tree of small random-content JPEGs (and some PNGs), deterministic."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = size[0] + int(rng.integers(0, 24)), size[1] + int(rng.integers(0, 24))
            base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
            if png_every and i % png_every == png_every - 1:
                img.save(d / f"img_{i:03d}.png", "PNG")
            else:
                img.save(d / f"img_{i:03d}.JPEG", "JPEG", quality=85)
    (root / "class_00" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="session")
def real_images() -> Path:
    return REAL_IMAGES


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("gen") / "train", classes=4, per_class=7)


def _pack(src: Path, out: Path, fmt: str, **kw) -> Path:
    opts = PackOptions(format=fmt, workers=kw.pop("workers", 1), **kw)
    pack(src, out, opts)
    return out


def _pack_all(src: Path, root: Path, shard_count: int, workers: int = 1) -> dict[str, Path]:
    """format -> dataset folder of ``src``, packed into every format (wds with small uneven shards)."""
    return {fmt: _pack(src, root / fmt, fmt, workers=workers, **({"shard_count": shard_count} if fmt == "wds" else {}))
            for fmt in FORMATS}


@pytest.fixture(scope="session")
def packed_generated(tmp_path_factory, generated):
    """format -> dataset folder of the generated folder."""
    return _pack_all(generated, tmp_path_factory.mktemp("packed-gen"), shard_count=5)


_CACHE_DIR: str | None = None
_OWN_CACHE = "DATASET_PACKER_TEST_CACHE"  # the DATASET_PACKER_CACHE that a pytest process of this suite made


_TMP_ROOT: str | None = None
_OWN_TMP = "DATASET_PACKER_TEST_TMP"  # the temp root that the controlling pytest process of this run made
_PASSED = False
_WIDS_DEFAULT = "/tmp/_wids_cache"
_WIDS_DEFAULT_EXISTED = os.path.exists(_WIDS_DEFAULT)


def _make_temp_root() -> None:
    """One temp folder for the whole run, made by the controlling process (xdist workers, servers and every
    subprocess inherit it through TMPDIR): pytest's tmp_path folders, multiprocessing's pymp-*, torchrun's
    torchelastic_*, Jupyter kernels, Ray's session folders, SeaweedFS logs, wids' download cache, the packer's
    task files all go there, and a passing run removes it whole. The prefix is short: Ray's socket paths
    under it must stay below the 107-byte limit of a Unix socket name."""
    global _TMP_ROOT
    import tempfile

    if os.environ.get(_OWN_TMP):
        return  # an xdist worker (or a nested run): the controller's root is already TMPDIR
    _TMP_ROOT = tempfile.mkdtemp(prefix="dp-tests-")
    os.environ[_OWN_TMP] = os.environ["TMPDIR"] = _TMP_ROOT
    os.environ["WIDS_CACHE"] = os.path.join(_TMP_ROOT, "_wids_cache")  # wids' default is /tmp/_wids_cache
    tempfile.tempdir = _TMP_ROOT  # this process may have asked for the temp folder already


def pytest_sessionfinish(session, exitstatus):
    global _PASSED
    _PASSED = exitstatus == 0


def _remove_temp_root(config) -> None:
    if _TMP_ROOT is None:
        return
    import shutil

    if _PASSED:
        shutil.rmtree(_TMP_ROOT, ignore_errors=True)
        if not _WIDS_DEFAULT_EXISTED:  # importing wids makes it, whatever WIDS_CACHE says (a default argument of
            try:                       # wids.LRUShards.__init__ is evaluated at import); ours if new and empty
                os.rmdir(_WIDS_DEFAULT)
            except OSError:
                pass
    else:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"the run's temp files are kept in {_TMP_ROOT}")


def pytest_configure(config):
    """The readers' record of checked indexes (readers.contract.checkcache) goes to a folder of this process, not
    to ~/.cache: set before any fixture packs or opens a dataset, inherited by subprocesses. Each
    pytest-xdist worker makes its own (it would otherwise inherit the controller's): no test sees
    records that a test on another worker wrote."""
    global _CACHE_DIR
    _make_temp_root()
    inherited = os.environ.get("DATASET_PACKER_CACHE")
    if inherited is None or inherited == os.environ.get(_OWN_CACHE):
        import tempfile

        _CACHE_DIR = tempfile.mkdtemp(prefix="dataset-packer-test-cache-")
        os.environ["DATASET_PACKER_CACHE"] = os.environ[_OWN_CACHE] = _CACHE_DIR


def pytest_unconfigure(config):
    if _CACHE_DIR is not None:
        import shutil

        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
        os.environ.pop("DATASET_PACKER_CACHE", None)
        os.environ.pop(_OWN_CACHE, None)
    _remove_temp_root(config)


# ----------------------------------------------------------------------------- parallel runs (pytest-xdist)
# scripts/test.sh runs the suite on one worker more than there are cores (``-n cores+1``). Each worker is a pytest session of its own (its
# own session fixtures, servers on free ports, temp and cache folders). The scheduler below sends a module
# whole to one worker, so that its module-scoped fixtures are built once; the Ray modules share one worker
# (two Ray clusters on one machine would both want Ray's fixed ports); the tests of SPREAD modules go one by
# one to whichever worker is free. (xdist's own ``xdist_group`` marks do nothing under pytest 9: xdist
# renames ``item._nodeid``, which pytest 9 no longer reads.)
SPREAD = {
    "test_notebooks", "test_fuzz", "test_bench", "test_bench_peers", "test_bench_fields", "test_bench_convert",
    "test_bench_gpu", "test_bench_pack", "test_bench_readers", "test_bench_scale", "test_bench_train",
}
GROUPS = {"test_ray_engine": "ray", "test_ray_parts": "ray", "test_ray_s3": "ray"}
# Started first, longest first (measured: docs/measuring.md), so that no long test is what the last worker
# still runs at the end; every other module follows in the collection's order.
FIRST = ["test_notebooks", "test_bench_scale", "test_bench_peers", "test_fuzz", "test_ray_engine", "test_ray_s3",
         "test_ray_parts", "test_bench_train", "test_bench_readers", "test_bench_pack", "test_bench_convert",
         "test_bench_fields", "test_bench", "test_remote_convert", "test_reliability", "test_readme", "test_wheel"]


def work_unit(nodeid: str) -> str:
    """What the parallel run keeps on one worker: the test alone, its module's group, or its module."""
    path = nodeid.split("::", 1)[0]
    module = Path(path).stem
    return nodeid if module in SPREAD else GROUPS.get(module, path)


def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (xdist's ``--dist load``): a scheduler of :func:`work_unit`s in the collection's order."""
    if config.getoption("dist") not in ("load", "loadgroup"):
        return None  # an explicit --dist loadfile, loadscope, each, worksteal: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # the order is FIRST's, then the collection's (below)
    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(session, config, items):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order its scheduler hands out work in
        rank = {name: k for k, name in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(item.path.stem, len(FIRST)))  # stable: each module keeps its order


@pytest.fixture(scope="session")
def packed_real(tmp_path_factory, real_images):
    """format -> dataset folder of the bundled real photos."""
    return _pack_all(real_images, tmp_path_factory.mktemp("packed-real"), shard_count=7, workers=2)


@pytest.fixture(autouse=True)
def thread_police():
    """Fail a test that leaves non-daemon threads running."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    assert not leaked, f"test left threads running: {leaked}"


def _open_fds() -> dict[int, str]:
    """fd -> what it points to (``os.readlink`` of /proc/self/fd/N), for this process."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (e.g. the directory listdir itself opened)
            pass
    return out


_FIXTURE_FDS: set[tuple[int, str]] = set()  # (fd, target) opened by module/session fixtures


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Remember the descriptors a longer-lived fixture opens, even one first requested inside a test."""
    if fixturedef.scope == "function":
        return (yield)
    before = set(_open_fds().items())
    try:
        return (yield)
    finally:
        opened = set(_open_fds().items()) - before
        _FIXTURE_FDS.update(opened)
        fixturedef.addfinalizer(lambda: _FIXTURE_FDS.difference_update(opened))


# Descriptors that libraries open once and keep for the life of the process (caches, not leaks):
# by what they point to ...
_PROCESS_LIFETIME = {
    "/dev/shm/pym-": "multiprocessing's shared heap arena (RawValue/Value), reused by later allocations",
    "/matplotlib/mpl-data/fonts/": "matplotlib's cache of loaded fonts",
}


def _process_lifetime_fds() -> set[int]:
    """... and by owner, for pipes and sockets: multiprocessing's resource tracker (started by the
    first spawn, one per process), and the asyncio event loop that jupyter_core (under nbclient)
    keeps set for the thread and reuses (its epoll descriptor and self-pipe socket pair)."""
    fds = set()
    tracker = getattr(multiprocessing.resource_tracker, "_resource_tracker", None)
    if getattr(tracker, "_fd", None) is not None:
        fds.add(tracker._fd)
    loop = getattr(getattr(asyncio.get_event_loop_policy(), "_local", None), "_loop", None)
    if loop is not None and not loop.is_closed():
        for owner in (getattr(loop, "_selector", None), getattr(loop, "_ssock", None), getattr(loop, "_csock", None)):
            if owner is not None:
                fds.add(owner.fileno())
    return fds


def _leaked_fds(before: set[tuple[int, str]], grace_s: float = 2.0, socket_grace_s: float = 6.0) -> list[tuple[int, str]]:
    """Descriptors open now that were not in ``before``, nor opened by a longer-lived fixture,
    nor one of the libraries' process-lifetime descriptors (above).

    Collects garbage (objects the test dropped are finalized) and waits up to ``grace_s`` for
    descriptors being closed asynchronously: a multiprocessing queue's daemon feeder thread
    (DataLoader workers' index queues) closes its pipe when it has flushed, a moment after the
    queue is closed. Sockets get ``socket_grace_s``: an aiohttp connection is closed by fsspec's
    event-loop thread, which a loaded 2-core machine may not schedule for a while. Neither wait
    costs anything when nothing is left open.
    """
    start = time.monotonic()
    while True:
        lifetime = _process_lifetime_fds()
        leaked = sorted((fd, target) for fd, target in set(_open_fds().items()) - before - _FIXTURE_FDS
                        if fd not in lifetime and not any(part in target for part in _PROCESS_LIFETIME))
        waited = time.monotonic() - start
        if not leaked or waited > socket_grace_s or (
                waited > grace_s and not all(t.startswith("socket:") for _, t in leaked)):
            return [(fd, _described(target)) for fd, target in leaked]
        gc.collect()
        time.sleep(0.02)


def _described(target: str) -> str:
    """``socket:[INODE]`` with its TCP endpoints (``127.0.0.1:41234 -> 127.0.0.1:10000``), so that a leak
    names the server it talks to; anything else as it is."""
    if not target.startswith("socket:["):
        return target
    inode = target[len("socket:["):-1]
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[9] == inode:
                def addr(hexed: str) -> str:
                    host, port = hexed.split(":")
                    ip = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(host) == 8 else host
                    return f"{ip}:{int(port, 16)}"
                return f"{target} (tcp {addr(cols[1])} -> {addr(cols[2])})"
    return target


@pytest.fixture(autouse=True)
def fd_police():
    """Fail a test that leaves file descriptors open (files, pipes, sockets, memory-mapped files).

    Compares /proc/self/fd before and after the test, after a garbage collection (so objects the
    test dropped are finalized) and a short grace for asynchronous closes; descriptors opened by
    module- or session-scoped fixtures are theirs to keep.
    """
    before = set(_open_fds().items())
    yield
    leaked = _leaked_fds(before)
    assert not leaked, "test left file descriptors open: " + ", ".join(f"fd {fd} -> {t}" for fd, t in leaked)


@pytest.fixture(scope="session")
def stored_bytes():
    """``stored_bytes(root, i)``: the bytes stored for sample ``i`` of the dataset folder ``root``."""
    cache: dict[Path, list[bytes]] = {}

    def get(root, i: int) -> bytes:
        root = Path(root)
        if root not in cache:
            if len(cache) >= 2:  # real-photo mmap packs are ~150 MB: keep few
                cache.pop(next(iter(cache)))
            cache[root] = stored_samples(root)
        return cache[root][i]

    return get

