#!/usr/bin/env python
"""Feeding a GPU: pinned vs pageable copies, ToCUDA per batch, prefetch overlap, GPU utilization.

On a CUDA machine it measures, for uint8 image batches of ``--batch`` (256) x 3 x 224 x 224:

* host-to-device bandwidth from pinned and from pageable host memory (GB/s);
* "ToCUDA": the time per batch of ``readers.loader.prefetch.DevicePrefetcher``'s copy + normalize;
* overlap: a loop of a dummy model step (matrix multiplies of ``--step-ms`` about) fed
  synchronously (copy, then step) and through ``DevicePrefetcher`` (copy of batch n+1 on a
  side stream while batch n is used); the closer the prefetched loop's time per batch is to the
  step alone, the better the copy is hidden;
* GPU utilization sampled during the prefetched loop (``torch.cuda.utilization``, which needs
  pynvml; "n/a" without it).

On a machine without CUDA it prints ``no CUDA device: skipped`` and exits 0.

Usage::

    python benchmarks/bench_gpu.py [--batch 256] [--batches 50] [--step-ms 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from readers.loader.prefetch import DevicePrefetcher


def _bandwidth(host: torch.Tensor, repeats: int) -> float:
    """GB/s of ``host`` -> device copies (CUDA events around ``repeats`` copies)."""
    dev = torch.empty(host.shape, dtype=host.dtype, device="cuda")
    dev.copy_(host, non_blocking=True)  # warm up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        dev.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    return host.numel() * host.element_size() * repeats / (start.elapsed_time(end) / 1000) / 1e9


def _dummy_step(size: int, target_ms: float) -> tuple[torch.Tensor, int]:
    """A weight and the number of matmuls that take about ``target_ms`` on this GPU."""
    w = torch.randn(size, size, device="cuda")
    x = torch.randn(size, size, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        x = torch.tanh(x @ w)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 10
    return w, max(1, round(target_ms / 1000 / per))


def _run(batches: list[tuple], w: torch.Tensor, reps: int, prefetch: bool) -> tuple[float, list[float]]:
    """Seconds per batch of the dummy training loop, and GPU utilization samples taken during it."""
    state = torch.randn(w.shape[0], w.shape[0], device="cuda")
    util: list[float] = []
    source = DevicePrefetcher(batches, device="cuda") if prefetch else batches
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k, batch in enumerate(source):
        if not prefetch:  # the copy first, on the compute stream
            images = batch[0].to("cuda", non_blocking=True).float()
        else:
            images = batch[0]
        for _ in range(reps):
            state = torch.tanh(state @ w)
        state = state + images.mean() * 0  # the step uses the batch
        if prefetch and k % 5 == 4:
            try:
                util.append(float(torch.cuda.utilization()))
            except (RuntimeError, ModuleNotFoundError):  # no pynvml / NVML
                pass
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / len(batches), util


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--step-ms", type=float, default=20.0, help="time of one dummy model step")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return
    shape = (args.batch, 3, 224, 224)
    pageable = torch.randint(0, 256, shape, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    out = {"device": torch.cuda.get_device_name(), "batch": args.batch,
           "pinned_gb_s": _bandwidth(pinned, 20), "pageable_gb_s": _bandwidth(pageable, 20)}
    labels = torch.zeros(args.batch, dtype=torch.int64)
    batches = [(pinned.clone().pin_memory(), labels) for _ in range(min(args.batches, 8))]
    batches = [batches[k % len(batches)] for k in range(args.batches)]
    pre = DevicePrefetcher(batches, device="cuda")
    for _ in pre:
        pass
    stats = pre.stats()
    out["tocuda_ms_median"] = stats["copy_s_median"] * 1000
    w, reps = _dummy_step(2048, args.step_ms)
    step_alone, _ = _run([(torch.zeros(1, dtype=torch.uint8).pin_memory(), labels)] * args.batches, w, reps, True)
    synchronous, _ = _run(batches, w, reps, False)
    prefetched, util = _run(batches, w, reps, True)
    out.update(step_ms=step_alone * 1000, synchronous_ms=synchronous * 1000, prefetched_ms=prefetched * 1000,
               gpu_util_median=statistics.median(util) if util else None)
    print(f"device: {out['device']}, batch {args.batch} x 3 x 224 x 224 uint8 "
          f"({pinned.numel() / 2**20:.0f} MiB)")
    print(f"host->device: pinned {out['pinned_gb_s']:.1f} GB/s, pageable {out['pageable_gb_s']:.1f} GB/s")
    print(f"ToCUDA (DevicePrefetcher copy + normalize): {out['tocuda_ms_median']:.2f} ms per batch (median)")
    print(f"per batch: step alone {out['step_ms']:.1f} ms, copy then step {out['synchronous_ms']:.1f} ms, "
          f"prefetched {out['prefetched_ms']:.1f} ms")
    print("GPU utilization (prefetched loop): "
          + (f"{out['gpu_util_median']:.0f}%" if out["gpu_util_median"] is not None else "n/a (no pynvml)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
