"""Measurement: how fast the packed formats feed a ``DataLoader``, beside a naive baseline, on this machine.

The top layer of the project: ``bench`` -> ``packer`` -> ``readers`` ->
``readers.spec``. Nothing below imports it. One module per job:

* :mod:`bench.machine` -- the machine: CPUs, RAM, CPU model, PSS, other load;
* :mod:`bench.cache` -- page-cache control: eviction, residency check, sequential read;
* :mod:`bench.synth` -- the ImageNet-like folder generator;
* :mod:`bench.naive` -- the naive PIL-per-file baseline;
* :mod:`bench.targets` -- what is read: packed datasets (packed on demand), the source folder;
* :mod:`bench.measure` -- one loader measurement (:class:`~bench.measure.LoaderStats`);
* :mod:`bench.limits` -- the machine's raw read and decode rates;
* :mod:`bench.plan`, :mod:`bench.isolate`, :mod:`bench.run` -- a ``dataset-bench`` run:
  its configuration and cases, one fresh process per measurement, the run itself;
* :mod:`bench.results`, :mod:`bench.report` -- the result as plain data / JSON, and as
  tables, headline and chart;
* :mod:`bench.remote`, :mod:`bench.servers` -- ``dataset-bench --remote``: reading from a
  loopback S3 server (SeaweedFS) against the official reader and the local disk; the real
  servers (SeaweedFS, nginx) that it and the tests start;
* :mod:`bench.cli` -- the ``dataset-bench`` command (the only place with argparse and
  progress bars).

The names below are importable from ``bench`` directly (lazily: ``import bench``
costs nothing).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_benchmark": "bench.run",
    "Progress": "bench.run",
    "BenchConfig": "bench.plan",
    "BenchResult": "bench.results",
    "LoaderStats": "bench.measure",
    "measure_loader": "bench.measure",
    "measure_format": "bench.measure",
    "measure_naive": "bench.measure",
    "eval_transform": "bench.measure",
    "NaiveImageFolder": "bench.naive",
    "naive_load": "bench.naive",
    "naive_loader": "bench.naive",
    "CacheControl": "bench.cache",
    "sequential_read": "bench.cache",
    "CpuMonitor": "bench.machine",
    "machine_info": "bench.machine",
    "machine_label": "bench.machine",
    "pss_bytes": "bench.machine",
    "process_tree_pss": "bench.machine",
    "generate_image_folder": "bench.synth",
    "make_imagenet_like": "bench.synth",
    "SynthOptions": "bench.synth",
    "pack_formats": "bench.targets",
    "dataset_target": "bench.targets",
    "folder_target": "bench.targets",
    "run_isolated": "bench.isolate",
    "decode_rates": "bench.limits",
    "format_table": "bench.report",
    "format_limits": "bench.report",
    "headline": "bench.report",
    "draw_chart": "bench.report",
    "report_text": "bench.report",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'bench' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
