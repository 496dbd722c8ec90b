"""``packer.pack_map``: a function mapped over inputs, in input order, into one Writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packer import MapError, PackOptions, pack_map
from packer.errors import PackError
from packer.cli import main as cli_main
from readers import open_dataset
from readers.contract import spec

N = 100


def render(i: int):
    """Input ``i``: two samples (a generator) when i % 10 == 3, none when i % 10 == 7, else one."""
    def one(k: int) -> dict:
        arr = np.random.default_rng(k).integers(0, 256, (8 + k % 5, 12, 3), dtype=np.uint8)
        return {"image": arr, "label": k % 3, "caption": f"input {k}"}
    if i % 10 == 7:
        return None
    if i % 10 == 3:
        return (one(i * 1000 + j) for j in range(2))
    return [one(i)] if i % 2 else one(i)


def files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def opts() -> PackOptions:
    return PackOptions(format="wds", shard_count=4)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack_map")
    done = {}
    for workers in (0, 1, 2):
        out = root / f"w{workers}"
        done[workers] = (out, pack_map(render, range(N), out, workers=workers, options=opts(),
                                       classes=["a", "b", "c"]))
    return done


def test_output_bytes_do_not_depend_on_the_worker_count(outputs):
    (out0, r0), (out1, r1), (out2, r2) = outputs[0], outputs[1], outputs[2]
    want = files(out0)
    assert spec.INDEX_NAME in want and any(name.endswith(".tar") for name in want)
    assert files(out1) == want and files(out2) == want
    assert r0.inputs == r1.inputs == r2.inputs == N and r0.samples == r1.samples == r2.samples


def test_generator_list_and_none_returns_in_input_order(outputs):
    out, result = outputs[2]
    expected = [c for i in range(N) if i % 10 != 7
                for c in ([f"input {i * 1000 + j}" for j in range(2)] if i % 10 == 3 else [f"input {i}"])]
    assert result.samples == len(expected) == 100 and result.rejects == ()
    ds = open_dataset(out, fields=("caption", "label"), decode=False, shuffle=False, pad=False)
    try:
        got = list(ds)
    finally:
        ds.close()
    assert [c for c, _ in got] == expected
    assert cli_main(["verify", str(out)]) == 0


def flaky(item) -> dict:
    i = item["id"] if isinstance(item, dict) else item
    if i == 5:
        raise ValueError("bad record\nsecond line")
    return render(0 if i % 10 in (3, 7) else i)


def reject_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / spec.REJECTS_NAME).read_text(encoding="utf-8").splitlines()]


def test_a_failing_input_is_one_reject_naming_it_in_the_result_and_rejects_jsonl(tmp_path):
    got = {}
    for workers in (0, 2):
        out = tmp_path / f"w{workers}"
        result = pack_map(flaky, [{"id": i} for i in range(20)], out, workers=workers, options=opts())
        assert result.rejects == ("input 5 ({'id': 5}): ValueError: bad record second line",)
        assert result.inputs == 20 and result.samples == 19
        assert result.result is not None and result.result.rejected == 1 and result.result.images == 19
        assert json.loads((out / spec.INDEX_NAME).read_text())["num_samples"] == 19
        assert reject_lines(out) == [{"path": "input 5 ({'id': 5})", "reason": "ValueError: bad record second line"}]
        got[workers] = files(out)
    assert got[0] == got[2]  # rejects.jsonl included


@pytest.mark.parametrize("workers", [0, 2])
def test_failures_before_the_first_sample_are_rejects_in_their_places(tmp_path, workers):
    def first_two_fail(i: int):
        if i < 2:
            raise OSError(f"cannot read record {i}")
        return render(2 * i)

    out = tmp_path / "o"
    result = pack_map(first_two_fail, range(6), out, workers=workers, options=opts())
    assert [r["path"] for r in reject_lines(out)] == ["input 0 (0)", "input 1 (1)"]
    assert reject_lines(out)[1]["reason"] == "OSError: cannot read record 1"
    assert result.samples == 4 and result.result is not None and result.result.rejected == 2
    ds = open_dataset(out, fields=("caption",), decode=False, shuffle=False, pad=False)
    try:
        assert [c for (c,) in ds] == [f"input {2 * i}" for i in range(2, 6)]
    finally:
        ds.close()


def test_a_job_whose_every_input_fails_packs_nothing_and_says_how_many(tmp_path):
    def fails(i: int):
        raise ValueError(i)

    with pytest.raises(PackError, match=r"no sample was written \(3 rejected\); nothing was packed"):
        pack_map(fails, range(3), tmp_path / "o", options=opts())


@pytest.mark.parametrize("workers", [0, 2])
def test_on_error_raise_stops_with_one_line_naming_the_input(tmp_path, workers):
    with pytest.raises(MapError) as info:
        pack_map(flaky, list(range(20)), tmp_path / "o", workers=workers, options=opts(), on_error="raise")
    assert str(info.value) == "input 5 (5): ValueError: bad record second line"
    assert not (tmp_path / "o" / spec.INDEX_NAME).exists()


def test_progress_callback_counts_inputs(tmp_path):
    ticks: list[int] = []
    pack_map(render, range(12), tmp_path / "o", options=opts(), progress=ticks.append)
    assert sum(ticks) == 12


def test_a_lambda_runs_in_workers_and_a_generator_failing_midway_is_one_reject(tmp_path):
    def gen(i: int):
        yield render(2)
        if i == 2:
            raise KeyError("caption")
        yield render(4) if i != 3 else [render(4)]

    result = pack_map(lambda i: gen(i), range(4), tmp_path / "o", workers=2, options=opts())  # fn is never pickled
    assert result.rejects == ("input 2 (2): KeyError: 'caption'",
                              "input 3 (3): TypeError: fn gave a list among its samples; expected sample dicts")
    assert result.samples == 4  # the failing input's first sample is not written either


def test_an_interrupted_job_resumes_to_the_uninterrupted_bytes(tmp_path, outputs):
    out = tmp_path / "o"

    def dies_at_70(i: int):
        if i == 70:
            raise RuntimeError("killed")
        return render(i)

    with pytest.raises(MapError):
        pack_map(dies_at_70, range(N), out, workers=2, options=opts(), classes=["a", "b", "c"], on_error="raise")
    assert (out / spec.STATE_NAME).exists() and not (out / spec.INDEX_NAME).exists()
    result = pack_map(render, range(N), out, workers=2, options=opts(), classes=["a", "b", "c"], resume=True)
    assert result.result is not None and result.result.resumed_from > 0
    assert files(out) == files(outputs[0][0])
    again = pack_map(render, range(N), out, options=opts(), classes=["a", "b", "c"], resume=True)  # complete: no-op
    assert again.samples == 100 and files(out) == files(outputs[0][0])


class Stop(Exception):
    """Raised by the progress callback: the job stops there (the Writer aborted, resumable)."""


def test_a_resumed_job_with_rejects_is_byte_for_byte_the_uninterrupted_one(tmp_path):
    def fails_at_5_and_41(i: int):
        if i in (5, 41):
            raise ValueError(f"bad {i}")
        return render(i)

    ref, out = tmp_path / "ref", tmp_path / "o"
    done = pack_map(fails_at_5_and_41, range(N), ref, options=opts(), classes=["a", "b", "c"])
    assert len(done.rejects) == 2

    def stop_at_70(n: int, seen=[0]) -> None:  # noqa: B006 - the count of inputs so far
        seen[0] += n
        if seen[0] == 70:
            raise Stop

    with pytest.raises(Stop):
        pack_map(fails_at_5_and_41, range(N), out, workers=2, options=opts(), classes=["a", "b", "c"],
                 progress=stop_at_70)
    assert (out / spec.STATE_NAME).exists() and not (out / spec.INDEX_NAME).exists()
    result = pack_map(fails_at_5_and_41, range(N), out, workers=2, options=opts(), classes=["a", "b", "c"],
                      resume=True)
    assert result.result is not None and result.result.resumed_from > 0 and result.result.rejected == 2
    assert result.rejects == done.rejects
    assert files(out) == files(ref)
    assert [r["path"] for r in reject_lines(out)] == ["input 5 (5)", "input 41 (41)"]
    again = pack_map(fails_at_5_and_41, range(N), out, options=opts(), classes=["a", "b", "c"], resume=True)
    assert again.rejects == done.rejects and files(out) == files(ref)  # complete: the rejects count, nothing written


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "mmap"])
def test_every_file_of_each_format_does_not_depend_on_the_worker_count(tmp_path, fmt):
    got = {}
    for workers in (0, 1, 2):
        out = tmp_path / f"w{workers}"
        pack_map(flaky, range(40), out, workers=workers, options=PackOptions(format=fmt), classes=["a", "b", "c"])
        got[workers] = files(out)
        # lmdb's lock.mdb is left out: it is LMDB's run-time lock file, not data; its reader table
        # holds the id of the thread that opened the environment (it differs between two runs in
        # two processes at byte 146, while data.mdb is the same), and no reader needs its contents.
        # Nothing else holds a time or a path: the index names its source "packer.Writer", hdf5
        # datasets are made with track_times=False.
        got[workers].pop("lock.mdb", None)
    assert spec.INDEX_NAME in got[0] and spec.REJECTS_NAME in got[0] and len(got[0]) > 3
    assert got[1] == got[0] and got[2] == got[0]


def test_writer_reject_takes_a_place_in_the_sequence_and_one_rejects_line(tmp_path):
    from packer import UsageError, Writer

    out = tmp_path / "o"
    with Writer(out, format="mmap", on_error="raise") as w:  # reject() is the caller's: on_error does not apply
        w.reject("record a", "unreadable\nat byte 3")
        w.write(render(2))
        w.reject("record c", "ValueError: no caption")
        w.write(render(4))
        assert w.count == 4
    assert w.result is not None and w.result.images == 2 and w.result.rejected == 2
    assert reject_lines(out) == [{"path": "record a", "reason": "unreadable at byte 3"},
                                 {"path": "record c", "reason": "ValueError: no caption"}]
    assert json.loads((out / spec.INDEX_NAME).read_text())["num_samples"] == 2
    with pytest.raises(UsageError, match="this Writer is closed"):
        w.reject("late", "too late")


def test_an_unknown_engine_is_one_line(tmp_path):
    from packer import UsageError

    with pytest.raises(UsageError, match=r"^engine must be 'local' or 'ray', got 'spark'$"):
        pack_map(lambda i: None, range(3), tmp_path / "out", format="wds", engine="spark")
    assert not (tmp_path / "out").exists()
