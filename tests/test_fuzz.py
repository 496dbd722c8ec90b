"""Fuzz: mutate a small dataset of each format; readers and verify fail cleanly or read the original data.

For every format, a seeded loop mutates one thing per case in a fresh copy
of a small packed dataset: a field of ``index.json`` (deleted, retyped, set
to hostile values such as ``../canary/evil.tar``, ``/dev/zero``, 2**63), the
``.npy`` index arrays (bytes flipped, truncated, values set out of range, with
the checksum in ``index.json`` left alone or crafted to match), or the data
files (bytes flipped or zeroed, truncated, extended, replaced by a FIFO, a
folder, or a symlink to a copy outside the folder). Then, in a child process:

* opening and reading every sample either gives the original (label, bytes)
  or raises ``DatasetFormatError`` whose message names a path in the folder;
* ``packer.tools.verify.verify`` either raises ``DatasetFormatError`` (naming the
  folder) or returns a report; if reading gave other data, the report is not
  OK, and if the report is OK, reading gave the original data;
* no other exception type, no crash (the child dying is a failure), no hang
  (each case has a timeout), and no file outside the folder is opened (an
  audit hook watches every ``open``; the canary copies outside the folder
  hold valid data, so reading them would otherwise go unnoticed).

Bounded in time: each format runs cases for ``FUZZ_SECONDS`` (default 10: some 300 cases on
the 2-core machine; ``FUZZ_SECONDS=60`` for a longer hunt) after the child has started.
``FUZZ_SEED`` changes the seed (default 0); a failing case prints its number and mutation so it
can be replayed.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from packer import PackOptions, pack
from readers.contract import spec
from reliability_helpers import env

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("FUZZ_SECONDS", "10"))
SEED = int(os.environ.get("FUZZ_SEED", "0"))
CASE_TIMEOUT = 30.0
MIN_CASES = 20  # at least: cases after the budget's end (one child more) where the machine is slow

_CHILD = textwrap.dedent(r'''
    import json, os, random, shutil, sys, time
    from pathlib import Path
    import numpy as np

    pristine, scratch, canary = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    seed, first, seconds = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    FORBIDDEN = (os.path.realpath(canary), "/etc/passwd", "/dev/zero")
    opened = []

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            try:
                opened.append(os.path.realpath(os.fsdecode(args[0])))
            except (TypeError, ValueError):
                pass

    from readers import open_dataset
    from readers.contract import spec
    from packer.tools.verify import verify

    def read_all(root):
        ds = open_dataset(root, decode=False)
        try:
            return [(int(ds.labels[i]), bytes(np.asarray(ds.read(i)).tobytes() if ds.format == "mmap" else ds.read(i)))
                    for i in range(len(ds.labels))]
        finally:
            ds.close()

    ORIGINAL = read_all(pristine)
    sys.addaudithook(hook)

    HOSTILE = [None, True, False, -1, 0, 1, 7, 2**31, 2**63, -2**63, 1.5, float("nan"), "", "x", "../x",
               "/etc/passwd", "/dev/zero", "../canary/evil.tar", "a/../../b", [], {}, [1], {"a": 1}, "\u0000"]

    def leaves(obj, path=()):
        yield path
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from leaves(v, path + (k,))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                yield from leaves(v, path + (i,))

    def mutate_json(d, rng):
        path = d / "index.json"
        m = json.loads(path.read_text())
        where = rng.choice([p for p in leaves(m) if p])
        parent = m
        for k in where[:-1]:
            parent = parent[k]
        key, op = where[-1], rng.choice(["delete", "hostile", "nudge"])
        if op == "delete" and isinstance(parent, dict):
            del parent[key]
        elif op == "nudge" and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] += rng.choice([-1, 1, -512, 512, 10**9])
        else:
            parent[key] = rng.choice(HOSTILE)
        path.write_text(json.dumps(m))
        return f"index.json {'/'.join(map(str, where))}: {op}"

    def flip(path, rng, count, zero=False):
        data = bytearray(path.read_bytes())
        if not data:
            return "empty"
        at = rng.randrange(len(data))
        for j in range(count):
            k = min(len(data) - 1, at + j) if zero else rng.randrange(len(data))
            data[k] = 0 if zero else data[k] ^ (1 << rng.randrange(8))
        path.write_bytes(bytes(data))
        return f"{'zeroed' if zero else 'flipped'} {count} at {at}"

    def replace(path, rng):
        how = rng.choice(["fifo", "folder", "outside", "missing", "truncate", "extend"])
        if how == "truncate":
            os.truncate(path, rng.randrange(path.stat().st_size + 1))
        elif how == "extend":
            with open(path, "ab") as f:
                f.write(bytes(rng.randrange(1, 70000)))
        else:
            saved = path.read_bytes()
            path.unlink()
            if how == "fifo":
                os.mkfifo(path)
            elif how == "folder":
                path.mkdir()
            elif how == "outside":
                copy = canary / f"{path.name}.{rng.randrange(10**9)}"
                copy.write_bytes(saved)
                path.symlink_to(copy)
        return how

    def mutate_array(d, rng):
        names = sorted(p.name for p in d.glob("*.npy") if p.name != spec.DATA_FILE.get("mmap"))
        name = rng.choice(names)
        path = d / name
        op = rng.choice(["flip", "value", "value", "replace"])
        if op == "flip":
            what = flip(path, rng, rng.choice([1, 1, 4]))
        elif op == "replace":
            what = replace(path, rng)
        else:
            arr = np.load(path)
            if len(arr):
                value = rng.choice([-1, 0, 1, 2, 255, 2**31 - 1, -2**31, 10**6])
                arr[rng.randrange(len(arr))] = np.array([value], dtype=np.int64).astype(arr.dtype)[0]  # wraps
            np.save(path, arr)
            what = "value"
        crafted = rng.random() < 0.5 and name[:-4] in spec.ARRAY_DTYPES and path.is_file()
        if crafted:  # index.json made to agree: only the range checks can catch it
            m = json.loads((d / "index.json").read_text())
            data = path.read_bytes()
            m.setdefault(spec.ARRAYS_KEY, {})[name[:-4]] = {"crc32": spec.checksum(data), "bytes": len(data)}
            (d / "index.json").write_text(json.dumps(m))
        return f"{name}: {op} {what}" + (" (checksum made to match)" if crafted else "")

    def mutate_data(d, rng):
        names = sorted(p.name for p in d.iterdir() if p.suffix in (".tar", ".mdb", ".h5")
                       or p.name in (spec.HDF5_CHUNK_TABLE, spec.DATA_FILE["mmap"]))
        names = [n for n in names if n != "lock.mdb"]
        path = d / rng.choice(names)
        op = rng.choice(["flip", "flip", "zero", "replace"])
        if op == "flip":
            what = flip(path, rng, rng.choice([1, 1, 2, 8]))
        elif op == "zero":
            what = flip(path, rng, rng.choice([16, 512, 4096]), zero=True)
        else:
            what = replace(path, rng)
        return f"{path.name}: {op} {what}"

    def names_a_file(msg, d):
        return str(d) in msg

    def run_case(k):
        rng = random.Random(seed * 1_000_003 + k)
        d = scratch / f"case{k}"
        shutil.copytree(pristine, d, symlinks=True)
        kind = rng.choice(["json", "array", "data", "data"])
        desc = {"json": mutate_json, "array": mutate_array, "data": mutate_data}[kind](d, rng)
        print(json.dumps({"case": k, "mutation": desc}), flush=True)
        problems = []
        opened.clear()
        read, read_error = None, None
        try:
            read = read_all(d)
        except spec.DatasetFormatError as exc:
            read_error = str(exc)
            if not names_a_file(read_error, d):
                problems.append(f"read error names no file: {read_error}")
        except Exception as exc:
            problems.append(f"reading raised {type(exc).__name__}: {exc}")
        report = None
        try:
            report = verify(d)
        except spec.DatasetFormatError as exc:
            if not names_a_file(str(exc), d):
                problems.append(f"verify error names no file: {exc}")
        except Exception as exc:
            problems.append(f"verify raised {type(exc).__name__}: {exc}")
        if report is not None and report.ok and read != ORIGINAL:  # verify must see what reading sees
            problems.append(f"verify said OK but reading gave {'an error: ' + str(read_error) if read is None else 'other data'}")
        if report is not None:
            for p in report.problems:
                if str(d) not in p.where:
                    problems.append(f"verify problem names no file in the folder: {p}")
        bad = sorted({p for p in opened if any(p == f or p.startswith(f + "/") for f in FORBIDDEN)})
        if bad:
            problems.append(f"opened files outside the dataset folder: {bad}")
        outcome = "read" if read == ORIGINAL else "error" if read is None else "other-data"
        print(json.dumps({"case": k, "problems": problems, "outcome": outcome,
                          "verified": None if report is None else report.ok}), flush=True)
        shutil.rmtree(d, ignore_errors=True)

    k = first
    deadline = time.time() + seconds  # from here: the imports (torch) above are not the budget's
    while time.time() < deadline:
        run_case(k)
        k += 1
    print(json.dumps({"done": k}), flush=True)
''')


def _tiny(root: Path, fmt: str) -> Path:
    from conftest import make_image_folder

    src = root / "src"
    if not src.exists():
        make_image_folder(src, classes=3, per_class=3, size=(40, 32), png_every=3)
    kw = {"shard_count": 4} if fmt == "wds" else {}
    pack(src, root / fmt, PackOptions(format=fmt, workers=1, **kw))
    return root / fmt


def _run(pristine: Path, scratch: Path, canary: Path, seed: int, first: int, seconds: float) -> subprocess.Popen:
    """The fuzz child: cases from ``first`` on, for ``seconds`` after its imports."""
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(pristine), str(scratch), str(canary), str(seed),
                             str(first), str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env())


def _lines(proc: subprocess.Popen, timeout: float):
    """Lines of the child's stdout, or None when it stays silent for ``timeout`` seconds."""
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            yield None
            return
        line = proc.stdout.readline()
        if not line:
            return
        yield line


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_fuzz_readers_and_verify(tmp_path, fmt):
    pristine = _tiny(tmp_path, fmt)
    scratch, canary = tmp_path / "scratch", tmp_path / "canary"
    scratch.mkdir()
    canary.mkdir()
    (canary / "evil.tar").write_bytes(next(pristine.glob("*.tar")).read_bytes() if fmt == "wds" else b"canary")
    seed = SEED * 10 + spec.FORMATS.index(fmt)
    failures, cases, outcomes, first = [], 0, {}, 0
    left = SECONDS  # seconds of cases: a child's start (its torch import, long on a loaded machine) is not counted
    while left > 0 or (cases < MIN_CASES and not failures):  # a loaded machine: more time, not fewer cases
        proc = _run(pristine, scratch, canary, seed, first, max(left, 3.0))
        current, started = None, None
        for line in _lines(proc, CASE_TIMEOUT):
            started = started or time.time()  # the first case began about now
            if line is None:
                failures.append(f"case {current}: no answer in {CASE_TIMEOUT:.0f} s (a hang)")
                proc.kill()
                break
            msg = json.loads(line)
            if "mutation" in msg:
                current = msg
            elif "problems" in msg:
                cases += 1
                outcomes[msg["outcome"]] = outcomes.get(msg["outcome"], 0) + 1
                failures += [f"case {msg['case']} ({current['mutation']}): {p}" for p in msg["problems"]]
                current = None
            elif "done" in msg:
                first = msg["done"]
        _, err = proc.communicate(timeout=60)
        left -= time.time() - started if started else left
        if proc.returncode != 0 and current is not None:
            failures.append(f"case {current['case']} ({current['mutation']}): the child died "
                            f"(exit {proc.returncode}): {err[-500:]}")
        elif proc.returncode != 0:
            failures.append(f"the fuzz child failed (exit {proc.returncode}): {err[-2000:]}")
            break
        if current is None:  # ran to its deadline
            if cases >= MIN_CASES or failures:
                break
            continue  # too few cases on a slow machine: one more child, from where this one stopped ("done")
        first = current["case"] + 1  # restart after the case that killed it
    print(f"\n[fuzz {fmt}] {cases} cases, seed {seed}: {outcomes}")
    assert cases >= MIN_CASES, f"only {cases} cases ran"
    assert not failures, "\n".join(failures[:20])
