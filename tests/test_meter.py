"""readers.meter.StarvationMeter: wait vs step accounting, summary, device copies, profiler trace."""

from __future__ import annotations

import json
import time

import pytest
import torch

from readers.meter import StarvationMeter, verdict


class SleepyLoader:
    """Yields ``n`` batches of ``batch`` samples, sleeping ``delay`` seconds before each."""

    def __init__(self, n: int, delay: float, batch: int = 8, first_delay: float | None = None) -> None:
        self.n, self.delay, self.batch, self.first_delay = n, delay, batch, first_delay

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.first_delay if i == 0 and self.first_delay is not None else self.delay)
            yield torch.zeros(self.batch, 3, 4, 4, dtype=torch.uint8), torch.arange(self.batch)


def run(meter: StarvationMeter, step: float) -> None:
    for _images, _labels in meter:
        time.sleep(step)


SUMMARY_KEYS = {
    "steps", "samples", "wall_s", "total_wait_s", "total_step_s", "first_wait_s", "wait_share",
    "wait_share_pct", "wait_share_incl_first_pct", "wait_p50_ms", "wait_p95_ms", "wait_max_ms", "step_p50_ms",
    "step_p95_ms", "samples_per_s", "steps_per_s", "to_device_s", "to_device_p50_ms", "to_device_source",
    "cuda_sync", "trace", "verdict",
}


def test_loader_bound_share():
    meter = StarvationMeter(SleepyLoader(10, delay=0.04))
    run(meter, step=0.01)
    s = meter.summary()
    assert SUMMARY_KEYS <= set(s)
    assert s["steps"] == 10 and s["samples"] == 80
    # expected 0.04 / 0.05 = 80%; sleeps overshoot on a busy machine, so be generous
    assert 0.55 <= s["wait_share"] <= 0.95, s
    assert s["verdict"].startswith("loader-bound"), s["verdict"]
    assert f"{s['wait_share']:.0%}" in s["verdict"]
    assert 30 <= s["wait_p50_ms"] <= 120
    assert s["wait_p50_ms"] <= s["wait_p95_ms"] <= s["wait_max_ms"]
    assert s["total_wait_s"] >= 0.35 and s["total_step_s"] >= 0.09
    assert s["samples_per_s"] == pytest.approx(80 / s["wall_s"])
    assert s["to_device_s"] is None and s["to_device_source"] is None


def test_compute_bound_share():
    meter = StarvationMeter(SleepyLoader(8, delay=0.005))
    run(meter, step=0.06)
    s = meter.summary()
    # expected 0.005 / 0.065 = 8%
    assert 0.0 <= s["wait_share"] <= 0.3, s
    assert not s["verdict"].startswith("loader-bound") or s["wait_share"] >= 0.2


def test_first_wait_is_startup_not_steady_state():
    meter = StarvationMeter(SleepyLoader(6, delay=0.005, first_delay=0.3))
    run(meter, step=0.03)
    s = meter.summary()
    assert s["first_wait_s"] >= 0.3
    assert s["wait_share"] < 0.4  # steady state: 5 / 35 ms
    assert s["wait_share_incl_first_pct"] > s["wait_share_pct"]


def test_break_early_and_reset():
    meter = StarvationMeter(SleepyLoader(10, delay=0.0))
    for k, _batch in enumerate(meter):
        if k == 2:
            break
    s = meter.summary()
    assert s["steps"] == 2 and len(meter.waits) == 3  # the step that was broken out of is not counted
    meter.reset()
    assert meter.summary()["steps"] == 0
    assert meter.summary()["verdict"] == "no steps measured"
    assert len(meter) == 10


def test_count_and_batch_size():
    class Opaque:
        def __iter__(self):
            yield from (object() for _ in range(3))

    assert StarvationMeter(Opaque(), batch_size=5).summary()["samples"] == 0
    m = StarvationMeter(Opaque(), batch_size=5)
    list(m)
    assert m.summary()["samples"] == 15
    m = StarvationMeter(Opaque(), count=lambda b: 2)
    list(m)
    assert m.summary()["samples"] == 6


def test_to_device_on_cpu_is_timed():
    meter = StarvationMeter(SleepyLoader(4, delay=0.0))
    for images, labels in meter:
        images, labels = meter.to_device((images, labels), "cpu")
        assert images.device.type == "cpu"
    s = meter.summary()
    assert s["to_device_source"] == "meter"
    assert s["to_device_s"] is not None and s["to_device_s"] >= 0
    assert "to device" in meter.report()


def test_record_copy_hook_and_loader_copy_times():
    meter = StarvationMeter(SleepyLoader(2, delay=0.0))
    list(meter)
    meter.record_copy(0.25)
    assert meter.summary()["to_device_s"] == pytest.approx(0.25)

    class WithCopyTimes(SleepyLoader):
        copy_times: list[float] = []

        def __iter__(self):
            for batch in super().__iter__():
                self.copy_times.append(0.01)
                yield batch

    loader = WithCopyTimes(3, delay=0.0)
    loader.copy_times = [0.5]  # from an earlier epoch: not counted
    meter = StarvationMeter(loader)
    list(meter)
    s = meter.summary()
    assert s["to_device_source"] == "loader.copy_times"
    assert s["to_device_s"] == pytest.approx(0.03)


def test_device_prefetcher_copy_times():
    prefetch = pytest.importorskip("readers.prefetch")
    meter = StarvationMeter(prefetch.DevicePrefetcher(SleepyLoader(3, delay=0.0), "cpu"))
    for x, _labels in meter:
        assert x.dtype == torch.float32
    s = meter.summary()
    assert s["to_device_source"] == "loader.copy_times"
    assert s["steps"] == 3


def test_with_a_real_loader(packed_generated):
    from readers import make_loader, open_dataset

    loader = make_loader(open_dataset(packed_generated["mmap"]), batch_size=4, num_workers=0)
    meter = StarvationMeter(loader)
    run(meter, step=0.001)
    s = meter.summary()
    assert s["samples"] == len(loader.dataset)
    assert s["steps"] == len(loader)


def test_profiler_trace(tmp_path):
    meter = StarvationMeter(SleepyLoader(7, delay=0.002), profile_dir=tmp_path / "trace", profile_steps=2)
    for images, _labels in meter:
        (images.float() * 2).sum()
    assert meter.trace_path is not None and meter.trace_path.exists()
    assert meter.trace_path.parent == tmp_path / "trace"
    assert meter.trace_path.stat().st_size < 5_000_000
    trace = json.loads(meter.trace_path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "StarvationMeter.step" in names and "StarvationMeter.wait" in names
    assert meter.summary()["trace"] == str(meter.trace_path)


def test_profiler_with_fewer_steps_than_the_schedule(tmp_path):
    meter = StarvationMeter(SleepyLoader(1, delay=0.0), profile_dir=tmp_path, profile_steps=3)
    list(meter)
    assert meter.summary()["steps"] == 1  # no error; a trace may or may not exist


@pytest.mark.parametrize("share, start", [(None, "no steps"), (0.62, "loader-bound: 62%"),
                                          (0.1, "mostly compute-bound"), (0.01, "compute-bound: the loader")])
def test_verdict(share, start):
    assert verdict(share).startswith(start)


def test_bad_profile_steps():
    with pytest.raises(ValueError):
        StarvationMeter([], profile_steps=0)
