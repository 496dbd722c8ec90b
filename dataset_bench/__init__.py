"""Measurement: how fast the packed formats feed a ``DataLoader``, beside a naive baseline, on this machine.

The top layer of the project: ``dataset_bench`` -> ``packer`` -> ``readers`` ->
``readers.contract.spec``. Nothing below imports it. One module per job:

* :mod:`dataset_bench.machine` -- the machine: CPUs, RAM, CPU model, PSS, other load;
* :mod:`dataset_bench.cache` -- page-cache control: eviction, residency check, sequential read;
* :mod:`dataset_bench.synth` -- the ImageNet-like folder generator;
* :mod:`dataset_bench.naive` -- the naive PIL-per-file baseline;
* :mod:`dataset_bench.targets` -- what is read: packed datasets (packed on demand), the source folder;
* :mod:`dataset_bench.measure` -- one loader measurement (:class:`~dataset_bench.measure.LoaderStats`);
* :mod:`dataset_bench.limits` -- the machine's raw read and decode rates;
* :mod:`dataset_bench.memory`, :mod:`dataset_bench.onecore` -- a loader's processes' memory as the
  targets count it; per-image work timed on one core;
* :mod:`dataset_bench.plan`, :mod:`dataset_bench.isolate`, :mod:`dataset_bench.run` -- a ``dataset-bench`` run:
  its configuration and cases, one fresh process per measurement, the run itself;
* :mod:`dataset_bench.results`, :mod:`dataset_bench.report` -- the result as plain data / JSON, and as
  tables, headline and chart;
* :mod:`dataset_bench.remote`, :mod:`dataset_bench.servers` -- ``dataset-bench --remote``: reading from a
  loopback S3 server (SeaweedFS) against the official reader and the local disk; the real
  servers (SeaweedFS, nginx) that it and the tests start;
* :mod:`dataset_bench.convert`, :mod:`dataset_bench.fieldsbench` -- ``pack-dataset convert`` beside a
  raw copy; ``dataset-bench --fields``, the previous release beside this checkout;
* :mod:`dataset_bench.writerbench` -- ``benchmarks/bench_writer.py``: ``packer.Writer`` and
  ``packer.pack_map`` beside the peers' writers;
* :mod:`dataset_bench.peers`, :mod:`dataset_bench.peerreaders`, :mod:`dataset_bench.peerwriters`,
  :mod:`dataset_bench.newpeers` -- the peers: which ones are installed (here or in a venv of their own),
  the older peers' readers and writers, the 2026 peers' loaders and writers;
* :mod:`dataset_bench.sidecases`, :mod:`dataset_bench.sidemeasure`, :mod:`dataset_bench.sidebyside`,
  :mod:`dataset_bench.sidereport`, :mod:`dataset_bench.sidecli` -- ``dataset-bench --peers``: its
  configuration and read cases, one measurement, the run, its report, its command;
* :mod:`dataset_bench.cli` -- the ``dataset-bench`` command (with :mod:`dataset_bench.sidecli`, the only
  places with argparse and progress bars).

The names below are importable from ``dataset_bench`` directly (lazily: ``import dataset_bench``
costs nothing).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_benchmark": "dataset_bench.run",
    "BenchProgress": "dataset_bench.run",
    "BenchConfig": "dataset_bench.plan",
    "BenchResult": "dataset_bench.results",
    "LoaderStats": "dataset_bench.measure",
    "measure_loader": "dataset_bench.measure",
    "measure_format": "dataset_bench.measure",
    "measure_naive": "dataset_bench.measure",
    "eval_transform": "dataset_bench.measure",
    "NaiveImageFolder": "dataset_bench.naive",
    "naive_load": "dataset_bench.naive",
    "naive_loader": "dataset_bench.naive",
    "CacheControl": "dataset_bench.cache",
    "sequential_read": "dataset_bench.cache",
    "CpuMonitor": "dataset_bench.machine",
    "machine_info": "dataset_bench.machine",
    "machine_label": "dataset_bench.machine",
    "pss_bytes": "dataset_bench.machine",
    "process_tree_pss": "dataset_bench.machine",
    "generate_image_folder": "dataset_bench.synth",
    "make_imagenet_like": "dataset_bench.synth",
    "SynthOptions": "dataset_bench.synth",
    "pack_formats": "dataset_bench.targets",
    "dataset_target": "dataset_bench.targets",
    "folder_target": "dataset_bench.targets",
    "run_isolated": "dataset_bench.isolate",
    "decode_rates": "dataset_bench.limits",
    "format_table": "dataset_bench.report",
    "format_limits": "dataset_bench.report",
    "headline": "dataset_bench.report",
    "draw_chart": "dataset_bench.report",
    "report_text": "dataset_bench.report",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dataset_bench' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
