"""``pack-dataset index --engine ray``: each shard scanned by a Ray task, for many shards on a cluster.

Counterpart of the local pool in :func:`packer.tools.index.index_shards`: the same
:func:`packer.tools.index_scan.scan_shard` per shard, run as a task (``SPREAD`` over the nodes),
at most two per CPU of the cluster in flight, results taken in shard order (so the index is the
one the local pool writes). The cluster is reached as for a pack (:class:`packer.engines.ray.RaySession`:
``--ray-address``, else a one-machine Ray with ``--workers`` CPUs); shards on a node's disk must be
at the same path on every node, shards in a bucket are read by the nodes themselves.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Iterator

import ray

from packer.engines.ray import RaySession
from packer.options import PackOptions
from packer.tools.index_scan import ShardScan, scan_shard

__all__ = ["ray_scans"]


@ray.remote(scheduling_strategy="SPREAD")
def _scan(job: tuple[str, str, Any]) -> ShardScan:
    return scan_shard(job)


def ray_scans(jobs: Iterable[tuple[str, str, Any]], workers: int | None, address: str | None) -> Iterator[ShardScan]:
    """The scans of ``jobs`` (``scan_shard``'s), in order, from Ray tasks."""
    options = PackOptions(format="wds", engine="ray", workers=workers, ray_address=address)
    with RaySession.connect(options) as session:
        window = max(2, 2 * session.cpus)
        pending: deque[tuple[Any, str]] = deque()
        for job in jobs:
            pending.append((_scan.remote(job), job[1]))
            if len(pending) >= window:
                ref, name = pending.popleft()
                yield session.get(ref, f"shard {name}")
        try:
            while pending:
                ref, name = pending.popleft()
                yield session.get(ref, f"shard {name}")
        finally:
            session.cancel([ref for ref, _ in pending])
