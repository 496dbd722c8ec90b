"""Shuffle quality: pack-time order, ShardDataset's shard interleave, the metric and the ImageNet-shaped simulation."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

import readers.contract.env
from conftest import make_image_folder
from packer import PackOptions, pack
from readers import make_loader, open_dataset
from readers.contract import spec
from readers.contract.env import WorkerEnv
from readers.formats.wds import ShardDataset
from readers.order.epoch import ShardLayout, ShardSettings, interleave, worker_order
from readers.order.quality import expected_displacement, expected_distinct, measure, measure_loader, simulate
from readers.contract.spec import FORMATS


# --------------------------------------------------------------------------- the metric


@pytest.mark.parametrize("counts,batch", [([2, 3, 1], 2), ([4, 1, 1, 2], 3), ([5], 2), ([1, 1, 1], 3), ([3, 2], 5)])
def test_expected_distinct_equals_enumeration(counts, batch):
    labels = [c for c, k in enumerate(counts) for _ in range(k)]
    combos = list(itertools.combinations(range(len(labels)), batch))
    brute = np.mean([len({labels[i] for i in combo}) for combo in combos])
    assert expected_distinct(counts, batch) == pytest.approx(brute, rel=1e-9)


def test_expected_distinct_imagenet_shape():
    # 1000 classes x 1,281, batch 256: 1000 * (1 - C(N-1281, 256) / C(N, 256)) ~ 1000 * (1 - (1 - 1/1000)^256)
    assert expected_distinct([1281] * 1000, 256) == pytest.approx(1000 * (1 - (1 - 1 / 1000) ** 256), rel=1e-3)


def test_displacement_extremes_and_uniform():
    n = 2000
    rng = np.random.default_rng(0)
    labels = np.zeros(n, dtype=int)
    ident = measure([(None, labels[k:k + 100], np.arange(k, k + 100)) for k in range(0, n, 100)], [n])
    assert ident.displacement == pytest.approx(0.0, abs=1e-12)
    rev = np.arange(n)[::-1]
    assert measure([(None, labels[:n], rev)], [n]).displacement == pytest.approx(0.5, abs=1e-3)
    perm = rng.permutation(n)
    q = measure([(None, labels[perm[k:k + 100]], perm[k:k + 100]) for k in range(0, n, 100)], [n])
    assert q.expected_displacement == pytest.approx(1 / 3, abs=1e-3)
    assert 0.9 < q.displacement_ratio < 1.1
    assert expected_displacement(np.arange(n), n) == pytest.approx(q.expected_displacement)


def test_class_sorted_batches_score_low_and_shuffled_ones_near_one():
    classes, per = 50, 40
    labels = np.repeat(np.arange(classes), per)
    sorted_q = measure([labels[k:k + 64] for k in range(0, len(labels), 64)], [per] * classes)
    assert sorted_q.distinct <= 3 and sorted_q.distinct_ratio < 0.1
    perm = np.random.default_rng(1).permutation(len(labels))
    shuffled_q = measure([labels[perm[k:k + 64]] for k in range(0, len(labels), 64)], [per] * classes)
    assert 0.95 < shuffled_q.distinct_ratio < 1.05
    assert json.dumps(shuffled_q.as_dict())  # plain data


# --------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_defaults_reach_a_uniform_shuffle_on_a_small_shape(fmt):
    q = simulate(fmt, classes=100, per_class=128, world_size=2, num_workers=2, batch_size=32, shard_samples=200)
    assert q.distinct_ratio >= 0.9, q.summary()
    assert 0.9 <= q.displacement_ratio <= 1.1, q.summary()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_defaults_reach_the_target_on_imagenet_shape(fmt, capsys):
    """1000 classes x 1,281 images, 8 ranks x 8 workers, batch 256 (readers.order.quality.IMAGENET)."""
    q = simulate(fmt)
    with capsys.disabled():
        print(f"\n[shuffle] {fmt} defaults, ImageNet shape: {q.summary()}")
    assert q.batches >= 1281000 // 256
    assert q.distinct_ratio >= 0.9, q.summary()


def test_source_ordered_shards_are_caught_and_interleave_helps():
    shape = dict(classes=100, per_class=1000, world_size=2, num_workers=2, batch_size=64, shard_samples=2000)
    one = simulate("wds", order="source", open_shards=1, **shape)
    four = simulate("wds", order="source", open_shards=4, **shape)
    assert one.distinct_ratio < 0.3, "class-sorted shards read one at a time must score low"
    assert four.distinct > 1.2 * one.distinct, (one.summary(), four.summary())


# --------------------------------------------------------------------------- interleave


def test_interleave_keeps_each_shard_in_order_and_opens_at_most_k():
    layout = ShardLayout.from_sizes([7, 3, 9, 1, 5, 6])
    samples = np.arange(layout.num_samples)
    for k in (1, 2, 4, 10):
        out = interleave(samples, layout.shard_of[samples], k, np.random.default_rng(k))
        assert sorted(out.tolist()) == samples.tolist()
        for s in range(len(layout.sizes)):
            mine = out[layout.shard_of[out] == s]
            assert (np.diff(mine) == 1).all(), "a shard is no longer read front to back"
        # at any time at most k shards are started and not finished
        started, finished, open_now = set(), Counter(), 0
        for i in out.tolist():
            s = int(layout.shard_of[i])
            if s not in started:
                started.add(s)
                open_now += 1
            finished[s] += 1
            assert open_now <= max(k, 1)
            if finished[s] == layout.sizes[s]:
                open_now -= 1
        if k == 1:
            assert out.tolist() == samples.tolist()


def test_worker_orders_partition_the_epoch():
    layout = ShardLayout.from_sizes([5, 5, 5, 5, 5, 5, 3])
    settings = ShardSettings(seed=3, buffer_size=4, open_shards=3)
    for world, workers in ((1, 1), (2, 2), (3, 2)):
        seen = Counter()
        for r in range(world):
            for w in range(workers):
                seen.update(worker_order(layout, settings, 1, WorkerEnv(r, world, w, workers)).tolist())
        assert set(seen) == set(range(33)) and sum(seen.values()) - 33 <= world - 1


def test_sample_order_is_what_iteration_delivers(packed_generated, monkeypatch):
    ds = ShardDataset(packed_generated["wds"], decode=False, return_index=True, seed=4, buffer_size=5)
    ds.set_epoch(2)
    for env in (WorkerEnv(0, 1, 0, 1), WorkerEnv(1, 2, 1, 2)):
        monkeypatch.setattr(readers.contract.env, "worker_env_hook", lambda env=env: env)
        assert [t[2] for t in ds] == ds.sample_order().tolist() == ds.sample_order(env, 2).tolist()


# --------------------------------------------------------------------------- pack-time order


@pytest.fixture(scope="module")
def sorted_source(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("order") / "src", classes=4, per_class=9, size=(24, 20), seed=5)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_pack_order_default_per_format_is_recorded(sorted_source, tmp_path, fmt):
    pack(sorted_source, tmp_path / fmt, PackOptions(format=fmt, workers=1))
    index = spec.read_index(tmp_path / fmt)
    assert index.meta["order"]["kind"] == spec.DEFAULT_ORDER[fmt] == index.meta["options"]["order"]
    names = [json.loads(line) for line in (tmp_path / fmt / spec.NAMES_FILE).read_text().splitlines()]
    classes = index.classes
    # labels follow names.jsonl, whatever the order
    assert [classes[label] for label in index.labels.tolist()] == [n.split("/")[0] for n in names]
    if spec.DEFAULT_ORDER[fmt] == "source":
        assert names == sorted(names) and (np.diff(index.labels) >= 0).all()
    else:
        assert names != sorted(names) and sorted(names) == sorted(set(names))


def test_shuffled_pack_is_seeded_and_reads_back_the_right_bytes(sorted_source, tmp_path, stored_bytes):
    runs = {}
    for name, opts in {"a": dict(shuffle_seed=1), "b": dict(shuffle_seed=1), "c": dict(shuffle_seed=2),
                       "src": dict(order="source")}.items():
        pack(sorted_source, tmp_path / name, PackOptions(format="lmdb", workers=1, order=opts.get("order", "shuffled"),
                                                         shuffle_seed=opts.get("shuffle_seed", 0)))
        runs[name] = (tmp_path / name / spec.NAMES_FILE).read_text().splitlines()
    assert runs["a"] == runs["b"] != runs["c"]
    assert sorted(runs["a"]) == runs["src"]
    meta = spec.read_index(tmp_path / "a").meta
    assert meta["order"] == {"kind": "shuffled", "seed": 1}
    # sample i of the shuffled pack holds the file names.jsonl names (same bytes as in the source-order pack)
    for i, name in enumerate(runs["a"]):
        assert stored_bytes(tmp_path / "a", i) == stored_bytes(tmp_path / "src", runs["src"].index(name))


@pytest.mark.slow
def test_order_keeps_the_fingerprint_and_the_cli_matches_the_api(sorted_source, tmp_path):
    """Resume identity ignores the order (it is an option); the CLI writes what the API writes."""
    import subprocess
    import sys

    opts = PackOptions(format="wds", workers=1, shard_count=4)
    pack(sorted_source, tmp_path / "ref", opts)
    from packer.journal import Journal
    from packer.sources.source import scan

    source = scan(sorted_source)
    shuffled = source.ordered("shuffled", 0)
    assert shuffled.fingerprint() == source.fingerprint(), "the fingerprint must not depend on the order"
    assert Journal.identity_of("x", shuffled, opts) == Journal.identity_of("x", source, opts)
    assert sorted(shuffled.paths) == source.paths and shuffled.paths != source.paths
    with pytest.raises(ValueError):
        PackOptions(format="wds", order="random")
    res = subprocess.run([sys.executable, "-m", "packer.cli", str(sorted_source), "-f", "wds", "-o",
                          str(tmp_path / "cli"), "--shard-count", "4", "-q", "-w", "1"], capture_output=True)
    assert res.returncode == 0, res.stderr
    for f in sorted(p.name for p in (tmp_path / "ref").iterdir()):
        if f != spec.INDEX_NAME:
            assert (tmp_path / "ref" / f).read_bytes() == (tmp_path / "cli" / f).read_bytes(), f


def test_measure_loader_on_a_real_loader(packed_generated):
    for fmt in FORMATS:
        ds = open_dataset(packed_generated[fmt], decode=False, return_index=True)
        q = measure_loader(make_loader(ds, batch_size=8, num_workers=0))
        n = ds.index.num_samples
        assert q.batches == -(-n // 8) and 1 <= q.distinct <= 4
        assert q.displacement is not None and q.expected_displacement > 0


def test_dataset_bench_reports_shuffle_quality_beside_throughput(packed_generated):
    from dataset_bench.measure import measure_format
    from dataset_bench.report import format_table
    from dataset_bench.results import BenchResult, summarize

    stats = measure_format(packed_generated["wds"], mode="raw", num_workers=0, batch_size=8)
    assert stats.samples_per_s > 0 and 0 < stats.shuffle_ratio <= 1.5 and stats.displacement_ratio is not None
    row = {"target": "wds", "mode": "raw", "workers": 0, "cache": "warm", "x_naive": None, **summarize([stats], [], [])}
    table = format_table(BenchResult(machine={}, config={}, targets=[], rows=[row], limits={}, notes=[],
                                     transform=""))
    assert "shuffle x uniform" in table.splitlines()[0] and f"{stats.shuffle_ratio:.2f}x |" in table.splitlines()[2]
