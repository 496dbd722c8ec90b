"""readers.loader.meter.StarvationMeter: wait vs step accounting, summary, device copies, profiler trace."""

from __future__ import annotations

import json
import time

import pytest
import torch

from readers.loader import meter as meter_module
from readers.loader.meter import StarvationMeter, verdict


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


class Clock:
    """A stand-in for ``time.perf_counter`` that only moves when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TimedLoader:
    """Yields one batch of ``batch`` samples per entry of ``waits``, each after ``waits[i]`` seconds of ``clock``."""

    def __init__(self, clock: Clock, waits: list[float], batch: int = 8) -> None:
        self.clock, self.waits, self.batch = clock, waits, batch

    def __len__(self) -> int:
        return len(self.waits)

    def __iter__(self):
        for wait in self.waits:
            self.clock.advance(wait)
            yield torch.zeros(self.batch, 3, 4, 4, dtype=torch.uint8), torch.arange(self.batch)


class _TimeWith:
    """The ``time`` module, except for ``perf_counter``."""

    def __init__(self, perf_counter: Clock) -> None:
        self.perf_counter = perf_counter

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The meter's clock, driven by the test: every wait and step takes exactly the time it says."""
    clock = Clock()
    monkeypatch.setattr(meter_module, "time", _TimeWith(clock))
    return clock


def measure(clock: Clock, waits: list[float], steps: list[float], **kw) -> StarvationMeter:
    meter = StarvationMeter(TimedLoader(clock, waits), cuda_sync=False, **kw)
    for k, _batch in enumerate(meter):
        clock.advance(steps[k])
    return meter


# Times are multiples of 1/128 s, so the sums below are exact in binary floating point.
def test_loader_bound_verdict(clock):
    # wait 1/4 s, step 1/16 s: 80% of the time waiting for data
    meter = measure(clock, [0.25] * 10, [0.0625] * 10)
    s = meter.summary()
    assert SUMMARY_KEYS <= set(s)
    assert s["steps"] == 10 and s["samples"] == 80
    assert s["wait_share"] == pytest.approx(0.8) and s["wait_share_pct"] == pytest.approx(80.0)
    assert s["verdict"] == "loader-bound: 80% of time waiting for data"
    assert meter.report().splitlines()[-1] == s["verdict"]
    assert s["wait_p50_ms"] == s["wait_p95_ms"] == s["wait_max_ms"] == pytest.approx(250.0)
    assert s["step_p50_ms"] == pytest.approx(62.5)
    assert s["total_wait_s"] == pytest.approx(2.5) and s["total_step_s"] == pytest.approx(0.625)
    assert s["wall_s"] == pytest.approx(3.125)
    assert s["samples_per_s"] == pytest.approx(80 / 3.125) and s["steps_per_s"] == pytest.approx(10 / 3.125)
    assert s["to_device_s"] is None and s["to_device_source"] is None


def test_compute_bound_verdict(clock):
    # wait 1/128 s, step 1/4 s: 3% of the time waiting for data
    s = measure(clock, [0.0078125] * 8, [0.25] * 8).summary()
    assert s["wait_share"] == pytest.approx(0.0078125 / 0.2578125)
    assert s["verdict"] == "compute-bound: the loader keeps up (3% of time waiting for data)"


def test_mostly_compute_bound_verdict(clock):
    # wait 1/32 s, step 1/4 s: 11% of the time waiting for data
    s = measure(clock, [0.03125] * 6, [0.25] * 6).summary()
    assert s["verdict"] == "mostly compute-bound: 11% of time waiting for data"


def test_threshold_moves_the_loader_bound_line(clock):
    waits, steps = [0.0625] * 5, [0.1875] * 5  # 25% waiting
    assert measure(clock, waits, steps).summary()["verdict"] == "loader-bound: 25% of time waiting for data"
    s = measure(clock, waits, steps, threshold=0.5).summary()
    assert s["verdict"] == "mostly compute-bound: 25% of time waiting for data"


def test_first_wait_is_startup_not_steady_state(clock):
    # a 2 s start-up (workers, opening files), then 1/128 s waits under 1/8 s steps
    meter = measure(clock, [2.0] + [0.0078125] * 5, [0.125] * 6)
    s = meter.summary()
    assert s["first_wait_s"] == pytest.approx(2.0)
    assert s["wait_share"] == pytest.approx(0.0078125 / 0.1328125)  # steps 2..6 only
    assert s["verdict"] == "mostly compute-bound: 6% of time waiting for data"
    assert s["wait_share_incl_first_pct"] == pytest.approx(100 * (2.0 + 5 * 0.0078125) / (2.0 + 5 * 0.0078125 + 0.75))
    assert s["wait_max_ms"] == pytest.approx(7.8125)  # the start-up is not a steady-state wait
    assert "first batch 2.00 s" in meter.report()


def test_one_step_uses_that_step(clock):
    s = measure(clock, [0.5], [0.5]).summary()
    assert s["steps"] == 1 and s["verdict"] == "loader-bound: 50% of time waiting for data"


def test_real_clock_counts_at_least_the_time_slept():
    meter = StarvationMeter(SleepyLoader(5, delay=0.02))
    run(meter, step=0.01)
    s = meter.summary()
    assert s["steps"] == 5 and s["samples"] == 40
    assert s["total_wait_s"] >= 5 * 0.02 and s["total_step_s"] >= 5 * 0.01  # sleep never returns early
    assert s["wall_s"] >= s["total_wait_s"] + s["total_step_s"]
    assert s["wait_p50_ms"] <= s["wait_p95_ms"] <= s["wait_max_ms"]


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
    prefetch = pytest.importorskip("readers.loader.prefetch")
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


@pytest.mark.parametrize("share, expected", [
    (None, "no steps measured"),
    (0.62, "loader-bound: 62% of time waiting for data"),
    (0.2, "loader-bound: 20% of time waiting for data"),  # the default threshold is loader-bound
    (0.1, "mostly compute-bound: 10% of time waiting for data"),
    (0.01, "compute-bound: the loader keeps up (1% of time waiting for data)"),
])
def test_verdict(share, expected):
    assert verdict(share) == expected


def test_bad_profile_steps():
    with pytest.raises(ValueError):
        StarvationMeter([], profile_steps=0)
