"""``dataset-bench --remote``: a quick run end to end against its own SeaweedFS (slow: starts a server)."""

from __future__ import annotations

import json
import shutil

import pytest

from dataset_bench.remote import RemoteConfig, remote_report, run_remote, synthetic_wds_index, tcp_loopback_mb_s
from readers import open_dataset

pytest_plugins = ["servers"]


def test_tcp_loopback_is_measured():
    assert tcp_loopback_mb_s(64 << 20) > 10


def test_synthetic_index_opens(tmp_path):
    synthetic_wds_index(tmp_path / "idx", 10_000, shards=8)
    ds = open_dataset(tmp_path / "idx")
    assert ds.index.num_samples == 10_000 and len(ds.shard_names) == 8
    ds.close()


def test_config_validation():
    with pytest.raises(ValueError):
        RemoteConfig(repeats=0)
    with pytest.raises(ValueError, match="nothing to measure"):
        RemoteConfig(generate=0)


@pytest.mark.slow
def test_remote_bench_quick_end_to_end(s3_server, tmp_path):
    """Every row measured, every sample read, both ratios computed, JSON written."""
    if shutil.which("curl") is None:
        pytest.skip("curl is needed for the webdataset (pipe:curl) row")
    cfg = RemoteConfig(generate=96, shards=4, batch_size=16, repeats=1, index_samples=20_000, isolate=False,
                       work_dir=str(tmp_path / "work"))
    result = run_remote(cfg)
    assert set(result.rows) == {"local disk", "webdataset (pipe:curl)", "ours, streaming", "ours, cache epoch 1",
                                "ours, cache epoch 2"}
    assert all(row["samples"] == result.dataset["samples"] == 96 for row in result.rows.values())
    assert all(r is not None for r, _ in result.ratios().values())
    assert result.ceilings["tcp loopback"] > 0 and result.index_open["samples"] == 20_000
    text = remote_report(result)
    assert "streaming vs webdataset" in text and "cache epoch 2 vs local disk" in text
    saved = json.loads(result.save_json(tmp_path / "r.json").read_text())
    assert set(saved["ratios"]) == {"streaming vs webdataset", "cache epoch 2 vs local disk"}
